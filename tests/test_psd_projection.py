"""The packed PSD projection of the generated Hessian duals (``project_psd_unrolled``: odd-even parallel-order Jacobi with
literal indices, the CUDA default up to k = 12) against NumPy's eigendecomposition and against the loop projection
(``project_psd``: runtime indices into a k x k matrix), for every size it exists for; and the shape of its code.

The projection of a symmetric H = V diag(lambda) V^T is P = V diag(max(lambda, eps)) V^T (``absolute``:
max(|lambda|, eps)): P is symmetric positive semi-definite with H's eigenvectors and the clamped eigenvalues.
"""

import functools
import re

import numpy as np
import pytest
import warp as wp

from warp_meshad.kernels import _dualgen, ad

wp.config.log_level = wp.LOG_WARNING

DTYPES = {"float32": wp.float32, "float64": wp.float64}
TOL = {"float32": 3e-5, "float64": 2e-11}  # relative to the spectral norm of the input
SIZES = [(k, "float64") for k in range(1, 13)] + [(6, "float32"), (12, "float32")]


def _kernel(D, loop: bool):
    """One thread per matrix: ``hout[e]`` = the projection of ``hin[e]`` (the packed one, or the loop one)."""

    @wp.kernel(module="unique", enable_backward=False)
    def project(hin: wp.array(dtype=D.matK), eps: wp.array(dtype=D.S), absolute: wp.array(dtype=int),
                hout: wp.array(dtype=D.matK)):  # fmt: skip
        e = wp.tid()
        if wp.static(loop):
            hout[e] = D.project_psd(hin[e], eps[e], absolute[e], D.K)
        else:
            hout[e] = D.unpack(D.project_psd_unrolled(D.pack(hin[e]), eps[e], absolute[e]))

    return project


def _orthogonal(rng, k):
    q, r = np.linalg.qr(rng.standard_normal((k, k)))
    return q * np.sign(np.diag(r))


def _cases(k: int):
    """(name, H, eps, absolute): indefinite, repeated eigenvalues, a spring's rank-one block, scaled, nearly
    diagonal, already definite (the early out), zero."""
    rng = np.random.default_rng(100 + k)
    out = []
    for r in range(2):
        m = rng.standard_normal((k, k))
        h = 0.5 * (m + m.T)
        out += [(f"indefinite{r}", h, 0.0, 0), (f"indefinite{r}_abs", h, 0.0, 1), (f"indefinite{r}_eps", h, 0.3, 0)]
    q = _orthogonal(rng, k)
    lam = np.where(np.arange(k) % 3 == 0, -2.0, np.where(np.arange(k) % 3 == 1, 1.5, 1.5))  # two repeated values
    out += [("repeated", (q * lam) @ q.T, 0.0, 0), ("repeated_abs", (q * lam) @ q.T, 0.0, 1)]
    n = rng.standard_normal(k)
    n /= np.linalg.norm(n)
    out += [("rank_one_negative", 2.0 * np.eye(k) - 5.0 * np.outer(n, n), 1e-9, 0)]
    m = rng.standard_normal((k, k))
    out += [("large", 1e6 * (m + m.T), 0.0, 0), ("small", 1e-6 * (m + m.T), 0.0, 1)]
    d = np.diag(rng.uniform(-3.0, 3.0, k)) + 1e-9 * (m + m.T)
    out += [("nearly_diagonal", d, 0.0, 0)]
    m = rng.standard_normal((k, k))
    out += [("definite", m @ m.T + np.eye(k), 1e-3, 0), ("zero", np.zeros((k, k)), 0.25, 0)]
    return out


@functools.lru_cache(maxsize=None)
def _projected(k: int, dtype: str, loop: bool, device: str):
    cases = _cases(k)
    D = ad.duals(k, DTYPES[dtype])
    hin = wp.array(np.stack([c[1] for c in cases]), dtype=D.matK, device=device)
    hout = wp.zeros(len(cases), dtype=D.matK, device=device)
    eps = wp.array([c[2] for c in cases], dtype=D.S, device=device)
    absolute = wp.array([c[3] for c in cases], dtype=int, device=device)
    wp.launch(_kernel(D, loop), dim=len(cases), inputs=[hin, eps, absolute, hout], device=device)
    return hout.numpy().astype(np.float64)


