"""Built-in energies (warp_meshad.kernels.energies): derivatives against central differences on real
meshes, and known answers (symmetric Dirichlet = 4 area at an isometry, +inf when flipped; springs
zero at rest and rotation invariant; Dirichlet and area in closed form on a grid)."""

import os
import pathlib
from typing import Any

import numpy as np
import pytest
import warp as wp
from derivcheck import check_problem_derivatives

import warp_meshad as wm
from warp_meshad._src.mesh.tutte import tutte_embedding
from warp_meshad.kernels import ad
from warp_meshad.kernels.energies import (
    DirichletData,
    InertiaGravityData,
    MassSpringData,
    SphereBarrierData,
    SymmetricDirichletData,
    dirichlet,
    inertia_gravity,
    mass_spring,
    sphere_barrier,
    surface_area,
    symmetric_dirichlet,
    weighted_dirichlet,
)

MESHES = pathlib.Path(__file__).resolve().parents[1] / "assets" / "meshes"
DEVICE = os.environ.get("WARP_MESHAD_TEST_DEVICE", "cpu")
pytestmark = pytest.mark.device  # every test runs on DEVICE: the GPU subset under a CUDA test device


def _rotation(rng) -> np.ndarray:
    q, r = np.linalg.qr(rng.normal(size=(3, 3)))
    q = q * np.sign(np.diag(r))
    return q if np.linalg.det(q) > 0 else -q


def _signed_areas(faces, uv):
    a = uv[faces[:, 1]] - uv[faces[:, 0]]
    b = uv[faces[:, 2]] - uv[faces[:, 0]]
    return 0.5 * (a[:, 0] * b[:, 1] - a[:, 1] * b[:, 0])


@pytest.fixture(scope="module")
def woody():
    return wm.TriMesh.from_file(MESHES / "woody.obj")


@pytest.fixture(scope="module")
def spot():
    return wm.TriMesh.from_file(MESHES / "spot.obj")


@pytest.fixture(scope="module")
def grid():
    return wm.TriMesh.grid(4, 3, width=1.5, height=0.8)


# ------------------------------------------------------------------------------ symmetric Dirichlet


def _sd_data(mesh, dtype=wp.float64):
    return SymmetricDirichletData(
        dtype,
        rest_inverse=wp.array(mesh.face_rest_frame_inverses(), dtype=wp.types.matrix((2, 2), dtype), device=DEVICE),
        area=wp.array(mesh.face_areas(), dtype=dtype, device=DEVICE),
    )


def _split_faces_problem(mesh):
    """One uv variable per face corner (faces not sharing vertices), so each face can be isometric."""
    m = mesh.face_count
    problem = wm.Problem(3 * m, variable_dim=2, device=DEVICE)
    problem.add_term(np.arange(3 * m).reshape(m, 3), symmetric_dirichlet, _sd_data(mesh))
    return problem


def _isometric_corners(mesh, rng):
    """Corners u0 = t, u1 = t + R Dm[:, 0], u2 = t + R Dm[:, 1] with a random rotation R and shift t per face."""
    dm = mesh.face_rest_frames()
    m = mesh.face_count
    theta = rng.uniform(0, 2 * np.pi, size=m)
    rot = np.stack([np.stack([np.cos(theta), -np.sin(theta)], -1), np.stack([np.sin(theta), np.cos(theta)], -1)], 1)
    cols = np.einsum("fij,fjk->fik", rot, dm)  # (m, 2, 2), columns are the rotated rest edges
    t = rng.normal(size=(m, 2))
    u = np.stack([t, t + cols[:, :, 0], t + cols[:, :, 1]], axis=1)  # (m, 3, 2)
    return u.reshape(3 * m, 2)


def test_symmetric_dirichlet_derivatives_on_perturbed_tutte_map(woody):
    rng = np.random.default_rng(1)
    uv = tutte_embedding(woody) * np.sqrt(woody.total_area() / np.pi)  # same total area as the mesh
    # perturb each vertex by a fraction of its shortest incident edge: stays flip-free
    shortest = np.full(woody.vertex_count, np.inf)
    lengths = np.linalg.norm(uv[woody.edges[:, 0]] - uv[woody.edges[:, 1]], axis=1)
    np.minimum.at(shortest, woody.edges[:, 0], lengths)
    np.minimum.at(shortest, woody.edges[:, 1], lengths)
    uv = uv + 0.1 * shortest[:, None] * rng.uniform(-1, 1, size=uv.shape)
    assert _signed_areas(woody.faces, uv).min() > 0
    problem = wm.Problem(woody.vertex_count, variable_dim=2, device=DEVICE)
    problem.add_term(woody.faces, symmetric_dirichlet, _sd_data(woody), weight=1.0 / woody.total_area())
    result = check_problem_derivatives(problem, uv)
    assert result["energy"] > 4.0  # above the isometric lower bound 4 (normalized by total area)


