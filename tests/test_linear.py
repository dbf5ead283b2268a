"""Linear back-ends: SciPy, QDLDL and Warp CG against numpy.linalg.solve on the test device ($WARP_MESHAD_TEST_DEVICE:
the host back-ends copy a GPU system to the host); CuPy/cuDSS/CG on a CUDA device (marked gpu); what 'auto' picks
and how it reports why it did not pick cuDSS."""

import sys
import warnings

import numpy as np
import pytest
import scipy.sparse as sps
import warp as wp
import warp.sparse as wps

from warp_meshad._src.solve import linear as linear
from warp_meshad._src.solve.linear import (
    LINEAR_SOLVER_NAMES,
    CGSolver,
    LinearSolveInfo,
    QdldlSolver,
    ScipySolver,
    make_linear_solver,
)

wp.config.log_level = wp.LOG_WARNING

pytestmark = pytest.mark.device


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
def test_csr_conversion_matches_scipy(device, bs):
    A, dense, *_ = spd_system(n=17, bs=bs, seed=3, device=device)
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
def test_scipy_matches_numpy(device, bs, symmetric):
    A, dense, b_np, b, x = spd_system(bs=bs, seed=bs, device=device)
    solver = ScipySolver(symmetric=symmetric)
    info = solver.solve(A, b, x)
    np.testing.assert_allclose(_flat(x), np.linalg.solve(dense, b_np), rtol=1e-9, atol=1e-11)
    assert isinstance(info, LinearSolveInfo)
    assert info.backend == "scipy" and info.iterations == 1 and info.converged
    assert info.residual_norm < 1e-9 * np.linalg.norm(b_np)


