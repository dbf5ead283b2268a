"""Generated dual numbers: every operation against a closed form, in float32 and float64.

Each kernel below evaluates many operations at one point and writes every result (a dual scalar, or the
components of a dual vector / matrix, row-major) to one flat output array, in the order of a host-side case
list. Each case is then checked on the host, one test per operation:

* value, gradient and Hessian against a closed form written by hand (derivative tables for the unary
  functions, partial derivatives for the binary ones; dot, length, normalize, cross, outer; matrix identities
  for det and inverse). Structural vector / matrix operations (constructors, +, -, products, index, where) are
  polynomials of degree <= 2 in the variables, for which central differences are exact up to rounding: those
  use the differences as the reference;
* in float64, the closed form itself against Richardson-extrapolated central differences of its value, and the
  AD result against those differences, so a wrong closed form cannot hide a wrong operation;
* the Hessian is symmetric.

The gradient-only duals (``hessian=False``) run the same kernels and must give the same values and gradients.
``project_psd`` is checked against a NumPy eigendecomposition.

Kernels are built by factories that take the generated module ``D`` as a closure variable; the factory binds
``add, sub, mul, div`` of ``D`` and each kernel names them once, so ``+ - * /`` on duals inside it resolve
to that module's overload sets (Warp looks operator overloads up in the kernel's closure, then globals).
"""

import functools
from typing import Any, NamedTuple

import numpy as np
import pytest
import warp as wp

from warp_meshad.kernels import ad

wp.config.log_level = wp.LOG_WARNING

DTYPES = {"float32": wp.float32, "float64": wp.float64}
NP_DTYPES = {"float32": np.float32, "float64": np.float64}
# AD against a closed form; atol is relative to the largest entry of the checked block
TOL = {"float32": (1e-4, 1e-5), "float64": (1e-10, 1e-12)}
# float64 AD (and closed forms) against central differences
FD_TOL = (1e-7, 1e-8)
# each test kernel runs once on one thread. On the CPU, -O0 compiles the long straight-line dual code in seconds,
# where -O2 takes minutes for the k = 6 vector kernel. On CUDA, -O0 leaves ~200 KB of locals per thread (float64
# vector kernel), which the driver reserves for every thread the GPU can hold (~50 GB on an H200: launches fail
# with "out of memory"), while full optimization compiles in ~12 s and keeps everything in registers.
KERNEL_OPTIONS = {"optimization_level": 0} if wp.get_device().is_cpu else {}


# ------------------------------------------------------------------------------------------------------------
# host-side references
# ------------------------------------------------------------------------------------------------------------


class Jet(NamedTuple):
    """Value ``v`` (shape S), gradient ``g`` (S + (k,)) and Hessian ``h`` (S + (k, k)) of a reference."""

    v: Any
    g: Any
    h: Any


def const_jet(v, k):
    v = np.asarray(v, dtype=np.float64)
    return Jet(v, np.zeros(v.shape + (k,)), np.zeros(v.shape + (k, k)))


def fd_derivatives(f, z, h=2e-3):
    """Gradient and Hessian of ``f`` at ``z`` by central differences, Richardson-extrapolated (error O(h^4))."""
    z = np.asarray(z, dtype=np.float64)
    k = z.size
    f0 = np.asarray(f(z), dtype=np.float64)

    def at(dz):
        return np.asarray(f(z + dz), dtype=np.float64)

    def central(step):
        e = np.eye(k) * step
        g = np.stack([(at(e[i]) - at(-e[i])) / (2 * step) for i in range(k)], axis=-1)
        hess = np.zeros(f0.shape + (k, k))
        for i in range(k):
            hess[..., i, i] = (at(e[i]) - 2 * f0 + at(-e[i])) / step**2
            for j in range(i + 1, k):
                hij = (at(e[i] + e[j]) - at(e[i] - e[j]) - at(e[j] - e[i]) + at(-e[i] - e[j])) / (4 * step**2)
                hess[..., i, j] = hess[..., j, i] = hij
        return g, hess

    g1, h1 = central(h)
    g2, h2 = central(h / 2)
    return (4 * g2 - g1) / 3, (4 * h2 - h1) / 3


def _scaled_close(got, ref, rtol, atol, what):
    ref = np.asarray(ref, dtype=np.float64)
    got = np.asarray(got, dtype=np.float64)
    scale = max(1.0, float(np.max(np.abs(ref)))) if ref.size else 1.0
    np.testing.assert_allclose(got, ref, rtol=rtol, atol=atol * scale, err_msg=what)


def check_dual(got: Jet, ref: Jet, dtype: str, name: str, hessian: bool = True):
    """AD result against the reference: value, gradient, Hessian and Hessian symmetry."""
    rtol, atol = TOL[dtype]
    assert np.all(np.isfinite(got.v)) and np.all(np.isfinite(got.g)), f"{name}: non-finite result"
    _scaled_close(got.v, ref.v, rtol, atol, f"{name}: value")
    _scaled_close(got.g, ref.g, rtol, atol, f"{name}: gradient")
    if hessian:
        assert np.all(np.isfinite(got.h)), f"{name}: non-finite Hessian"
        _scaled_close(got.h, ref.h, rtol, atol, f"{name}: Hessian")
        # exact symmetry up to rounding (an fma may round the two triangles differently)
        sym_tol = 8 * np.finfo(NP_DTYPES[dtype]).eps * max(1.0, float(np.max(np.abs(got.h))))
        np.testing.assert_allclose(got.h, np.swapaxes(got.h, -1, -2), rtol=0, atol=sym_tol, err_msg=f"{name}: symmetry")


def check_against_fd(got: Jet, value_fn, z, name: str, ref: Jet | None = None):
    """float64 only: AD (and the closed form when given) against central differences of ``value_fn``."""
    g_fd, h_fd = fd_derivatives(value_fn, z)
    rtol, atol = FD_TOL
    _scaled_close(got.g, g_fd, rtol, atol, f"{name}: AD gradient vs central differences")
    _scaled_close(got.h, h_fd, rtol, atol, f"{name}: AD Hessian vs central differences")
    if ref is not None:
        _scaled_close(ref.g, g_fd, rtol, atol, f"{name}: closed-form gradient vs central differences")
        _scaled_close(ref.h, h_fd, rtol, atol, f"{name}: closed-form Hessian vs central differences")


def full_hessian(packed: np.ndarray) -> np.ndarray:
    """The k x k Hessians of duals from their ``h`` fields (the upper triangle, row by row; shape (..., p))."""
    p = packed.shape[-1]
    k = int(round((np.sqrt(8 * p + 1) - 1) / 2))
    assert k * (k + 1) // 2 == p, f"a packed Hessian field has k (k + 1) / 2 entries, got {p}"
    iu, ju = np.triu_indices(k)
    h = np.zeros(packed.shape[:-1] + (k, k), dtype=packed.dtype)
    h[..., iu, ju] = packed
    h[..., ju, iu] = packed
    return h


def unpack(out: np.ndarray, start: int, size: int, scalar: bool, hessian: bool = True) -> Jet:
    sl = slice(start, start + size)
    h = full_hessian(out["h"][sl]) if hessian else None
    if scalar:
        return Jet(out["v"][sl][0], out["g"][sl][0], None if h is None else h[0])
    return Jet(out["v"][sl], out["g"][sl], h)


# ------------------------------------------------------------------------------------------------------------
# storing helpers: write a dual (or the components of a dual vector / matrix) at a running index
# ------------------------------------------------------------------------------------------------------------


@wp.func
def _put(out: wp.array(dtype=Any), i: int, a: Any):
    out[i] = a
    return i + 1


@wp.func
def _put2(out: wp.array(dtype=Any), i: int, a: Any):
    out[i] = a.x
    out[i + 1] = a.y
    return i + 2


@wp.func
def _put3(out: wp.array(dtype=Any), i: int, a: Any):
    out[i] = a.x
    out[i + 1] = a.y
    out[i + 2] = a.z
    return i + 3


@wp.func
def _put4(out: wp.array(dtype=Any), i: int, a: Any):
    out[i] = a.x
    out[i + 1] = a.y
    out[i + 2] = a.z
    out[i + 3] = a.w
    return i + 4


@wp.func
def _put22(out: wp.array(dtype=Any), i: int, a: Any):
    out[i] = a.m00
    out[i + 1] = a.m01
    out[i + 2] = a.m10
    out[i + 3] = a.m11
    return i + 4


@wp.func
def _put33(out: wp.array(dtype=Any), i: int, a: Any):
    out[i] = a.m00
    out[i + 1] = a.m01
    out[i + 2] = a.m02
    out[i + 3] = a.m10
    out[i + 4] = a.m11
    out[i + 5] = a.m12
    out[i + 6] = a.m20
    out[i + 7] = a.m21
    out[i + 8] = a.m22
    return i + 9


@wp.func
def _flag(flags: wp.array(dtype=int), j: int, c: bool):
    flags[j] = wp.where(c, 1, 0)
    return j + 1


# ============================================================================================================
# scalar operations, k = 2: seeds x, y; polynomials a, b, c of them; s a runtime scalar of the dual's dtype
# ============================================================================================================

X0, Y0, S0 = 0.6, 0.3, 0.7


def jet_a(z):
    """a = x^2 + x y + 2 (2.54 at the test point)."""
    x, y = z
    return Jet(x * x + x * y + 2.0, np.array([2 * x + y, x]), np.array([[2.0, 1.0], [1.0, 0.0]]))


def jet_b(z):
    """b = x y - y^2 / 2 + 1 - x (0.535)."""
    x, y = z
    return Jet(x * y - 0.5 * y * y + 1.0 - x, np.array([y - 1.0, x - y]), np.array([[0.0, 1.0], [1.0, -1.0]]))


def jet_c(z):
    """c = x y / 2 + x / 4 - y^2 (0.15: inside the domain of asin / acos)."""
    x, y = z
    g = np.array([0.5 * y + 0.25, 0.5 * x - 2 * y])
    return Jet(0.5 * x * y + 0.25 * x - y * y, g, np.array([[0.0, 0.5], [0.5, -2.0]]))


def jet_x(z):
    return Jet(z[0], np.array([1.0, 0.0]), np.zeros((2, 2)))


def jet_y(z):
    return Jet(z[1], np.array([0.0, 1.0]), np.zeros((2, 2)))


