"""Shell energies: Neo-Hookean membrane, discrete-shells bending, ground-plane barrier.

Derivatives against central differences (float64, shared helper), known values, zero at rest,
invariance under rigid motions, +inf for invalid states. Each energy's kernels are compiled once
(one small problem per energy, reused by its tests).
"""

import os
import pathlib

import numpy as np
import pytest
import warp as wp
from derivcheck import check_problem_derivatives

import warp_meshad as wm
from warp_meshad.kernels.energies import (
    DiscreteShellsBendingData,
    GroundPlaneData,
    NeoHookeanMembraneData,
    discrete_shells_bending,
    discrete_shells_rest_state,
    ground_plane_barrier,
    neo_hookean_membrane,
)

MESHES = pathlib.Path(__file__).resolve().parents[1] / "assets" / "meshes"
DEVICE = os.environ.get("WARP_MESHAD_TEST_DEVICE", "cpu")
pytestmark = pytest.mark.device  # every test runs on DEVICE: the GPU subset under a CUDA test device


def _rotation(rng) -> np.ndarray:
    q, r = np.linalg.qr(rng.normal(size=(3, 3)))
    q = q * np.sign(np.diag(r))
    return q if np.linalg.det(q) > 0 else -q


def _vec3(x):
    return wp.array(np.asarray(x, dtype=np.float64), dtype=wp.vec3d, device=DEVICE)


@pytest.fixture(scope="module")
def spot():
    return wm.TriMesh.from_file(MESHES / "spot.obj")


@pytest.fixture(scope="module")
def sheet():
    """A 4 x 3 grid (12 vertices, 36 scalars: checked densely), gently curved so no diamond is flat."""
    mesh = wm.TriMesh.grid(4, 3, width=1.2, height=0.8)
    v = mesh.vertices.copy()
    v[:, 2] = 0.15 * np.sin(2.0 * v[:, 0]) + 0.1 * v[:, 1] ** 2
    return wm.TriMesh(v, mesh.faces)


# ------------------------------------------------------------------------------ Neo-Hookean membrane


def _membrane_problem(mesh, mu=2.0, lam=3.0, thickness=0.01):
    data = NeoHookeanMembraneData()
    data.rest_inverse = wp.array(mesh.face_rest_frame_inverses(), dtype=wp.mat22d, device=DEVICE)
    data.area = wp.array(mesh.face_areas(), dtype=wp.float64, device=DEVICE)
    data.mu = wp.float64(mu)
    data.lam = wp.float64(lam)
    data.thickness = wp.float64(thickness)
    problem = wm.Problem(mesh.vertex_count, variable_dim=3, device=DEVICE)
    problem.add_term(mesh.faces, neo_hookean_membrane, data)
    return problem


def _membrane_reference(mesh, x, mu=2.0, lam=3.0, thickness=0.01):
    """NumPy: t A (mu/2 (tr C - 2) - mu log J + lam/2 log^2 J) from the 3x2 F = Ds Dm^-1."""
    f = mesh.faces
    ds = np.stack([x[f[:, 1]] - x[f[:, 0]], x[f[:, 2]] - x[f[:, 0]]], axis=2)  # (m, 3, 2)
    F = ds @ mesh.face_rest_frame_inverses()
    C = np.einsum("mki,mkj->mij", F, F)
    log_j = 0.5 * np.log(np.linalg.det(C))
    psi = 0.5 * mu * (np.trace(C, axis1=1, axis2=2) - 2.0) - mu * log_j + 0.5 * lam * log_j**2
    return float(np.sum(thickness * mesh.face_areas() * psi))


def test_neo_hookean_membrane_derivatives(sheet):
    rng = np.random.default_rng(1)
    x = sheet.vertices * np.array([1.1, 0.9, 1.0]) + 0.05 * rng.normal(size=sheet.vertices.shape)
    result = check_problem_derivatives(_membrane_problem(sheet), x)
    np.testing.assert_allclose(result["energy"], _membrane_reference(sheet, x), rtol=1e-12)
    assert result["energy"] > 0
    assert result["proj_clamp_min_eig"] >= 0