@pytest.mark.parametrize("k, dtype", SIZES)
def test_packed_projection_is_the_eigendecomposition_with_clamped_eigenvalues(k, dtype, device):
    cases = _cases(k)
    got = _projected(k, dtype, False, str(device))
    for (name, h, eps, absolute), p in zip(cases, got):
        h = h.astype(np.float32).astype(np.float64) if dtype == "float32" else h  # what the kernel read
        scale = max(np.linalg.norm(h, 2), 1e-300)
        tol = TOL[dtype] * max(scale, eps)
        lam, vec = np.linalg.eigh(h)
        target = np.maximum(np.abs(lam) if absolute else lam, eps)
        np.testing.assert_allclose(p, p.T, rtol=0, atol=tol, err_msg=f"{name}: symmetry")
        # H's eigenvectors, each with its clamped eigenvalue (P v = max(lambda, eps) v)
        np.testing.assert_allclose(p @ vec, vec * target, rtol=0, atol=tol, err_msg=f"{name}: eigenpairs")
        np.testing.assert_allclose(p, (vec * target) @ vec.T, rtol=0, atol=tol, err_msg=name)
        assert np.linalg.eigvalsh(p).min() >= eps - tol, name
        if name == "definite":  # every eigenvalue above eps: H itself, bit for bit (the Cholesky early out)
            np.testing.assert_array_equal(p, h if dtype == "float64" else h.astype(np.float32))


@pytest.mark.parametrize("k, dtype", [(5, "float64"), (12, "float64"), (12, "float32")])
def test_packed_projection_equals_the_loop_projection(k, dtype, device):
    packed = _projected(k, dtype, False, str(device))
    loop = _projected(k, dtype, True, str(device))
    for (name, h, _eps, _abs), a, b in zip(_cases(k), packed, loop):
        np.testing.assert_allclose(a, b, rtol=0, atol=TOL[dtype] * max(np.linalg.norm(h, 2), 1.0), err_msg=name)


def _projection_text(k: int, dtype: str = "float64") -> str:
    src = _dualgen.source(k, dtype, "packed")
    start = src.index("def project_psd_unrolled(")
    end = src.find("\n@wp.func", start)
    return src[start:] if end < 0 else src[start:end]


@pytest.mark.parametrize("k", range(1, 13))
def test_only_the_two_kinds_of_step_are_written_out(k):
    # one step rotates the pairs (0, 1), (2, 3), ..., the other (1, 2), (3, 4), ...: k - 1 rotations in all, which a
    # runtime (while) loop repeats
    text = _projection_text(k)
    assert text.count("apq = ") == k - 1
    assert ("while step < " in text) == (k > 1)
    assert not re.search(r"\bfor \w+ in range\(", text)  # Warp unrolls constant-bound for loops
    # the text grows as k^2 (a sweep written out grows as k^4: 6879 lines at k = 12)
    assert text.count("\n") < 12 * k * k + 60, text.count("\n")


def test_packed_module_has_no_operator_overloads_and_hessian_duals_reexport_it():
    # each + - * / of the projections resolves to Warp's builtin at once (no dual overload set to try first)
    packed = _dualgen.load(12, wp.float64, "packed")
    assert not any(hasattr(packed, op) for op in ("add", "sub", "mul", "div"))
    hess = _dualgen.load(12, wp.float64, "hess")
    for name in ("unpack", "pack", "sym_mv", "project_psd", "project_psd_unrolled"):
        assert getattr(hess, name) is getattr(packed, name)
    assert not hasattr(_dualgen.load(13, wp.float64, "hess"), "project_psd_unrolled")
