"""The benchmarks' correctness checks at a tiny size (no timing): every Warp method agrees with the reference, and the
reference with central differences in float64."""

import pathlib
import sys

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `benchmarks` is a folder of the checkout, not an installed package
    sys.path.insert(0, str(ROOT))

from benchmarks import area_smoothing, assembly_auto, assembly_choice, param_hvp, smoothing_hand, tet_hand  # noqa: E402

WARP_AREA = ["warp_meshad", "handwritten", "warp_tape"]
WARP_HVP = ["warp_meshad", "warp_meshad_assembled", "warp_meshad_assemble_spmv"]


def _central_gradient(energy, X: np.ndarray, h: float = 1e-6) -> np.ndarray:
    """Central differences (energy(X + h e) - energy(X - h e)) / 2h of a NumPy energy, entry by entry of X (n, 3)."""
    fd = np.zeros_like(X)
    for i in range(X.shape[0]):
        for c in range(X.shape[1]):
            d = np.zeros_like(X)
            d[i, c] = h
            fd[i, c] = (energy(X + d) - energy(X - d)) / (2 * h)
    return fd


def test_area_smoothing_warp_methods_agree(device):
    case = area_smoothing.Case(5, device)
    ready, errors = area_smoothing.check(case, WARP_AREA, verbose=False)
    assert sorted(ready) == sorted(WARP_AREA)
    assert max(errors.values()) <= 1e-5, errors

    # the reference (handwritten) against central differences of the float64 area at the same float32 positions
    run, result, _, _ = area_smoothing.SETUP["handwritten"](case)
    run()
    energy, grad = result()
    X = case.X.astype(np.float64)

    def area(p):
        return float(area_smoothing.area_energy(p, case.faces_np, np.sqrt))

    np.testing.assert_allclose(energy, area(X), rtol=1e-6)
    fd = _central_gradient(area, X)
    assert np.abs(fd[:, 2]).max() > 1e-2  # the z-noise makes the gradient non-trivial out of the plane
    np.testing.assert_allclose(grad, fd, rtol=0, atol=1e-5 * np.abs(fd).max())


@pytest.mark.parametrize("energy", smoothing_hand.ENERGIES)
def test_smoothing_hand_agrees_with_ad_and_central_differences(device, energy):
    case = smoothing_hand.Case.grid(4, device)
    _, errors, results = smoothing_hand.check(case, energy, verbose=False)  # raises beyond 1e-12
    assert errors["hand"] <= 1e-12, errors

    # the hand-written kernel against central differences of the NumPy energy, float64
    f, g = results["hand"]
    X = case.X

    def energy_of(p):
        return smoothing_hand.smoothing_energy(p, case.mesh, energy)

    np.testing.assert_allclose(f, energy_of(X), rtol=1e-12)
    fd = _central_gradient(energy_of, X)
    assert np.abs(fd[:, 2]).max() > 1e-3  # the z-noise makes the gradient non-trivial out of the plane
    np.testing.assert_allclose(g, fd, rtol=0, atol=1e-7 * np.abs(fd).max())


@pytest.mark.parametrize("case", assembly_choice.CASES)
def test_assembly_choice_problems_agree(device, case):
    # the default and the deterministic problem of each case give the same energy, gradient and Hessian
    errors = assembly_choice.run_case(case, 6, device, runs=1, records=[], check_only=True)
    assert max(errors) <= 1e-5, errors


@pytest.mark.parametrize("case", ["tet_F", "springs_f64"])
def test_assembly_auto_variants_agree(device, case):
    # the atomic, tiled and tiled-rounds Hessians of one term agree (run_case asserts it, returns the errors)
    errors = assembly_auto.run_case(case, device, 1, [], small=True, check_only=True)
    assert sorted(errors) == ["atomic", "rounds", "tiled"] and max(errors.values()) < 1e-12