# unary functions: (f, f', f'') written by hand
UNARY = {
    "sqrt": (np.sqrt, lambda t: 0.5 / np.sqrt(t), lambda t: -0.25 * t**-1.5),
    "exp": (np.exp, np.exp, np.exp),
    "log": (np.log, lambda t: 1 / t, lambda t: -1 / t**2),
    "sin": (np.sin, np.cos, lambda t: -np.sin(t)),
    "cos": (np.cos, lambda t: -np.sin(t), lambda t: -np.cos(t)),
    "tan": (np.tan, lambda t: 1 / np.cos(t) ** 2, lambda t: 2 * np.tan(t) / np.cos(t) ** 2),
    "asin": (np.arcsin, lambda t: 1 / np.sqrt(1 - t * t), lambda t: t / (1 - t * t) ** 1.5),
    "acos": (np.arccos, lambda t: -1 / np.sqrt(1 - t * t), lambda t: -t / (1 - t * t) ** 1.5),
    "atan": (np.arctan, lambda t: 1 / (1 + t * t), lambda t: -2 * t / (1 + t * t) ** 2),
    "sinh": (np.sinh, np.cosh, np.sinh),
    "cosh": (np.cosh, np.sinh, np.cosh),
    "tanh": (np.tanh, lambda t: 1 / np.cosh(t) ** 2, lambda t: -2 * np.tanh(t) / np.cosh(t) ** 2),
    "abs": (np.abs, np.sign, lambda t: 0.0 * t),
    "sq": (lambda t: t * t, lambda t: 2 * t, lambda t: 2.0 + 0 * t),
}

# binary functions f(p, q): (f, f_p, f_q, f_pp, f_pq, f_qq) written by hand
BINARY = {
    "add": lambda p, q: (p + q, 1.0, 1.0, 0.0, 0.0, 0.0),
    "sub": lambda p, q: (p - q, 1.0, -1.0, 0.0, 0.0, 0.0),
    "mul": lambda p, q: (p * q, q, p, 0.0, 1.0, 0.0),
    "div": lambda p, q: (p / q, 1 / q, -p / q**2, 0.0, -1 / q**2, 2 * p / q**3),
    "pow": lambda p, q: (
        p**q,
        q * p ** (q - 1),
        p**q * np.log(p),
        q * (q - 1) * p ** (q - 2),
        p ** (q - 1) * (1 + q * np.log(p)),
        p**q * np.log(p) ** 2,
    ),
    # atan2(p = y, q = x)
    "atan2": lambda p, q: (
        np.arctan2(p, q),
        q / (p * p + q * q),
        -p / (p * p + q * q),
        -2 * p * q / (p * p + q * q) ** 2,
        (p * p - q * q) / (p * p + q * q) ** 2,
        2 * p * q / (p * p + q * q) ** 2,
    ),
}


def unary(name, a: Jet) -> Jet:
    f, f1, f2 = UNARY[name]
    t = a.v
    return Jet(f(t), f1(t) * a.g, f1(t) * a.h + f2(t) * np.outer(a.g, a.g))


def binary(name, a, b) -> Jet:
    """``name(a, b)`` for jets or plain numbers (constants)."""
    a = a if isinstance(a, Jet) else const_jet(a, 2)
    b = b if isinstance(b, Jet) else const_jet(b, 2)
    f, fp, fq, fpp, fpq, fqq = BINARY[name](a.v, b.v)
    g = fp * a.g + fq * b.g
    h = fp * a.h + fq * b.h + fpp * np.outer(a.g, a.g) + fqq * np.outer(b.g, b.g)
    h = h + fpq * (np.outer(a.g, b.g) + np.outer(b.g, a.g))
    return Jet(f, g, h)


def neg(a: Jet) -> Jet:
    return Jet(-a.v, -a.g, -a.h)


A, B, C = jet_a, jet_b, jet_c
# (name, reference jet as a function of z = (x, y)), in the order the kernel writes them
SCALAR_CASES = [
    ("seed_x", jet_x),
    ("seed_y", jet_y),
    ("poly_a_operators_literals", A),
    ("poly_b_operators_literals", B),
    ("poly_c_operators_int_division", C),
    ("const_scalar", lambda z: const_jet(S0, 2)),
    ("add_dual_dual", lambda z: binary("add", A(z), B(z))),
    ("add_dual_scalar", lambda z: binary("add", A(z), S0)),
    ("add_scalar_dual", lambda z: binary("add", S0, A(z))),
    ("add_dual_float_literal", lambda z: binary("add", A(z), 1.5)),
    ("add_float_literal_dual", lambda z: binary("add", 1.5, A(z))),
    ("add_dual_int_literal", lambda z: binary("add", A(z), 2.0)),
    ("add_int_literal_dual", lambda z: binary("add", 2.0, A(z))),
    ("sub_dual_dual", lambda z: binary("sub", A(z), B(z))),
    ("sub_dual_scalar", lambda z: binary("sub", A(z), S0)),
    ("sub_scalar_dual", lambda z: binary("sub", S0, A(z))),
    ("sub_dual_float_literal", lambda z: binary("sub", A(z), 1.5)),
    ("sub_float_literal_dual", lambda z: binary("sub", 1.5, A(z))),
    ("sub_dual_int_literal", lambda z: binary("sub", A(z), 2.0)),
    ("sub_int_literal_dual", lambda z: binary("sub", 2.0, A(z))),
    ("mul_dual_dual", lambda z: binary("mul", A(z), B(z))),
    ("mul_dual_scalar", lambda z: binary("mul", A(z), S0)),
    ("mul_scalar_dual", lambda z: binary("mul", S0, A(z))),
    ("mul_dual_float_literal", lambda z: binary("mul", A(z), 1.5)),
    ("mul_float_literal_dual", lambda z: binary("mul", 1.5, A(z))),
    ("mul_dual_int_literal", lambda z: binary("mul", A(z), 2.0)),
    ("mul_int_literal_dual", lambda z: binary("mul", 2.0, A(z))),
    ("div_dual_dual", lambda z: binary("div", A(z), B(z))),
    ("div_dual_dual_reversed", lambda z: binary("div", B(z), A(z))),
    ("div_dual_scalar", lambda z: binary("div", A(z), S0)),
    ("div_scalar_dual", lambda z: binary("div", S0, A(z))),
    ("div_dual_float_literal", lambda z: binary("div", A(z), 1.5)),
    ("div_float_literal_dual", lambda z: binary("div", 1.5, A(z))),
    ("div_dual_int_literal", lambda z: binary("div", A(z), 2.0)),
    ("div_int_literal_dual", lambda z: binary("div", 2.0, A(z))),
    ("neg", lambda z: neg(A(z))),
    ("pow_dual_dual", lambda z: binary("pow", A(z), B(z))),
    ("pow_dual_scalar", lambda z: binary("pow", A(z), S0)),
    ("pow_scalar_dual", lambda z: binary("pow", S0, A(z))),
    ("pow_dual_float_literal", lambda z: binary("pow", A(z), 1.5)),
    ("pow_float_literal_dual", lambda z: binary("pow", 1.5, A(z))),
    ("pow_dual_int_literal", lambda z: binary("pow", A(z), 3.0)),
    ("pow_int_literal_dual", lambda z: binary("pow", 2.0, A(z))),
    ("atan2_dual_dual", lambda z: binary("atan2", C(z), B(z))),
    ("atan2_dual_dual_third_quadrant", lambda z: binary("atan2", neg(C(z)), neg(B(z)))),
    ("atan2_dual_scalar", lambda z: binary("atan2", C(z), S0)),
    ("atan2_scalar_dual", lambda z: binary("atan2", S0, C(z))),
    ("atan2_dual_float_literal", lambda z: binary("atan2", C(z), 1.5)),
    ("atan2_float_literal_dual", lambda z: binary("atan2", 1.5, C(z))),
    ("atan2_dual_int_literal", lambda z: binary("atan2", C(z), 2.0)),
    ("atan2_int_literal_dual", lambda z: binary("atan2", 2.0, C(z))),
    # a = 2.54 > s = 0.7 > b = 0.535
    ("min_dual_dual_first_smaller", B),  # min(b, a)
    ("min_dual_dual_second_smaller", B),  # min(a, b)
    ("max_dual_dual_first_larger", A),  # max(a, b)
    ("max_dual_dual_second_larger", A),  # max(b, a)
    ("min_dual_scalar_takes_dual", B),  # min(b, s)
    ("min_dual_scalar_takes_scalar", lambda z: const_jet(S0, 2)),  # min(a, s)
    ("min_scalar_dual_takes_dual", B),  # min(s, b)
    ("min_scalar_dual_takes_scalar", lambda z: const_jet(S0, 2)),  # min(s, a)
    ("max_dual_scalar_takes_dual", A),  # max(a, s)
    ("max_dual_scalar_takes_scalar", lambda z: const_jet(S0, 2)),  # max(b, s)
    ("max_scalar_dual_takes_dual", A),  # max(s, a)
    ("max_scalar_dual_takes_scalar", lambda z: const_jet(S0, 2)),  # max(s, b)
    ("min_dual_float_literal", lambda z: const_jet(1.5, 2)),  # min(a, 1.5)
    ("max_float_literal_dual", A),  # max(1.5, a)
    ("min_dual_int_literal", A),  # min(a, 3)
    ("max_int_literal_dual", lambda z: const_jet(3.0, 2)),  # max(3, a)
    ("where_dual_dual_true", A),  # where(t, a, b)
    ("where_dual_dual_false", B),  # where(f, a, b)
    ("where_dual_scalar_true", A),  # where(t, a, s)
    ("where_dual_scalar_false", lambda z: const_jet(S0, 2)),  # where(f, a, s)
    ("where_scalar_dual_true", lambda z: const_jet(S0, 2)),  # where(t, s, a)
    ("where_scalar_dual_false", A),  # where(f, s, a)
    ("where_dual_float_literal_false", lambda z: const_jet(1.5, 2)),  # where(f, a, 1.5)
    ("where_int_literal_dual_true", lambda z: const_jet(2.0, 2)),  # where(t, 2, a)
    ("select_dual_dual_true", B),  # select(t, a, b)
    ("select_dual_dual_false", A),  # select(f, a, b)
    ("select_dual_scalar_true", lambda z: const_jet(S0, 2)),  # select(t, a, s)
    ("select_dual_scalar_false", A),  # select(f, a, s)
    ("select_scalar_dual_true", A),  # select(t, s, a)
    ("select_scalar_dual_false", lambda z: const_jet(S0, 2)),  # select(f, s, a)
    ("sqrt", lambda z: unary("sqrt", A(z))),
    ("exp", lambda z: unary("exp", C(z))),
    ("log", lambda z: unary("log", A(z))),
    ("sin", lambda z: unary("sin", A(z))),
    ("cos", lambda z: unary("cos", A(z))),
    ("tan", lambda z: unary("tan", C(z))),
    ("asin", lambda z: unary("asin", C(z))),
    ("acos", lambda z: unary("acos", C(z))),
    ("atan", lambda z: unary("atan", A(z))),
    ("sinh", lambda z: unary("sinh", C(z))),
    ("cosh", lambda z: unary("cosh", C(z))),
    ("tanh", lambda z: unary("tanh", C(z))),
    ("abs_positive", lambda z: unary("abs", C(z))),
    ("abs_negative", lambda z: unary("abs", neg(C(z)))),
    ("sq", lambda z: unary("sq", B(z))),
    # exp(sin(a) b) / (1 + c)
    (
        "composite_chain",
        lambda z: binary("div", unary("exp", binary("mul", unary("sin", A(z)), B(z))), binary("add", 1.0, C(z))),
    ),
]
SCALAR_NAMES = [name for name, _ in SCALAR_CASES]

