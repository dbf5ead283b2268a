"""Tet energies (stable Neo-Hookean, ARAP): derivatives against central differences in float64 (through inverted tets),
projected Hessians PSD, zero energy and gradient at rest and under rigid motions, rotation invariance, and known
answers: the rest Hessian is linear elasticity's stiffness matrix, ARAP is sum (s_i - 1)^2 over the signed singular
values, stable Neo-Hookean's closed form at an inversion.

Each energy compiles its kernels once (the first test using it); every later test reuses them."""

import os

import numpy as np
import pytest
import warp as wp
from derivcheck import check_problem_derivatives

import warp_meshad as wm
from warp_meshad.kernels.energies import (
    ArapTetData,
    StableNeoHookeanData,
    arap_tet,
    stable_neo_hookean,
    stable_neo_hookean_lame,
)

DEVICE = os.environ.get("WARP_MESHAD_TEST_DEVICE", "cpu")
pytestmark = pytest.mark.device  # every test runs on DEVICE: the GPU subset under a CUDA test device
MU, LAM = 2.0, 5.0  # [Pa]: the energy's parameters (ARAP uses MU only)
ENERGIES = ["stable_neo_hookean", "arap_tet"]


def _rotation(rng) -> np.ndarray:
    q, r = np.linalg.qr(rng.normal(size=(3, 3)))
    q = q * np.sign(np.diag(r))
    return q if np.linalg.det(q) > 0 else -q


def _problem(name: str, mesh: wm.TetMesh, mu: float = MU, lam: float = LAM) -> wm.Problem:
    if name == "stable_neo_hookean":
        data, energy = StableNeoHookeanData(), stable_neo_hookean
        data.lam = wp.float64(lam)
    else:
        data, energy = ArapTetData(), arap_tet
    data.mu = wp.float64(mu)
    data.rest_inverse = wp.array(mesh.rest_matrix_inverses(), dtype=wp.mat33d, device=DEVICE)
    data.volume = wp.array(mesh.volumes(), dtype=wp.float64, device=DEVICE)
    problem = wm.Problem(mesh.vertex_count, 3, wp.float64, DEVICE)
    problem.add_term(mesh.tets, energy, data)
    return problem


def _vec(x) -> wp.array:
    return wp.array(np.asarray(x, dtype=np.float64), dtype=wp.vec3d, device=DEVICE)


def _disjoint_tets(count: int, rng) -> wm.TetMesh:
    """``count`` separate tets (4 vertices each) of random positive rest shapes."""
    corners = []
    for _ in range(count):
        while True:
            c = rng.normal(size=(4, 3))
            if np.linalg.det((c[1:] - c[0]).T) > 0.2:
                break
        corners.append(c)
    return wm.TetMesh(np.concatenate(corners), np.arange(4 * count).reshape(count, 4))


def _apply_per_tet(mesh: wm.TetMesh, deformation: np.ndarray) -> np.ndarray:
    """Positions of disjoint tets with F_t = deformation[t]: corner x_k = F_t (X_k - X_0) + X_0."""
    rest = mesh.vertices.reshape(-1, 4, 3)
    x = np.einsum("tij,tkj->tki", deformation, rest - rest[:, :1]) + rest[:, :1]
    return x.reshape(-1, 3)


@pytest.fixture(scope="module")
def bar():
    return wm.TetMesh.box(3, 2, 2, 1.0, 0.6, 0.4)  # 12 vertices, 12 tets: 36 scalars, checked densely


@pytest.fixture(scope="module", params=ENERGIES)
def energy(request, bar):
    return request.param, _problem(request.param, bar)


def _deformed(bar, rng):
    """A large random deformation of the bar with at least one inverted tet."""
    while True:
        x = bar.vertices + 0.25 * rng.normal(size=bar.vertices.shape)
        vol = bar.volumes(x)
        if (vol < 0).any() and (np.abs(vol) > 1e-3).all():
            return x


def test_derivatives_against_central_differences(energy, bar):
    name, problem = energy
    x = _deformed(bar, np.random.default_rng(0))
    result = check_problem_derivatives(problem, x)
    assert result["energy"] > 0.0
    assert result["hessian_min_eig"] < 0.0  # indefinite there; the projected Hessians (checked) are PSD


def test_zero_energy_and_gradient_at_rest_and_under_rigid_motion(energy, bar):
    name, problem = energy
    rng = np.random.default_rng(1)
    scale = MU * bar.total_volume()
    for x in (bar.vertices, bar.vertices @ _rotation(rng).T + rng.normal(size=3)):
        f, g = problem.eval_with_gradient(_vec(x))
        assert abs(f) <= 1e-13 * scale, f"{name}: energy {f} at a rigid motion of the rest shape"
        np.testing.assert_allclose(g.numpy(), 0.0, atol=1e-13 * MU)


def test_rotation_and_translation_invariance(energy, bar):
    name, problem = energy
    rng = np.random.default_rng(2)
    x = _deformed(bar, rng)
    f0, g0 = problem.eval_with_gradient(_vec(x))
    g0 = g0.numpy().copy()
    for _ in range(3):
        r, t = _rotation(rng), rng.normal(size=3)
        f, g = problem.eval_with_gradient(_vec(x @ r.T + t))
        np.testing.assert_allclose(f, f0, rtol=1e-12)
        np.testing.assert_allclose(g.numpy(), g0 @ r.T, rtol=1e-9, atol=1e-12 * np.abs(g0).max())