def test_tet_hand_kernel_and_the_F_path_agree_with_the_corner_path(device):
    # run_size asserts the hand-written kernel's and the F paths' (auto, atomic, tiled) energy, gradient and Hessian
    # within 1e-12 (relative), the analytic projections' projected Hessians within 1e-9 of the Jacobi one
    records = []
    tet_hand.run_size(3, device, 1, records, "auto")
    assert [r["method"] for r in records] == list(tet_hand.METHODS)
    exact = [r["check_rel_error"] for r in records if "check_rel_error" in r and "analytic" not in r["method"]]
    assert len(exact) == 4 and max(exact) < 1e-12
    analytic = [r["check_rel_error"] for r in records if "analytic" in r["method"]]
    assert len(analytic) == 3 and max(analytic) < 1e-9  # the analytic projection against the Jacobi one


def test_param_hvp_warp_methods_agree(device):
    case = param_hvp.Case(5, device, "float32")
    ready, errors = param_hvp.check(case, WARP_HVP, verbose=False)
    assert sorted(ready) == sorted(WARP_HVP)
    assert max(errors.values()) <= 1e-5, errors

    # w^T H v against a float64 central second difference of the energy, for two directions w
    run, result, _, _ = param_hvp.SETUP["warp_meshad"](case, {})
    run()
    hv = result().astype(np.float64)
    U, V = case.U.astype(np.float64), case.V.astype(np.float64)
    rinv, area = case.rinv_np.astype(np.float64), case.area_np.astype(np.float64)

    def energy(p):
        return float(param_hvp.sd_energy(p, case.faces_np, rinv, area, np.where))

    rng = np.random.default_rng(1)
    h = 1e-4
    for w in (V, rng.normal(size=V.shape)):
        fd = (energy(U + h * V + h * w) - energy(U + h * V - h * w) - energy(U - h * V + h * w)
              + energy(U - h * V - h * w)) / (4 * h * h)
        np.testing.assert_allclose(np.sum(w * hv), fd, rtol=1e-4)


@pytest.mark.parametrize("baseline", ["jax", "torch"])
def test_baselines_agree_when_installed(baseline, device, capsys):
    pytest.importorskip(baseline, reason=f"{baseline} (a benchmark baseline) is not installed")
    checks = ((area_smoothing.check, area_smoothing.Case(5, device), "handwritten"),
              (param_hvp.check, param_hvp.Case(5, device, "float32"), "warp_meshad"))
    for check, case, reference in checks:
        capsys.readouterr()
        _, errors = check(case, [reference, baseline], verbose=False)  # raises if they disagree beyond 1e-5
        if baseline in errors:
            assert errors[baseline] <= 1e-5
        else:  # left out, saying so, only where the library has no backend for a GPU
            assert device != "cpu" and f"{baseline}: skipped" in capsys.readouterr().out


def test_shells_pile_resumes_where_it_stopped(device, tmp_path, monkeypatch):
    """A run continued from a checkpoint ends where an uninterrupted run does (the lent GPU host stops a command
    after 10 minutes; spot_pile takes longer)."""
    from benchmarks import shells_pile

    monkeypatch.setenv("BENCH_OUT", str(tmp_path / "out"))
    base = ["--config", "shells/spot_drop", "--device", device, "--set", "layout=[1,1,1]", "iterations=3"]
    shells_pile.main(base + ["--steps", "1", "--checkpoint", str(tmp_path / "a")])
    resumed = shells_pile.main(base + ["--steps", "2", "--checkpoint", str(tmp_path / "a")])
    whole = shells_pile.main(base + ["--steps", "2", "--checkpoint", str(tmp_path / "b")])
    assert resumed["resumed_at"] == 1 and resumed["steps_taken"] == 2 and whole["resumed_at"] == 0
    a, b = np.load(tmp_path / "a" / "state.npz"), np.load(tmp_path / "b" / "state.npz")
    assert int(a["steps_done"]) == int(b["steps_done"]) == 2
    np.testing.assert_allclose(a["x"], b["x"], rtol=0, atol=1e-12)
    np.testing.assert_allclose(a["v"], b["v"], rtol=0, atol=1e-9)