def test_scipy_reuses_pattern_and_refreshes_values(device):
    A, dense, b_np, b, x = spd_system(seed=5, device=device)
    solver = ScipySolver()
    solver.solve(A, b, x)
    csr = solver._csr
    # new values, same pattern: scale the matrix by 2 in place
    _scale_values(A, 2.0)
    solver.solve(A, b, x)
    assert solver._csr is csr
    np.testing.assert_allclose(_flat(x), np.linalg.solve(2.0 * dense, b_np), rtol=1e-9, atol=1e-11)
    # a different pattern is detected and rebuilt
    A2, dense2, b2_np, b2, x2 = spd_system(n=23, seed=6, device=device)
    solver.solve(A2, b2, x2)
    assert solver._csr is not csr
    np.testing.assert_allclose(_flat(x2), np.linalg.solve(dense2, b2_np), rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize("bs", [1, 3])
@pytest.mark.parametrize("dtype", [wp.float64, wp.float32])
def test_qdldl_matches_numpy_and_refactors_in_place(device, bs, dtype):
    A, dense, b_np, b, x = spd_system(bs=bs, seed=11 + bs, dtype=dtype, device=device)
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
    A2, dense2, b2_np, b2, x2 = spd_system(n=23, bs=bs, seed=6, dtype=dtype, device=device)
    solver.solve(A2, b2, x2)
    assert solver._ldl is not ldl
    np.testing.assert_allclose(_flat(x2), np.linalg.solve(dense2, b2_np), **tol)


def test_qdldl_falls_back_to_superlu_where_ldl_fails(device):
    # symmetric, nonsingular, zero diagonal: LDL^T without pivoting has no first pivot; SuperLU solves it
    n = 4
    rows, cols = [0, 1, 2, 3], [1, 0, 3, 2]
    A = wps.bsr_from_triplets(n, n, wp.array(rows, dtype=int, device=device), wp.array(cols, dtype=int, device=device),
                              wp.array([1.0, 1.0, 2.0, 2.0], dtype=wp.float64, device=device))
    b_np = np.array([1.0, 2.0, 3.0, 4.0])
    b = wp.array(b_np, dtype=wp.float64, device=device)
    x = wp.zeros(n, dtype=wp.float64, device=device)
    solver = QdldlSolver()
    info = solver.solve(A, b, x)
    full = np.zeros((n, n))
    full[rows, cols] = [1.0, 1.0, 2.0, 2.0]
    assert info.backend == "scipy" and solver.fallbacks == 1
    np.testing.assert_allclose(_flat(x), np.linalg.solve(full, b_np), rtol=1e-12)
    # an SPD system afterwards factors with LDL^T again
    A2, dense2, b2_np, b2, x2 = spd_system(n=9, bs=1, seed=2, device=device)
    assert solver.solve(A2, b2, x2).backend == "qdldl"
    np.testing.assert_allclose(_flat(x2), np.linalg.solve(dense2, b2_np), rtol=1e-9, atol=1e-11)


def test_scipy_singular_raises(device):
    n = 4
    diagonal = wp.array([0, 1], dtype=int, device=device)
    A = wps.bsr_from_triplets(n, n, diagonal, diagonal, wp.array([1.0, 1.0], dtype=wp.float64, device=device))
    b = wp.ones(n, dtype=wp.float64, device=device)
    x = wp.zeros(n, dtype=wp.float64, device=device)
    with pytest.raises(linear.LinearSolveError):
        ScipySolver().solve(A, b, x)


@pytest.mark.parametrize("preconditioner", ["none", "diag", "block_jacobi"])
def test_cg_matches_numpy(device, preconditioner):
    A, dense, b_np, b, x = spd_system(seed=7, device=device)
    info = CGSolver(preconditioner=preconditioner, tol=1e-12, maxiter=2000).solve(A, b, x)
    assert info.backend == "cg" and info.converged and info.iterations > 0
    np.testing.assert_allclose(_flat(x), np.linalg.solve(dense, b_np), rtol=1e-7, atol=1e-8)


def test_scipy_and_cg_agree(device):
    A, dense, b_np, b, x = spd_system(seed=8, device=device)
    x_cg = wp.zeros_like(x)
    ScipySolver().solve(A, b, x)
    info = CGSolver(tol=1e-10, maxiter=2000).solve(A, b, x_cg)
    assert info.converged
    np.testing.assert_allclose(_flat(x_cg), _flat(x), rtol=1e-6, atol=1e-7)


def test_scipy_float32(device):
    A, dense, b_np, b, x = spd_system(dtype=wp.float32, seed=8, device=device)
    ScipySolver().solve(A, b, x)
    assert wp.types.types_equal(x.dtype, wp.vec3f)
    np.testing.assert_allclose(_flat(x), np.linalg.solve(dense, b_np), rtol=1e-3, atol=1e-3)


def test_cg_uses_initial_guess_and_reports_cap(device):
    A, dense, b_np, b, x = spd_system(seed=9, device=device)
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
    assert make_linear_solver("cg").cudss_skipped_reason is None  # named: 'auto' did not pick it
    assert set(LINEAR_SOLVER_NAMES) == {"auto", "scipy", "qdldl", "cg", "cupy", "cudss"}
    with pytest.raises(ValueError, match="cudss"):
        make_linear_solver("umfpack")
    with pytest.raises(TypeError, match="bogus"):
        make_linear_solver("cg", bogus=1)
    with pytest.raises(ValueError, match="preconditioner"):
        make_linear_solver("cg", preconditioner="ilu")
    with pytest.raises(ValueError, match="dtype: expected wp.float32 or wp.float64, got int32"):
        make_linear_solver("auto", device="cpu", dtype=wp.int32)


@pytest.mark.cpu
def test_auto_on_the_cpu_picks_qdldl_and_says_why_not_cudss():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        solver = make_linear_solver("auto", device="cpu")
    assert solver.name == "qdldl"  # a dependency: installed with the package
    assert solver.cudss_skipped_reason == "the device is the CPU (cpu); cuDSS runs on CUDA devices only"
    assert not [w for w in caught if "cuDSS" in str(w.message)]  # the CPU is no surprise: a field, no warning
    assert make_linear_solver("auto", device="cpu", tol=1e-6).name == "qdldl"  # cg-only option is dropped
    assert make_linear_solver("auto", device="cpu", symmetric=False).name == "scipy"  # LDL^T is for symmetric A
    assert make_linear_solver("auto", device="cpu", dtype=wp.float32).name == "qdldl"  # probed in float32


class _FakeCuda:
    """What 'auto' reads of a device: whether it is CUDA, and its name."""

    is_cuda = True

    def __str__(self):
        return "cuda:7"


def test_auto_on_cuda_warns_once_why_cudss_is_not_used(monkeypatch):
    # the probe's verdicts are faked: this checks what 'auto' does with them (the probe itself runs on a real GPU in
    # test_gpu_auto_picks_a_gpu_backend)
    verdicts = {"cudss": (False, "not importable: no nvmath here"), "cupy": (True, "")}
    monkeypatch.setattr(linear, "_probe", lambda name, device, dtype: verdicts[name])
    monkeypatch.setattr(linear, "_warned_auto", set())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = linear._pick_auto(_FakeCuda(), wp.float64, {})
        again = linear._pick_auto(_FakeCuda(), wp.float64, {})
    assert first == again == ("cupy", "cuDSS not importable: no nvmath here")
    assert [str(w.message) for w in caught] == [
        "linear_solver='auto' on cuda:7: cuDSS is not used (cuDSS not importable: no nvmath here); using 'cupy'"]
    # another reason is warned too; without CuPy, Warp CG
    verdicts.update(cudss=(False, "its float32 test solve failed: LinearSolveError: x"), cupy=(False, "no cupy"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert linear._pick_auto(_FakeCuda(), wp.float32, {}) == (
            "cg", "cuDSS its float32 test solve failed: LinearSolveError: x")
    assert len(caught) == 1 and "using 'cg'" in str(caught[0].message)
    # cuDSS works: picked, nothing to report
    verdicts["cudss"] = (True, "")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert linear._pick_auto(_FakeCuda(), wp.float64, {}) == ("cudss", None)
    assert caught == []


def _hide_packages(monkeypatch, *names):
    """Make ``import name`` (and of its submodules) fail, as if the packages were not installed."""
    for key in [k for k in sys.modules if any(k == n or k.startswith(n + ".") for n in names)] + list(names):
        monkeypatch.setitem(sys.modules, key, None)


def test_probe_says_why_a_back_end_is_unusable(monkeypatch):
    monkeypatch.setattr(linear, "_probe_cache", {})
    _hide_packages(monkeypatch, "nvmath")
    ok, why = linear._probe("cudss", wp.get_device(), wp.float64)
    assert not ok and why.startswith("not importable: ") and "warp-meshad[cudss]" in why
    assert linear._probe("cudss", wp.get_device(), wp.float64) == (ok, why)  # cached


def test_missing_optional_packages_name_the_extra(monkeypatch):
    _hide_packages(monkeypatch, "cupy", "cupyx", "nvmath")
    with pytest.raises(ImportError, match=r"warp-meshad\[cudss\]"):
        make_linear_solver("cupy")
    with pytest.raises(ImportError, match=r"warp-meshad\[cudss\]"):
        make_linear_solver("cudss")


def test_input_validation_messages(device):
    A, dense, b_np, b, x = spd_system(n=6, seed=1, device=device)
    wrong = wp.zeros(6, dtype=wp.vec3f, device=device)
    with pytest.raises(TypeError, match="expected dtype vec3d"):
        ScipySolver().solve(A, wrong, x)
    with pytest.raises(ValueError, match=r"expected shape \(6,\), got \(5,\)"):
        ScipySolver().solve(A, b, wp.zeros(5, dtype=wp.vec3d, device=device))
    with pytest.raises(TypeError, match="BsrMatrix"):
        ScipySolver().solve(dense, b, x)


# ----------------------------------------------------------------------------------------------------------------------
# GPU (need a CUDA device whatever the test device; skipped, saying so, without one)
# ----------------------------------------------------------------------------------------------------------------------

_NEEDS = {"cupy": ("cupy", "the cupy back-end needs CuPy"),
          "cudss": ("nvmath", "the cudss back-end needs nvmath-python (pip install warp-meshad[cudss])")}


def _require_backend(name):
    if name in _NEEDS:
        pytest.importorskip(_NEEDS[name][0], reason=_NEEDS[name][1])


@pytest.mark.parametrize("name", ["scipy", "qdldl", "cudss"])
def test_resolve_reuses_the_last_factorization(device, name, monkeypatch):
    """resolve() solves for another right-hand side with the factors of the last solve (SciPy, QDLDL, cuDSS keep
    them): right answer, no factorization; after new values and a solve, the new factors."""
    if name == "cudss":
        if not device.startswith("cuda"):
            pytest.skip("cuDSS runs on a CUDA device (the test device is the CPU)")
        _require_backend(name)
    A, dense, b_np, b, x = spd_system(n=30, bs=3, seed=4, device=device)
    solver = make_linear_solver(name, device=device)
    solver.solve(A, b, x)
    b2_np = np.random.default_rng(5).standard_normal(b_np.size)
    b2 = wp.array(b2_np.reshape(-1, 3), dtype=b.dtype, device=device)
    if name == "scipy":
        import scipy.sparse.linalg as spla

        monkeypatch.setattr(spla, "splu", lambda *a, **k: pytest.fail("resolve refactored"))
    elif name == "qdldl":
        class NoUpdate:  # the kept factors; a refactorization would call update
            def __init__(self, ldl):
                self.solve = ldl.solve

            def update(self, *a, **k):
                pytest.fail("resolve refactored")

        monkeypatch.setattr(solver, "_ldl", NoUpdate(solver._ldl))
    info = solver.resolve(A, b2, x)
    np.testing.assert_allclose(_flat(x), np.linalg.solve(dense, b2_np), rtol=1e-8, atol=1e-9)
    assert info.factor_ms == 0.0
    monkeypatch.undo()
    _scale_values(A, 2.0)
    solver.solve(A, b, x)
    solver.resolve(A, b2, x)
    np.testing.assert_allclose(_flat(x), np.linalg.solve(2.0 * dense, b2_np), rtol=1e-8, atol=1e-9)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["cg", "cupy", "cudss", "scipy"])
@pytest.mark.parametrize("bs", [1, 3])
def test_gpu_backends_match_numpy(name, bs):
    _require_backend(name)
    A, dense, b_np, b, x = spd_system(n=60, bs=bs, seed=11, device="cuda:0")
    options = {"tol": 1e-12, "maxiter": 5000} if name == "cg" else {}
    solver = make_linear_solver(name, **options)
    info = solver.solve(A, b, x)
    np.testing.assert_allclose(_flat(x), np.linalg.solve(dense, b_np), rtol=1e-7, atol=1e-8)
    assert info.backend == name and info.converged
    # second solve with new values on the same pattern reuses the analysis
    _scale_values(A, 3.0)
    info2 = solver.solve(A, b, x)
    np.testing.assert_allclose(_flat(x), np.linalg.solve(3.0 * dense, b_np), rtol=1e-7, atol=1e-8)
    if name in ("cudss", "cupy", "scipy"):
        assert info2.analysis_ms <= info.analysis_ms + 5.0


@pytest.mark.gpu
@pytest.mark.parametrize("matrix_type", ["general", "symmetric", "spd"])
def test_gpu_cudss_matrix_types(matrix_type):
    _require_backend("cudss")
    A, dense, b_np, b, x = spd_system(n=50, seed=12, device="cuda:0")
    make_linear_solver("cudss", matrix_type=matrix_type).solve(A, b, x)
    np.testing.assert_allclose(_flat(x), np.linalg.solve(dense, b_np), rtol=1e-7, atol=1e-8)


@pytest.mark.gpu
def test_gpu_auto_picks_a_gpu_backend_and_says_why_not_cudss(monkeypatch):
    monkeypatch.setattr(linear, "_warned_auto", set())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        solver = make_linear_solver("auto", device="cuda:0")
    assert solver.name in ("cudss", "cupy", "cg")
    ours = [str(w.message) for w in caught if "cuDSS is not used" in str(w.message)]
    if solver.name == "cudss":
        assert solver.cudss_skipped_reason is None and ours == []
    else:
        # probed and failed: the reason (e.g. nvmath-python not importable) is a field and one warning
        assert solver.cudss_skipped_reason.startswith("cuDSS ") and len(ours) == 1
        assert solver.cudss_skipped_reason in ours[0]
    A, dense, b_np, b, x = spd_system(n=30, seed=13, device="cuda:0")
    solver.solve(A, b, x)
    np.testing.assert_allclose(_flat(x), np.linalg.solve(dense, b_np), rtol=1e-6, atol=1e-7)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["cudss", "cupy", "cg"])
def test_gpu_backends_work_from_any_thread(name):
    """A back-end is called from threads it was not made in (PyTorch's autograd thread, Ray's workers, a pool):
    first use, later solves and resolve() in a fresh thread each give the main thread's answer."""
    import threading

    _require_backend(name)
    A, dense, b_np, b, x = spd_system(n=40, bs=3, seed=13, device="cuda:0")
    options = {"tol": 1e-12, "maxiter": 5000} if name == "cg" else {}
    solver = make_linear_solver(name, **options)
    errors = []

    def in_thread(fn):
        def run():
            try:
                fn()
            except BaseException as exc:  # noqa: BLE001 (re-raised in the main thread)
                errors.append(exc)

        t = threading.Thread(target=run)
        t.start()
        t.join()
        if errors:
            raise errors[0]

    in_thread(lambda: solver.solve(A, b, x))  # the first use (cuDSS's analysis) in a thread
    np.testing.assert_allclose(_flat(x), np.linalg.solve(dense, b_np), rtol=1e-7, atol=1e-8)
    solver.solve(A, b, x)  # then in the main thread
    _scale_values(A, 2.0)
    in_thread(lambda: solver.solve(A, b, x))  # and again in another thread
    np.testing.assert_allclose(_flat(x), np.linalg.solve(2.0 * dense, b_np), rtol=1e-7, atol=1e-8)
    if name == "cudss":
        in_thread(lambda: solver.resolve(A, b, x))
        np.testing.assert_allclose(_flat(x), np.linalg.solve(2.0 * dense, b_np), rtol=1e-7, atol=1e-8)
