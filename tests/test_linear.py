"""Linear back-ends: SciPy, QDLDL and Warp CG on CPU against numpy.linalg.solve; CuPy/cuDSS/CG on GPU (marked gpu)."""

import importlib.util

import numpy as np
import pytest
import scipy.sparse as sps
import warp as wp
import warp.sparse as wps

from warp_meshad._src import linear
from warp_meshad._src.linear import (
    LINEAR_SOLVER_NAMES,
    CGSolver,
    LinearSolveInfo,
    QdldlSolver,
    ScipySolver,
    make_linear_solver,
)

wp.config.log_level = wp.LOG_WARNING

HAS_GPU = wp.get_cuda_device_count() > 0
gpu = pytest.mark.gpu
needs_gpu = pytest.mark.skipif(not HAS_GPU, reason="needs a CUDA device")


def spd_system(n=40, bs=3, dtype=wp.float64, seed=0, device="cpu", shift=0.5):
    """SPD block system from a random mesh-like edge pattern: A = sum_e [K -K; -K K] + shift I."""
    rng = np.random.default_rng(seed)
    np_dtype = np.float64 if dtype == wp.float64 else np.float32
    # a ring plus random chords: every vertex has a handful of neighbours, like a mesh one-ring
    edges = {(i, (i + 1) % n) for i in range(n)} | {(i, (i + 2) % n) for i in range(n)}
    for _ in range(n):
        i, j = rng.integers(0, n, size=2)
        if i != j:
            edges.add((min(i, j), max(i, j)))
    rows, cols, blocks = [], [], []
    dense = np.zeros((n * bs, n * bs))
    for i, j in sorted(edges):
        m = rng.standard_normal((bs, bs))
        k = m @ m.T + 0.1 * np.eye(bs)
        for r, c, s in ((i, i, 1), (j, j, 1), (i, j, -1), (j, i, -1)):
            rows.append(r)
            cols.append(c)
            blocks.append(s * k)
            dense[r * bs : (r + 1) * bs, c * bs : (c + 1) * bs] += s * k
    for i in range(n):
        rows.append(i)
        cols.append(i)
        blocks.append(shift * np.eye(bs))
        dense[i * bs : (i + 1) * bs, i * bs : (i + 1) * bs] += shift * np.eye(bs)
    block_type = dtype if bs == 1 else wp.types.matrix(shape=(bs, bs), dtype=dtype)
    vec_type = dtype if bs == 1 else wp.types.vector(length=bs, dtype=dtype)
    vals = np.array(blocks, dtype=np_dtype)
    if bs == 1:
        vals = vals.reshape(-1)
    A = wps.bsr_from_triplets(
        n,
        n,
        wp.array(np.array(rows), dtype=int, device=device),
        wp.array(np.array(cols), dtype=int, device=device),
        wp.array(vals, dtype=block_type, device=device),
    )
    b_np = rng.standard_normal(n * bs)
    b = wp.array(b_np.reshape(n, bs) if bs > 1 else b_np, dtype=vec_type, device=device)
    x = wp.zeros(n, dtype=vec_type, device=device)
    return A, dense, b_np, b, x


def _flat(x):
    return x.numpy().reshape(-1)


def _scale_values(A, factor):
    """Scale the stored blocks of A in place (same pattern); slots past nnz may hold garbage, leave them."""
    nnz = A.nnz_sync()
    vals = A.values.numpy().copy()
    vals[:nnz] *= factor
    A.values.assign(vals)


@pytest.mark.parametrize("bs", [1, 3])
def test_csr_conversion_matches_scipy(bs):
    A, dense, *_ = spd_system(n=17, bs=bs, seed=3)
    csr = linear._CsrBuffers(A)
    csr.update_values(A)
    ours = sps.csr_matrix(
        (csr.data.numpy()[: csr.nnz], csr.indices.numpy()[: csr.nnz], csr.indptr.numpy()), shape=dense.shape
    )
    assert ours.has_sorted_indices
    assert ours.nnz == A.nnz * bs * bs
    np.testing.assert_allclose(ours.toarray(), dense, rtol=0, atol=1e-12)