# TinyAD's a(x) = x^2 + x + 2 at x = 1 (a = 4, a' = 3, a'' = 2), x seeded at index 0 of k = 2: known answers
KNOWN_CASES = [
    ("sqrt", 2.0, [3 / 4, 0.0], [[7 / 32, 0.0], [0.0, 0.0]]),  # f' = 1/4, f'' = -1/32
    ("log", np.log(4.0), [3 / 4, 0.0], [[-1 / 16, 0.0], [0.0, 0.0]]),  # 2/4 - 9/16
    ("reciprocal", 0.25, [-3 / 16, 0.0], [[5 / 32, 0.0], [0.0, 0.0]]),  # -2/16 + 2 * 9/64
    ("sq", 16.0, [24.0, 0.0], [[34.0, 0.0], [0.0, 0.0]]),  # 2*4*2 + 2*9
]

# comparisons on duals: (name, expected) with a = 2.54, b = 0.535, s = 0.7
COMPARE_CASES = [
    ("lt_dual_dual", False),  # a < b
    ("lt_dual_dual_reversed", True),  # b < a
    ("lt_dual_dual_equal", False),  # a < a
    ("le_dual_dual_equal", True),  # a <= a
    ("gt_dual_dual", True),  # a > b
    ("ge_dual_dual", False),  # b >= a
    ("ge_dual_dual_equal", True),  # a >= a
    ("lt_dual_scalar", False),  # a < s
    ("lt_scalar_dual", True),  # s < a
    ("le_dual_scalar", True),  # b <= s
    ("le_scalar_dual", False),  # s <= b
    ("gt_dual_scalar", True),  # a > s
    ("gt_scalar_dual", True),  # s > b
    ("ge_dual_scalar", False),  # b >= s
    ("ge_scalar_dual", False),  # s >= a
    ("lt_dual_float_literal", True),  # a < 3.0
    ("lt_float_literal_dual", False),  # 3.0 < a
    ("gt_dual_int_literal", True),  # a > 2
    ("gt_int_literal_dual", False),  # 2 > a
    ("ge_dual_int_literal", False),  # a >= 3
    ("le_int_literal_dual", True),  # 2 <= a
]

# float64 plain values mixed with float32 literals (overloads every generated module carries), s = 0.7
PLAIN_CASES = [
    ("plain_add_literal", S0 + 0.5),
    ("plain_literal_add", 0.5 + S0),
    ("plain_sub_literal", S0 - 0.5),
    ("plain_literal_sub", 0.5 - S0),
    ("plain_mul_literal", S0 * 0.5),
    ("plain_literal_mul", 0.5 * S0),
    ("plain_div_literal", S0 / 0.5),
    ("plain_literal_div", 0.5 / S0),
    ("plain_pow_literal", S0**0.5),
    ("plain_atan2_literal", np.arctan2(S0, 0.5)),
    ("plain_min_literal", 0.5),
    ("plain_max_literal", S0),
    ("plain_vec3_mul_literal", 0.5 * S0),  # (s, 2s, 3s) * 0.5, its y / 2
    ("plain_literal_mul_vec3", 0.5 * S0),
    ("plain_vec3_div_literal", 2.0 * S0),
    ("plain_mat22_mul_literal", 0.5 * S0),
    ("plain_lt_literal", 0.0),  # s < 0.5
    ("plain_literal_lt", 1.0),  # 0.5 < s
    ("value_of_dual", X0 * X0 + X0 * Y0 + 2.0),  # value(a)
    ("value_of_plain", S0),  # value(s)
    ("variable_value", S0),  # variable(s, 1).v
]


def scalar_kernel(D):
    """k = 2 kernel: every scalar case, in SCALAR_CASES order, then the known answers and comparisons."""
    S = D.S
    add, sub, mul, div = D.add, D.sub, D.mul, D.div

    @wp.kernel(module="unique", enable_backward=False, module_options=KERNEL_OPTIONS)
    def kernel(
        inp: wp.array(dtype=S),
        out: wp.array(dtype=D.Dual),
        known: wp.array(dtype=D.Dual),
        flags: wp.array(dtype=int),
        plain: wp.array(dtype=S),
        acc_g: wp.array(dtype=D.vecK),
        acc_h: wp.array(dtype=D.matK),
        count: wp.array(dtype=int),
    ):
        x = D.seed(inp[0], 0)
        y = D.seed(inp[1], 1)
        s = inp[2]
        t = inp[3] > S(0.0)
        f = inp[3] < S(0.0)
        a = x * x + x * y + 2.0
        b = x * y - 0.5 * y * y + 1.0 - x
        c = x * y / 2 + 0.25 * x - y * y
        i = int(0)
        i = _put(out, i, x)
        i = _put(out, i, y)
        i = _put(out, i, a)
        i = _put(out, i, b)
        i = _put(out, i, c)
        i = _put(out, i, D.const(s))
        # add / sub / mul / div: dual-dual, dual-scalar both ways, float literal both ways, int literal both ways
        i = _put(out, i, add(a, b))
        i = _put(out, i, a + s)
        i = _put(out, i, s + a)
        i = _put(out, i, a + 1.5)
        i = _put(out, i, 1.5 + a)
        i = _put(out, i, a + 2)
        i = _put(out, i, 2 + a)
        i = _put(out, i, sub(a, b))
        i = _put(out, i, a - s)
        i = _put(out, i, s - a)
        i = _put(out, i, a - 1.5)
        i = _put(out, i, 1.5 - a)
        i = _put(out, i, a - 2)
        i = _put(out, i, 2 - a)
        i = _put(out, i, mul(a, b))
        i = _put(out, i, a * s)
        i = _put(out, i, s * a)
        i = _put(out, i, a * 1.5)
        i = _put(out, i, 1.5 * a)
        i = _put(out, i, a * 2)
        i = _put(out, i, 2 * a)
        i = _put(out, i, div(a, b))
        i = _put(out, i, b / a)
        i = _put(out, i, a / s)
        i = _put(out, i, s / a)
        i = _put(out, i, a / 1.5)
        i = _put(out, i, 1.5 / a)
        i = _put(out, i, a / 2)
        i = _put(out, i, 2 / a)
        i = _put(out, i, D._wm_neg(a))
        i = _put(out, i, D.pow(a, b))
        i = _put(out, i, D.pow(a, s))
        i = _put(out, i, D.pow(s, a))
        i = _put(out, i, D.pow(a, 1.5))
        i = _put(out, i, D.pow(1.5, a))
        i = _put(out, i, D.pow(a, 3))
        i = _put(out, i, D.pow(2, a))
        i = _put(out, i, D.atan2(c, b))
        i = _put(out, i, D.atan2(D._wm_neg(c), D._wm_neg(b)))
        i = _put(out, i, D.atan2(c, s))
        i = _put(out, i, D.atan2(s, c))
        i = _put(out, i, D.atan2(c, 1.5))
        i = _put(out, i, D.atan2(1.5, c))
        i = _put(out, i, D.atan2(c, 2))
        i = _put(out, i, D.atan2(2, c))
        i = _put(out, i, D.min(b, a))
        i = _put(out, i, D.min(a, b))
        i = _put(out, i, D.max(a, b))
        i = _put(out, i, D.max(b, a))
        i = _put(out, i, D.min(b, s))
        i = _put(out, i, D.min(a, s))
        i = _put(out, i, D.min(s, b))
        i = _put(out, i, D.min(s, a))
        i = _put(out, i, D.max(a, s))
        i = _put(out, i, D.max(b, s))
        i = _put(out, i, D.max(s, a))
        i = _put(out, i, D.max(s, b))
        i = _put(out, i, D.min(a, 1.5))
        i = _put(out, i, D.max(1.5, a))
        i = _put(out, i, D.min(a, 3))
        i = _put(out, i, D.max(3, a))
        i = _put(out, i, D.where(t, a, b))
        i = _put(out, i, D.where(f, a, b))
        i = _put(out, i, D.where(t, a, s))
        i = _put(out, i, D.where(f, a, s))
        i = _put(out, i, D.where(t, s, a))
        i = _put(out, i, D.where(f, s, a))
        i = _put(out, i, D.where(f, a, 1.5))
        i = _put(out, i, D.where(t, 2, a))
        i = _put(out, i, D.select(t, a, b))
        i = _put(out, i, D.select(f, a, b))
        i = _put(out, i, D.select(t, a, s))
        i = _put(out, i, D.select(f, a, s))
        i = _put(out, i, D.select(t, s, a))
        i = _put(out, i, D.select(f, s, a))
        i = _put(out, i, D.sqrt(a))
        i = _put(out, i, D.exp(c))
        i = _put(out, i, D.log(a))
        i = _put(out, i, D.sin(a))
        i = _put(out, i, D.cos(a))
        i = _put(out, i, D.tan(c))
        i = _put(out, i, D.asin(c))
        i = _put(out, i, D.acos(c))
        i = _put(out, i, D.atan(a))
        i = _put(out, i, D.sinh(c))
        i = _put(out, i, D.cosh(c))
        i = _put(out, i, D.tanh(c))
        i = _put(out, i, D.abs(c))
        i = _put(out, i, D.abs(D._wm_neg(c)))
        i = _put(out, i, D.sq(b))
        i = _put(out, i, D.exp(D.sin(a) * b) / (1.0 + c))
        count[0] = i

        # TinyAD's known answers: a1(x1) = x1^2 + x1 + 2 at x1 = 1
        x1 = D.seed(S(1.0), 0)
        a1 = x1 * x1 + x1 + 2.0
        n = int(0)
        n = _put(known, n, D.sqrt(a1))
        n = _put(known, n, D.log(a1))
        n = _put(known, n, 1.0 / a1)
        n = _put(known, n, D.sq(a1))
        count[1] = n

        j = int(0)
        j = _flag(flags, j, D._wm_lt(a, b))
        j = _flag(flags, j, D._wm_lt(b, a))
        j = _flag(flags, j, D._wm_lt(a, a))
        j = _flag(flags, j, D._wm_le(a, a))
        j = _flag(flags, j, D._wm_gt(a, b))
        j = _flag(flags, j, D._wm_ge(b, a))
        j = _flag(flags, j, D._wm_ge(a, a))
        j = _flag(flags, j, D._wm_lt(a, s))
        j = _flag(flags, j, D._wm_lt(s, a))
        j = _flag(flags, j, D._wm_le(b, s))
        j = _flag(flags, j, D._wm_le(s, b))
        j = _flag(flags, j, D._wm_gt(a, s))
        j = _flag(flags, j, D._wm_gt(s, b))
        j = _flag(flags, j, D._wm_ge(b, s))
        j = _flag(flags, j, D._wm_ge(s, a))
        j = _flag(flags, j, D._wm_lt(a, 3.0))
        j = _flag(flags, j, D._wm_lt(3.0, a))
        j = _flag(flags, j, D._wm_gt(a, 2))
        j = _flag(flags, j, D._wm_gt(2, a))
        j = _flag(flags, j, D._wm_ge(a, 3))
        j = _flag(flags, j, D._wm_le(2, a))
        count[2] = j

        # plain scalars with float literals (float32 literals mix with float64 through overloads)
        m = int(0)
        m = _put(plain, m, s + 0.5)
        m = _put(plain, m, 0.5 + s)
        m = _put(plain, m, s - 0.5)
        m = _put(plain, m, 0.5 - s)
        m = _put(plain, m, s * 0.5)
        m = _put(plain, m, 0.5 * s)
        m = _put(plain, m, s / 0.5)
        m = _put(plain, m, 0.5 / s)
        m = _put(plain, m, D.pow(s, 0.5))
        m = _put(plain, m, D.atan2(s, 0.5))
        m = _put(plain, m, D.min(s, 0.5))
        m = _put(plain, m, D.max(0.5, s))
        v = wp.vector(s, S(2.0) * s, S(3.0) * s)
        m = _put(plain, m, (v * 0.5)[1] / S(2.0))
        m = _put(plain, m, (0.5 * v)[1] / S(2.0))
        m = _put(plain, m, (v / 0.5)[1] / S(2.0))
        mm = wp.matrix_from_rows(v, v, v)
        m = _put(plain, m, (mm * 0.5)[2, 0])
        m = _put(plain, m, wp.where(D._wm_lt(s, 0.5), S(1.0), S(0.0)))
        m = _put(plain, m, wp.where(D._wm_lt(0.5, s), S(1.0), S(0.0)))
        # accessors: value / gradient / hessian of a dual, value of a plain scalar, variable(x, i)
        m = _put(plain, m, D.value(a))
        m = _put(plain, m, D.value(s))
        m = _put(plain, m, D.variable(s, 1).v)
        count[3] = m
        acc_g[0] = D.gradient(a)
        acc_g[1] = D.variable(s, 1).g
        if wp.static(D.HESSIAN):
            acc_h[0] = D.hessian(a)

    return kernel