def test_symmetric_dirichlet_is_four_area_at_an_isometry(woody):
    rng = np.random.default_rng(2)
    problem = _split_faces_problem(woody)
    u = _isometric_corners(woody, rng)
    f, g = problem.eval_with_gradient(wp.array(u, dtype=wp.vec2d, device=DEVICE))
    np.testing.assert_allclose(f, 4.0 * woody.total_area(), rtol=1e-12)
    # an isometry is the minimum: zero gradient
    np.testing.assert_allclose(g.numpy(), 0.0, atol=1e-9 * np.abs(u).max())
    # the mesh's own rest frames as uv, unrotated: each face gives exactly 4 A_f
    dm = woody.face_rest_frames()
    corners = np.stack([np.zeros((woody.face_count, 2)), dm[:, :, 0], dm[:, :, 1]], axis=1).reshape(-1, 2)
    f0 = problem.eval(wp.array(corners, dtype=wp.vec2d, device=DEVICE))
    np.testing.assert_allclose(f0 / woody.total_area(), 4.0, rtol=1e-12)


def test_symmetric_dirichlet_is_inf_for_flipped_or_degenerate_triangle(woody):
    rng = np.random.default_rng(3)
    problem = _split_faces_problem(woody)
    u = _isometric_corners(woody, rng)
    flipped = u.copy()
    flipped[[3 * 5 + 1, 3 * 5 + 2]] = flipped[[3 * 5 + 2, 3 * 5 + 1]]  # swap two corners of face 5
    x = wp.array(flipped, dtype=wp.vec2d, device=DEVICE)
    assert problem.eval(x) == np.inf
    f, g = problem.eval_with_gradient(x)
    assert f == np.inf
    assert np.all(np.isfinite(g.numpy())), "a rejected (+inf) element must not poison the gradient with NaN"
    degenerate = u.copy()
    degenerate[3 * 7 + 1] = degenerate[3 * 7]  # two coincident corners: det J = 0 exactly
    assert problem.eval(wp.array(degenerate, dtype=wp.vec2d, device=DEVICE)) == np.inf


# ------------------------------------------------------------------------------ mass spring


def _spring_problem(mesh, stiffness=3.0, rest=None, dtype=wp.float64):
    rest = wp.array(mesh.edge_lengths() if rest is None else rest, dtype=dtype, device=DEVICE)
    data = MassSpringData(dtype, rest=rest, stiffness=stiffness)
    problem = wm.Problem(mesh.vertex_count, variable_dim=3, dtype=dtype, device=DEVICE)
    problem.add_term(mesh.edges, mass_spring, data)
    return problem


def test_mass_spring_derivatives_on_spot(spot):
    rng = np.random.default_rng(4)
    x = spot.vertices + 0.2 * spot.edge_lengths().mean() * rng.normal(size=spot.vertices.shape)
    check_problem_derivatives(_spring_problem(spot), x)


def test_mass_spring_derivatives_dense_on_grid(grid):
    rng = np.random.default_rng(5)
    x = grid.vertices + 0.1 * rng.normal(size=grid.vertices.shape)
    result = check_problem_derivatives(_spring_problem(grid, rest=1.1 * grid.edge_lengths()), x)
    assert result["hessian_min_eig"] < 0  # compressed springs: indefinite, the projection matters
    assert result["proj_clamp_min_eig"] >= 0