@pytest.mark.parametrize("bs", [1, 3])
@pytest.mark.parametrize("symmetric", [True, False])
def test_scipy_matches_numpy(bs, symmetric):
    A, dense, b_np, b, x = spd_system(bs=bs, seed=bs)
    solver = ScipySolver(symmetric=symmetric)
    info = solver.solve(A, b, x)
    np.testing.assert_allclose(_flat(x), np.linalg.solve(dense, b_np), rtol=1e-9, atol=1e-11)
    assert isinstance(info, LinearSolveInfo)
    assert info.backend == "scipy" and info.iterations == 1 and info.converged
    assert info.residual_norm < 1e-9 * np.linalg.norm(b_np)


def test_scipy_reuses_pattern_and_refreshes_values():
    A, dense, b_np, b, x = spd_system(seed=5)
    solver = ScipySolver()
    solver.solve(A, b, x)
    csr = solver._csr
    # new values, same pattern: scale the matrix by 2 in place
    _scale_values(A, 2.0)
    solver.solve(A, b, x)
    assert solver._csr is csr
    np.testing.assert_allclose(_flat(x), np.linalg.solve(2.0 * dense, b_np), rtol=1e-9, atol=1e-11)
    # a different pattern is detected and rebuilt
    A2, dense2, b2_np, b2, x2 = spd_system(n=23, seed=6)
    solver.solve(A2, b2, x2)
    assert solver._csr is not csr
    np.testing.assert_allclose(_flat(x2), np.linalg.solve(dense2, b2_np), rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize("bs", [1, 3])
@pytest.mark.parametrize("dtype", [wp.float64, wp.float32])
def test_qdldl_matches_numpy_and_refactors_in_place(bs, dtype):
    A, dense, b_np, b, x = spd_system(bs=bs, seed=11 + bs, dtype=dtype)
    solver = QdldlSolver()
    tol = dict(rtol=1e-9, atol=1e-11) if dtype == wp.float64 else dict(rtol=2e-4, atol=1e-5)
    info = solver.solve(A, b, x)
    assert info.backend == "qdldl" and info.iterations == 1 and solver.fallbacks == 0
    np.testing.assert_allclose(_flat(x), np.linalg.solve(dense.astype(np.float64), b_np), **tol)
    ldl = solver._ldl
    # new values, same pattern: the ordering and symbolic factorization are kept, the numbers refactored
    _scale_values(A, 4.0)
    info = solver.solve(A, b, x)
    assert solver._ldl is ldl and info.analysis_ms < 1e3
    np.testing.assert_allclose(_flat(x), np.linalg.solve(4.0 * dense, b_np), **tol)
    # a new pattern gets a new factorization
    A2, dense2, b2_np, b2, x2 = spd_system(n=23, bs=bs, seed=6, dtype=dtype)
    solver.solve(A2, b2, x2)
    assert solver._ldl is not ldl
    np.testing.assert_allclose(_flat(x2), np.linalg.solve(dense2, b2_np), **tol)


def test_qdldl_falls_back_to_superlu_where_ldl_fails():
    # symmetric, nonsingular, zero diagonal: LDL^T without pivoting has no first pivot; SuperLU solves it
    n = 4
    rows, cols = [0, 1, 2, 3], [1, 0, 3, 2]
    A = wps.bsr_from_triplets(
        n, n, wp.array(rows, dtype=int), wp.array(cols, dtype=int), wp.array([1.0, 1.0, 2.0, 2.0], dtype=wp.float64)
    )
    b_np = np.array([1.0, 2.0, 3.0, 4.0])
    b = wp.array(b_np, dtype=wp.float64)
    x = wp.zeros(n, dtype=wp.float64)
    solver = QdldlSolver()
    info = solver.solve(A, b, x)
    full = np.zeros((n, n))
    full[rows, cols] = [1.0, 1.0, 2.0, 2.0]
    assert info.backend == "scipy" and solver.fallbacks == 1
    np.testing.assert_allclose(_flat(x), np.linalg.solve(full, b_np), rtol=1e-12)
    # an SPD system afterwards factors with LDL^T again
    A2, dense2, b2_np, b2, x2 = spd_system(n=9, bs=1, seed=2)
    assert solver.solve(A2, b2, x2).backend == "qdldl"
    np.testing.assert_allclose(_flat(x2), np.linalg.solve(dense2, b2_np), rtol=1e-9, atol=1e-11)


def test_scipy_singular_raises():
    n = 4
    A = wps.bsr_from_triplets(
        n, n, wp.array([0, 1], dtype=int), wp.array([0, 1], dtype=int), wp.array([1.0, 1.0], dtype=wp.float64)
    )
    b = wp.ones(n, dtype=wp.float64)
    x = wp.zeros(n, dtype=wp.float64)
    with pytest.raises(linear.LinearSolveError):
        ScipySolver().solve(A, b, x)


@pytest.mark.parametrize("preconditioner", ["none", "diag", "block_jacobi"])
def test_cg_matches_numpy(preconditioner):
    A, dense, b_np, b, x = spd_system(seed=7)
    info = CGSolver(preconditioner=preconditioner, tol=1e-12, maxiter=2000).solve(A, b, x)
    assert info.backend == "cg" and info.converged and info.iterations > 0
    np.testing.assert_allclose(_flat(x), np.linalg.solve(dense, b_np), rtol=1e-7, atol=1e-8)


def test_scipy_and_cg_agree():
    A, dense, b_np, b, x = spd_system(seed=8)
    x_cg = wp.zeros_like(x)
    ScipySolver().solve(A, b, x)
    info = CGSolver(tol=1e-10, maxiter=2000).solve(A, b, x_cg)
    assert info.converged
    np.testing.assert_allclose(_flat(x_cg), _flat(x), rtol=1e-6, atol=1e-7)


def test_scipy_float32():
    A, dense, b_np, b, x = spd_system(dtype=wp.float32, seed=8)
    ScipySolver().solve(A, b, x)
    assert wp.types.types_equal(x.dtype, wp.vec3f)
    np.testing.assert_allclose(_flat(x), np.linalg.solve(dense, b_np), rtol=1e-3, atol=1e-3)


def test_cg_uses_initial_guess_and_reports_cap():
    A, dense, b_np, b, x = spd_system(seed=9)
    exact = np.linalg.solve(dense, b_np)
    x.assign(exact.reshape(-1, 3))
    info = CGSolver(tol=1e-8, maxiter=10).solve(A, b, x)
    assert info.converged and info.iterations <= 10
    x.zero_()
    info = CGSolver(preconditioner="none", tol=1e-14, maxiter=10).solve(A, b, x)
    assert not info.converged


def test_factory_names_and_errors():
    assert make_linear_solver("scipy").name == "scipy"
    cg = make_linear_solver("cg", preconditioner="diag", tol=1e-9)
    assert cg.name == "cg" and cg.preconditioner == "diag"
    assert make_linear_solver("qdldl").name == "qdldl"
    assert make_linear_solver("auto", device="cpu").name == "qdldl"  # a dependency: installed with the package
    assert make_linear_solver("auto", device="cpu", tol=1e-6).name == "qdldl"  # cg-only option is dropped
    assert make_linear_solver("auto", device="cpu", symmetric=False).name == "scipy"  # LDL^T is for symmetric A
    assert set(LINEAR_SOLVER_NAMES) == {"auto", "scipy", "qdldl", "cg", "cupy", "cudss"}
    with pytest.raises(ValueError, match="cudss"):
        make_linear_solver("umfpack")
    with pytest.raises(TypeError, match="bogus"):
        make_linear_solver("cg", bogus=1)
    with pytest.raises(ValueError, match="preconditioner"):
        make_linear_solver("cg", preconditioner="ilu")


@pytest.mark.skipif(importlib.util.find_spec("cupy") is not None, reason="CuPy is installed")
def test_missing_optional_packages_name_the_extra():
    with pytest.raises(ImportError, match=r"warp-meshad\[cudss\]"):
        make_linear_solver("cupy")
    with pytest.raises(ImportError, match=r"warp-meshad\[cudss\]"):
        make_linear_solver("cudss")


def test_input_validation_messages():
    A, dense, b_np, b, x = spd_system(n=6, seed=1)
    wrong = wp.zeros(6, dtype=wp.vec3f)
    with pytest.raises(TypeError, match="expected dtype vec3d"):
        ScipySolver().solve(A, wrong, x)
    with pytest.raises(ValueError, match=r"expected shape \(6,\), got \(5,\)"):
        ScipySolver().solve(A, b, wp.zeros(5, dtype=wp.vec3d))
    with pytest.raises(TypeError, match="BsrMatrix"):
        ScipySolver().solve(dense, b, x)


# ----------------------------------------------------------------------------------------------------------------------
# GPU (run on a CUDA host; skipped here)
# ----------------------------------------------------------------------------------------------------------------------


def _gpu_backend_available(name):
    if not HAS_GPU:
        return False
    mod = {"cupy": "cupy", "cudss": "nvmath"}.get(name)
    return mod is None or importlib.util.find_spec(mod) is not None


@gpu
@needs_gpu
@pytest.mark.parametrize("name", ["cg", "cupy", "cudss", "scipy"])
@pytest.mark.parametrize("bs", [1, 3])
def test_gpu_backends_match_numpy(name, bs):
    if not _gpu_backend_available(name):
        pytest.skip(f"{name} not installed")
    A, dense, b_np, b, x = spd_system(n=60, bs=bs, seed=11, device="cuda:0")
    options = {"tol": 1e-12, "maxiter": 5000} if name == "cg" else {}
    solver = make_linear_solver(name, **options)
    info = solver.solve(A, b, x)
    np.testing.assert_allclose(_flat(x), np.linalg.solve(dense, b_np), rtol=1e-7, atol=1e-8)
    assert info.backend == name
    # second solve with new values on the same pattern reuses the analysis
    _scale_values(A, 3.0)
    info2 = solver.solve(A, b, x)
    np.testing.assert_allclose(_flat(x), np.linalg.solve(3.0 * dense, b_np), rtol=1e-7, atol=1e-8)
    if name in ("cudss", "cupy", "scipy"):
        assert info2.analysis_ms <= info.analysis_ms + 5.0


@gpu
@needs_gpu
@pytest.mark.parametrize("matrix_type", ["general", "symmetric", "spd"])
def test_gpu_cudss_matrix_types(matrix_type):
    if not _gpu_backend_available("cudss"):
        pytest.skip("nvmath-python not installed")
    A, dense, b_np, b, x = spd_system(n=50, seed=12, device="cuda:0")
    make_linear_solver("cudss", matrix_type=matrix_type).solve(A, b, x)
    np.testing.assert_allclose(_flat(x), np.linalg.solve(dense, b_np), rtol=1e-7, atol=1e-8)


@gpu
@needs_gpu
def test_gpu_auto_picks_a_gpu_backend():
    solver = make_linear_solver("auto", device="cuda:0")
    assert solver.name in ("cudss", "cupy", "cg")
    A, dense, b_np, b, x = spd_system(n=30, seed=13, device="cuda:0")
    solver.solve(A, b, x)
    np.testing.assert_allclose(_flat(x), np.linalg.solve(dense, b_np), rtol=1e-6, atol=1e-7)
