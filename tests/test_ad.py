"""Public ``ad`` math in plain mode: every function on float32 and float64 scalars, vectors and matrices vs NumPy.

One kernel per dtype evaluates every function at fixed inputs and writes each result to the output array of its
kind (scalar, vec2, vec3, vec4, mat22, mat33), in the order of that kind's entries in ``CASES``; each case is then
one test. Float literals in float64 code (``ad.pow(a, 1.5)``) go through the float32-literal overloads. The
dual-number overloads of the same functions are checked in ``test_duals.py``.
"""

import functools

import numpy as np
import pytest
import warp as wp

from warp_meshad.kernels import ad

wp.config.log_level = wp.LOG_WARNING

DTYPES = {"float32": wp.float32, "float64": wp.float64}
RTOL = {"float32": 2e-6, "float64": 1e-14}
# each kernel runs once on one thread: compile fast rather than run fast on the CPU; on CUDA, -O0 leaves the
# locals on the stack, which the driver reserves for every thread the GPU can hold (see test_duals.py)
KERNEL_OPTIONS = {"optimization_level": 0} if wp.get_device().is_cpu else {}

A, B, C = 1.3, 0.6, 0.35  # |C| < 1 for asin / acos
V2, W2 = np.array([0.6, -0.8]), np.array([0.3, 0.5])
V3, W3 = np.array([0.6, -0.8, 1.1]), np.array([-0.4, 0.9, 0.5])
V4, W4 = np.array([0.6, -0.8, 1.1, 0.4]), np.array([0.2, 0.1, -0.3, 0.7])
M22, N22 = np.array([[1.2, -0.4], [0.3, 0.9]]), np.array([[0.5, 0.1], [-0.2, 0.8]])
M33 = np.array([[1.3, 0.2, -0.4], [0.1, 0.9, 0.3], [-0.5, 0.2, 1.1]])
N33 = np.array([[0.4, -0.1, 0.2], [0.3, 0.7, -0.5], [0.0, 0.6, 0.1]])