def test_mass_spring_zero_at_rest_and_rotation_invariant(spot):
    rng = np.random.default_rng(6)
    problem = _spring_problem(spot)
    rest = wp.array(spot.vertices, dtype=wp.vec3d, device=DEVICE)
    f, g = problem.eval_with_gradient(rest)
    assert f < 1e-20
    np.testing.assert_allclose(g.numpy(), 0.0, atol=1e-12)

    x = spot.vertices + 0.05 * rng.normal(size=spot.vertices.shape)
    f1, g1 = problem.eval_with_gradient(wp.array(x, dtype=wp.vec3d, device=DEVICE))
    g1 = g1.numpy().copy()
    rot = _rotation(rng)
    moved = x @ rot.T + rng.normal(size=3)
    f2, g2 = problem.eval_with_gradient(wp.array(moved, dtype=wp.vec3d, device=DEVICE))
    assert f1 > 0
    np.testing.assert_allclose(f2, f1, rtol=1e-10)
    np.testing.assert_allclose(g2.numpy(), g1 @ rot.T, rtol=1e-8, atol=1e-10 * np.abs(g1).max())


def _sphere_barrier_problem(mesh, dtype):
    center = np.array([0.75, 0.4, -0.5])
    data = SphereBarrierData(dtype, center=wp.types.vector(3, dtype)(*center), radius=0.5, activation_distance=0.1,
                             stiffness=3.0)
    problem = wm.Problem(mesh.vertex_count, variable_dim=3, dtype=dtype, device=DEVICE)
    problem.add_term(mesh.vertex_indices, sphere_barrier, data)
    return problem


def _inertia_gravity_problem(mesh, dtype):
    rng = np.random.default_rng(8)
    vec3 = wp.types.vector(3, dtype)
    data = InertiaGravityData(dtype, mass=wp.array(rng.uniform(0.5, 2.0, mesh.vertex_count), dtype=dtype,
                              device=DEVICE), target=wp.array(rng.normal(size=(mesh.vertex_count, 3)), dtype=vec3,
                              device=DEVICE), gravity=vec3(0.0, -9.81, 0.0), inv_h2=100.0)  # fmt: skip
    problem = wm.Problem(mesh.vertex_count, variable_dim=3, dtype=dtype, device=DEVICE)
    problem.add_term(mesh.vertex_indices, inertia_gravity, data)
    return problem


def _symmetric_dirichlet_problem(mesh, dtype):
    """uv variables (the grid's x, y): the flat grid's rest frames and areas."""
    problem = wm.Problem(mesh.vertex_count, variable_dim=2, dtype=dtype, device=DEVICE)
    problem.add_term(mesh.faces, symmetric_dirichlet, _sd_data(mesh, dtype))
    return problem


@pytest.mark.parametrize(
    "make",
    [_spring_problem, _sphere_barrier_problem, _inertia_gravity_problem, _symmetric_dirichlet_problem],
    ids=lambda f: f.__name__[1:-8],
)
def test_dtype_generic_energy_float32_matches_float64(grid, make):
    """One definition serves both dtypes: float32 energy, gradient and Hessian agree with the float64 ones, and the
    float64 derivatives match central differences."""
    p64 = make(grid, dtype=wp.float64)
    dim = p64.variable_dim
    x = grid.vertices[:, :dim] + 0.02 * np.random.default_rng(7).normal(size=(grid.vertex_count, dim))
    check_problem_derivatives(p64, x)
    f64, g64, h64 = p64.eval_with_hessian(wp.array(x, dtype=wp.types.vector(dim, wp.float64), device=DEVICE))
    p32 = make(grid, dtype=wp.float32)
    f32, g32, h32 = p32.eval_with_hessian(wp.array(x, dtype=wp.types.vector(dim, wp.float32), device=DEVICE))
    assert f64 > 0
    np.testing.assert_allclose(f32, f64, rtol=1e-5)
    g64 = g64.numpy()
    np.testing.assert_allclose(g32.numpy(), g64, rtol=1e-4, atol=1e-5 * np.abs(g64).max())
    h64 = wm.to_scipy(h64).toarray()
    np.testing.assert_allclose(wm.to_scipy(h32).toarray(), h64, rtol=1e-4, atol=1e-5 * np.abs(h64).max())


def test_dtype_struct_builds_one_struct_per_dtype_and_names_bad_input():
    assert MassSpringData.of(wp.float32) is MassSpringData.of(wp.float32)
    assert MassSpringData.of(wp.float32).vars["rest"].type.dtype is wp.float32
    assert InertiaGravityData.of(wp.float64).vars["target"].type.dtype is wp.vec3d
    assert SphereBarrierData.of(wp.float32).vars["center"].type is wp.vec3f
    assert SymmetricDirichletData.of(wp.float32).vars["rest_inverse"].type.dtype is wp.mat22f
    assert SymmetricDirichletData.of(wp.float64).vars["rest_inverse"].type.dtype is wp.mat22d
    with pytest.raises(TypeError, match="MassSpringData: dtype must be wp.float16, wp.float32 or wp.float64, got"):
        MassSpringData(wp.int32)
    with pytest.raises(TypeError, match="MassSpringData has no field.s. stifness; its fields: rest, stiffness"):
        MassSpringData(wp.float64, stifness=1.0)


