"""Energies of the deformation gradient (``Problem.add_deformation_term``): the F forms of the built-in energies give
the energy, gradient and Hessian of their corner forms (``add_term``) to round-off; a user-written psi(F) matches
central differences; the projected Hessian (projected on F) is PSD and equals the unprojected one where the F Hessian
is already PD; element kinds without a deformation gradient, energies of the wrong arity and bad rest inverses are
refused with a message.

Every F term compiles its own kernels (k = 9, 6, 4 duals) and each corner form its own: the tests share problems so
that each (energy, mode) is compiled once."""

import os
from typing import Any

import numpy as np
import pytest
import warp as wp
from derivcheck import check_problem_derivatives

import warp_meshad as wm
from warp_meshad.kernels import ad
from warp_meshad.kernels.energies import (
    ArapTetData,
    NeoHookeanMembraneData,
    StableNeoHookeanData,
    SymmetricDirichletData,
    arap_tet,
    arap_tet_F,
    neo_hookean_membrane,
    neo_hookean_membrane_F,
    stable_neo_hookean,
    stable_neo_hookean_F,
    symmetric_dirichlet,
    symmetric_dirichlet_F,
)

DEVICE = os.environ.get("WARP_MESHAD_TEST_DEVICE", "cpu")
pytestmark = pytest.mark.device


def _f64(a):
    return wp.array(np.asarray(a, dtype=np.float64), dtype=wp.float64, device=DEVICE)


def _tet_case(name: str):
    """A 2 x 2 x 2 box of tets (48 tets, 27 vertices), stretched and randomly moved (no tet inverted)."""
    mesh = wm.TetMesh.box(3, 3, 3)
    rng = np.random.default_rng(1)
    x = mesh.vertices * np.array([1.1, 0.95, 1.0]) + 0.08 * rng.uniform(-1.0, 1.0, mesh.vertices.shape)
    dinv = wp.array(mesh.rest_matrix_inverses(), dtype=wp.mat33d, device=DEVICE)
    if name == "stable_neo_hookean":
        data = StableNeoHookeanData()
        data.lam = wp.float64(5.0)
        corner, psi = stable_neo_hookean, stable_neo_hookean_F
    else:
        data = ArapTetData()
        corner, psi = arap_tet, arap_tet_F
    data.rest_inverse = dinv
    data.volume = _f64(mesh.volumes())
    data.mu = wp.float64(2.0)
    return mesh.vertex_count, 3, mesh.tets, corner, psi, dinv, data, x


def _membrane_case():
    """A 4 x 3 grid in the plane, its vertices lifted and moved (triangles in 3D: F 3 x 2)."""
    mesh = wm.TriMesh.grid(4, 3, width=1.2, height=0.8)
    rng = np.random.default_rng(2)
    x = mesh.vertices * 1.05 + 0.05 * rng.uniform(-1.0, 1.0, mesh.vertices.shape)
    dinv = wp.array(mesh.face_rest_frame_inverses(), dtype=wp.mat22d, device=DEVICE)
    data = NeoHookeanMembraneData()
    data.rest_inverse = dinv
    data.area = _f64(mesh.face_areas())
    data.mu, data.lam, data.thickness = wp.float64(2.0), wp.float64(5.0), wp.float64(0.01)
    return mesh.vertex_count, 3, mesh.faces, neo_hookean_membrane, neo_hookean_membrane_F, dinv, data, x


def _dirichlet_case():
    """A 4 x 3 grid mapped to the plane with small random moves (flat triangles: F 2 x 2, none flipped)."""
    mesh = wm.TriMesh.grid(4, 3, width=1.2, height=0.8)
    rng = np.random.default_rng(3)
    uv = mesh.vertices[:, :2] * np.array([1.2, 0.9]) + 0.04 * rng.uniform(-1.0, 1.0, (mesh.vertex_count, 2))
    dinv = wp.array(mesh.face_rest_frame_inverses(), dtype=wp.mat22d, device=DEVICE)
    data = SymmetricDirichletData(wp.float64, rest_inverse=dinv, area=_f64(mesh.face_areas()))
    return mesh.vertex_count, 2, mesh.faces, symmetric_dirichlet, symmetric_dirichlet_F, dinv, data, uv


CASES = {
    "stable_neo_hookean": lambda: _tet_case("stable_neo_hookean"),
    "arap_tet": lambda: _tet_case("arap_tet"),
    "neo_hookean_membrane": _membrane_case,
    "symmetric_dirichlet": _dirichlet_case,
}


def _problems(name: str):
    n, dim, elements, corner, psi, dinv, data, x = CASES[name]()
    pc = wm.Problem(n, dim, wp.float64, device=DEVICE)
    pc.add_term(elements, corner, data)
    pf = wm.Problem(n, dim, wp.float64, device=DEVICE)
    pf.add_deformation_term(elements, psi, rest_inverse=dinv, data=data)
    xw = wp.array(x, dtype=pf.variable_type, device=DEVICE)
    return pc, pf, xw


def _dense(problem, x, proj: bool = False):
    f, g, H = problem.eval_with_hessian_proj(x) if proj else problem.eval_with_hessian(x)
    return f, g.numpy().copy(), wm.to_scipy(H).toarray()


def _assert_round_off(got, want, what: str):
    want = np.asarray(want)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-13 * np.abs(want).max(), err_msg=what)


