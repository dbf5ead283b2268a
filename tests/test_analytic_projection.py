"""The analytic PSD projection of a deformation term (``add_deformation_term(..., projection=...)``): stable
Neo-Hookean's closed-form eigensystem (``stable_neo_hookean_F_hessian_proj``, Smith, de Goes, Kim 2019) gives the
same projected 9 x 9 F Hessian as the Jacobi projection of the dual Hessian and as numpy's eigen-decomposition, on
random F including inverted, degenerate and repeated-singular-value ones; the assembled projected Hessian, energy and
gradient equal the Jacobi path's; bad projections are refused.

Each tet of the 9 x 9 test has its own four vertices and D_m^-1 = I, so F = [x_1 - x_0, x_2 - x_0, x_3 - x_0] and the
blocks (a, b) of corners 1..3 of its 12 x 12 Hessian are the entries of the F Hessian themselves:
H_x[(a, i), (b, l)] = H_F[3 i + a - 1, 3 l + b - 1]."""

import os
from typing import Any

import numpy as np
import pytest
import warp as wp

import warp_meshad as wm
from warp_meshad.kernels.energies import (
    StableNeoHookeanData,
    stable_neo_hookean_F,
    stable_neo_hookean_F_hessian_proj,
)

DEVICE = os.environ.get("WARP_MESHAD_TEST_DEVICE", "cpu")
pytestmark = pytest.mark.device
EPS = 1e-12  # "clamp" at a tiny eps: the projection sets negative eigenvalues to (almost) zero


def _rotation(rng):
    q, r = np.linalg.qr(rng.normal(size=(3, 3)))
    q = q * np.sign(np.diag(r))
    return q * np.linalg.det(q)


def _deformation_gradients():
    """Random F near and far from I, inverted ones, and the degenerate cases of the eigensystem: equal singular
    values (twist/flip pairs of equal eigenvalues), s_i = -s_j (an inverted F's pair), a flat and a collapsed tet,
    F = 0, rotations, reflections."""
    rng = np.random.default_rng(7)
    fs = [np.eye(3) + 0.3 * rng.normal(size=(3, 3)) for _ in range(12)]
    fs += [rng.normal(size=(3, 3)) for _ in range(12)]
    fs += [f @ np.diag([1.0, 1.0, -1.0]) for f in fs[:12]]  # inverted
    diag = [(1.0, 1.0, 1.0), (1.0, 1.0, -1.0), (1.3, 0.7, -0.7), (0.6, 0.6, 0.6), (2.0, 1e-9, 1e-9),
            (1.5, 1.0, 1e-8), (1.0, 1.0, 0.0), (0.0, 0.0, 0.0), (1.2, 1.2, 0.3), (0.4, 0.4, -0.4), (3.0, 0.2, -0.1)]
    for s in diag:
        fs.append(_rotation(rng) @ np.diag(s) @ _rotation(rng).T)
        fs.append(np.diag(s))
    return np.array(fs)


def _disjoint_tets(fs, volume, mu, lam, projection):
    m = len(fs)
    x = np.zeros((4 * m, 3))
    x[1::4], x[2::4], x[3::4] = fs[:, :, 0], fs[:, :, 1], fs[:, :, 2]
    data = StableNeoHookeanData()
    data.rest_inverse = wp.array(np.tile(np.eye(3), (m, 1, 1)), dtype=wp.mat33d, device=DEVICE)
    data.volume = wp.array(volume, dtype=wp.float64, device=DEVICE)
    data.mu, data.lam = wp.float64(mu), wp.float64(lam)
    p = wm.Problem(4 * m, 3, wp.float64, device=DEVICE)
    p.add_deformation_term(np.arange(4 * m).reshape(m, 4), stable_neo_hookean_F, rest_inverse=data.rest_inverse,
                           data=data, projection=projection)  # fmt: skip
    return p, wp.array(x, dtype=wp.vec3d, device=DEVICE)


def _f_hessians(H, m):
    """The 9 x 9 F Hessian of each tet from the dense 12m x 12m Hessian in x (see the module docstring)."""
    out = np.zeros((m, 9, 9))
    idx = np.array([(a, i) for i in range(3) for a in range(1, 4)])  # F entry 3 i + j  <->  corner j + 1, row i
    for t in range(m):
        rows = [(4 * t + a) * 3 + i for a, i in idx]
        out[t] = H[np.ix_(rows, rows)]
    return out


def _dense(p, x, mode=None):
    f, g, H = p.eval_with_hessian(x) if mode is None else p.eval_with_hessian_proj(x, mode=mode, eps=EPS)
    return f, g.numpy().copy(), wm.to_scipy(H).toarray()


def _numpy_projection(h, mode):
    w, q = np.linalg.eigh(0.5 * (h + h.T))
    w = np.maximum(np.abs(w) if mode == "abs" else w, EPS)
    return (q * w) @ q.T


@pytest.fixture(scope="module")
def tets():
    fs = _deformation_gradients()
    vol = np.random.default_rng(8).uniform(0.5, 2.0, len(fs))
    jacobi = _disjoint_tets(fs, vol, 2.0, 30.0, None)
    analytic = _disjoint_tets(fs, vol, 2.0, 30.0, stable_neo_hookean_F_hessian_proj)
    return fs, jacobi, analytic


