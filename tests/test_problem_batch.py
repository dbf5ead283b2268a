"""ProblemBatch and BatchNewtonSolver: B meshes of different sizes in one problem give each mesh's single solve.

References are independent single-mesh solves (``NewtonSolver`` on each mesh's own ``Problem``): per mesh the batch
must reach the same minimum (1e-8 relative) in the same number of iterations (+-1), with the same stop reason.
"""

import pathlib
from typing import Any

import numpy as np
import pytest
import warp as wp

import warp_meshad as wm
from warp_meshad.kernels import ad
from warp_meshad.kernels.energies import SymmetricDirichletData, symmetric_dirichlet

ROOT = pathlib.Path(__file__).resolve().parents[1]
PATCHES = ["patch_000", "patch_004", "patch_007", "patch_012", "patch_016"]  # five sizes
DEV = "cpu"


def _param_problem(name):
    mesh = wm.TriMesh.from_file(ROOT / "assets" / "datasets" / "param_patches_small" / f"{name}.obj")
    uv = wm.tutte_embedding(mesh)
    areas = mesh.face_areas()
    e1 = uv[mesh.faces[:, 1]] - uv[mesh.faces[:, 0]]
    e2 = uv[mesh.faces[:, 2]] - uv[mesh.faces[:, 0]]
    uv = uv * np.sqrt(areas.sum() / (0.5 * (e1[:, 0] * e2[:, 1] - e1[:, 1] * e2[:, 0])).sum())
    data = SymmetricDirichletData(wp.float64, rest_inverse=wp.array(mesh.face_rest_frame_inverses(), dtype=wp.mat22d,
                                                                    device=DEV),
                                  area=wp.array(areas, dtype=wp.float64, device=DEV))  # fmt: skip
    problem = wm.Problem(mesh.vertex_count, 2, wp.float64, DEV)
    problem.add_term(mesh.faces, symmetric_dirichlet, data)
    return problem, uv


@wp.struct
class _ChainData:
    rest: wp.array(dtype=wp.float64)  # per element
    stiffness: wp.float64  # shared


@wp.func
def _chain_energy(e: int, a: Any, b: Any, data: _ChainData):
    """A user's energy: a spring with a quartic term (k/2 (l - L)^2 + (l - L)^4), non-quadratic so Newton iterates."""
    s = ad.length(b - a) - data.rest[e]
    return data.stiffness * 0.5 * s * s + s * s * s * s


def _chain_problem(n, seed, stiffness=3.0):
    """A noisy 3D chain of n vertices whose last vertex is 2 rest lengths per element from the first (pinned ends
    keep it stretched: the minimum energy is > 0); rest lengths per element."""
    rng = np.random.default_rng(seed)
    x = np.cumsum(rng.normal(size=(n, 3)), axis=0)
    x[-1] = x[0] + np.array([2.0 * (n - 1), 0.0, 0.0])
    elements = np.stack([np.arange(n - 1), np.arange(1, n)], axis=1)
    data = _ChainData()
    data.rest = wp.array(rng.uniform(0.5, 1.5, size=n - 1), dtype=wp.float64, device=DEV)
    data.stiffness = stiffness
    problem = wm.Problem(n, 3, wp.float64, DEV)
    problem.add_term(elements, _chain_energy, data)
    return problem, x


def _assert_same(singles, batched):
    for b, (s, r) in enumerate(zip(singles, batched.results)):
        assert r.reason == s.reason, f"mesh {b}: {r.reason} != {s.reason}"
        assert abs(r.iterations - s.iterations) <= 1, f"mesh {b}: {r.iterations} != {s.iterations} iterations"
        np.testing.assert_allclose(r.energies[-1], s.energies[-1], rtol=1e-8, err_msg=f"mesh {b}")
        np.testing.assert_allclose(r.x.numpy(), s.x.numpy(), rtol=1e-6, atol=1e-8, err_msg=f"mesh {b}")