# (name, kind, expected value); the name starts with the ad function it checks
CASES = [
    # scalars
    ("sqrt", "s", np.sqrt(A)),
    ("exp", "s", np.exp(C)),
    ("log", "s", np.log(A)),
    ("sin", "s", np.sin(A)),
    ("cos", "s", np.cos(A)),
    ("tan", "s", np.tan(C)),
    ("asin", "s", np.arcsin(C)),
    ("acos", "s", np.arccos(C)),
    ("atan", "s", np.arctan(A)),
    ("sinh", "s", np.sinh(C)),
    ("cosh", "s", np.cosh(C)),
    ("tanh", "s", np.tanh(C)),
    ("abs_negative", "s", C),
    ("abs_positive", "s", C),
    ("sq", "s", B * B),
    ("pow", "s", A**B),
    ("pow_float_literal", "s", A**1.5),
    ("pow_float_literal_base", "s", 1.5**B),
    ("atan2", "s", np.arctan2(C, B)),
    ("atan2_third_quadrant", "s", np.arctan2(-C, -B)),
    ("atan2_float_literal", "s", np.arctan2(C, 0.5)),
    ("min", "s", B),
    ("min_reversed", "s", B),
    ("min_float_literal", "s", 0.5),
    ("max", "s", A),
    ("max_float_literal", "s", A),
    ("where_true", "s", A),
    ("where_false", "s", B),
    ("select_true", "s", B),
    ("select_false", "s", A),
    ("value", "s", A),
    ("length_vec2", "s", np.linalg.norm(V2)),
    ("length_vec3", "s", np.linalg.norm(V3)),
    ("length_vec4", "s", np.linalg.norm(V4)),
    ("length_sq_vec2", "s", V2 @ V2),
    ("length_sq_vec3", "s", V3 @ V3),
    ("length_sq_vec4", "s", V4 @ V4),
    ("dot_vec2", "s", V2 @ W2),
    ("dot_vec3", "s", V3 @ W3),
    ("dot_vec4", "s", V4 @ W4),
    ("det_2x2", "s", np.linalg.det(M22)),
    ("det_3x3", "s", np.linalg.det(M33)),
    ("trace_2x2", "s", np.trace(M22)),
    ("trace_3x3", "s", np.trace(M33)),
    ("frobenius_sq_2x2", "s", np.sum(M22**2)),
    ("frobenius_sq_3x3", "s", np.sum(M33**2)),
    # vectors
    ("normalize_vec2", "v2", V2 / np.linalg.norm(V2)),
    ("vec2", "v2", [A, B]),
    ("matmul_2x2_vec2", "v2", M22 @ V2),
    ("normalize_vec3", "v3", V3 / np.linalg.norm(V3)),
    ("cross", "v3", np.cross(V3, W3)),
    ("vec3", "v3", [A, B, C]),
    ("matmul_3x3_vec3", "v3", M33 @ V3),
    ("where_vec3_true", "v3", V3),
    ("where_vec3_false", "v3", W3),
    ("select_vec3_true", "v3", W3),
    ("select_vec3_false", "v3", V3),
    ("value_vec3", "v3", V3),
    ("normalize_vec4", "v4", V4 / np.linalg.norm(V4)),
    ("vec4", "v4", [A, B, C, -A]),
    # matrices
    ("outer_vec2", "m22", np.outer(V2, W2)),
    ("inverse_2x2", "m22", np.linalg.inv(M22)),
    ("transpose_2x2", "m22", M22.T),
    ("matmul_2x2", "m22", M22 @ N22),
    ("mat22", "m22", [[A, B], [C, -A]]),
    ("mat22_cols", "m22", np.column_stack([V2, W2])),
    ("mat22_rows", "m22", np.vstack([V2, W2])),
    ("outer_vec3", "m33", np.outer(V3, W3)),
    ("inverse_3x3", "m33", np.linalg.inv(M33)),
    ("transpose_3x3", "m33", M33.T),
    ("matmul_3x3", "m33", M33 @ N33),
    ("mat33_cols", "m33", np.column_stack([V3, W3, V3 + W3])),
    ("mat33_rows", "m33", np.vstack([V3, W3, V3 + W3])),
    ("where_3x3_true", "m33", M33),
    ("select_3x3_true", "m33", N33),
]
KINDS = ("s", "v2", "v3", "v4", "m22", "m33")