# ------------------------------------------------------------------------------ Dirichlet


def _graph_laplacian(mesh, weights=None):
    import scipy.sparse as sp

    e = mesh.edges
    w = np.ones(e.shape[0]) if weights is None else weights
    n = mesh.vertex_count
    rows, cols = np.concatenate([e[:, 0], e[:, 1]]), np.concatenate([e[:, 1], e[:, 0]])
    a = sp.coo_matrix((np.concatenate([w, w]), (rows, cols)), shape=(n, n))
    return (sp.diags(np.asarray(a.sum(axis=1)).ravel()) - a).toarray()


def test_dirichlet_closed_form_on_grid():
    nx, ny, width, height = 5, 4, 2.0, 1.5
    mesh = wm.TriMesh.grid(nx, ny, width=width, height=height)
    problem = wm.Problem(mesh.vertex_count, variable_dim=3, device=DEVICE)
    problem.add_term(mesh.edges, dirichlet, weight=2.0)
    a, b = width / (nx - 1), height / (ny - 1)
    # horizontal, vertical and diagonal edges, each 1/2 w |e|^2 with w = 2
    expected = (nx - 1) * ny * a * a + nx * (ny - 1) * b * b + (nx - 1) * (ny - 1) * (a * a + b * b)
    x = wp.array(mesh.vertices, dtype=wp.vec3d, device=DEVICE)
    f, g, H = problem.eval_with_hessian(x)
    np.testing.assert_allclose(f, expected, rtol=1e-13)
    # the Hessian is w L (x) I3 with L the graph Laplacian; the gradient is w L x
    lap = _graph_laplacian(mesh)
    np.testing.assert_allclose(wm.to_scipy(H).toarray(), 2.0 * np.kron(lap, np.eye(3)), atol=1e-13)
    np.testing.assert_allclose(g.numpy(), 2.0 * lap @ mesh.vertices, atol=1e-12)
    # quadratic: E(s x) = s^2 E(x)
    scaled = wp.array(3.0 * mesh.vertices, dtype=wp.vec3d, device=DEVICE)
    np.testing.assert_allclose(problem.eval(scaled), 9.0 * f, rtol=1e-13)


def test_weighted_dirichlet_derivatives_and_laplacian(grid):
    rng = np.random.default_rng(8)
    weights = rng.uniform(0.5, 2.0, size=grid.edge_count)
    data = DirichletData()
    data.weight = wp.array(weights, dtype=wp.float64, device=DEVICE)
    problem = wm.Problem(grid.vertex_count, variable_dim=3, device=DEVICE)
    problem.add_term(grid.edges, weighted_dirichlet, data)
    x = grid.vertices + rng.normal(size=grid.vertices.shape)
    result = check_problem_derivatives(problem, x)
    lap = _graph_laplacian(grid, weights)
    np.testing.assert_allclose(result["energy"], 0.5 * np.sum(x * (lap @ x)), rtol=1e-12)
    _, _, H = problem.eval_with_hessian(wp.array(x, dtype=wp.vec3d, device=DEVICE))
    np.testing.assert_allclose(wm.to_scipy(H).toarray(), np.kron(lap, np.eye(3)), atol=1e-13)


# ------------------------------------------------------------------------------ surface area


def _area_problem(mesh):
    problem = wm.Problem(mesh.vertex_count, variable_dim=3, device=DEVICE)
    problem.add_term(mesh.faces, surface_area)
    return problem


def test_surface_area_derivatives_on_grid(grid):
    rng = np.random.default_rng(9)
    x = grid.vertices + 0.05 * rng.normal(size=grid.vertices.shape)
    check_problem_derivatives(_area_problem(grid), x)