def test_neo_hookean_membrane_zero_at_rest_rotation_invariant_and_inf_when_degenerate(spot):
    rng = np.random.default_rng(2)
    problem = _membrane_problem(spot)
    f0, g0 = problem.eval_with_gradient(_vec3(spot.vertices))
    assert abs(f0) < 1e-15
    np.testing.assert_allclose(g0.numpy(), 0.0, atol=1e-12)
    rot = _rotation(rng)
    moved = spot.vertices @ rot.T + rng.normal(size=3)
    f1, g1 = problem.eval_with_gradient(_vec3(moved))  # a rigid motion is a rest state too
    assert abs(f1) < 1e-13
    np.testing.assert_allclose(g1.numpy(), 0.0, atol=1e-10)

    x = spot.vertices + 0.2 * spot.edge_lengths().mean() * rng.normal(size=spot.vertices.shape)
    fx, gx = problem.eval_with_gradient(_vec3(x))
    gx = gx.numpy().copy()
    assert fx > 0
    np.testing.assert_allclose(fx, _membrane_reference(spot, x), rtol=1e-11)
    fr, gr = problem.eval_with_gradient(_vec3(x @ rot.T + rng.normal(size=3)))
    np.testing.assert_allclose(fr, fx, rtol=1e-10)
    np.testing.assert_allclose(gr.numpy(), gx @ rot.T, rtol=1e-8, atol=1e-10 * np.abs(gx).max())

    collapsed = spot.vertices.copy()
    a, b, _ = spot.faces[7]
    collapsed[b] = collapsed[a]  # a face with two coincident corners: det C = 0
    assert problem.eval(_vec3(collapsed)) == np.inf


# ------------------------------------------------------------------------------ discrete-shells bending


def _bending_problem(mesh, rest_vertices=None, stiffness=0.7):
    rest = mesh.vertices if rest_vertices is None else rest_vertices
    angle, weight = discrete_shells_rest_state(rest, mesh.edge_diamonds)
    data = DiscreteShellsBendingData()
    data.rest_angle = wp.array(angle, dtype=wp.float64, device=DEVICE)
    data.weight = wp.array(weight, dtype=wp.float64, device=DEVICE)
    data.stiffness = wp.float64(stiffness)
    problem = wm.Problem(mesh.vertex_count, variable_dim=3, device=DEVICE)
    problem.add_term(mesh.edge_diamonds, discrete_shells_bending, data)
    return problem


def test_discrete_shells_bending_derivatives(sheet):
    rng = np.random.default_rng(3)
    x = sheet.vertices + 0.08 * rng.normal(size=sheet.vertices.shape)
    result = check_problem_derivatives(_bending_problem(sheet), x)
    assert result["energy"] > 0


def test_discrete_shells_bending_known_value_of_one_folded_diamond():
    # diamond [v0, v1, a, b]: faces (v0, v1, a) and (v1, v0, b); flat at rest, then b rotated by phi about the edge
    phi = 0.3
    rest = np.array([[0.0, 0, 0], [1, 0, 0], [0.4, 1, 0], [0.6, -1, 0]])
    mesh = wm.TriMesh(rest, np.array([[0, 1, 2], [1, 0, 3]]))
    np.testing.assert_array_equal(mesh.edge_diamonds, [[0, 1, 2, 3]])
    angle, weight = discrete_shells_rest_state(rest, mesh.edge_diamonds)
    np.testing.assert_allclose(angle, 0.0, atol=1e-15)
    np.testing.assert_allclose(weight, 3.0 * 1.0 / (0.5 + 0.5))  # 3 |e|^2 / (A1 + A2)
    problem = _bending_problem(mesh, stiffness=2.0)
    folded = rest.copy()
    folded[3] = [0.6, -np.cos(phi), np.sin(phi)]
    np.testing.assert_allclose(problem.eval(_vec3(folded)), 2.0 * 3.0 * phi**2, rtol=1e-12)
    folded[3] = [0.6, -np.cos(phi), -np.sin(phi)]  # the other way: same energy (signed angle -phi)
    np.testing.assert_allclose(problem.eval(_vec3(folded)), 2.0 * 3.0 * phi**2, rtol=1e-12)
    np.testing.assert_allclose(np.abs(discrete_shells_rest_state(folded, mesh.edge_diamonds)[0]), [phi], rtol=1e-12)