def plain_kernel(S):
    """Every case of CASES, in order, for scalar type ``S``."""
    vec2 = wp.types.vector(length=2, dtype=S)
    vec3 = wp.types.vector(length=3, dtype=S)
    vec4 = wp.types.vector(length=4, dtype=S)
    mat22 = wp.types.matrix(shape=(2, 2), dtype=S)
    mat33 = wp.types.matrix(shape=(3, 3), dtype=S)

    @wp.kernel(module="unique", enable_backward=False, module_options=KERNEL_OPTIONS)
    def kernel(
        sin: wp.array(dtype=S),
        v2in: wp.array(dtype=vec2),
        v3in: wp.array(dtype=vec3),
        v4in: wp.array(dtype=vec4),
        m22in: wp.array(dtype=mat22),
        m33in: wp.array(dtype=mat33),
        out_s: wp.array(dtype=S),
        out_v2: wp.array(dtype=vec2),
        out_v3: wp.array(dtype=vec3),
        out_v4: wp.array(dtype=vec4),
        out_m22: wp.array(dtype=mat22),
        out_m33: wp.array(dtype=mat33),
        count: wp.array(dtype=int),
    ):
        a = sin[0]
        b = sin[1]
        c = sin[2]
        t = sin[3] > S(0.0)
        f = sin[3] < S(0.0)
        v2 = v2in[0]
        w2 = v2in[1]
        v3 = v3in[0]
        w3 = v3in[1]
        v4 = v4in[0]
        w4 = v4in[1]
        m22 = m22in[0]
        n22 = m22in[1]
        m33 = m33in[0]
        n33 = m33in[1]

        i = int(0)
        out_s[i + 0] = ad.sqrt(a)
        out_s[i + 1] = ad.exp(c)
        out_s[i + 2] = ad.log(a)
        out_s[i + 3] = ad.sin(a)
        out_s[i + 4] = ad.cos(a)
        out_s[i + 5] = ad.tan(c)
        out_s[i + 6] = ad.asin(c)
        out_s[i + 7] = ad.acos(c)
        out_s[i + 8] = ad.atan(a)
        out_s[i + 9] = ad.sinh(c)
        out_s[i + 10] = ad.cosh(c)
        out_s[i + 11] = ad.tanh(c)
        out_s[i + 12] = ad.abs(-c)
        out_s[i + 13] = ad.abs(c)
        out_s[i + 14] = ad.sq(b)
        out_s[i + 15] = ad.pow(a, b)
        out_s[i + 16] = ad.pow(a, 1.5)
        out_s[i + 17] = ad.pow(1.5, b)
        out_s[i + 18] = ad.atan2(c, b)
        out_s[i + 19] = ad.atan2(-c, -b)
        out_s[i + 20] = ad.atan2(c, 0.5)
        out_s[i + 21] = ad.min(a, b)
        out_s[i + 22] = ad.min(b, a)
        out_s[i + 23] = ad.min(a, 0.5)
        out_s[i + 24] = ad.max(a, b)
        out_s[i + 25] = ad.max(0.5, a)
        out_s[i + 26] = ad.where(t, a, b)
        out_s[i + 27] = ad.where(f, a, b)
        out_s[i + 28] = ad.select(t, a, b)
        out_s[i + 29] = ad.select(f, a, b)
        out_s[i + 30] = ad.value(a)
        out_s[i + 31] = ad.length(v2)
        out_s[i + 32] = ad.length(v3)
        out_s[i + 33] = ad.length(v4)
        out_s[i + 34] = ad.length_sq(v2)
        out_s[i + 35] = ad.length_sq(v3)
        out_s[i + 36] = ad.length_sq(v4)
        out_s[i + 37] = ad.dot(v2, w2)
        out_s[i + 38] = ad.dot(v3, w3)
        out_s[i + 39] = ad.dot(v4, w4)
        out_s[i + 40] = ad.det(m22)
        out_s[i + 41] = ad.det(m33)
        out_s[i + 42] = ad.trace(m22)
        out_s[i + 43] = ad.trace(m33)
        out_s[i + 44] = ad.frobenius_sq(m22)
        out_s[i + 45] = ad.frobenius_sq(m33)
        count[0] = 46

        out_v2[0] = ad.normalize(v2)
        out_v2[1] = ad.vec2(a, b)
        out_v2[2] = ad.matmul(m22, v2)
        count[1] = 3

        out_v3[0] = ad.normalize(v3)
        out_v3[1] = ad.cross(v3, w3)
        out_v3[2] = ad.vec3(a, b, c)
        out_v3[3] = ad.matmul(m33, v3)
        out_v3[4] = ad.where(t, v3, w3)
        out_v3[5] = ad.where(f, v3, w3)
        out_v3[6] = ad.select(t, v3, w3)
        out_v3[7] = ad.select(f, v3, w3)
        out_v3[8] = ad.value(v3)
        count[2] = 9

        out_v4[0] = ad.normalize(v4)
        out_v4[1] = ad.vec4(a, b, c, -a)
        count[3] = 2

        out_m22[0] = ad.outer(v2, w2)
        out_m22[1] = ad.inverse(m22)
        out_m22[2] = ad.transpose(m22)
        out_m22[3] = ad.matmul(m22, n22)
        out_m22[4] = ad.mat22(a, b, c, -a)
        out_m22[5] = ad.mat22_cols(v2, w2)
        out_m22[6] = ad.mat22_rows(v2, w2)
        count[4] = 7

        out_m33[0] = ad.outer(v3, w3)
        out_m33[1] = ad.inverse(m33)
        out_m33[2] = ad.transpose(m33)
        out_m33[3] = ad.matmul(m33, n33)
        out_m33[4] = ad.mat33_cols(v3, w3, v3 + w3)
        out_m33[5] = ad.mat33_rows(v3, w3, v3 + w3)
        out_m33[6] = ad.where(t, m33, n33)
        out_m33[7] = ad.select(t, m33, n33)
        count[5] = 8

    return kernel