@pytest.mark.parametrize("name", list(CASES))
def test_F_form_equals_the_corner_form(name):
    pc, pf, x = _problems(name)
    fc, gc, hc = _dense(pc, x)
    ff, gf, hf = _dense(pf, x)
    np.testing.assert_allclose(ff, fc, rtol=1e-12)
    _assert_round_off(gf, gc, f"{name}: gradient")
    _assert_round_off(hf, hc, f"{name}: Hessian")
    assert pf.eval(x) == pytest.approx(fc, rel=1e-12)  # the plain-value kernel


def test_F_projection_is_psd_and_hvp_is_H_v():
    _, pf, x = _problems("stable_neo_hookean")
    x = wp.array(x.numpy() * np.array([0.5, 1.0, 1.0]), dtype=wp.vec3d, device=DEVICE)  # compressed: J ~ 0.5
    _, _, h = _dense(pf, x)
    assert np.linalg.eigvalsh(h).min() < -1e-6 * np.abs(h).max()  # indefinite here: the projection has work to do
    _, _, hp = _dense(pf, x, proj=True)
    np.testing.assert_allclose(hp, hp.T, atol=1e-13 * np.abs(hp).max())
    assert np.linalg.eigvalsh(hp).min() >= -1e-12 * np.abs(hp).max()
    v = np.random.default_rng(4).normal(size=(pf.variable_count, 3))
    hv = pf.hessian_vector_product(x, wp.array(v, dtype=wp.vec3d, device=DEVICE)).numpy()
    _assert_round_off(hv.reshape(-1), h @ v.reshape(-1), "Hessian-vector product")


@wp.struct
class _VolumeData:
    volume: wp.array(dtype=wp.float64)


@wp.func
def _convex_psi(t: int, F: Any, data: _VolumeData):
    """V (|F|^2 + |F|^4 / 4 + det F): its F Hessian 2 I + |F|^2 I + 2 F (x) F + d2 det is PD near F = I."""
    s = ad.frobenius_sq(F)
    return data.volume[t] * (s + 0.25 * s * s + ad.det(F))


def test_user_psi_matches_central_differences_and_projection_keeps_a_pd_F_hessian():
    mesh = wm.TetMesh.box(2, 2, 3)
    rng = np.random.default_rng(5)
    x = mesh.vertices * 1.05 + 0.04 * rng.uniform(-1.0, 1.0, mesh.vertices.shape)
    data = _VolumeData()
    data.volume = _f64(mesh.volumes())
    p = wm.Problem(mesh.vertex_count, 3, wp.float64, device=DEVICE)
    p.add_deformation_term(mesh.tets, _convex_psi, rest_inverse=mesh.rest_matrix_inverses(), data=data)
    check_problem_derivatives(p, x)
    xw = wp.array(x, dtype=wp.vec3d, device=DEVICE)
    _, _, h = _dense(p, xw)
    _, _, hp = _dense(p, xw, proj=True)
    _assert_round_off(hp, h, "projected Hessian of a PD F Hessian")


def test_bad_element_kinds_energies_and_rest_inverses_are_refused():
    mesh = wm.TetMesh.box(2, 2, 2)
    data = _VolumeData()
    data.volume = _f64(mesh.volumes())
    dinv = mesh.rest_matrix_inverses()
    p = wm.Problem(mesh.vertex_count, 3, wp.float64, device=DEVICE)
    edges = mesh.tets[:, :2]
    with pytest.raises(ValueError, match=r"deformation gradients exist for valence 4 with variable_dim 3 .*"
                                         r"got valence 2 with variable_dim 3"):  # fmt: skip
        p.add_deformation_term(edges, _convex_psi, rest_inverse=dinv, data=data)
    with pytest.raises(ValueError, match=r"must take 3 arguments \(element index, F 3x3 \(one matrix\), data\)"):
        p.add_deformation_term(mesh.tets, stable_neo_hookean, rest_inverse=dinv, data=data)
    with pytest.raises(ValueError, match=r"rest_inverse=\.\.\.\) must have shape \[\d+\] of 3x3 matrices of float64"
                                         r".*got a float64 array of shape \(\d+, 2, 2\)"):  # fmt: skip
        p.add_deformation_term(mesh.tets, _convex_psi, rest_inverse=dinv[:, :2, :2], data=data)
    with pytest.raises(ValueError, match=r"rest_inverse=\.\.\.\): expected D_m\^-1 per element, got None"):
        p.add_deformation_term(mesh.tets, _convex_psi, rest_inverse=None, data=data)
    assert p.terms == []


def test_deterministic_F_term_equals_the_atomic_one():
    _, pf, x = _problems("stable_neo_hookean")
    n, dim, elements, _, psi, dinv, data, _ = CASES["stable_neo_hookean"]()
    pd = wm.Problem(n, dim, wp.float64, device=DEVICE, deterministic=True)
    pd.add_deformation_term(elements, psi, rest_inverse=dinv, data=data)
    f, g, h = _dense(pf, x)
    fd, gd, hd = _dense(pd, x)
    np.testing.assert_allclose(fd, f, rtol=1e-12)
    _assert_round_off(gd, g, "deterministic gradient")
    _assert_round_off(hd, h, "deterministic Hessian")
