"""Linear back-ends: SciPy, QDLDL and Warp CG against numpy.linalg.solve on the test device ($WARP_MESHAD_TEST_DEVICE:
the host back-ends copy a GPU system to the host); CuPy/cuDSS/CG on a CUDA device (marked gpu); what 'auto' picks
and how it reports why it did not pick cuDSS."""

import math
import pathlib
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
    registry,
)
from warp_meshad._src.solve.linear.csr import _CsrBuffers

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
    csr = _CsrBuffers(A)
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
    monkeypatch.setattr(registry, "_probe", lambda name, device, dtype: verdicts[name])
    monkeypatch.setattr(registry, "_warned_auto", set())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = registry._pick_auto(_FakeCuda(), wp.float64, {})
        again = registry._pick_auto(_FakeCuda(), wp.float64, {})
    assert first == again == ("cupy", "cuDSS not importable: no nvmath here")
    assert [str(w.message) for w in caught] == [
        "linear_solver='auto' on cuda:7: cuDSS is not used (cuDSS not importable: no nvmath here); using 'cupy'"]
    # another reason is warned too; without CuPy, Warp CG
    verdicts.update(cudss=(False, "its float32 test solve failed: LinearSolveError: x"), cupy=(False, "no cupy"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert registry._pick_auto(_FakeCuda(), wp.float32, {}) == (
            "cg", "cuDSS its float32 test solve failed: LinearSolveError: x")
    assert len(caught) == 1 and "using 'cg'" in str(caught[0].message)
    # cuDSS works: picked, nothing to report
    verdicts["cudss"] = (True, "")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert registry._pick_auto(_FakeCuda(), wp.float64, {}) == ("cudss", None)
    assert caught == []


def _hide_packages(monkeypatch, *names):
    """Make ``import name`` (and of its submodules) fail, as if the packages were not installed."""
    for key in [k for k in sys.modules if any(k == n or k.startswith(n + ".") for n in names)] + list(names):
        monkeypatch.setitem(sys.modules, key, None)


def test_probe_says_why_a_back_end_is_unusable(monkeypatch):
    monkeypatch.setattr(registry, "_probe_cache", {})
    _hide_packages(monkeypatch, "nvmath")
    ok, why = registry._probe("cudss", wp.get_device(), wp.float64)
    assert not ok and why.startswith("not importable: ") and "warp-meshad[cudss]" in why
    assert registry._probe("cudss", wp.get_device(), wp.float64) == (ok, why)  # cached


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
# Factorizations serving several solves: reuse_factorization, float32 factors (SciPy, QDLDL here; cuDSS below)
# ----------------------------------------------------------------------------------------------------------------------


def _dense_of(A):
    """A (BSR, 3x3 or 1x1 blocks) as a dense numpy matrix."""
    nnz = A.nnz_sync()
    bs = A.block_shape[0]
    vals = A.values.numpy()[:nnz].reshape(nnz, bs, bs)
    offsets, columns = A.offsets.numpy(), A.columns.numpy()[:nnz]
    dense = np.zeros((A.nrow * bs, A.ncol * bs))
    for r in range(A.nrow):
        for t in range(offsets[r], offsets[r + 1]):
            c = columns[t]
            dense[r * bs : (r + 1) * bs, c * bs : (c + 1) * bs] = vals[t]
    return dense


def _perturb_diagonal(A, amount, seed):
    """Add ``amount`` times a random SPD block to every diagonal block of A, in place (same pattern: a new matrix of
    the sequence, SPD if A was, not a multiple of it)."""
    rng = np.random.default_rng(seed)
    nnz = A.nnz_sync()
    bs = A.block_shape[0]
    vals = A.values.numpy().copy()
    offsets, columns = A.offsets.numpy(), A.columns.numpy()
    for r in range(A.nrow):
        t = offsets[r] + int(np.flatnonzero(columns[offsets[r] : offsets[r + 1]] == r)[0])
        m = rng.standard_normal((bs, bs))
        vals[t] += amount * (m @ m.T + np.eye(bs)).reshape(vals[t].shape)
    A.values.assign(vals)
    return nnz


def _solve_sequence(solver, A, b, x, amounts, seed=0):
    """Solve A_k x = b for A_k = A_{k-1} + diagonal perturbation (amounts[k]); per solve: (info, relative error vs
    numpy, relative residual)."""
    out = []
    b_np = _flat(b).astype(np.float64)
    for k, amount in enumerate(amounts):
        if amount:
            _perturb_diagonal(A, amount, seed + k)
        info = solver.solve(A, b, x)
        dense = _dense_of(A)
        ref = np.linalg.solve(dense, b_np)
        err = np.linalg.norm(_flat(x) - ref) / np.linalg.norm(ref)
        res = np.linalg.norm(b_np - dense @ _flat(x)) / np.linalg.norm(b_np)
        out.append((info, err, res))
    return out


# small steps a kept factorization serves, a jump it cannot, then small steps again
_AMOUNTS = [0.0, 0.02, 0.02, 0.02, 0.02, 3.0, 0.02, 0.02]


@pytest.mark.parametrize("name", ["qdldl", "scipy"])
def test_reused_factorization_gives_the_fresh_solution(device, name):
    """reuse_factorization=3: every solve of an SPD sequence equals numpy's to the refinement tolerance; the small
    steps reuse the factors (at most 3 solves per factorization), the jump refactorizes early; the counters add up."""
    A, dense, b_np, b, x = spd_system(n=40, bs=3, seed=21, device=device)
    # refine_budget=None: no time rule (these factorizations take less than a millisecond: the rule would refactor)
    solver = make_linear_solver(name, reuse_factorization=3, refine_budget=None)
    assert solver.reuse_factorization == 3 and solver.refine_tol == 1e-10
    got = _solve_sequence(solver, A, b, x, _AMOUNTS)
    for info, err, res in got:
        assert res <= 1e-10 and err <= 1e-8, (info, err, res)
        assert info.iterations == 1 + info.refinement_iterations and info.factor_dtype == "float64"
        assert info.converged and info.residual_norm <= 1e-10 * np.linalg.norm(b_np)
    flags = [info.factorized for info, _, _ in got]
    assert flags[0] and not flags[1] and not flags[2] and flags[3]  # at most 3 solves per factorization
    assert flags[5]  # the jump: its PCG gives up, the call refactorizes
    assert solver.early_refactorizations >= 1 and got[5][0].refinement_iterations >= 1
    assert all(info.factor_ms == 0.0 for info, _, _ in got if not info.factorized)
    assert solver.factorizations == sum(flags) and solver.reused_solves == len(flags) - sum(flags)
    assert solver.reused_solves >= 3


def test_reuse_off_is_the_plain_solve(device):
    # reuse_factorization=1 (the default) factorizes every solve and reports as before: no refinement, no dtype
    A, dense, b_np, b, x = spd_system(n=30, seed=22, device=device)
    solver = QdldlSolver()
    got = _solve_sequence(solver, A, b, x, [0.0, 0.02, 0.02])
    assert all(info.factorized and info.iterations == 1 and info.factor_dtype is None for info, _, _ in got)
    assert all(err <= 1e-10 for _, err, _ in got)
    assert solver.factorizations == solver.reused_solves == 0  # counted by the options' path only


@pytest.mark.parametrize("name", ["qdldl", "scipy"])
def test_reused_factors_on_an_indefinite_sequence_stay_correct(device, name):
    """An indefinite symmetric sequence (no PCG): the refinement goes on as classic iterative refinement or gives up
    and refactorizes; every answer is still numpy's."""
    A, dense, b_np, b, x = spd_system(n=30, bs=3, seed=23, device=device, shift=-0.5)
    assert np.linalg.eigvalsh(dense).min() < 0
    solver = make_linear_solver(name, reuse_factorization=4, refine_budget=None)
    for info, err, res in _solve_sequence(solver, A, b, x, [0.0, 0.01, 0.01, 2.0, 0.01]):
        assert err <= 1e-8 and res <= 1e-10, (info, err, res)


def test_resolve_with_reused_factors_solves_the_current_matrix(device):
    # after a solve that reused older factors, resolve() (another right-hand side, same matrix) refines on the
    # current matrix too: numpy's answer, no factorization
    A, dense, b_np, b, x = spd_system(n=30, seed=24, device=device)
    solver = QdldlSolver(reuse_factorization=2, refine_budget=None)
    got = _solve_sequence(solver, A, b, x, [0.0, 0.02])
    assert not got[1][0].factorized
    b2_np = np.random.default_rng(3).standard_normal(b_np.size)
    b2 = wp.array(b2_np.reshape(-1, 3), dtype=b.dtype, device=device)
    info = solver.resolve(A, b2, x)
    np.testing.assert_allclose(_flat(x), np.linalg.solve(_dense_of(A), b2_np), rtol=1e-8, atol=1e-9)
    assert not info.factorized and info.factor_ms == 0.0 and solver.factorizations == 1
    # forget_factors(): the next solve factorizes
    solver.forget_factors()
    assert solver.solve(A, b, x).factorized and solver.factorizations == 2


def test_scipy_float32_factors_refine_to_float64_accuracy(device):
    """factor_dtype='float32': SuperLU of a float32 copy, refined in float64 to refine_tol: float64 accuracy (a
    float32 solve alone is ~1e-6 off), reported as float32 factors; combined with reuse too."""
    A, dense, b_np, b, x = spd_system(n=40, bs=3, seed=25, device=device)
    solver = ScipySolver(factor_dtype="float32")
    for info, err, res in _solve_sequence(solver, A, b, x, [0.0, 0.02, 3.0]):
        assert info.factorized and info.factor_dtype == "float32" and info.refinement_iterations >= 1
        assert err <= 1e-8 and res <= 1e-10, (info, err, res)
    assert solver.float64_fallbacks == 0 and solver.factorizations == 3
    both = ScipySolver(factor_dtype="float32", reuse_factorization=2, refine_budget=None)
    A, _, _, b, x = spd_system(n=40, bs=3, seed=25, device=device)
    got = _solve_sequence(both, A, b, x, [0.0, 0.02])
    assert [info.factorized for info, _, _ in got] == [True, False]
    assert all(info.factor_dtype == "float32" and err <= 1e-8 for info, err, _ in got)


def test_scipy_float32_factors_fall_back_to_float64_when_too_ill_conditioned(device):
    # condition number ~1e11: float32 factors cannot refine to the tolerance; the call factorizes in float64, says
    # so, and answers as a float64 solve does
    A, dense, b_np, b, x = spd_system(n=40, bs=3, seed=3, device=device, shift=1e-10)
    plain = wp.zeros_like(x)
    ScipySolver().solve(A, b, plain)
    solver = ScipySolver(factor_dtype="float32")
    info = solver.solve(A, b, x)
    assert solver.float64_fallbacks == 1 and info.factor_dtype == "float64" and info.factorized
    np.testing.assert_allclose(_flat(x), _flat(plain), rtol=1e-12, atol=0)


def test_reuse_options_are_checked_and_auto_passes_them():
    for bad in (0, 1.5, True, "2"):
        with pytest.raises(ValueError, match="reuse_factorization"):
            QdldlSolver(reuse_factorization=bad)
    with pytest.raises(ValueError, match="factor_dtype"):
        ScipySolver(factor_dtype="float16")
    with pytest.raises(ValueError, match="refine_tol"):
        ScipySolver(refine_tol=0.0)
    with pytest.raises(ValueError, match="refine_maxiter"):
        ScipySolver(refine_maxiter=0)
    with pytest.raises(ValueError, match="refine_budget"):
        ScipySolver(refine_budget=0.0)
    with pytest.raises(TypeError, match="factor_dtype"):
        make_linear_solver("qdldl", factor_dtype="float32")  # QDLDL factors in float64 only
    auto = make_linear_solver("auto", device="cpu", reuse_factorization=2)
    # what "auto" picks without options (QDLDL where it can run; SuperLU on a host whose Warp has no CPU compiler)
    assert auto.name == make_linear_solver("auto", device="cpu").name and auto.reuse_factorization == 2
    auto = make_linear_solver("auto", device="cpu", factor_dtype="float32")
    assert auto.name == "scipy" and auto.factor_dtype == "float32"


def _twisted_box(device, n=5):
    """Stable Neo-Hookean box (as benchmarks/newton_tet.py): x_min pinned, x_max turned 90 degrees and pulled 30%."""
    import warp_meshad as wm
    from warp_meshad.kernels.energies import (StableNeoHookeanData, stable_neo_hookean_F,
                                              stable_neo_hookean_F_hessian_proj)

    mesh = wm.TetMesh.box(n, n, n)
    X = mesh.vertices
    data = StableNeoHookeanData()
    data.rest_inverse = wp.array(mesh.rest_matrix_inverses(), dtype=wp.mat33d, device=device)
    data.volume = wp.array(mesh.volumes(), dtype=wp.float64, device=device)
    data.mu, data.lam = wp.float64(1.0e4), wp.float64(4.0e4)
    problem = wm.Problem(mesh.vertex_count, 3, dtype=wp.float64, device=device)
    problem.add_deformation_term(mesh.tets, stable_neo_hookean_F, rest_inverse=data.rest_inverse, data=data,
                                 projection=stable_neo_hookean_F_hessian_proj)  # fmt: skip
    lo, hi = np.flatnonzero(X[:, 0] < 1e-9), np.flatnonzero(X[:, 0] > 1.0 - 1e-9)
    x0 = X.copy()
    c, s = np.cos(np.pi / 2), np.sin(np.pi / 2)
    y, z = X[hi, 1] - 0.5, X[hi, 2] - 0.5
    x0[hi] = np.stack([1.3 * X[hi, 0], 0.5 + c * y - s * z, 0.5 + s * y + c * z], axis=1)
    return problem, wp.array(x0, dtype=wp.vec3d, device=device), np.concatenate([lo, hi])


def test_newton_with_reused_and_float32_factors_reaches_the_same_minimum(device):
    """Projected Newton on a twisted stable Neo-Hookean box: factors reused (QDLDL, k = 3; host and device loop) and
    float32 factors (SciPy) reach the plain solve's minimum within the Newton tolerance, in the same number of
    iterations (+-1); reused solves show as more than one solve with the factors per linear solve."""
    from warp_meshad._src.solve.solvers import NewtonSolver

    problem, x0, fixed = _twisted_box(device)
    e0 = problem.eval(x0)
    tol = 1e-9 * e0
    runs = {}
    for key, backend, loop in (("plain", QdldlSolver(), False),
                               ("reuse", QdldlSolver(reuse_factorization=3, refine_budget=None), False),
                               ("float32", ScipySolver(factor_dtype="float32"), False),
                               ("reuse_device_loop", QdldlSolver(reuse_factorization=3, refine_budget=None), True)):
        solver = NewtonSolver(problem, linear_solver=backend, fixed=fixed, device_loop=loop)
        result = solver.solve(x0, max_iterations=30, tolerance=tol)
        assert result.converged and result.reason == "newton_decrement", (key, result.reason)
        assert result.steepest_descent_fallbacks == 0 and result.linear_solves_capped == 0
        runs[key] = (result, backend)
    plain = runs["plain"][0]
    assert 5 <= plain.iterations <= 15
    for key in ("reuse", "float32", "reuse_device_loop"):
        result, backend = runs[key]
        assert abs(result.iterations - plain.iterations) <= 1, (key, result.iterations, plain.iterations)
        assert abs(result.energies[-1] - plain.energies[-1]) <= tol, key
        np.testing.assert_allclose(result.x.numpy(), plain.x.numpy(), rtol=0, atol=1e-6)
    reuse = runs["reuse"][1]
    assert reuse.reused_solves >= 1 and reuse.factorizations + reuse.reused_solves == len(runs["reuse"][0].linear_iterations)
    assert max(runs["reuse"][0].linear_iterations) > 1  # a reused solve: x0 and its PCG iterations
    assert runs["float32"][1].float64_fallbacks == 0 and min(runs["float32"][0].linear_iterations) >= 1


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


def _indefinite_system(n, seed, device):
    """A symmetric indefinite but invertible block system (3x3 blocks): the SPD test system shifted by the midpoint of
    two neighbouring eigenvalues a third up its spectrum (a third of the eigenvalues negative, none near zero)."""
    _, dense, b_np, b, x = spd_system(n=n, seed=seed, device=device)
    eig = np.linalg.eigvalsh(dense)
    k = dense.shape[0] // 3
    dense = dense - 0.5 * (eig[k - 1] + eig[k]) * np.eye(dense.shape[0])
    blocks = dense.reshape(n, 3, n, 3).transpose(0, 2, 1, 3)
    rows, cols = np.nonzero(np.abs(blocks).sum(axis=(2, 3)))
    A = wps.bsr_from_triplets(n, n, wp.array(rows.astype(np.int32), dtype=int, device=device),
                              wp.array(cols.astype(np.int32), dtype=int, device=device),
                              wp.array(blocks[rows, cols], dtype=wp.mat33d, device=device))
    return A, dense, b_np, b, x


@pytest.mark.gpu
def test_gpu_cudss_spd_or_general_keeps_cholesky_on_spd_and_falls_back_to_lu_otherwise():
    """``matrix_type="spd_or_general"``: an SPD sequence stays on Cholesky; an indefinite invertible matrix fails
    Cholesky on its first factorization and is solved by LU (the right answer, then LU for good), in
    :meth:`solve` and in :meth:`solve_deferred` alike."""
    _require_backend("cudss")
    from warp_meshad._src.solve.linear import CudssSolver

    A, dense, b_np, b, x = spd_system(n=50, seed=21, device="cuda:0")
    solver = CudssSolver(matrix_type="spd_or_general")
    for factor in (1.0, 2.0):
        _scale_values(A, factor)
        solver.solve(A, b, x)
    assert solver.active_matrix_type == "spd"
    np.testing.assert_allclose(_flat(x), np.linalg.solve(2.0 * dense, b_np), rtol=1e-7, atol=1e-8)
    for deferred in (False, True):
        A, dense, b_np, b, x = _indefinite_system(50, 22, "cuda:0")
        assert np.linalg.eigvalsh(dense).min() < 0.0
        solver = CudssSolver(matrix_type="spd_or_general")
        if deferred:
            residual_sq = wp.zeros(1, dtype=wp.float64, device="cuda:0")
            solver.solve_deferred(A, b, x, residual_sq)
            assert math.isfinite(residual_sq.numpy()[0])
        else:
            solver.solve(A, b, x)
        assert solver.active_matrix_type == "general"
        np.testing.assert_allclose(_flat(x), np.linalg.solve(dense, b_np), rtol=1e-7, atol=1e-8)


def _shift_diagonal(A, shift):
    """Subtract ``shift`` from A's diagonal in place (same pattern: the diagonal blocks are stored)."""
    nnz = A.nnz_sync()
    offsets, columns, vals = A.offsets.numpy(), A.columns.numpy()[:nnz], A.values.numpy().copy()
    rows = np.repeat(np.arange(A.nrow), np.diff(offsets))
    diagonal = np.flatnonzero(rows == columns)
    assert len(diagonal) == A.nrow
    vals[diagonal] -= shift * np.eye(3)
    A.values.assign(vals)


@pytest.mark.gpu
def test_gpu_cudss_spd_or_general_goes_to_lu_when_a_later_cholesky_is_wrong():
    """``spd_or_general`` after a good first Cholesky: new values on the same pattern that are indefinite make the
    next Cholesky fail or come out wrong. :meth:`solve` checks the residual and redoes the solve with LU; inside
    :meth:`solve_deferred` the queued residual misses :attr:`direction_rtol` and :meth:`direction_rejected` switches
    to LU (what the device loop does), after which the solve is right."""
    _require_backend("cudss")
    from warp_meshad._src.solve.linear import CudssSolver

    for deferred in (False, True):
        A, dense, b_np, b, x = spd_system(n=50, seed=24, device="cuda:0")
        solver = CudssSolver(matrix_type="spd_or_general")
        solver.solve(A, b, x)
        assert solver.active_matrix_type == "spd" and solver.direction_rtol == CudssSolver.SPD_CHECK_RTOL
        eig = np.linalg.eigvalsh(dense)
        shift = 0.5 * (eig[49] + eig[50])  # a third of the spectrum negative
        _shift_diagonal(A, shift)
        expected = np.linalg.solve(dense - shift * np.eye(150), b_np)
        if deferred:
            residual_sq = wp.zeros(1, dtype=wp.float64, device="cuda:0")
            solver.solve_deferred(A, b, x, residual_sq)
            r2 = residual_sq.numpy()[0]
            assert not (r2 <= (solver.direction_rtol * np.linalg.norm(b_np)) ** 2), r2
            assert solver.direction_rejected() and not solver.direction_rejected()  # once: LU is for good
            assert solver.direction_rtol == 0.0
            solver.solve_deferred(A, b, x, residual_sq)
        else:
            solver.solve(A, b, x)
        assert solver.active_matrix_type == "general"
        np.testing.assert_allclose(_flat(x), expected, rtol=1e-7, atol=1e-8)


@pytest.mark.gpu
def test_gpu_cudss_user_permutation_gives_the_same_solution():
    """A user ordering (the reverse order, and cuDSS's own handed back) is used by the analysis and solves as well."""
    _require_backend("cudss")
    from warp_meshad._src.solve.linear import CudssSolver

    A, dense, b_np, b, x = spd_system(n=40, seed=23, device="cuda:0")
    plain = CudssSolver()
    plain.solve(A, b, x)
    own = np.array(plain._solver.plan_info.row_permutation, dtype=np.int32)
    for perm in (np.arange(dense.shape[0])[::-1].copy(), own):
        solver = CudssSolver(permutation=perm)
        solver.solve(A, b, x)
        np.testing.assert_allclose(_flat(x), np.linalg.solve(dense, b_np), rtol=1e-7, atol=1e-8)
        np.testing.assert_array_equal(np.asarray(solver._solver.plan_info.row_permutation), perm)


@pytest.mark.gpu
def test_gpu_cudss_direct_calls_give_nvmath_calls_answers():
    """Direct cuDSS calls (the default) and nvmath's calls: the same solutions over a sequence of values, in solve,
    solve_deferred (with its queued residual), resolve, a right-hand side that is the solution array, and the
    refinement of reused factors (nvmath's solve() on factors made by a direct call)."""
    _require_backend("cudss")
    from warp_meshad._src.solve.linear import CudssSolver

    A, dense, b_np, b, x = spd_system(n=45, seed=31, device="cuda:0")
    direct, wrapped = CudssSolver(), CudssSolver(direct_calls=False)
    assert direct._direct and not wrapped._direct
    residual_sq = wp.zeros(1, dtype=wp.float64, device="cuda:0")
    for factor in (1.0, 1.5):
        _scale_values(A, factor)
        want = np.linalg.solve(factor * dense, b_np) if factor == 1.0 else np.linalg.solve(1.5 * dense, b_np)
        for solver in (direct, wrapped):
            x.zero_()
            info = solver.solve(A, b, x)
            np.testing.assert_allclose(_flat(x), want, rtol=1e-9, atol=1e-10)
            assert info.residual_norm <= 1e-9 * np.linalg.norm(b_np)
            x.zero_()
            solver.solve_deferred(A, b, x, residual_sq)
            np.testing.assert_allclose(_flat(x), want, rtol=1e-9, atol=1e-10)
            assert residual_sq.numpy()[0] <= 1e-18 * float(b_np @ b_np)
    b2_np = np.random.default_rng(32).standard_normal(b_np.size)
    same = wp.array(b2_np.reshape(-1, 3), dtype=b.dtype, device="cuda:0")
    direct.resolve(A, same, same)  # b is x: copied into the plan's buffer first
    np.testing.assert_allclose(_flat(same), np.linalg.solve(1.5 * dense, b2_np), rtol=1e-9, atol=1e-10)
    reused = CudssSolver(matrix_type="spd", reuse_factorization=2, refine_budget=None)
    for factor in (1.0, 1.01):
        _scale_values(A, factor)
        info = reused.solve(A, b, x)
    assert not info.factorized and info.refinement_iterations >= 1
    np.testing.assert_allclose(_flat(x), np.linalg.solve(1.5 * 1.01 * dense, b_np), rtol=1e-8, atol=1e-9)


@pytest.mark.gpu
def test_gpu_cudss_analysis_cache_hands_back_ordering_and_tree(tmp_path):
    """``analysis_cache``: the first solver of a pattern writes its ordering and partition tree; a new solver of the
    same pattern takes them (a hit), solves the same and gets factors of the same size; another pattern or matrix
    type is another entry; an unreadable entry is a miss and is rewritten."""
    _require_backend("cudss")
    from warp_meshad._src.solve.linear import CudssSolver

    A, dense, b_np, b, x = spd_system(n=60, seed=33, device="cuda:0")
    first = CudssSolver(analysis_cache=tmp_path)
    first.solve(A, b, x)
    assert first.analysis_cache_hit is False
    files = sorted(tmp_path.glob("*.npz"))
    assert len(files) == 1
    nnz = int(first._solver.factorization_info.lu_nnz)
    again = CudssSolver(analysis_cache=tmp_path)
    again.solve(A, b, x)
    assert again.analysis_cache_hit is True
    np.testing.assert_allclose(_flat(x), np.linalg.solve(dense, b_np), rtol=1e-9, atol=1e-10)
    assert int(again._solver.factorization_info.lu_nnz) == nnz
    np.testing.assert_array_equal(np.asarray(again._solver.plan_info.row_permutation),
                                  np.asarray(first._solver.plan_info.row_permutation))
    CudssSolver(analysis_cache=tmp_path, matrix_type="spd").solve(A, b, x)
    A2, dense2, b2_np, b2, x2 = spd_system(n=61, seed=33, device="cuda:0")
    CudssSolver(analysis_cache=tmp_path).solve(A2, b2, x2)
    assert len(list(tmp_path.glob("*.npz"))) == 3
    files[0].write_bytes(b"not an npz")
    broken = CudssSolver(analysis_cache=tmp_path)
    broken.solve(A, b, x)
    assert broken.analysis_cache_hit is False
    np.testing.assert_allclose(_flat(x), np.linalg.solve(dense, b_np), rtol=1e-9, atol=1e-10)
    with np.load(files[0]) as f:  # rewritten
        assert f["perm"].shape == (dense.shape[0],) and f["tree"].size > 0


def test_cudss_analysis_cache_default_follows_the_environment(monkeypatch, tmp_path):
    """``CudssSolver(analysis_cache=None)``: Warp's kernel cache by default, the folder or "off" the environment
    variable names; False is off whatever the environment says."""
    from warp_meshad._src.solve.linear import ANALYSIS_CACHE_FOLDER, ANALYSIS_CACHE_VARIABLE
    from warp_meshad._src.solve.linear.cudss_analysis_cache import _check_analysis_cache_option

    monkeypatch.delenv(ANALYSIS_CACHE_VARIABLE, raising=False)
    wp.init()
    assert _check_analysis_cache_option(None) == pathlib.Path(wp.config.kernel_cache_dir) / ANALYSIS_CACHE_FOLDER
    assert _check_analysis_cache_option(False) is None
    assert _check_analysis_cache_option(tmp_path) == tmp_path
    for off in ("0", "off"):
        monkeypatch.setenv(ANALYSIS_CACHE_VARIABLE, off)
        assert _check_analysis_cache_option(None) is None
    monkeypatch.setenv(ANALYSIS_CACHE_VARIABLE, str(tmp_path))
    assert _check_analysis_cache_option(None) == tmp_path


def test_cudss_analysis_cache_keeps_to_its_size_limit_least_recently_used_first(monkeypatch, tmp_path):
    """Past ``WARP_MESHAD_CUDSS_ANALYSIS_CACHE_MB`` the entries used least recently go first (a hit touches its
    entry: ``_apply_cached_analysis``), never the one just written; other files stay; a bad limit names the
    variable."""
    import os
    import types

    from warp_meshad._src.solve.linear import ANALYSIS_CACHE_LIMIT_VARIABLE
    from warp_meshad._src.solve.linear.cudss_analysis_cache import (_analysis_cache_limit_bytes,
                                                                    _apply_cached_analysis, _prune_analysis_cache)

    monkeypatch.delenv(ANALYSIS_CACHE_LIMIT_VARIABLE, raising=False)
    assert _analysis_cache_limit_bytes() == 1024 * 1024 * 1024
    monkeypatch.setenv(ANALYSIS_CACHE_LIMIT_VARIABLE, "0.5")
    assert _analysis_cache_limit_bytes() == 512 * 1024
    for bad in ("lots", "-1"):
        monkeypatch.setenv(ANALYSIS_CACHE_LIMIT_VARIABLE, bad)
        with pytest.raises(ValueError, match=f"{ANALYSIS_CACHE_LIMIT_VARIABLE}: expected a number of MiB"):
            _analysis_cache_limit_bytes()
    n = 1000  # 4 kB of ordering per entry
    paths = []
    for k in range(5):
        path = tmp_path / f"entry{k}.npz"
        np.savez(path, perm=np.arange(n, dtype=np.int32), tree=np.ones(16, dtype=np.uint8))
        os.utime(path, (1000.0 + k, 1000.0 + k))  # entry0 the oldest
        paths.append(path)
    (tmp_path / "notes.txt").write_bytes(b"x" * 100_000)  # not an entry: never counted nor deleted
    size = paths[0].stat().st_size
    # a hit on entry0 makes it the most recently used
    fake = types.SimpleNamespace(DataParam=types.SimpleNamespace(USER_PERM=0, USER_ND_PARTITION_TREE=1),
                                 data_set=lambda *args: None)
    assert _apply_cached_analysis(fake, types.SimpleNamespace(handle=0, data_ptr=0), paths[0], n)
    deleted = _prune_analysis_cache(tmp_path, 2 * size, keep=paths[1])
    assert sorted(deleted) == sorted(str(p) for p in (paths[2], paths[3], paths[4]))  # entry1 kept: just written
    assert paths[0].exists() and paths[1].exists() and (tmp_path / "notes.txt").exists()
    assert _prune_analysis_cache(tmp_path, 2 * size) == []  # within the limit: nothing to do


def test_cudss_permutation_option_is_checked():
    from warp_meshad._src.solve.linear import CudssSolver

    with pytest.raises(ValueError, match="1-D int array"):
        CudssSolver(permutation=np.zeros((2, 2), dtype=np.int32))
    with pytest.raises(ValueError, match="each of 0..2 once"):
        CudssSolver(permutation=[0, 0, 2])
    with pytest.raises(ValueError, match="matrix_type: expected one of"):
        CudssSolver(matrix_type="cholesky")
    with pytest.raises(ValueError, match="handle: expected None or a cuDSS handle"):
        CudssSolver(handle="0x1")
    with pytest.raises(ValueError, match="handle: expected None with factor_dtype='float32'"):
        CudssSolver(handle=1, factor_dtype="float32")
    with pytest.raises(ValueError, match="analysis_cache: expected None, False, 'auto' or a folder"):
        CudssSolver(analysis_cache=3)
    with pytest.raises(ValueError, match="direct_calls: expected a bool"):
        CudssSolver(direct_calls="yes")
    with pytest.raises(ValueError, match="deterministic: expected a bool"):
        CudssSolver(deterministic=1)
    with pytest.raises(ValueError, match=r"config: expected None or a dict \{name: int\}, got list"):
        CudssSolver(config=[("nd_nlevels", 2)])
    with pytest.raises(ValueError, match=r"config\['factorization_alg'\]: expected an int, got 'alg_1'"):
        CudssSolver(config={"factorization_alg": "alg_1"})


def test_cudss_config_from_the_environment_is_checked(monkeypatch):
    """``CudssSolver(config=None)`` reads ``WARP_MESHAD_CUDSS_CONFIG`` (JSON); a bad value names the variable."""
    from warp_meshad._src.solve.linear import CONFIG_VARIABLE
    from warp_meshad._src.solve.linear.cudss import _check_cudss_config_option

    monkeypatch.delenv(CONFIG_VARIABLE, raising=False)
    assert _check_cudss_config_option(None) == {}
    monkeypatch.setenv(CONFIG_VARIABLE, '{"ND_NLEVELS": 2, "factorization_alg": 1}')
    assert _check_cudss_config_option(None) == {"nd_nlevels": 2, "factorization_alg": 1}
    assert _check_cudss_config_option({"solve_alg": 3}) == {"solve_alg": 3}  # the argument wins
    monkeypatch.setenv(CONFIG_VARIABLE, "nd_nlevels=2")
    with pytest.raises(ValueError, match="WARP_MESHAD_CUDSS_CONFIG: expected a JSON object .* got 'nd_nlevels=2'"):
        _check_cudss_config_option(None)
    monkeypatch.setenv(CONFIG_VARIABLE, '{"nd_nlevels": 2.5}')
    with pytest.raises(ValueError, match=r"WARP_MESHAD_CUDSS_CONFIG\['nd_nlevels'\]: expected an int, got 2.5"):
        _check_cudss_config_option(None)


@pytest.mark.gpu
def test_gpu_auto_picks_a_gpu_backend_and_says_why_not_cudss(monkeypatch):
    monkeypatch.setattr(registry, "_warned_auto", set())
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


_CUDSS_OPTIONS = [
    {"reuse_factorization": 3, "refine_budget": None},
    {"factor_dtype": "float32"},
    {"factor_dtype": "float32", "reuse_factorization": 2, "refine_budget": None},
    {"matrix_type": "spd", "reuse_factorization": 3, "refine_budget": None},
    {"execution": "hybrid"},
    {"deterministic": True},
    {"config": {"nd_nlevels": 2}},
]


@pytest.mark.gpu
@pytest.mark.parametrize("options", _CUDSS_OPTIONS, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()))
def test_gpu_cudss_options_give_the_plain_solution(options):
    """cuDSS with reused factors, float32 factors (refined in float64), both, and hybrid execution: every solve of an
    SPD sequence equals numpy's and plain cuDSS's to the refinement tolerance; reuse and float32 show in the infos;
    the options' solves synchronize (defers_checks False), plain and hybrid cuDSS defer."""
    _require_backend("cudss")
    from warp_meshad._src.solve.linear import CudssSolver

    A, dense, b_np, b, x = spd_system(n=60, bs=3, seed=31, device="cuda:0")
    A2, _, _, b2, x2 = spd_system(n=60, bs=3, seed=31, device="cuda:0")
    solver, plain = CudssSolver(**options), CudssSolver()
    got = _solve_sequence(solver, A, b, x, _AMOUNTS)
    ref = _solve_sequence(plain, A2, b2, x2, _AMOUNTS)
    for (info, err, res), (_, err_plain, _) in zip(got, ref):
        assert err <= 1e-8 and res <= 1e-10 and err_plain <= 1e-10, (info, err, res, err_plain)
    flags = [info.factorized for info, _, _ in got]
    reuse = options.get("reuse_factorization", 1)
    float32 = options.get("factor_dtype") == "float32"
    assert solver.defers_checks == (reuse == 1 and not float32)
    if reuse > 1:
        assert not all(flags) and solver.reused_solves == flags.count(False) >= 2
    else:
        assert all(flags)
    if float32:
        assert all(info.factor_dtype == "float32" for info, _, _ in got) and solver.float64_fallbacks == 0
    np.testing.assert_allclose(_flat(x), _flat(x2), rtol=1e-8, atol=1e-10)


@pytest.mark.gpu
def test_gpu_cudss_config_names_are_checked_and_key_the_analysis_cache(tmp_path):
    """``config`` names are cuDSS's ``ConfigParam`` members (an unknown one is refused with the list); a solver with
    a config does not take another's cached analysis (the cache keys on it)."""
    _require_backend("cudss")
    from warp_meshad._src.solve.linear import CudssSolver

    with pytest.raises(ValueError, match=r"config: unknown cuDSS configuration \['nd_levels'\] .*nd_nlevels"):
        CudssSolver(config={"nd_levels": 2})
    A, dense, b_np, b, x = spd_system(n=60, bs=3, seed=5, device="cuda:0")
    plain = CudssSolver(analysis_cache=tmp_path)
    plain.solve(A, b, x)
    assert plain.analysis_cache_hit is False
    other = CudssSolver(analysis_cache=tmp_path, config={"nd_nlevels": 2})
    other.solve(A, b, x)
    assert other.analysis_cache_hit is False  # its own entry
    np.testing.assert_allclose(_flat(x), np.linalg.solve(dense, b_np), rtol=1e-8, atol=1e-10)
    again = CudssSolver(analysis_cache=tmp_path, config={"ND_NLEVELS": 2})
    again.solve(A, b, x)
    assert again.analysis_cache_hit is True


@pytest.mark.gpu
def test_gpu_newton_with_cudss_options_reaches_the_same_minimum():
    """The twisted stable Neo-Hookean box on the GPU: cuDSS with reused factors (host and device loop) and with
    float32 factors reaches plain cuDSS's minimum within the Newton tolerance, iterations within one."""
    _require_backend("cudss")
    from warp_meshad._src.solve.linear import CudssSolver
    from warp_meshad._src.solve.solvers import NewtonSolver

    problem, x0, fixed = _twisted_box("cuda:0")
    e0 = problem.eval(x0)
    tol = 1e-9 * e0
    results = {}
    for key, options, loop in (("plain", {}, False), ("reuse", {"reuse_factorization": 3}, False),
                               ("float32", {"factor_dtype": "float32"}, False),
                               ("reuse_device_loop", {"reuse_factorization": 3}, True)):
        backend = CudssSolver(**options)
        result = NewtonSolver(problem, linear_solver=backend, fixed=fixed, device_loop=loop).solve(
            x0, max_iterations=30, tolerance=tol)
        assert result.converged and result.steepest_descent_fallbacks == 0, (key, result.reason)
        results[key] = result
    plain = results["plain"]
    for key, result in results.items():
        assert abs(result.iterations - plain.iterations) <= 1, (key, result.iterations, plain.iterations)
        assert abs(result.energies[-1] - plain.energies[-1]) <= tol, key
        np.testing.assert_allclose(result.x.numpy(), plain.x.numpy(), rtol=0, atol=1e-6)


@pytest.mark.gpu
@pytest.mark.parametrize("loop", [False, True])
def test_gpu_newton_with_pins_factorizes_by_cholesky_and_reaches_lus_minimum(loop):
    """Projected Newton with pinned variables and ``linear_solver="auto"`` gets cuDSS's ``spd_or_general``, stays on
    Cholesky on the twisted box and reaches LU's minimum; without pins it keeps LU."""
    _require_backend("cudss")
    from warp_meshad._src.solve.linear import CudssSolver
    from warp_meshad._src.solve.solvers import NewtonSolver

    problem, x0, fixed = _twisted_box("cuda:0")
    tol = 1e-9 * problem.eval(x0)
    auto = NewtonSolver(problem, fixed=fixed, device_loop=loop)
    assert auto.linear_solver.name == "cudss" and auto.linear_solver.matrix_type == "spd_or_general"
    lu = NewtonSolver(problem, linear_solver=CudssSolver(), fixed=fixed, device_loop=loop)
    got, ref = (s.solve(x0, max_iterations=30, tolerance=tol) for s in (auto, lu))
    assert got.converged and ref.converged and got.steepest_descent_fallbacks == 0
    assert auto.linear_solver.active_matrix_type == "spd"
    assert abs(got.iterations - ref.iterations) <= 1
    assert abs(got.energies[-1] - ref.energies[-1]) <= tol
    np.testing.assert_allclose(got.x.numpy(), ref.x.numpy(), rtol=0, atol=1e-6)
    assert NewtonSolver(problem).linear_solver.matrix_type == "general"