@functools.lru_cache(maxsize=None)
def plain_results(dtype: str):
    S = DTYPES[dtype]
    types = {
        "s": S,
        "v2": wp.types.vector(length=2, dtype=S),
        "v3": wp.types.vector(length=3, dtype=S),
        "v4": wp.types.vector(length=4, dtype=S),
        "m22": wp.types.matrix(shape=(2, 2), dtype=S),
        "m33": wp.types.matrix(shape=(3, 3), dtype=S),
    }
    inputs = [
        wp.array([A, B, C, 1.0], dtype=S),
        wp.array(np.stack([V2, W2]), dtype=types["v2"]),
        wp.array(np.stack([V3, W3]), dtype=types["v3"]),
        wp.array(np.stack([V4, W4]), dtype=types["v4"]),
        wp.array(np.stack([M22, N22]), dtype=types["m22"]),
        wp.array(np.stack([M33, N33]), dtype=types["m33"]),
    ]
    outs = {kind: wp.zeros(64, dtype=types[kind]) for kind in KINDS}
    count = wp.zeros(len(KINDS), dtype=int)
    wp.launch(plain_kernel(S), dim=1, inputs=[*inputs, *(outs[kind] for kind in KINDS), count])
    return {kind: outs[kind].numpy() for kind in KINDS}, count.numpy()


def _slot(name):
    kind = next(c[1] for c in CASES if c[0] == name)
    return kind, [c[0] for c in CASES if c[1] == kind].index(name)


@pytest.mark.parametrize("dtype", DTYPES)
def test_plain_kernel_writes_every_case(dtype):
    _, count = plain_results(dtype)
    assert list(count) == [sum(c[1] == kind for c in CASES) for kind in KINDS]


@pytest.mark.parametrize("name", [c[0] for c in CASES])
@pytest.mark.parametrize("dtype", DTYPES)
def test_plain_op(dtype, name):
    outs, _ = plain_results(dtype)
    kind, index = _slot(name)
    expected = np.asarray(next(c[2] for c in CASES if c[0] == name), dtype=np.float64)
    got = outs[kind][index].astype(np.float64)
    assert outs[kind].dtype == np.dtype(dtype), f"{name}: result is not {dtype}"
    np.testing.assert_allclose(got, expected, rtol=RTOL[dtype], atol=RTOL[dtype], err_msg=name)


def test_every_public_function_is_covered():
    public = set(ad.__all__) - {"duals"}
    covered = {name for name in public if any(c[0] == name or c[0].startswith(name + "_") for c in CASES)}
    assert covered == public
    for name in public:
        assert isinstance(getattr(ad, name), wp.Function), name


def test_duals_factory():
    d64 = ad.duals(3)
    assert d64 is ad.duals(3, wp.float64, hessian=True)
    assert d64.S is wp.float64 and d64.K == 3 and d64.HESSIAN
    assert [f for f, _ in d64.Dual.ctype._fields_] == ["v", "g", "h"]
    d32 = ad.duals(3, wp.float32, hessian=False)
    assert d32.S is wp.float32 and not d32.HESSIAN
    assert [f for f, _ in d32.Dual.ctype._fields_] == ["v", "g"]
    api = ("seed", "const", "value", "gradient", "add", "sub", "mul", "div")
    for name in api + ("DVec2", "DVec3", "DVec4", "DMat22", "DMat33"):
        assert hasattr(d32, name), name
    assert hasattr(d64, "hessian") and hasattr(d64, "project_psd")
    for bad in (0, 65, 2.0):
        with pytest.raises(ValueError, match="local size"):
            ad.duals(bad)
    with pytest.raises(ValueError, match="float32 or float64"):
        ad.duals(3, wp.float16)