def test_auto_compaction_waits_until_the_saved_rounds_pay_for_an_analysis():
    """``compact="auto"``: compact when rounds * t_round * (1 - share) > t_analysis * share (times of this solve)."""
    problems, _ = zip(*[_param_problem(n) for n in PATCHES[:2]])
    solver = wm.BatchNewtonSolver(wm.ProblemBatch(problems), linear_solver="qdldl")
    times = {"analysis": 300.0, "round": 3.0}  # an analysis costs 100 rounds (the H200's cuDSS, roughly)
    assert not solver._compacts(0.5, 20, {"analysis": 300.0})  # no round timed yet on this batch
    assert not solver._compacts(0.5, 20, times)  # 20 * 3 * 0.5 = 30 < 150
    assert solver._compacts(0.1, 20, times)  # 20 * 3 * 0.9 = 54 > 30
    assert not solver._compacts(0.1, 5, times)  # 5 * 3 * 0.9 = 13.5 < 30
    fixed = wm.BatchNewtonSolver(wm.ProblemBatch(problems), linear_solver="qdldl", compact=0.5)
    assert fixed._compacts(0.5, 0, {}) and not fixed._compacts(0.6, 100, times)
    with pytest.raises(ValueError, match=r"compact=...\): expected 'auto' or a fraction in \[0, 1\), got 'always'"):
        wm.BatchNewtonSolver(wm.ProblemBatch(problems), linear_solver="qdldl", compact="always")
    with pytest.raises(ValueError, match=r"BatchNewtonSolver\(hessian_shift=...\): expected a finite number >= 0"):
        wm.BatchNewtonSolver(wm.ProblemBatch(problems), linear_solver="qdldl", hessian_shift=-1.0)
    shifted = wm.BatchNewtonSolver(wm.ProblemBatch(problems), linear_solver="qdldl", hessian_shift=1e-8)
    assert shifted._first.newton.hessian_shift == 1e-8  # handed to the driver of every stage


def test_param_batch_equals_single_solves():
    problems, starts = zip(*[_param_problem(n) for n in PATCHES])
    assert len({p.variable_count for p in problems}) == len(PATCHES)
    kw = dict(max_iterations=200, tolerance=1e-6, energy_tolerance=0.0)
    singles = [wm.NewtonSolver(p, linear_solver="qdldl").solve(wp.array(uv, dtype=wp.vec2d, device=DEV), **kw)
               for p, uv in zip(problems, starts)]  # fmt: skip
    batch = wm.ProblemBatch(problems)
    np.testing.assert_allclose(batch.eval_per_mesh(batch.join(starts)), [s.energies[0] for s in singles], rtol=1e-12)
    result = wm.BatchNewtonSolver(batch, linear_solver="qdldl", compact=0.5).solve(batch.join(starts), **kw)
    assert all(s.converged for s in singles)
    _assert_same(singles, result)
    assert result.rounds == max(s.iterations for s in singles) + 1
    # the meshes that finish early leave the batch's system: the last rounds run on the active meshes only
    assert result.compactions >= 1
    _assert_same(singles, wm.BatchNewtonSolver(batch, linear_solver="qdldl").solve(batch.join(starts), **kw))
    whole = wm.BatchNewtonSolver(batch, linear_solver="qdldl", compact=0.0).solve(batch.join(starts), **kw)
    assert whole.compactions == 0
    _assert_same(singles, whole)
    # the merged final point is the meshes' final points in order
    for b, part in enumerate(batch.split(result.x)):
        np.testing.assert_array_equal(part, result.results[b].x.numpy())


def test_user_energy_batch_with_pins_equals_single_solves():
    sizes = [5, 9, 14, 7, 21]
    problems, starts = zip(*[_chain_problem(n, seed) for seed, n in enumerate(sizes)])
    fixed = [[0, n - 1] for n in sizes]
    fixed[3] = [0, 3, sizes[3] - 1]
    kw = dict(max_iterations=100, tolerance=1e-10, energy_tolerance=0.0)
    singles = [wm.NewtonSolver(p, linear_solver="scipy", fixed=f).solve(wp.array(x, dtype=wp.vec3d, device=DEV), **kw)
               for p, x, f in zip(problems, starts, fixed)]  # fmt: skip
    batch = wm.ProblemBatch(problems)
    result = wm.BatchNewtonSolver(batch, linear_solver="scipy", fixed=fixed).solve(batch.join(starts), **kw)
    _assert_same(singles, result)
    for b, f in enumerate(fixed):  # pins never move
        if f is not None:
            np.testing.assert_array_equal(result.results[b].x.numpy()[f], starts[b][f])