@functools.lru_cache(maxsize=None)
def scalar_results(dtype: str, hessian: bool = True):
    D = ad.duals(2, DTYPES[dtype], hessian=hessian)
    S = DTYPES[dtype]
    out = wp.zeros(len(SCALAR_CASES) + 8, dtype=D.Dual)
    known = wp.zeros(len(KNOWN_CASES) + 4, dtype=D.Dual)
    flags = wp.full(len(COMPARE_CASES) + 4, -1, dtype=int)
    plain = wp.zeros(len(PLAIN_CASES) + 4, dtype=S)
    acc_g = wp.zeros(2, dtype=D.vecK)
    acc_h = wp.zeros(1, dtype=D.matK)
    count = wp.zeros(4, dtype=int)
    inp = wp.array([X0, Y0, S0, 1.0], dtype=S)
    wp.launch(scalar_kernel(D), dim=1, inputs=[inp, out, known, flags, plain, acc_g, acc_h, count])
    return out.numpy(), known.numpy(), flags.numpy(), plain.numpy(), count.numpy(), acc_g.numpy(), acc_h.numpy()


@pytest.mark.parametrize("dtype", DTYPES)
def test_scalar_kernel_writes_every_case(dtype):
    count = scalar_results(dtype)[4]
    assert list(count) == [len(SCALAR_CASES), len(KNOWN_CASES), len(COMPARE_CASES), len(PLAIN_CASES)]