def test_discrete_shells_bending_zero_at_rest_and_rotation_invariant(spot):
    rng = np.random.default_rng(4)
    problem = _bending_problem(spot)
    f0, g0 = problem.eval_with_gradient(_vec3(spot.vertices))
    assert abs(f0) < 1e-20
    np.testing.assert_allclose(g0.numpy(), 0.0, atol=1e-10)
    rot = _rotation(rng)
    f1, g1 = problem.eval_with_gradient(_vec3(spot.vertices @ rot.T + rng.normal(size=3)))
    assert abs(f1) < 1e-16
    np.testing.assert_allclose(g1.numpy(), 0.0, atol=1e-7)

    x = spot.vertices + 0.1 * spot.edge_lengths().mean() * rng.normal(size=spot.vertices.shape)
    fx, gx = problem.eval_with_gradient(_vec3(x))
    gx = gx.numpy().copy()
    assert fx > 0
    angle, _ = discrete_shells_rest_state(x, spot.edge_diamonds)
    rest_angle, rest_weight = discrete_shells_rest_state(spot.vertices, spot.edge_diamonds)
    np.testing.assert_allclose(fx, 0.7 * np.sum(rest_weight * (angle - rest_angle) ** 2), rtol=1e-10)
    fr, gr = problem.eval_with_gradient(_vec3(x @ rot.T + rng.normal(size=3)))
    np.testing.assert_allclose(fr, fx, rtol=1e-9)
    np.testing.assert_allclose(gr.numpy(), gx @ rot.T, rtol=1e-7, atol=1e-9 * np.abs(gx).max())


# ------------------------------------------------------------------------------ ground plane


def _ground_problem(count, normal, origin, dhat=0.1, kappa=5.0):
    data = GroundPlaneData()
    n = np.asarray(normal, dtype=np.float64)
    data.normal = wp.vec3d(*(n / np.linalg.norm(n)))
    data.origin = wp.vec3d(*origin)
    data.activation_distance = wp.float64(dhat)
    data.stiffness = wp.float64(kappa)
    problem = wm.Problem(count, variable_dim=3, device=DEVICE)
    problem.add_term(np.arange(count)[:, None], ground_plane_barrier, data)
    return problem


def test_ground_plane_barrier_derivatives_values_and_limits():
    rng = np.random.default_rng(5)
    normal = np.array([0.2, 1.0, -0.1])
    unit = normal / np.linalg.norm(normal)
    origin = np.array([0.3, -0.5, 0.2])
    dhat, kappa = 0.1, 5.0
    problem = _ground_problem(6, normal, origin, dhat, kappa)
    heights = np.array([0.01, 0.03, 0.05, 0.07, 0.09, 0.002])
    tangent = np.cross(unit, rng.normal(size=(6, 3)))
    x = origin + heights[:, None] * unit + tangent
    result = check_problem_derivatives(problem, x)
    d, dh2 = heights**2, dhat**2
    np.testing.assert_allclose(result["energy"], np.sum(-kappa * (d - dh2) ** 2 * np.log(d / dh2)), rtol=1e-12)
    # convex in the height (rank one per vertex: the tangent eigenvalues are zero up to round-off)
    assert result["hessian_min_eig"] >= -1e-12 * kappa

    # zero (with zero gradient) at and beyond d_hat; +inf on and below the plane
    far = origin + np.array([dhat, 1.0, 2.0, 1e-3 + dhat, 5.0, 100.0])[:, None] * unit + tangent
    f, g = problem.eval_with_gradient(_vec3(far))
    assert f == 0.0
    np.testing.assert_array_equal(g.numpy(), 0.0)
    on = x.copy()
    on[2] = origin + tangent[2]
    assert problem.eval(_vec3(on)) == np.inf
    below = x.copy()
    below[4] = origin - 0.01 * unit
    f, g = problem.eval_with_gradient(_vec3(below))
    assert f == np.inf
    assert np.all(np.isfinite(g.numpy()))