def test_surface_area_closed_form(spot):
    mesh = wm.TriMesh.grid(6, 5, width=1.25, height=0.75)
    problem = _area_problem(mesh)
    f, g = problem.eval_with_gradient(wp.array(mesh.vertices, dtype=wp.vec3d, device=DEVICE))
    np.testing.assert_allclose(f, 1.25 * 0.75, rtol=1e-13)
    # a flat sheet is a critical point for moves of interior vertices (in plane and along the normal)
    interior = np.setdiff1d(np.arange(mesh.vertex_count), mesh.boundary_vertices)
    np.testing.assert_allclose(g.numpy()[interior], 0.0, atol=1e-13)
    # on a real mesh: the total area, invariant under rigid motion, times s^2 under scaling
    rng = np.random.default_rng(10)
    problem = _area_problem(spot)
    rest = wp.array(spot.vertices, dtype=wp.vec3d, device=DEVICE)
    np.testing.assert_allclose(problem.eval(rest), spot.total_area(), rtol=1e-12)
    moved = wp.array(2.0 * spot.vertices @ _rotation(rng).T + rng.normal(size=3), dtype=wp.vec3d, device=DEVICE)
    np.testing.assert_allclose(problem.eval(moved), 4.0 * spot.total_area(), rtol=1e-12)


# ------------------------------------------------------------------------------ core limitations met here


@wp.struct
class _ScaleData:
    scale: wp.float64


@wp.func
def _generic_data_energy(e: int, xa: Any, xb: Any, data: Any):
    return data.scale * ad.length_sq(xa - xb)


@wp.func
def _early_inf_energy(e: int, xa: Any, xb: Any):
    d = ad.length_sq(xa - xb)
    if d > 4.0:
        return wp.float64(wp.inf)
    return d


def test_energy_with_generic_data_struct():
    problem = wm.Problem(2, variable_dim=3, device=DEVICE)
    data = _ScaleData()
    data.scale = wp.float64(2.0)
    problem.add_term(np.array([[0, 1]]), _generic_data_energy, data)
    x = wp.array(np.array([[0.0, 0.0, 0.0], [1.0, 2.0, 0.0]]), dtype=wp.vec3d, device=DEVICE)
    np.testing.assert_allclose(problem.eval(x), 2.0 * 5.0)


def test_energy_with_early_inf_return():
    problem = wm.Problem(2, variable_dim=3, device=DEVICE)
    problem.add_term(np.array([[0, 1]]), _early_inf_energy)
    x = wp.array(np.array([[0.0, 0.0, 0.0], [3.0, 0.0, 0.0]]), dtype=wp.vec3d, device=DEVICE)
    f, g = problem.eval_with_gradient(x)
    assert f == np.inf
    x = wp.array(np.array([[0.0, 0.0, 0.0], [1.0, 0.0, 0.0]]), dtype=wp.vec3d, device=DEVICE)
    f, g = problem.eval_with_gradient(x)
    np.testing.assert_allclose(f, 1.0)
    np.testing.assert_allclose(g.numpy(), [[-2.0, 0, 0], [2.0, 0, 0]])


# ------------------------------------------------------------------------------ the helper itself


class _SkewedProblem:
    """A problem whose eval disagrees with its derivatives by eps * sum |x|^2 (the helper must notice)."""

    def __init__(self, problem, eps):
        self._problem, self._eps = problem, eps

    def __getattr__(self, name):
        return getattr(self._problem, name)

    def eval(self, x):
        return self._problem.eval(x) + self._eps * float(np.sum(x.numpy() ** 2))


def test_derivcheck_detects_a_wrong_gradient(grid):
    problem = _spring_problem(grid)  # kernels already built by the spring tests
    x = grid.vertices + 0.1 * np.random.default_rng(11).normal(size=grid.vertices.shape)
    check_problem_derivatives(problem, x)
    with pytest.raises(AssertionError, match="gradient"):
        check_problem_derivatives(_SkewedProblem(problem, 1e-4), x)


def test_surface_area_works_in_float32_and_float64(device):
    from warp_meshad.kernels.energies import surface_area

    mesh = wm.TriMesh.grid(6, 5, width=2.0, height=3.0)
    for dtype, vec in ((wp.float32, wp.vec3f), (wp.float64, wp.vec3d)):
        p = wm.Problem(mesh.vertex_count, 3, dtype=dtype, device=device)
        p.add_term(mesh.faces, surface_area)
        np.testing.assert_allclose(p.eval(wp.array(mesh.vertices, dtype=vec, device=device)), 6.0, rtol=1e-6)