@pytest.mark.parametrize("mode", ["clamp", "abs"])
def test_analytic_projection_equals_jacobi_and_numpy_per_F(tets, mode):
    fs, (pj, x), (pa, _) = tets
    m = len(fs)
    h = _f_hessians(_dense(pj, x)[2], m)
    hj = _f_hessians(_dense(pj, x, mode)[2], m)
    fa, ga, Ha = _dense(pa, x, mode)
    ha = _f_hessians(Ha, m)
    assert np.isfinite(Ha).all()
    for t in range(m):
        scale = np.abs(h[t]).max()
        np.testing.assert_allclose(ha[t], hj[t], rtol=0, atol=1e-9 * scale, err_msg=f"F = {fs[t].tolist()}")
        np.testing.assert_allclose(ha[t], _numpy_projection(h[t], mode), rtol=0, atol=1e-10 * scale,
                                   err_msg=f"F = {fs[t].tolist()}")  # fmt: skip
    assert any(np.linalg.eigvalsh(h[t]).min() < -1e-3 for t in range(m))  # the projection had work to do
    fj, gj, _ = _dense(pj, x, mode)
    np.testing.assert_allclose(fa, fj, rtol=1e-13)
    np.testing.assert_allclose(ga, gj, rtol=0, atol=1e-13 * np.abs(gj).max())


def test_assembled_analytic_projection_equals_the_jacobi_path():
    mesh = wm.TetMesh.box(3, 3, 3)
    rng = np.random.default_rng(9)
    x = mesh.vertices * np.array([0.5, 1.1, 1.0]) + 0.15 * rng.uniform(-1.0, 1.0, mesh.vertices.shape)
    x[0] = mesh.vertices[13] * 1.2  # one corner moved through the box: inverted tets
    data = StableNeoHookeanData()
    data.rest_inverse = wp.array(mesh.rest_matrix_inverses(), dtype=wp.mat33d, device=DEVICE)
    data.volume = wp.array(mesh.volumes(), dtype=wp.float64, device=DEVICE)
    data.mu, data.lam = wp.float64(2.0), wp.float64(30.0)
    problems = []
    for projection in (None, stable_neo_hookean_F_hessian_proj):
        p = wm.Problem(mesh.vertex_count, 3, wp.float64, device=DEVICE)
        p.add_deformation_term(mesh.tets, stable_neo_hookean_F, rest_inverse=data.rest_inverse, data=data,
                               weight=2.5, projection=projection)  # fmt: skip
        problems.append(p)
    xw = wp.array(x, dtype=wp.vec3d, device=DEVICE)
    fj, gj, hj = _dense(problems[0], xw, "clamp")
    fa, ga, ha = _dense(problems[1], xw, "clamp")
    assert np.linalg.eigvalsh(_dense(problems[0], xw)[2]).min() < -1e-3 * np.abs(hj).max()  # indefinite
    np.testing.assert_allclose(fa, fj, rtol=1e-13)
    np.testing.assert_allclose(ga, gj, rtol=0, atol=1e-13 * np.abs(gj).max())
    np.testing.assert_allclose(ha, hj, rtol=0, atol=1e-9 * np.abs(hj).max())
    assert np.linalg.eigvalsh(ha).min() >= -1e-12 * np.abs(ha).max()
    # the unprojected Hessian of the analytic problem is the dual one: bitwise on the CPU (serial adds); on a GPU the
    # float atomics add the element blocks in an order that varies from launch to launch (round-off)
    exact = wp.get_device(DEVICE).is_cpu
    np.testing.assert_allclose(_dense(problems[1], xw)[2], _dense(problems[0], xw)[2], rtol=0,
                               atol=0.0 if exact else 1e-14 * np.abs(hj).max())


@wp.func
def _three_args(t: int, F: Any, data: StableNeoHookeanData):
    return F


def test_bad_projections_are_refused():
    mesh = wm.TetMesh.box(2, 2, 2)
    data = StableNeoHookeanData()
    data.volume = wp.array(mesh.volumes(), dtype=wp.float64, device=DEVICE)
    dinv = mesh.rest_matrix_inverses()
    p = wm.Problem(mesh.vertex_count, 3, wp.float64, device=DEVICE)
    arity = (r"projection=_three_args\) must take 5 arguments \(e, F, data, eps, absolute\) for F 3x3 \(one matrix\); "
             r"it takes 3: \(t, F, data\)")
    with pytest.raises(ValueError, match=arity):
        p.add_deformation_term(mesh.tets, stable_neo_hookean_F, dinv, data, projection=_three_args)
    with pytest.raises(TypeError, match=r"projection=\.\.\.\) must be a @wp.func, got function"):
        p.add_deformation_term(mesh.tets, stable_neo_hookean_F, dinv, data, projection=lambda *a: None)
    with pytest.raises(ValueError, match=r"weight=\.\.\.\) must be > 0 with projection=\.\.\..*got 0.0"):
        p.add_deformation_term(mesh.tets, stable_neo_hookean_F, dinv, data, weight=0.0,
                               projection=stable_neo_hookean_F_hessian_proj)  # fmt: skip
    assert p.terms == []