def test_newton_tet_variants_reach_the_same_minimum(device, tmp_path, monkeypatch):
    """benchmarks/newton_tet at a 4^3 box: every linear variant (plain, reused and float32 factors; cuDSS's too on a
    CUDA device with nvmath) converges to the first variant's minimum, and the phases per iteration add up."""
    from benchmarks import newton_tet

    monkeypatch.setenv("BENCH_OUT", str(tmp_path))
    variants = ["qdldl", "qdldl_reuse2", "scipy_f32"]
    if device != "cpu":
        pytest.importorskip("nvmath", reason="the cudss variants need nvmath-python (pip install warp-meshad[cudss])")
        variants = ["cudss", "cudss_f32", "cudss_reuse2", "cudss_hybrid"] + variants
    records = newton_tet.main(["--device", device, "--sizes", "4", "--variants", ",".join(variants), "--runs", "1",
                               "--no-warm-up"])
    assert (tmp_path / "newton_tet.json").exists()
    runs = {r["method"]: r for r in records if r["method"] in variants}
    assert sorted(runs) == sorted(variants), [r.get("error") for r in records]
    first = runs[variants[0]]
    assert first["converged"] and 5 <= first["newton_iterations"] <= 12
    for name, r in runs.items():
        assert r["converged"] and abs(r["newton_iterations"] - first["newton_iterations"]) <= 1, name
        assert abs(r["energy_minus_first"]) <= r["tolerance"] and r["max_abs_x_minus_first"] <= 1e-6, name
        assert r["max_relative_residual"] <= 1e-9, name
        rows = r["iterations_detail"]
        assert len(rows) == len(r["linear_iterations"]) and [row["iteration"] for row in rows] == list(range(len(rows)))
        assert r["factorized_iterations"] + r["reused_solves"] == len(rows)
        for row in rows:
            assert row["linear_ms"] >= row["analysis_ms"] + row["factor_ms"] + row["solve_ms"] - 1.0
    assert all(row["factor_dtype"] == "float32" for row in runs["scipy_f32"]["iterations_detail"])
    split = next(r for r in records if r["method"] == "derivatives_split")
    assert split["hessian_proj_ms"] > 0.0 and split["energy_ms"] > 0.0


def test_manifold_lbfgs_jax_transcription_matches_warp_meshad(device, tmp_path, monkeypatch):
    """benchmarks/manifold_lbfgs on the sphere at 2 steps x 10 iterations: the JAX transcription of the L-BFGS ends at
    warp_meshad's energy (1e-9 relative) with the same iterations in every step, and both are timed."""
    jax = pytest.importorskip("jax", reason="jax (the benchmark's JAX transcription) is not installed")
    from benchmarks import manifold_lbfgs

    monkeypatch.setenv("BENCH_OUT", str(tmp_path))
    x64 = jax.config.jax_enable_x64
    try:
        records = manifold_lbfgs.main(["--device", device, "--scenes", "sphere_lbfgs", "--set", "steps=2",
                                       "--set", "iterations=10", "--methods", "warp_meshad,jax_transcription",
                                       "--runs", "1"])
    finally:
        jax.config.update("jax_enable_x64", x64)  # the benchmark turns float64 on for the whole process
    assert (tmp_path / "manifold_lbfgs.json").exists()
    runs = {r["method"]: r for r in records}
    assert sorted(runs) == ["jax_transcription", "warp_meshad"], [r.get("error") for r in records]
    warp, jx = runs["warp_meshad"], runs["jax_transcription"]
    assert warp["step_iterations"] == [10, 10] and jx["step_iterations"] == warp["step_iterations"]
    np.testing.assert_allclose(jx["step_energies"], warp["step_energies"], rtol=1e-9)
    np.testing.assert_allclose(jx["final_energy"], warp["final_energy"], rtol=1e-9)
    assert warp["final_energy"] < warp["start_energy"] - 0.1  # the steps moved the embedding
    assert jx["check"]["agree"] and jx["ms_median"] > 0.0 and warp["ms_median"] > 0.0