def _linear_elasticity_hessian(mesh: wm.TetMesh, mu_le: float, lam_le: float) -> np.ndarray:
    """Dense Hessian of sum_t V_t (mu |eps|^2 + lam / 2 tr(eps)^2), eps = sym(grad u), u linear per tet."""
    n = mesh.vertex_count
    k = np.zeros((3 * n, 3 * n))
    inv = mesh.rest_matrix_inverses()
    for t, tet in enumerate(mesh.tets):
        # grad u = sum_a u_a (x) b_a with b_1..3 the rows of Dm^-1 and b_0 = -(b_1 + b_2 + b_3)
        b = np.vstack([-inv[t].sum(axis=0), inv[t]])  # (4, 3)
        for a in range(4):
            for c in range(4):
                # d^2/du_a du_c of mu |sym(u (x) b)|^2 + lam / 2 (u . b)^2 summed
                block = mu_le * (np.dot(b[a], b[c]) * np.eye(3) + np.outer(b[c], b[a])) + lam_le * np.outer(b[a], b[c])
                k[3 * tet[a]:3 * tet[a] + 3, 3 * tet[c]:3 * tet[c] + 3] += mesh.volumes()[t] * block
    return k


def test_rest_hessian_is_linear_elasticity(energy, bar):
    """Small-strain limit: stable Neo-Hookean with (mu, lam) = lame(Y, nu) and ARAP (lambda_LE = 0)."""
    name, _ = energy
    young, poisson = 3.0e3, 0.3
    mu_le = young / (2 * (1 + poisson))
    lam_le = young * poisson / ((1 + poisson) * (1 - 2 * poisson))
    mu, lam = stable_neo_hookean_lame(young, poisson)
    assert mu == pytest.approx(mu_le) and lam == pytest.approx(lam_le + mu_le)
    problem = _problem(name, bar, mu=mu, lam=lam)
    _, _, h = problem.eval_with_hessian(_vec(bar.vertices))
    expected = _linear_elasticity_hessian(bar, mu_le, lam_le if name == "stable_neo_hookean" else 0.0)
    np.testing.assert_allclose(wm.to_scipy(h).toarray(), expected, rtol=1e-10, atol=1e-10 * np.abs(expected).max())


def test_arap_is_the_distance_to_the_closest_rotation():
    """psi = sum (s_i - 1)^2 over the signed singular values (det < 0: the smallest is negative), from random F."""
    rng = np.random.default_rng(4)
    count = 40
    mesh = _disjoint_tets(count, rng)
    s = rng.uniform(0.3, 2.5, size=(count, 3))
    s[: count // 4, 2] *= -1.0  # inverted tets
    s[count // 4: count // 4 + 4] = [[1.7, 1.7, 1.7], [1.0, 1.0, 0.2], [1.3, 1.3, 0.8], [2.0, 1e-4, 1e-4]]  # repeated
    f = np.stack([_rotation(rng) @ np.diag(si) @ _rotation(rng).T for si in s])
    problem = _problem("arap_tet", mesh)
    signed = np.sort(np.abs(s), axis=1)[:, ::-1] * np.where(np.arange(3) == 2, np.sign(s.prod(axis=1))[:, None], 1.0)
    expected = MU * np.sum(mesh.volumes() * np.sum((signed - 1.0) ** 2, axis=1))
    np.testing.assert_allclose(problem.eval(_vec(_apply_per_tet(mesh, f))), expected, rtol=1e-12)
    # a reflection: signed singular values (1, 1, -1), distance^2 4 to the closest rotation
    reflect = np.broadcast_to(np.diag([1.0, 1.0, -1.0]), (count, 3, 3))
    np.testing.assert_allclose(problem.eval(_vec(_apply_per_tet(mesh, reflect))), 4.0 * MU * mesh.total_volume(),
                               rtol=1e-12)
    # F = 0 (every tet collapsed to a point): psi = 3
    np.testing.assert_allclose(problem.eval(_vec(_apply_per_tet(mesh, np.zeros((count, 3, 3))))),
                               3.0 * MU * mesh.total_volume(), rtol=1e-12)


def test_stable_neo_hookean_closed_form_and_finite_through_inversion():
    rng = np.random.default_rng(5)
    count = 20
    mesh = _disjoint_tets(count, rng)
    problem = _problem("stable_neo_hookean", mesh)
    f = rng.normal(size=(count, 3, 3))
    ic = np.einsum("tij,tij->t", f, f)
    j = np.linalg.det(f)
    psi = 0.5 * MU * (ic - 3.0) - MU * (j - 1.0) + 0.5 * LAM * (j - 1.0) ** 2
    np.testing.assert_allclose(problem.eval(_vec(_apply_per_tet(mesh, f))), np.sum(mesh.volumes() * psi), rtol=1e-11)
    assert (j < 0).any()  # finite where inverted
    # flat tets (J = 0) and a full inversion F = -I (J = -1): finite, with a restoring gradient
    flat = np.broadcast_to(np.diag([1.0, 1.0, 0.0]), (count, 3, 3))
    f_flat, g_flat = problem.eval_with_gradient(_vec(_apply_per_tet(mesh, flat)))
    np.testing.assert_allclose(f_flat, mesh.total_volume() * (0.5 * MU * -1.0 + MU + 0.5 * LAM), rtol=1e-12)
    assert np.all(np.isfinite(g_flat.numpy())) and np.abs(g_flat.numpy()).max() > 0.0
    inverted = np.broadcast_to(-np.eye(3), (count, 3, 3))
    np.testing.assert_allclose(problem.eval(_vec(_apply_per_tet(mesh, inverted))),
                               mesh.total_volume() * (2.0 * MU + 2.0 * LAM), rtol=1e-12)


def test_lame_conversion_checks_its_arguments():
    with pytest.raises(ValueError, match="young: expected a Young's modulus > 0"):
        stable_neo_hookean_lame(0.0, 0.3)
    with pytest.raises(ValueError, match=r"poisson: expected a Poisson's ratio in \(-1, 0.5\), got 0.5"):
        stable_neo_hookean_lame(1.0, 0.5)