def test_batch_like_a_newton_solver_takes_its_settings():
    sizes = [5, 9, 7]
    problems, starts = zip(*[_chain_problem(n, seed) for seed, n in enumerate(sizes)])
    fixed = [[0, n - 1] for n in sizes]
    settings = dict(linear_solver="scipy", projection=wm.Projection(mode="abs", eps=1e-7),
                    line_search=wm.LineSearch(shrink=0.5, tries=30, c=1e-3), hessian_shift=1e-9)
    kw = dict(max_iterations=100, tolerance=1e-10, energy_tolerance=0.0)
    singles = [wm.NewtonSolver(p, fixed=f, **settings).solve(wp.array(x, dtype=wp.vec3d, device=DEV), **kw)
               for p, x, f in zip(problems, starts, fixed)]  # fmt: skip
    batch = wm.ProblemBatch(problems)
    like = wm.BatchNewtonSolver.like(wm.NewtonSolver(problems[0], **settings), batch, fixed=fixed)
    assert (like.projection, like.line_search, like.linear_solver.name) == (settings["projection"],
                                                                             settings["line_search"], "scipy")
    _assert_same(singles, like.solve(batch.join(starts), **kw))
    with pytest.raises(TypeError, match="expected a NewtonSolver, got LBFGSSolver"):
        wm.BatchNewtonSolver.like(wm.LBFGSSolver(problems[0]), batch)


def test_a_failing_mesh_stops_alone():
    problems, starts = zip(*[_chain_problem(n, seed) for seed, n in enumerate([6, 8, 10])])
    starts = [x.copy() for x in starts]
    starts[1][:] = 0.0  # every spring of mesh 1 has length 0: its gradient is NaN (d|v|/dv at v = 0)
    batch = wm.ProblemBatch(problems)
    fixed = [[0, n - 1] for n in (6, 8, 10)]
    result = wm.BatchNewtonSolver(batch, linear_solver="scipy", fixed=fixed).solve(batch.join(starts), max_iterations=100,
                                                                      tolerance=1e-10)  # fmt: skip
    assert result.results[1].reason == "non_finite_gradient"
    assert result.results[0].converged and result.results[2].converged
    np.testing.assert_array_equal(result.results[1].x.numpy(), starts[1])


def test_batch_refuses_mismatched_problems():
    p0, _ = _chain_problem(4, 0)
    p1, _ = _chain_problem(5, 1, stiffness=4.0)
    with pytest.raises(ValueError, match=r"data field 'stiffness' differs between mesh 0 \(3.0\) and mesh 1 \(4.0\)"):
        wm.ProblemBatch([p0, p1])
    other = wm.Problem(5, 3, wp.float64, DEV)
    other.add_term([[0, 1]], _chain_energy, p1.terms[0].data, weight=2.0)
    with pytest.raises(ValueError, match=r"term 0 \('_chain_energy'\) of mesh 1 has weight 2.0, mesh 0's 1.0"):
        wm.ProblemBatch([p0, other])
    # a data array that is not per element cannot be split among the meshes
    bad = _ChainData()
    bad.rest = wp.zeros(7, dtype=wp.float64, device=DEV)
    bad.stiffness = 3.0
    p2 = wm.Problem(5, 3, wp.float64, DEV)
    p2.add_term([[0, 1], [1, 2]], _chain_energy, bad)
    with pytest.raises(ValueError, match=r"data field 'rest' of mesh 1 has shape \(7,\); only per-element arrays"):
        wm.ProblemBatch([p0, p2])
    with pytest.raises(ValueError, match="expected at least one Problem"):
        wm.ProblemBatch([])


def test_join_and_indices_check_their_input():
    problems, starts = zip(*[_chain_problem(n, seed) for seed, n in enumerate([4, 6])])
    batch = wm.ProblemBatch(problems)
    assert batch.variable_count == 10 and list(batch.offsets) == [0, 4, 10]
    with pytest.raises(ValueError, match=r"mesh 1's array has shape \(5, 3\), expected \(6, 3\)"):
        batch.join([starts[0], starts[1][:5]])
    with pytest.raises(ValueError, match="mesh 0 has 4 variables, got index 4"):
        batch.join_indices([[4], None])
    np.testing.assert_array_equal(batch.join_indices([[0, 3], [0]]), [0, 3, 4])