@pytest.mark.parametrize("name", SCALAR_NAMES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_scalar_op(dtype, name):
    index = SCALAR_NAMES.index(name)
    z = np.array([X0, Y0])
    ref_fn = SCALAR_CASES[index][1]
    ref = ref_fn(z)
    got = unpack(scalar_results(dtype)[0], index, 1, scalar=True)
    check_dual(got, ref, dtype, name)
    if dtype == "float64":
        check_against_fd(got, lambda zz: ref_fn(zz).v, z, name, ref)


@pytest.mark.parametrize("name", [c[0] for c in KNOWN_CASES])
@pytest.mark.parametrize("dtype", DTYPES)
def test_known_answer_tinyad(dtype, name):
    index = [c[0] for c in KNOWN_CASES].index(name)
    _, v, g, h = KNOWN_CASES[index]
    got = unpack(scalar_results(dtype)[1], index, 1, scalar=True)
    check_dual(got, Jet(v, np.array(g), np.array(h)), dtype, name)


@pytest.mark.parametrize("dtype", DTYPES)
def test_comparisons(dtype):
    flags = scalar_results(dtype)[2]
    got = {name: bool(flags[i]) for i, (name, _) in enumerate(COMPARE_CASES)}
    assert got == dict(COMPARE_CASES)


@pytest.mark.parametrize("dtype", DTYPES)
def test_plain_values_with_float_literals(dtype):
    plain = scalar_results(dtype)[3]
    rtol = TOL[dtype][0]
    for i, (name, expected) in enumerate(PLAIN_CASES):
        np.testing.assert_allclose(plain[i], expected, rtol=rtol, atol=rtol, err_msg=name)


@pytest.mark.parametrize("dtype", DTYPES)
def test_gradient_and_hessian_accessors(dtype):
    *_, acc_g, acc_h = scalar_results(dtype)
    ref = jet_a(np.array([X0, Y0]))
    rtol, atol = TOL[dtype]
    np.testing.assert_allclose(acc_g[0], ref.g, rtol=rtol, atol=atol)
    np.testing.assert_allclose(acc_g[1], [0.0, 1.0], rtol=0, atol=0)
    np.testing.assert_allclose(acc_h[0], ref.h, rtol=rtol, atol=atol)


@pytest.mark.parametrize("dtype", DTYPES)
def test_gradient_only_mode_matches_hessian_mode(dtype):
    full, known_full, flags_full, plain_full, _, acc_g_full, _ = scalar_results(dtype, True)
    grad, known_grad, flags_grad, plain_grad, count, acc_g_grad, _ = scalar_results(dtype, False)
    assert "h" not in grad.dtype.names
    assert list(count) == [len(SCALAR_CASES), len(KNOWN_CASES), len(COMPARE_CASES), len(PLAIN_CASES)]
    rtol = 1e-6 if dtype == "float32" else 1e-14
    for i, name in enumerate(SCALAR_NAMES):
        np.testing.assert_allclose(grad["v"][i], full["v"][i], rtol=rtol, atol=rtol, err_msg=f"{name}: value")
        np.testing.assert_allclose(grad["g"][i], full["g"][i], rtol=rtol, atol=rtol, err_msg=f"{name}: gradient")
    np.testing.assert_allclose(known_grad["g"], known_full["g"], rtol=rtol, atol=rtol)
    np.testing.assert_array_equal(flags_grad, flags_full)
    np.testing.assert_allclose(plain_grad, plain_full, rtol=rtol)
    np.testing.assert_allclose(acc_g_grad, acc_g_full, rtol=rtol)
    # and against the closed forms
    z = np.array([X0, Y0])
    for i, (name, ref_fn) in enumerate(SCALAR_CASES):
        got = unpack(grad, i, 1, scalar=True, hessian=False)
        check_dual(got, ref_fn(z), dtype, name, hessian=False)


# ============================================================================================================
# dual vectors, k = 6: u and w seeded vec3 (variables z = (u, w)); p a plain vec3, s a runtime scalar
# ============================================================================================================


class Case(NamedTuple):
    """One vector / matrix operation: ``size`` output duals, their values as a function of the variables z,
    and optionally the closed-form jet (else the reference is central differences of ``value``)."""

    name: str
    size: int
    value: Any
    closed: Any = None


EPS3 = np.zeros((3, 3, 3))
EPS3[0, 1, 2] = EPS3[1, 2, 0] = EPS3[2, 0, 1] = 1.0
EPS3[0, 2, 1] = EPS3[2, 1, 0] = EPS3[1, 0, 2] = -1.0

U0 = np.array([0.6, -0.8, 1.1])
W0 = np.array([-0.4, 0.9, 0.5])
P0 = np.array([0.3, 0.2, -0.7])
Z_VEC = np.concatenate([U0, W0])


def _uw(z):
    return z[:3], z[3:]


def dot_jet(z):
    u, w = _uw(z)
    h = np.zeros((6, 6))
    h[:3, 3:] = h[3:, :3] = np.eye(3)
    return Jet(np.array([u @ w]), np.concatenate([w, u])[None], h[None])


def length_sq_jet(z):
    u, _ = _uw(z)
    h = np.zeros((6, 6))
    h[:3, :3] = 2 * np.eye(3)
    return Jet(np.array([u @ u]), np.concatenate([2 * u, np.zeros(3)])[None], h[None])


def length_jet(z):
    u, _ = _uw(z)
    r = np.linalg.norm(u)
    n = u / r
    h = np.zeros((6, 6))
    h[:3, :3] = (np.eye(3) - np.outer(n, n)) / r
    return Jet(np.array([r]), np.concatenate([n, np.zeros(3)])[None], h[None])


def normalize_jet(z):
    u, _ = _uw(z)
    r = np.linalg.norm(u)
    n = u / r
    eye = np.eye(3)
    g = np.zeros((3, 6))
    g[:, :3] = (eye - np.outer(n, n)) / r
    h = np.zeros((3, 6, 6))
    h[:, :3, :3] = (
        -(np.einsum("ij,k->ijk", eye, n) + np.einsum("ik,j->ijk", eye, n) + np.einsum("jk,i->ijk", eye, n))
        + 3 * np.einsum("i,j,k->ijk", n, n, n)
    ) / r**2
    return Jet(n, g, h)


def cross_jet(z):
    u, w = _uw(z)
    g = np.zeros((3, 6))
    g[:, :3] = np.einsum("ijl,l->ij", EPS3, w)
    g[:, 3:] = np.einsum("ijl,j->il", EPS3, u)
    h = np.zeros((3, 6, 6))
    h[:, :3, 3:] = EPS3
    h[:, 3:, :3] = np.swapaxes(EPS3, 1, 2)
    return Jet(np.cross(u, w), g, h)


def outer_jet(z):
    u, w = _uw(z)
    g = np.zeros((3, 3, 6))
    h = np.zeros((3, 3, 6, 6))
    for i in range(3):
        for j in range(3):
            g[i, j, i] = w[j]
            g[i, j, 3 + j] = u[i]
            h[i, j, i, 3 + j] = h[i, j, 3 + j, i] = 1.0
    return Jet(np.outer(u, w).ravel(), g.reshape(9, 6), h.reshape(9, 6, 6))


def _u(z):
    return z[:3]


def _w(z):
    return z[3:]


VEC_CASES = [
    Case("seed_vec3", 3, lambda z: _u(z)),
    Case("seed_vec3_offset", 3, lambda z: _w(z)),
    Case("dot_dual_dual", 1, lambda z: [_u(z) @ _w(z)], dot_jet),
    Case("dot_dual_plain", 1, lambda z: [_u(z) @ P0]),
    Case("dot_plain_dual", 1, lambda z: [P0 @ _w(z)]),
    Case("length", 1, lambda z: [np.linalg.norm(_u(z))], length_jet),
    Case("length_sq", 1, lambda z: [_u(z) @ _u(z)], length_sq_jet),
    Case("normalize", 3, lambda z: _u(z) / np.linalg.norm(_u(z)), normalize_jet),
    Case("cross_dual_dual", 3, lambda z: np.cross(_u(z), _w(z)), cross_jet),
    Case("cross_dual_plain", 3, lambda z: np.cross(_u(z), P0)),
    Case("cross_plain_dual", 3, lambda z: np.cross(P0, _w(z))),
    Case("outer_dual_dual", 9, lambda z: np.outer(_u(z), _w(z)).ravel(), outer_jet),
    Case("outer_dual_plain", 9, lambda z: np.outer(_u(z), P0).ravel()),
    Case("outer_plain_dual", 9, lambda z: np.outer(P0, _w(z)).ravel()),
    Case("vec_add_dual_dual", 3, lambda z: _u(z) + _w(z)),
    Case("vec_sub_dual_dual", 3, lambda z: _u(z) - _w(z)),
    Case("vec_add_dual_plain", 3, lambda z: _u(z) + P0),
    Case("vec_add_plain_dual", 3, lambda z: P0 + _w(z)),
    Case("vec_sub_dual_plain", 3, lambda z: _u(z) - P0),
    Case("vec_sub_plain_dual", 3, lambda z: P0 - _w(z)),
    Case("vec_neg", 3, lambda z: -_u(z)),
    Case("vec_mul_dual_scalar", 3, lambda z: _u(z) * S0),
    Case("vec_mul_scalar_dual", 3, lambda z: S0 * _u(z)),
    Case("vec_mul_dual_float_literal", 3, lambda z: _u(z) * 1.5),
    Case("vec_mul_float_literal_dual", 3, lambda z: 1.5 * _u(z)),
    Case("vec_div_dual_scalar", 3, lambda z: _u(z) / S0),
    Case("vec_div_dual_float_literal", 3, lambda z: _u(z) / 1.5),
    Case("vec_mul_dual_dualscalar", 3, lambda z: _u(z) * (_u(z) @ _w(z))),
    Case("vec_mul_dualscalar_dual", 3, lambda z: (_u(z) @ _w(z)) * _u(z)),
    Case("vec_div_dual_dualscalar", 3, lambda z: _u(z) / np.linalg.norm(_w(z))),
    Case("vec_mul_dualscalar_plain", 3, lambda z: np.linalg.norm(_u(z)) * P0),
    Case("vec_mul_plain_dualscalar", 3, lambda z: P0 * np.linalg.norm(_u(z))),
    Case("index_vec3", 3, lambda z: _u(z)),  # u[0], u[1], u[2] with runtime indices
    Case("index_vec2", 2, lambda z: z[[4, 0]]),  # vec2(u.x, w.y)[1], [0]
    Case("index_vec4", 1, lambda z: [z[3]]),  # vec4(u.x, u.y, u.z, w.x)[3]
    Case("vec2_dual_dual", 2, lambda z: z[[0, 4]]),
    Case("vec2_scalar_dual", 2, lambda z: [S0, z[4]]),
    Case("vec3_dual_dual_dual", 3, lambda z: z[[2, 3, 1]]),
    Case("vec3_dual_scalar_dual", 3, lambda z: [z[0], S0, z[5]]),
    Case("vec4_mixed", 4, lambda z: [z[0], z[1], z[3], S0]),
    Case("length_vec2", 1, lambda z: [np.hypot(z[0], z[4])]),
    Case("length_sq_vec2", 1, lambda z: [z[0] ** 2 + z[4] ** 2]),
    Case("normalize_vec2", 2, lambda z: z[[0, 4]] / np.hypot(z[0], z[4])),
    Case("dot_vec2", 1, lambda z: [z[0] * z[3] + z[4] * z[2]]),
    Case("outer_vec2", 4, lambda z: np.outer(z[[0, 4]], z[[3, 2]]).ravel()),
    Case("vec2_add_plain", 2, lambda z: z[[0, 4]] + P0[:2]),
    Case("length_vec4", 1, lambda z: [np.linalg.norm(z[:4])]),
    Case("length_sq_vec4", 1, lambda z: [z[:4] @ z[:4]]),
    Case("normalize_vec4", 4, lambda z: z[:4] / np.linalg.norm(z[:4])),
    Case("dot_vec4_plain", 1, lambda z: [z[:4] @ np.append(P0, S0)]),
    Case("where_vec3_true", 3, lambda z: _u(z)),
    Case("where_vec3_false", 3, lambda z: _w(z)),
    Case("select_vec3_true", 3, lambda z: _w(z)),
    Case("select_vec3_false", 3, lambda z: _u(z)),
    Case("const_vec3", 3, lambda z: P0),
]


def vector_kernel(D, part):
    """k = 6 kernels: every case of VEC_CASES, in order, in 4 parts (at -O0 one kernel holding all of
    them needs more local memory per thread than a CUDA launch allows in float64, and even half of them
    reserves tens of GB of local memory for a launch on an H200)."""
    S = D.S
    add, sub, mul, div = D.add, D.sub, D.mul, D.div

    @wp.kernel(module="unique", enable_backward=False, module_options=KERNEL_OPTIONS)
    def kernel(
        vin: wp.array(dtype=wp.types.vector(length=3, dtype=S)),
        sin: wp.array(dtype=S),
        idx: wp.array(dtype=int),
        out: wp.array(dtype=D.Dual),
        plain: wp.array(dtype=wp.types.vector(length=3, dtype=S)),
        count: wp.array(dtype=int),
    ):
        u = D.seed(vin[0], 0)
        w = D.seed(vin[1], 3)
        p = vin[2]
        s = sin[0]
        t = sin[1] > S(0.0)
        f = sin[1] < S(0.0)
        i = count[0]  # each part continues where the one before stopped
        if wp.static(part == 0):
            i = _put3(out, i, u)
            i = _put3(out, i, w)
            i = _put(out, i, D.dot(u, w))
            i = _put(out, i, D.dot(u, p))
            i = _put(out, i, D.dot(p, w))
            i = _put(out, i, D.length(u))
            i = _put(out, i, D.length_sq(u))
            i = _put3(out, i, D.normalize(u))
            i = _put3(out, i, D.cross(u, w))
            i = _put3(out, i, D.cross(u, p))
            i = _put3(out, i, D.cross(p, w))
            i = _put33(out, i, D.outer(u, w))
            i = _put33(out, i, D.outer(u, p))
            i = _put33(out, i, D.outer(p, w))
            i = _put3(out, i, add(u, w))
        if wp.static(part == 1):
            i = _put3(out, i, sub(u, w))
            i = _put3(out, i, u + p)
            i = _put3(out, i, p + w)
            i = _put3(out, i, u - p)
            i = _put3(out, i, p - w)
            i = _put3(out, i, D._wm_neg(u))
            i = _put3(out, i, mul(u, s))
            i = _put3(out, i, s * u)
            i = _put3(out, i, u * 1.5)
            i = _put3(out, i, 1.5 * u)
            i = _put3(out, i, div(u, s))
            i = _put3(out, i, u / 1.5)
            uw = D.dot(u, w)
            i = _put3(out, i, u * uw)
            i = _put3(out, i, uw * u)
            i = _put3(out, i, u / D.length(w))
        if wp.static(part == 2):
            i = _put3(out, i, D.length(u) * p)
            i = _put3(out, i, p * D.length(u))
            i = _put(out, i, D._wm_index(u, idx[0]))
            i = _put(out, i, D._wm_index(u, idx[1]))
            i = _put(out, i, D._wm_index(u, idx[2]))
            v2 = D.vec2(u.x, w.y)
            i = _put(out, i, D._wm_index(v2, idx[1]))
            i = _put(out, i, D._wm_index(v2, idx[0]))
            v4 = D.vec4(u.x, u.y, u.z, w.x)
            i = _put(out, i, D._wm_index(v4, idx[3]))
            i = _put2(out, i, v2)
            i = _put2(out, i, D.vec2(s, w.y))
            i = _put3(out, i, D.vec3(u.z, w.x, u.y))
            i = _put3(out, i, D.vec3(u.x, s, w.z))
            i = _put4(out, i, D.vec4(u.x, u.y, w.x, s))
            i = _put(out, i, D.length(v2))
            i = _put(out, i, D.length_sq(v2))
            i = _put2(out, i, D.normalize(v2))
            v2b = D.vec2(w.x, u.z)
            i = _put(out, i, D.dot(v2, v2b))
            i = _put22(out, i, D.outer(v2, v2b))
            i = _put2(out, i, v2 + wp.vector(p[0], p[1]))
            i = _put(out, i, D.length(v4))
            i = _put(out, i, D.length_sq(v4))
            i = _put4(out, i, D.normalize(v4))
            i = _put(out, i, D.dot(v4, wp.vector(p[0], p[1], p[2], s)))
        if wp.static(part == 3):
            i = _put3(out, i, D.where(t, u, w))
            i = _put3(out, i, D.where(f, u, w))
            i = _put3(out, i, D.select(t, u, w))
            i = _put3(out, i, D.select(f, u, w))
            i = _put3(out, i, D.const(p))
        count[0] = i
        plain[0] = p

    return kernel


def _run_case_kernel(make_kernel, D, dtype, cases, inputs, plain_dtype, parts=None):
    total = sum(c.size for c in cases)
    out = wp.zeros(total + 8, dtype=D.Dual)
    plain = wp.zeros(4, dtype=plain_dtype)
    count = wp.zeros(1, dtype=int)
    for kern in [make_kernel(D)] if parts is None else [make_kernel(D, part) for part in range(parts)]:
        wp.launch(kern, dim=1, inputs=[*inputs, out, plain, count])
    assert int(count.numpy()[0]) == total, "the kernel wrote a different number of duals than the case list has"
    return out.numpy(), plain.numpy()


def _offsets(cases):
    return dict(zip([c.name for c in cases], np.cumsum([0] + [c.size for c in cases])[:-1].tolist()))


@functools.lru_cache(maxsize=None)
def vector_results(dtype: str, hessian: bool = True):
    S = DTYPES[dtype]
    D = ad.duals(6, S, hessian=hessian)
    vec3 = wp.types.vector(length=3, dtype=S)
    inputs = [
        wp.array(np.stack([U0, W0, P0]), dtype=vec3),
        wp.array([S0, 1.0], dtype=S),
        wp.array([0, 1, 2, 3], dtype=int),
    ]
    return _run_case_kernel(vector_kernel, D, dtype, VEC_CASES, inputs, vec3, parts=4)


def check_case(case: Case, out: np.ndarray, start: int, dtype: str, z: np.ndarray):
    got = unpack(out, start, case.size, scalar=False)

    def value(zz):
        return np.atleast_1d(np.asarray(case.value(zz), dtype=np.float64))

    if case.closed is not None:
        ref = case.closed(z)
        np.testing.assert_allclose(ref.v, value(z), rtol=1e-14, atol=1e-14, err_msg=f"{case.name}: closed-form value")
        check_dual(got, ref, dtype, case.name)
        if dtype == "float64":
            check_against_fd(got, value, z, case.name, ref)
    else:
        ref = Jet(value(z), *fd_derivatives(value, z))
        if dtype == "float64":
            # central differences are exact up to rounding for the (bi)linear and quadratic cases
            rtol, atol = FD_TOL
            _scaled_close(got.v, ref.v, 1e-12, 1e-12, f"{case.name}: value")
            _scaled_close(got.g, ref.g, rtol, atol, f"{case.name}: gradient vs central differences")
            _scaled_close(got.h, ref.h, rtol, atol, f"{case.name}: Hessian vs central differences")
            np.testing.assert_allclose(got.h, np.swapaxes(got.h, -1, -2), rtol=0, atol=1e-13, err_msg=case.name)
        else:
            check_dual(got, ref, dtype, case.name)


@pytest.mark.parametrize("name", [c.name for c in VEC_CASES])
@pytest.mark.parametrize("dtype", DTYPES)
def test_vector_op(dtype, name):
    out, _ = vector_results(dtype)
    case = next(c for c in VEC_CASES if c.name == name)
    check_case(case, out, _offsets(VEC_CASES)[name], dtype, Z_VEC)


# ============================================================================================================
# dual matrices: A a seeded 2x2 (k = 4, z = A row-major); M a 3x3 from mat33_cols of three seeded vec3 (k = 9,
# z[3 j + i] = M[i, j]); P a plain matrix, q a plain vector, s a runtime scalar
# ============================================================================================================


def det_jet(mat, basis):
    """det and its derivatives along the matrices ``basis[a] = dA/dz_a``: d det = det tr(A^-1 dA),
    d2 det = det (tr(A^-1 E_a) tr(A^-1 E_b) - tr(A^-1 E_a A^-1 E_b))."""
    ai = np.linalg.inv(mat)
    d = np.linalg.det(mat)
    t = np.array([np.trace(ai @ e) for e in basis])
    tt = np.array([[np.trace(ai @ ea @ ai @ eb) for eb in basis] for ea in basis])
    return Jet(np.array([d]), (d * t)[None], (d * (np.outer(t, t) - tt))[None])


def inverse_jet(mat, basis):
    """inverse and its derivatives: dX = -X E_a X, d2X = X E_a X E_b X + X E_b X E_a X (X = A^-1), row-major."""
    x = np.linalg.inv(mat)
    k = len(basis)
    g = np.stack([-x @ e @ x for e in basis], axis=-1)
    h = np.zeros(mat.shape + (k, k))
    for a, ea in enumerate(basis):
        for b, eb in enumerate(basis):
            h[..., a, b] = x @ ea @ x @ eb @ x + x @ eb @ x @ ea @ x
    n = mat.size
    return Jet(x.ravel(), g.reshape(n, k), h.reshape(n, k, k))


def _basis(n, index_of):
    """dA/dz_a for the variable layout ``index_of(a) -> (row, col)``."""
    out = []
    for a in range(n * n):
        e = np.zeros((n, n))
        e[index_of(a)] = 1.0
        out.append(e)
    return out


A0 = np.array([[1.2, -0.4], [0.3, 0.9]])
PM2 = np.array([[0.5, 0.1], [-0.2, 0.8]])
Q2 = np.array([0.3, -0.6])
Z_M22 = A0.ravel()
BASIS22 = _basis(2, lambda a: (a // 2, a % 2))


def _a(z):
    return np.asarray(z).reshape(2, 2)


M22_CASES = [
    Case("mat22_rows_seeded", 4, lambda z: _a(z).ravel()),
    Case("seed_vec4", 4, lambda z: z),
    Case("det_2x2", 1, lambda z: [np.linalg.det(_a(z))], lambda z: det_jet(_a(z), BASIS22)),
    Case("inverse_2x2", 4, lambda z: np.linalg.inv(_a(z)).ravel(), lambda z: inverse_jet(_a(z), BASIS22)),
    Case("inverse_times_matrix_2x2", 4, lambda z: np.eye(2).ravel(), lambda z: const_jet(np.eye(2).ravel(), 4)),
    Case("transpose_2x2", 4, lambda z: _a(z).T.ravel()),
    Case("trace_2x2", 1, lambda z: [np.trace(_a(z))]),
    Case("frobenius_sq_2x2", 1, lambda z: [np.sum(_a(z) ** 2)]),
    Case("matmul_2x2_dual_dual", 4, lambda z: (_a(z) @ _a(z)).ravel()),
    Case("mul_operator_2x2_dual_dual", 4, lambda z: (_a(z) @ _a(z).T).ravel()),
    Case("matmul_2x2_dual_plain", 4, lambda z: (_a(z) @ PM2).ravel()),
    Case("matmul_2x2_plain_dual", 4, lambda z: (PM2 @ _a(z)).ravel()),
    Case("matvec_2x2_dual_dual", 2, lambda z: _a(z) @ z[[3, 1]]),
    Case("matvec_2x2_dual_plain", 2, lambda z: _a(z) @ Q2),
    Case("matvec_2x2_plain_dual", 2, lambda z: PM2 @ z[[3, 1]]),
    Case("mat_add_2x2_dual_dual", 4, lambda z: (_a(z) + _a(z).T).ravel()),
    Case("mat_sub_2x2_dual_plain", 4, lambda z: (_a(z) - PM2).ravel()),
    Case("mat_add_2x2_plain_dual", 4, lambda z: (PM2 + _a(z)).ravel()),
    Case("mat_sub_2x2_plain_dual", 4, lambda z: (PM2 - _a(z)).ravel()),
    Case("mat_neg_2x2", 4, lambda z: -z),
    Case("mat_mul_2x2_scalar", 4, lambda z: z * S0),
    Case("mat_mul_scalar_2x2", 4, lambda z: S0 * z),
    Case("mat_mul_2x2_float_literal", 4, lambda z: z * 1.5),
    Case("mat_div_2x2_scalar", 4, lambda z: z / S0),
    Case("mat_div_2x2_float_literal", 4, lambda z: z / 1.5),
    Case("mat_mul_2x2_dualscalar", 4, lambda z: z * np.linalg.det(_a(z))),
    Case("mat_mul_dualscalar_2x2", 4, lambda z: np.linalg.det(_a(z)) * z),
    Case("mat_div_2x2_dualscalar", 4, lambda z: z / np.trace(_a(z))),
    Case("mat22_mixed", 4, lambda z: [z[0], S0, z[2], z[3]]),
    Case("mat22_cols_dual_plain", 4, lambda z: np.column_stack([z[[0, 2]], Q2]).ravel()),
    Case("mat22_rows_plain_dual", 4, lambda z: np.vstack([Q2, z[[2, 3]]]).ravel()),
    Case("mat22_cols_dual_dual", 4, lambda z: np.column_stack([z[[0, 2]], z[[1, 3]]]).ravel()),
    Case("index2_2x2", 4, lambda z: z),  # A[i, j] with runtime (i, j) in row-major order
    Case("where_2x2_true", 4, lambda z: z),
    Case("where_2x2_false", 4, lambda z: _a(z).T.ravel()),
    Case("select_2x2_true", 4, lambda z: _a(z).T.ravel()),
    Case("select_2x2_false", 4, lambda z: z),
    Case("const_mat22", 4, lambda z: PM2.ravel()),
]


def mat22_kernel(D, part):
    """k = 4 kernels: every case of M22_CASES, in order, in 3 parts (at -O0 every temporary lives in
    local memory, which a CUDA launch reserves for every resident thread: small kernels keep that low);
    a part recomputes the earlier temporaries it uses."""
    S = D.S
    add, sub, mul, div = D.add, D.sub, D.mul, D.div
    vec2 = wp.types.vector(length=2, dtype=S)
    mat22 = wp.types.matrix(shape=(2, 2), dtype=S)

    @wp.kernel(module="unique", enable_backward=False, module_options=KERNEL_OPTIONS)
    def kernel(
        vin: wp.array(dtype=vec2),
        pin: wp.array(dtype=mat22),
        sin: wp.array(dtype=S),
        idx: wp.array(dtype=int),
        out: wp.array(dtype=D.Dual),
        plain: wp.array(dtype=vec2),
        count: wp.array(dtype=int),
    ):
        a = D.mat22_rows(D.seed(vin[0], 0), D.seed(vin[1], 2))
        q = vin[2]
        pm = pin[0]
        s = sin[0]
        t = sin[1] > S(0.0)
        f = sin[1] < S(0.0)
        i = count[0]  # each part continues where the one before stopped
        if wp.static(part == 0):
            i = _put22(out, i, a)
            i = _put4(out, i, D.seed(wp.vector(vin[0][0], vin[0][1], vin[1][0], vin[1][1]), 0))
            i = _put(out, i, D.det(a))
            i = _put22(out, i, D.inverse(a))
            i = _put22(out, i, D.matmul(D.inverse(a), a))
            i = _put22(out, i, D.transpose(a))
            i = _put(out, i, D.trace(a))
            i = _put(out, i, D.frobenius_sq(a))
            i = _put22(out, i, D.matmul(a, a))
            i = _put22(out, i, a * D.transpose(a))
            i = _put22(out, i, D.matmul(a, pm))
            i = _put22(out, i, D.matmul(pm, a))
            dv = D.vec2(a.m11, a.m01)
            i = _put2(out, i, D.matmul(a, dv))
        if wp.static(part == 1):
            dv = D.vec2(a.m11, a.m01)
            i = _put2(out, i, a * q)
            i = _put2(out, i, pm * dv)
            i = _put22(out, i, add(a, D.transpose(a)))
            i = _put22(out, i, sub(a, pm))
            i = _put22(out, i, pm + a)
            i = _put22(out, i, pm - a)
            i = _put22(out, i, D._wm_neg(a))
            i = _put22(out, i, mul(a, s))
            i = _put22(out, i, s * a)
            i = _put22(out, i, a * 1.5)
            i = _put22(out, i, div(a, s))
            i = _put22(out, i, a / 1.5)
            i = _put22(out, i, a * D.det(a))
            i = _put22(out, i, D.det(a) * a)
        if wp.static(part == 2):
            i = _put22(out, i, a / D.trace(a))
            i = _put22(out, i, D.mat22(a.m00, s, a.m10, a.m11))
            i = _put22(out, i, D.mat22_cols(D.vec2(a.m00, a.m10), q))
            i = _put22(out, i, D.mat22_rows(q, D.vec2(a.m10, a.m11)))
            i = _put22(out, i, D.mat22_cols(D.vec2(a.m00, a.m10), D.vec2(a.m01, a.m11)))
            i = _put(out, i, D._wm_index2(a, idx[0], idx[0]))
            i = _put(out, i, D._wm_index2(a, idx[0], idx[1]))
            i = _put(out, i, D._wm_index2(a, idx[1], idx[0]))
            i = _put(out, i, D._wm_index2(a, idx[1], idx[1]))
            i = _put22(out, i, D.where(t, a, D.transpose(a)))
            i = _put22(out, i, D.where(f, a, D.transpose(a)))
            i = _put22(out, i, D.select(t, a, D.transpose(a)))
            i = _put22(out, i, D.select(f, a, D.transpose(a)))
            i = _put22(out, i, D.const(pm))
        count[0] = i
        plain[0] = q

    return kernel


@functools.lru_cache(maxsize=None)
def mat22_results(dtype: str, hessian: bool = True):
    S = DTYPES[dtype]
    D = ad.duals(4, S, hessian=hessian)
    vec2 = wp.types.vector(length=2, dtype=S)
    inputs = [
        wp.array(np.vstack([A0, Q2]), dtype=vec2),
        wp.array(PM2[None], dtype=wp.types.matrix(shape=(2, 2), dtype=S)),
        wp.array([S0, 1.0], dtype=S),
        wp.array([0, 1], dtype=int),
    ]
    return _run_case_kernel(mat22_kernel, D, dtype, M22_CASES, inputs, vec2, parts=3)


@pytest.mark.parametrize("name", [c.name for c in M22_CASES])
@pytest.mark.parametrize("dtype", DTYPES)
def test_mat22_op(dtype, name):
    out, _ = mat22_results(dtype)
    case = next(c for c in M22_CASES if c.name == name)
    check_case(case, out, _offsets(M22_CASES)[name], dtype, Z_M22)


M0 = np.array([[1.3, 0.2, -0.4], [0.1, 0.9, 0.3], [-0.5, 0.2, 1.1]])
PM3 = np.array([[0.4, -0.1, 0.2], [0.3, 0.7, -0.5], [0.0, 0.6, 0.1]])
Q3 = np.array([0.3, -0.6, 0.2])
Z_M33 = M0.T.ravel()  # columns
BASIS33 = _basis(3, lambda a: (a % 3, a // 3))


def _m(z):
    return np.asarray(z).reshape(3, 3).T


M33_CASES = [
    Case("mat33_cols_seeded", 9, lambda z: _m(z).ravel()),
    Case("mat33_rows_seeded", 9, lambda z: z),
    Case("det_3x3", 1, lambda z: [np.linalg.det(_m(z))], lambda z: det_jet(_m(z), BASIS33)),
    Case("inverse_3x3", 9, lambda z: np.linalg.inv(_m(z)).ravel(), lambda z: inverse_jet(_m(z), BASIS33)),
    Case("inverse_times_matrix_3x3", 9, lambda z: np.eye(3).ravel(), lambda z: const_jet(np.eye(3).ravel(), 9)),
    Case("transpose_3x3", 9, lambda z: z),
    Case("trace_3x3", 1, lambda z: [np.trace(_m(z))]),
    Case("frobenius_sq_3x3", 1, lambda z: [z @ z]),
    Case("matmul_3x3_dual_dual", 9, lambda z: (_m(z) @ _m(z)).ravel()),
    Case("matmul_3x3_dual_plain", 9, lambda z: (_m(z) @ PM3).ravel()),
    Case("matmul_3x3_plain_dual", 9, lambda z: (PM3 @ _m(z)).ravel()),
    Case("matvec_3x3_dual_dual", 3, lambda z: _m(z) @ z[:3]),
    Case("matvec_3x3_dual_plain", 3, lambda z: _m(z) @ Q3),
    Case("matvec_3x3_plain_dual", 3, lambda z: PM3 @ z[:3]),
    Case("mat33_cols_mixed", 9, lambda z: np.column_stack([z[:3], Q3, z[6:]]).ravel()),
    Case("mat33_rows_mixed", 9, lambda z: np.vstack([Q3, z[3:6], Q3]).ravel()),
    Case("mat_add_3x3_dual_plain", 9, lambda z: (_m(z) + PM3).ravel()),
    Case("mat_sub_3x3_dual_dual", 9, lambda z: (_m(z) - _m(z).T).ravel()),
    Case("mat_neg_3x3", 9, lambda z: -_m(z).ravel()),
    Case("mat_mul_3x3_scalar", 9, lambda z: S0 * _m(z).ravel()),
    Case("mat_mul_3x3_float_literal", 9, lambda z: 1.5 * _m(z).ravel()),
    Case("mat_div_3x3_dualscalar", 9, lambda z: _m(z).ravel() / np.linalg.det(_m(z))),
    Case("index2_3x3", 2, lambda z: [_m(z)[2, 1], _m(z)[0, 2]]),
    Case("where_3x3_true", 9, lambda z: _m(z).ravel()),
    Case("where_3x3_false", 9, lambda z: z),
    Case("select_3x3_true", 9, lambda z: z),
    Case("select_3x3_false", 9, lambda z: _m(z).ravel()),
    Case("const_mat33", 9, lambda z: PM3.ravel()),
]


def mat33_kernel(D, part):
    """k = 9 kernels: every case of M33_CASES, in order, in 5 parts (see mat22_kernel)."""
    S = D.S
    add, sub, mul, div = D.add, D.sub, D.mul, D.div
    vec3 = wp.types.vector(length=3, dtype=S)
    mat33 = wp.types.matrix(shape=(3, 3), dtype=S)

    @wp.kernel(module="unique", enable_backward=False, module_options=KERNEL_OPTIONS)
    def kernel(
        vin: wp.array(dtype=vec3),
        pin: wp.array(dtype=mat33),
        sin: wp.array(dtype=S),
        idx: wp.array(dtype=int),
        out: wp.array(dtype=D.Dual),
        plain: wp.array(dtype=vec3),
        count: wp.array(dtype=int),
    ):
        c0 = D.seed(vin[0], 0)
        c1 = D.seed(vin[1], 3)
        c2 = D.seed(vin[2], 6)
        m = D.mat33_cols(c0, c1, c2)
        mt = D.transpose(m)
        q = vin[3]
        pm = pin[0]
        s = sin[0]
        t = sin[1] > S(0.0)
        f = sin[1] < S(0.0)
        i = count[0]  # each part continues where the one before stopped
        if wp.static(part == 0):
            i = _put33(out, i, m)
            i = _put33(out, i, D.mat33_rows(c0, c1, c2))
            d = D.det(m)
            i = _put(out, i, d)
            mi = D.inverse(m)
            i = _put33(out, i, mi)
        if wp.static(part == 1):
            mi = D.inverse(m)
            i = _put33(out, i, mi * m)
            i = _put33(out, i, mt)
            i = _put(out, i, D.trace(m))
            i = _put(out, i, D.frobenius_sq(m))
            i = _put33(out, i, D.matmul(m, m))
            i = _put33(out, i, D.matmul(m, pm))
        if wp.static(part == 2):
            i = _put33(out, i, pm * m)
            i = _put3(out, i, m * c0)
            i = _put3(out, i, D.matmul(m, q))
            i = _put3(out, i, pm * c0)
            i = _put33(out, i, D.mat33_cols(c0, q, c2))
            i = _put33(out, i, D.mat33_rows(q, c1, q))
            i = _put33(out, i, add(m, pm))
        if wp.static(part == 3):
            d = D.det(m)
            i = _put33(out, i, sub(m, mt))
            i = _put33(out, i, D._wm_neg(m))
            i = _put33(out, i, mul(s, m))
            i = _put33(out, i, 1.5 * m)
            i = _put33(out, i, div(m, d))
            i = _put(out, i, D._wm_index2(m, idx[2], idx[1]))
        if wp.static(part == 4):
            i = _put(out, i, D._wm_index2(m, idx[0], idx[2]))
            i = _put33(out, i, D.where(t, m, mt))
            i = _put33(out, i, D.where(f, m, mt))
            i = _put33(out, i, D.select(t, m, mt))
            i = _put33(out, i, D.select(f, m, mt))
            i = _put33(out, i, D.const(pm))
        count[0] = i
        plain[0] = q

    return kernel


@functools.lru_cache(maxsize=None)
def mat33_results(dtype: str, hessian: bool = True):
    S = DTYPES[dtype]
    D = ad.duals(9, S, hessian=hessian)
    vec3 = wp.types.vector(length=3, dtype=S)
    inputs = [
        wp.array(np.vstack([M0.T, Q3]), dtype=vec3),
        wp.array(PM3[None], dtype=wp.types.matrix(shape=(3, 3), dtype=S)),
        wp.array([S0, 1.0], dtype=S),
        wp.array([0, 1, 2], dtype=int),
    ]
    return _run_case_kernel(mat33_kernel, D, dtype, M33_CASES, inputs, vec3, parts=5)


@pytest.mark.parametrize("name", [c.name for c in M33_CASES])
@pytest.mark.parametrize("dtype", DTYPES)
def test_mat33_op(dtype, name):
    out, _ = mat33_results(dtype)
    case = next(c for c in M33_CASES if c.name == name)
    check_case(case, out, _offsets(M33_CASES)[name], dtype, Z_M33)


@pytest.mark.parametrize("kernel", ["vector", "mat22", "mat33"])
def test_gradient_only_mode_vector_matrix(kernel):
    """float64 gradient-only duals through the vector / matrix kernels: same values and gradients."""
    results, cases = {
        "vector": (vector_results, VEC_CASES),
        "mat22": (mat22_results, M22_CASES),
        "mat33": (mat33_results, M33_CASES),
    }[kernel]
    full, _ = results("float64", True)
    grad, _ = results("float64", False)
    assert "h" not in grad.dtype.names
    for case in cases:
        start = _offsets(cases)[case.name]
        sl = slice(start, start + case.size)
        for field in ("v", "g"):
            got, expected = grad[field][sl], full[field][sl]
            np.testing.assert_allclose(got, expected, rtol=1e-14, atol=1e-14, err_msg=f"{case.name}.{field}")


# ============================================================================================================
# value() of dual vectors and matrices
# ============================================================================================================



def value_vec3_kernel(D):
    S = D.S
    vec3 = wp.types.vector(length=3, dtype=S)

    @wp.kernel(module="unique", enable_backward=False, module_options=KERNEL_OPTIONS)
    def kernel(vin: wp.array(dtype=vec3), out: wp.array(dtype=vec3)):
        u = D.seed(vin[0], 0)
        out[0] = D.value(u)

    return kernel


def value_mat33_kernel(D):
    S = D.S
    mat33 = wp.types.matrix(shape=(3, 3), dtype=S)

    @wp.kernel(module="unique", enable_backward=False, module_options=KERNEL_OPTIONS)
    def kernel(pin: wp.array(dtype=mat33), out: wp.array(dtype=mat33)):
        m = D.mul(D.const(pin[0]), D.seed(S(2.0), 0))
        out[0] = D.value(m)

    return kernel


def test_value_of_dual_vec3():
    S = wp.float64
    vec3 = wp.types.vector(length=3, dtype=S)
    out = wp.zeros(1, dtype=vec3)
    wp.launch(value_vec3_kernel(ad.duals(3, S)), dim=1, inputs=[wp.array(U0[None], dtype=vec3), out])
    np.testing.assert_allclose(out.numpy()[0], U0)


def test_value_of_dual_mat33():
    S = wp.float64
    mat33 = wp.types.matrix(shape=(3, 3), dtype=S)
    out = wp.zeros(1, dtype=mat33)
    wp.launch(value_mat33_kernel(ad.duals(3, S)), dim=1, inputs=[wp.array(M0[None], dtype=mat33), out])
    np.testing.assert_allclose(out.numpy()[0], 2.0 * M0)


# ============================================================================================================
# project_psd: per-element projection of a symmetric k x k matrix onto the PSD cone
# ============================================================================================================

PSD_SIZES = [(6, "float32"), (6, "float64"), (12, "float32"), (12, "float64")]
PSD_TOL = {"float32": 2e-5, "float64": 1e-11}  # relative to the matrix norm
# the packed, unrolled Jacobi (what CUDA kernels use up to k = 12; k = 12 compiles in ~35 s on the CPU)
PSD_UNROLLED = [(3, "float64", "unrolled"), (6, "float32", "unrolled"), (9, "float64", "unrolled"), (12, "float64", "unrolled")]


def psd_kernel(D, unrolled: bool):
    """``project_psd`` (k x k matrix, runtime size) or ``project_psd_unrolled`` (packed upper triangle, size k)."""
    matK = D.matK

    @wp.kernel(module="unique", enable_backward=False, module_options=KERNEL_OPTIONS)
    def kernel(
        hin: wp.array(dtype=matK),
        eps: wp.array(dtype=D.S),
        absolute: wp.array(dtype=int),
        n: wp.array(dtype=int),
        hout: wp.array(dtype=matK),
    ):
        e = wp.tid()
        if wp.static(unrolled):
            hout[e] = D.unpack(D.project_psd_unrolled(D.pack(hin[e]), eps[e], absolute[e]))
        else:
            hout[e] = D.project_psd(hin[e], eps[e], absolute[e], n[e])

    return kernel


def _sym(rng, k):
    m = rng.standard_normal((k, k))
    return 0.5 * (m + m.T)


def reference_projection(h, eps, absolute):
    lam, vec = np.linalg.eigh(h)
    lam = np.abs(lam) if absolute else lam
    return (vec * np.maximum(lam, eps)) @ vec.T


@functools.lru_cache(maxsize=None)
def psd_results(k: int, dtype: str, variant: str = "loop"):
    """Batch: indefinite (clamp, abs, eps 0 / 0.1), positive definite, diagonal, zero, and a leading block.

    ``variant``: ``"loop"`` (``project_psd`` on a k x k matrix, runtime size) or ``"unrolled"``
    (``project_psd_unrolled`` on the packed upper triangle; its size is k, so the leading block case is
    left out)."""
    rng = np.random.default_rng(7 + k)
    cases = []  # (name, input, eps, absolute, n)
    for r in range(3):
        h = _sym(rng, k)
        cases += [
            (f"indefinite{r}_clamp", h, 0.0, 0, k),
            (f"indefinite{r}_abs", h, 0.0, 1, k),
            (f"indefinite{r}_clamp_eps", h, 0.1, 0, k),
            (f"indefinite{r}_abs_eps", h, 0.1, 1, k),
        ]
    m = rng.standard_normal((k, k))
    spd = m @ m.T + 0.5 * np.eye(k)
    cases += [("positive_definite_clamp", spd, 1e-3, 0, k), ("positive_definite_abs", spd, 1e-3, 1, k)]
    diag = np.diag(rng.uniform(-2.0, 2.0, k))
    cases += [("diagonal_clamp", diag, 0.0, 0, k), ("diagonal_abs", diag, 0.0, 1, k)]
    cases += [("zero_eps", np.zeros((k, k)), 0.25, 0, k)]
    block = np.zeros((k, k))
    block[: k // 2, : k // 2] = _sym(rng, k // 2)
    if variant == "loop":
        cases += [("leading_block", block, 0.0, 0, k // 2)]
    S = DTYPES[dtype]
    D = ad.duals(k, S)
    hin = wp.array(np.stack([c[1] for c in cases]), dtype=D.matK)
    hout = wp.zeros(len(cases), dtype=D.matK)
    wp.launch(
        psd_kernel(D, unrolled=variant == "unrolled"),
        dim=len(cases),
        inputs=[
            hin,
            wp.array([c[2] for c in cases], dtype=S),
            wp.array([c[3] for c in cases], dtype=int),
            wp.array([c[4] for c in cases], dtype=int),
            hout,
        ],
    )
    return cases, hout.numpy().astype(np.float64)


PSD_CASE_NAMES = [f"indefinite{r}_{m}" for r in range(3) for m in ("clamp", "abs", "clamp_eps", "abs_eps")] + [
    "positive_definite_clamp",
    "positive_definite_abs",
    "diagonal_clamp",
    "diagonal_abs",
    "zero_eps",
    "leading_block",
]


# every case on every size and variant, except "leading_block" on the unrolled projection (it has no runtime size)
PSD_PARAMS = [(k, t, v, name) for k, t, v in [(k, t, "loop") for k, t in PSD_SIZES] + PSD_UNROLLED
              for name in PSD_CASE_NAMES if not (v == "unrolled" and name == "leading_block")]


@pytest.mark.parametrize("k, dtype, variant, name", PSD_PARAMS)
def test_project_psd(k, dtype, variant, name):
    cases, hout = psd_results(k, dtype, variant)
    index = [c[0] for c in cases].index(name)
    _, h, eps, absolute, n = cases[index]
    got = hout[index]
    tol = PSD_TOL[dtype] * max(1.0, np.linalg.norm(h, 2))
    expected = np.zeros((k, k))
    expected[:n, :n] = reference_projection(h[:n, :n], eps, absolute)
    # against the eigendecomposition (clamp: max(lambda, eps); abs: max(|lambda|, eps))
    np.testing.assert_allclose(got, expected, rtol=0, atol=tol, err_msg=name)
    np.testing.assert_allclose(got, got.T, rtol=0, atol=tol, err_msg=f"{name}: symmetry")
    # positive semi-definite, eigenvalues at least eps on the projected block
    assert np.linalg.eigvalsh(got[:n, :n]).min() >= eps - tol, name
    if name.startswith("positive_definite"):
        # already PSD with eigenvalues above eps: unchanged
        np.testing.assert_allclose(got, h, rtol=0, atol=tol)
    if name.startswith("indefinite") and name.endswith("abs"):
        # |lambda| keeps the curvature magnitude: same Frobenius norm as the input
        np.testing.assert_allclose(np.linalg.norm(got), np.linalg.norm(h), rtol=10 * PSD_TOL[dtype])
