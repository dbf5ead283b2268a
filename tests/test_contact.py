"""Contact geometry and IPC barriers: distances, barrier derivatives, CCD, candidates, intersection tests.

References are independent of the code under test: NumPy distances by projection and clamping
(not by Voronoi regions), the separating-axis theorem for triangle pairs, a Lipschitz-certified
sampling of the distance along CCD paths, and brute force for candidate pairs.
"""

import os
import pathlib

import numpy as np
import pytest
import warp as wp
from derivcheck import check_problem_derivatives

import warp_meshad as wm
from warp_meshad._src.contact import search as contact
from warp_meshad.kernels.contact import (
    edge_edge_distance_sq,
    edge_edge_distance_type,
    point_triangle_distance_sq,
    point_triangle_distance_type,
    segment_triangle_intersect,
    triangles_intersect,
    triangles_intersect_np,
)
from warp_meshad.kernels.energies import (
    BarrierData,
    EdgeEdgeBarrierData,
    edge_edge_barrier,
    point_triangle_barrier,
)

MESHES = pathlib.Path(__file__).resolve().parents[1] / "assets" / "meshes"
DEVICE = os.environ.get("WARP_MESHAD_TEST_DEVICE", "cpu")
pytestmark = pytest.mark.device  # every test runs on DEVICE: the GPU subset under a CUDA test device


def _vec3(x):
    return wp.array(np.asarray(x, dtype=np.float64), dtype=wp.vec3d, device=DEVICE)


# ------------------------------------------------------------------------------ NumPy references


def _dot(a, b):
    return np.einsum("...i,...i->...", a, b)


def _point_segment_sq(p, u, v):
    e = v - u
    t = np.clip(_dot(p - u, e) / _dot(e, e), 0.0, 1.0)
    return _dot(p - u - e * t[..., None], p - u - e * t[..., None])


def ref_point_triangle_sq(p, a, b, c):
    """min(distance to the plane if the projection is inside, distances to the three closed edges)."""
    edges = np.minimum(np.minimum(_point_segment_sq(p, a, b), _point_segment_sq(p, b, c)), _point_segment_sq(p, c, a))
    e1, e2, w = b - a, c - a, p - a
    g11, g12, g22, r1, r2 = _dot(e1, e1), _dot(e1, e2), _dot(e2, e2), _dot(e1, w), _dot(e2, w)
    det = g11 * g22 - g12 * g12
    with np.errstate(divide="ignore", invalid="ignore"):
        s, t = (g22 * r1 - g12 * r2) / det, (g11 * r2 - g12 * r1) / det
        n = np.cross(e1, e2)
        plane = _dot(w, n) ** 2 / _dot(n, n)
        inside = (det > 1e-12 * g11 * g22) & (s >= 0) & (t >= 0) & (s + t <= 1)
    return np.where(inside, plane, edges)


def ref_edge_edge_sq(a0, a1, b0, b1):
    """min(distance of the lines if both closest points are interior, the four endpoint-segment distances)."""
    ends = np.minimum.reduce(
        [_point_segment_sq(a0, b0, b1), _point_segment_sq(a1, b0, b1), _point_segment_sq(b0, a0, a1)]
        + [_point_segment_sq(b1, a0, a1)]
    )
    u, v, w = a1 - a0, b1 - b0, b0 - a0
    uu, uv, vv, uw, vw = _dot(u, u), _dot(u, v), _dot(v, v), _dot(u, w), _dot(v, w)
    det = uu * vv - uv * uv  # closest points a0 + s u, b0 + t v
    with np.errstate(divide="ignore", invalid="ignore"):
        s, t = (vv * uw - uv * vw) / det, (uv * uw - uu * vw) / det
        n = np.cross(u, v)
        lines = _dot(w, n) ** 2 / _dot(n, n)
        inside = (det > 1e-12 * uu * vv) & (s > 0) & (s < 1) & (t > 0) & (t < 1)
    return np.where(inside, lines, ends)


def ref_triangles_intersect_sat(t1, t2):
    """Separating-axis test of closed triangles: face normals, edge x edge, and in-plane edge normals."""
    e1 = np.roll(t1, -1, axis=1) - t1  # (m, 3, 3) edges
    e2 = np.roll(t2, -1, axis=1) - t2
    n1 = np.cross(e1[:, 0], e1[:, 1])
    n2 = np.cross(e2[:, 0], e2[:, 1])
    axes = [n1, n2]
    axes += [np.cross(e1[:, i], e2[:, j]) for i in range(3) for j in range(3)]
    axes += [np.cross(n1, e1[:, i]) for i in range(3)] + [np.cross(n2, e2[:, i]) for i in range(3)]
    separated = np.zeros(t1.shape[0], dtype=bool)
    for ax in axes:
        p1 = np.einsum("mki,mi->mk", t1, ax)
        p2 = np.einsum("mki,mi->mk", t2, ax)
        scale = np.abs(p1).max(1) + np.abs(p2).max(1) + 1e-300
        gap = np.maximum(p2.min(1) - p1.max(1), p1.min(1) - p2.max(1))
        separated |= (gap > 1e-12 * scale) & (_dot(ax, ax) > 1e-24)
    return ~separated


# ------------------------------------------------------------------------------ plain device kernels


@wp.kernel(enable_backward=False)
def _distances(x: wp.array2d(dtype=wp.vec3d), out: wp.array2d(dtype=wp.float64), types: wp.array2d(dtype=wp.int32)):
    i = wp.tid()
    out[i, 0] = point_triangle_distance_sq(x[i, 0], x[i, 1], x[i, 2], x[i, 3])
    out[i, 1] = edge_edge_distance_sq(x[i, 0], x[i, 1], x[i, 2], x[i, 3])
    types[i, 0] = point_triangle_distance_type(x[i, 0], x[i, 1], x[i, 2], x[i, 3])
    types[i, 1] = edge_edge_distance_type(x[i, 0], x[i, 1], x[i, 2], x[i, 3])


@wp.kernel(enable_backward=False)
def _intersections(x: wp.array2d(dtype=wp.vec3d), out: wp.array2d(dtype=wp.int32)):
    i = wp.tid()
    out[i, 0] = wp.where(triangles_intersect(x[i, 0], x[i, 1], x[i, 2], x[i, 3], x[i, 4], x[i, 5]), 1, 0)
    out[i, 1] = wp.where(segment_triangle_intersect(x[i, 0], x[i, 1], x[i, 3], x[i, 4], x[i, 5]), 1, 0)


def _device_distances(points):
    m = points.shape[0]
    out = wp.zeros((m, 2), dtype=wp.float64, device=DEVICE)
    types = wp.zeros((m, 2), dtype=wp.int32, device=DEVICE)
    wp.launch(_distances, m, inputs=[wp.array(points, dtype=wp.vec3d, device=DEVICE), out, types], device=DEVICE)
    return out.numpy(), types.numpy()


def _device_intersections(tris):
    m = tris.shape[0]
    out = wp.zeros((m, 2), dtype=wp.int32, device=DEVICE)
    wp.launch(_intersections, m, inputs=[wp.array(tris, dtype=wp.vec3d, device=DEVICE), out], device=DEVICE)
    return out.numpy().astype(bool)


# ------------------------------------------------------------------------------ distances


def test_distances_match_references_and_cover_every_type():
    rng = np.random.default_rng(0)
    pts = rng.normal(size=(20000, 4, 3))
    pts[:200, 3] = pts[:200, 2] + 1e-13 * rng.normal(size=(200, 3))  # degenerate triangles, point-like edges
    pts[200:400, 3] = pts[200:400, 2] + 0.7 * (pts[200:400, 1] - pts[200:400, 0])  # parallel edges
    d, types = _device_distances(pts)
    p, a, b, c = (pts[:, i] for i in range(4))
    np.testing.assert_allclose(d[400:, 0], ref_point_triangle_sq(p, a, b, c)[400:], rtol=1e-9)
    np.testing.assert_allclose(d[:, 1], ref_edge_edge_sq(p, a, b, c), rtol=1e-9, atol=1e-14)
    # degenerate triangles: the distance to the closest of their edges
    edges = np.minimum.reduce([_point_segment_sq(p, a, b), _point_segment_sq(p, b, c), _point_segment_sq(p, c, a)])
    np.testing.assert_allclose(d[:200, 0], edges[:200], rtol=1e-9)
    assert np.all(types[:200, 0] != 6)
    assert np.all(types[200:400, 1] != 0), "parallel edges never use the line-line formula"
    np.testing.assert_array_equal(np.unique(types[:, 0]), np.arange(7))
    np.testing.assert_array_equal(np.unique(types[:, 1]), np.arange(9))


# ------------------------------------------------------------------------------ barriers


TRIANGLE = np.array([[0.0, 0.0, 0.0], [1.0, 0.0, 0.0], [0.2, 0.9, 0.0]])
# one point per region of TRIANGLE: vertices a, b, c; edges ab, bc, ca; face
PT_POINTS = np.array(
    [[-0.2, -0.15, 0.1], [1.2, -0.1, 0.1], [0.15, 1.2, -0.1]]  # vertex regions
    + [[0.5, -0.2, 0.12], [0.75, 0.6, -0.1], [-0.1, 0.4, 0.15]]  # edge regions
    + [[0.4, 0.3, 0.2]]  # face
)


def _point_triangle_setup(rng, dhat=0.5, kappa=10.0):
    x = []
    for i, p in enumerate(PT_POINTS):
        rot = np.linalg.qr(rng.normal(size=(3, 3)))[0]
        x += list((np.vstack([p, TRIANGLE]) @ rot.T) + rng.normal(size=3))
    x = np.array(x)
    data = BarrierData()
    data.activation_distance = wp.float64(dhat)
    data.stiffness = wp.float64(kappa)
    problem = wm.Problem(x.shape[0], variable_dim=3, device=DEVICE)
    elements = np.arange(x.shape[0]).reshape(-1, 4)
    problem.add_term(elements, point_triangle_barrier, data)
    return problem, x, elements


def _barrier_ref(d, dhat, kappa):
    dh2 = dhat * dhat
    return np.where(d < dh2, -kappa * (d - dh2) ** 2 * np.log(d / dh2), 0.0)


def test_point_triangle_barrier_derivatives_in_every_region():
    rng = np.random.default_rng(1)
    problem, x, el = _point_triangle_setup(rng)
    _, types = _device_distances(x[el])
    np.testing.assert_array_equal(types[:, 0], np.arange(7))  # one element per region
    result = check_problem_derivatives(problem, x)
    d = ref_point_triangle_sq(*(x[el[:, i]] for i in range(4)))
    assert np.all(d < 0.25)
    np.testing.assert_allclose(result["energy"], _barrier_ref(d, 0.5, 10.0).sum(), rtol=1e-12)


def test_point_triangle_barrier_zero_beyond_dhat_and_inf_at_contact():
    rng = np.random.default_rng(2)
    problem, x, el = _point_triangle_setup(rng)
    f, g = problem.eval_with_gradient(_vec3(4.0 * (x - x.mean(0))))  # scaled: every distance >= d_hat
    assert f == 0.0
    np.testing.assert_array_equal(g.numpy(), 0.0)
    touching = x.copy()
    # the face point moved onto a corner of its triangle: the distance is exactly 0 in any arithmetic (onto the
    # centroid, rounding leaves a distance of ~1e-17 on a GPU, where FMA contraction differs, and the energy is finite)
    touching[el[6, 0]] = x[el[6, 1]]
    assert problem.eval(_vec3(touching)) == np.inf
    f, g = problem.eval_with_gradient(_vec3(touching))
    assert f == np.inf and np.all(np.isfinite(g.numpy()))


def _edge_edge_setup(rng, dhat=0.5, kappa=10.0):
    """Pairs [a0, a1, b0, b1] of every distance type, a near-parallel pair (mollifier active) and a far pair."""
    a = np.array([[0.0, 0.0, 0.0], [1.0, 0.0, 0.0]])
    cases = [
        [[0.5, -0.5, 0.2], [0.45, 0.5, 0.25]],  # 0 interiors
        [[-0.2, -0.5, 0.1], [-0.25, 0.5, 0.2]],  # 3: b's line passes beyond a0 -> a0 vs edge b
        [[1.2, -0.5, 0.1], [1.25, 0.5, 0.2]],  # a1 vs edge b
        [[0.4, 0.15, 0.1], [0.6, 1.0, 0.3]],  # b0 vs edge a
        [[0.6, 1.0, 0.2], [0.45, 0.2, -0.1]],  # b1 vs edge a
        [[-0.1, -0.1, 0.15], [-0.6, -1.0, 0.2]],  # a0 - b0
        [[-0.6, -1.0, 0.2], [-0.15, -0.05, -0.1]],  # a0 - b1
        [[1.1, 0.1, 0.15], [1.6, 1.0, 0.2]],  # a1 - b0
        [[1.6, 1.0, 0.2], [1.05, 0.1, -0.15]],  # a1 - b1
        [[0.1, 0.02, 0.25], [1.2, 0.035, 0.26]],  # near parallel: |a x b|^2 < eps_x
    ]
    x = []
    for b in cases:
        rot = np.linalg.qr(rng.normal(size=(3, 3)))[0]
        x += list((np.vstack([a, b]) @ rot.T) + rng.normal(size=3))
    x = np.array(x)
    elements = np.arange(x.shape[0]).reshape(-1, 4)
    data = EdgeEdgeBarrierData()
    data.activation_distance = wp.float64(dhat)
    data.stiffness = wp.float64(kappa)
    data.mollifier_threshold = contact.edge_edge_mollifier_thresholds(x, elements, device=DEVICE)
    problem = wm.Problem(x.shape[0], variable_dim=3, device=DEVICE)
    problem.add_term(elements, edge_edge_barrier, data)
    return problem, x, elements, data


def test_edge_edge_barrier_derivatives_every_type_and_near_parallel():
    rng = np.random.default_rng(3)
    problem, x, el, data = _edge_edge_setup(rng)
    _, types = _device_distances(x[el])
    np.testing.assert_array_equal(types[:9, 1], [0, 1, 2, 3, 4, 5, 6, 7, 8])
    a0, a1, b0, b1 = (x[el[:, i]] for i in range(4))
    eps = data.mollifier_threshold.numpy()
    np.testing.assert_allclose(eps, 1e-3 * _dot(a1 - a0, a1 - a0) * _dot(b1 - b0, b1 - b0), rtol=1e-14)
    c = _dot(np.cross(a1 - a0, b1 - b0), np.cross(a1 - a0, b1 - b0))
    assert c[9] < 0.5 * eps[9] and np.all(c[:9] > 1.5 * eps[:9])  # mollifier active only on the last pair
    result = check_problem_derivatives(problem, x)
    d = ref_edge_edge_sq(a0, a1, b0, b1)
    assert np.all(d < 0.25)
    mollifier = np.where(c < eps, (2.0 - c / eps) * c / eps, 1.0)
    np.testing.assert_allclose(result["energy"], np.sum(mollifier * _barrier_ref(d, 0.5, 10.0)), rtol=1e-12)


def test_edge_edge_barrier_parallel_edges_vanish_and_limits():
    rng = np.random.default_rng(4)
    problem, x, el, _ = _edge_edge_setup(rng)
    # exactly parallel copies of every pair (b = a shifted): the mollifier makes each energy zero, with zero gradient
    par = x.copy()
    for row in el:
        shift = np.cross(x[row[1]] - x[row[0]], rng.normal(size=3))
        shift *= 0.2 / np.linalg.norm(shift)
        par[row[2]], par[row[3]] = x[row[0]] + shift + 0.3 * (x[row[1]] - x[row[0]]), x[row[1]] + shift
    f, g, H = problem.eval_with_hessian(_vec3(par))
    assert abs(f) < 1e-20
    np.testing.assert_allclose(g.numpy(), 0.0, atol=1e-10)
    assert np.all(np.isfinite(wm.to_scipy(H).data))
    f, g = problem.eval_with_gradient(_vec3(4.0 * (x - x.mean(0))))  # beyond d_hat
    assert f == 0.0
    np.testing.assert_array_equal(g.numpy(), 0.0)
    crossing = x.copy()
    crossing[el[0, 2]] = x[el[0, 0]]  # b0 on a0: distance exactly 0
    assert problem.eval(_vec3(crossing)) == np.inf


# ------------------------------------------------------------------------------ CCD


def _ccd(kind, x0, dx, t_max=1.0, min_distance=0.0):
    """Per-pair ACCD times of impact through the contact module's kernels (pairs are rows of 4 vertices)."""
    m = x0.shape[0]
    rows = wp.array(np.arange(4 * m, dtype=np.int32).reshape(m, 4), dtype=wp.int32, device=DEVICE)
    toi = wp.zeros(m, dtype=wp.float64, device=DEVICE)
    t_min = wp.array([t_max], dtype=wp.float64, device=DEVICE)
    args = [wp.float64(min_distance), wp.float64(t_max), wp.float64(0.9), 100_000]
    inputs = [_vec3(x0.reshape(-1, 3)), _vec3(dx.reshape(-1, 3)), rows, 0 if kind == "pt" else 1, *args, toi, t_min]
    wp.launch(contact._pair_step, m, inputs=inputs, device=DEVICE)
    return toi.numpy()


def _certified_separation(kind, x0, dx, toi, samples=4000):
    """Lower bound of the distance over [0, toi] per pair: fine samples plus the Lipschitz bound between them."""
    ref = ref_point_triangle_sq if kind == "pt" else ref_edge_edge_sq
    u = dx - dx.mean(1, keepdims=True)
    speed = np.linalg.norm(u, axis=2)
    lp = speed[:, 0] + speed[:, 1:].max(1) if kind == "pt" else speed[:, :2].max(1) + speed[:, 2:].max(1)
    s = np.linspace(0.0, 1.0, samples + 1)[None, :] * toi[:, None]  # (m, S)
    pos = x0[:, None] + s[:, :, None, None] * dx[:, None]  # (m, S, 4, 3)
    d = np.sqrt(ref(*(pos[:, :, i] for i in range(4))))
    step = toi / samples
    return np.min(0.5 * (d[:, 1:] + d[:, :-1] - lp[:, None] * step[:, None]), axis=1)


def _colliding_pairs(kind, rng, m):
    """Random pairs that meet at a known time t* in (0.2, 0.8): returns x0, dx, t*."""
    x0 = rng.normal(size=(m, 4, 3))
    dx = rng.normal(size=(m, 4, 3))
    t_star = rng.uniform(0.2, 0.8, size=m)
    xs = x0 + t_star[:, None, None] * dx  # configuration at t*
    if kind == "pt":
        w = rng.dirichlet(np.ones(3), size=m)
        target = np.einsum("mk,mki->mi", w, xs[:, 1:])  # a point of the triangle at t*
        dx[:, 0] = (target - x0[:, 0]) / t_star[:, None]
    else:
        s = rng.uniform(0.05, 0.95, size=(m, 2))
        pa = xs[:, 0] + s[:, :1] * (xs[:, 1] - xs[:, 0])
        pb = xs[:, 2] + s[:, 1:] * (xs[:, 3] - xs[:, 2])
        dx[:, 2:] += ((pa - pb) / t_star[:, None])[:, None]  # edge b shifted so the two points meet at t*
    return x0, dx, t_star


@pytest.mark.parametrize("kind", ["pt", "ee"])
def test_ccd_is_safe_and_stops_before_impact(kind):
    rng = np.random.default_rng(5 if kind == "pt" else 6)
    m = 150
    x0, dx, t_star = _colliding_pairs(kind, rng, m)
    toi = _ccd(kind, x0, dx)
    assert np.all(toi > 0) and np.all(toi < t_star)
    assert np.all(_certified_separation(kind, x0, dx, toi) > 0)
    # random motions (most never meet): still safe
    x1 = rng.normal(size=(m, 4, 3))
    d1 = 2.0 * rng.normal(size=(m, 4, 3))
    toi1 = _ccd(kind, x1, d1)
    assert np.all((toi1 > 0) & (toi1 <= 1.0))
    assert np.all(_certified_separation(kind, x1, d1, toi1) > 0)
    assert np.mean(toi1 == 1.0) > 0.3  # pairs that stay apart are not blocked
    # a rigid translation of the whole pair never blocks the step; nothing moving gives t_max
    shift = np.repeat(rng.normal(size=(m, 1, 3)), 4, axis=1)
    np.testing.assert_array_equal(_ccd(kind, x1, shift), 1.0)
    np.testing.assert_array_equal(_ccd(kind, x1, np.zeros_like(x1), t_max=0.7), 0.7)


def test_ccd_separated_pairs_moving_apart_get_the_full_step():
    rng = np.random.default_rng(7)
    m = 100
    # point above the triangle's plane moving along the normal, away
    x0 = rng.normal(size=(m, 4, 3))
    n = np.cross(x0[:, 2] - x0[:, 1], x0[:, 3] - x0[:, 1])
    n /= np.linalg.norm(n, axis=1, keepdims=True)
    side = np.sign(_dot(x0[:, 0] - x0[:, 1], n))[:, None]
    dx = np.zeros_like(x0)
    dx[:, 0] = side * n * rng.uniform(0.1, 5.0, size=(m, 1))
    np.testing.assert_array_equal(_ccd("pt", x0, dx), 1.0)
    # edges moving apart along the common normal, even when starting very close
    x0[:, 3] = x0[:, 2] + rng.normal(size=(m, 3))
    nn = np.cross(x0[:, 1] - x0[:, 0], x0[:, 3] - x0[:, 2])
    nn /= np.linalg.norm(nn, axis=1, keepdims=True)
    mid_a = 0.5 * (x0[:, 0] + x0[:, 1])
    gap = 1e-4
    x0[:, 2:] += (mid_a - 0.5 * (x0[:, 2] + x0[:, 3]) + gap * nn)[:, None]
    dx = np.zeros_like(x0)
    dx[:, 2:] = (nn * rng.uniform(0.1, 5.0, size=(m, 1)))[:, None]
    toi = _ccd("ee", x0, dx)
    np.testing.assert_array_equal(toi, 1.0)
    # in contact (b0 on a0) and moving apart: no step can be certified from distance 0
    x0[:, 2] = x0[:, 0]
    np.testing.assert_array_equal(_ccd("ee", x0, dx), 0.0)


# ------------------------------------------------------------------------------ candidates and step bound


def _crumpled_sheet(rng):
    mesh = wm.TriMesh.grid(7, 6, width=1.0, height=0.8)
    v = mesh.vertices.copy()
    v[:, 2] = 0.25 * np.sin(5.0 * v[:, 0]) * np.cos(4.0 * v[:, 1]) + 0.02 * rng.normal(size=v.shape[0])
    v[:, :2] += 0.02 * rng.normal(size=(v.shape[0], 2))
    return v, mesh.faces, mesh.edges


def _brute_force_pairs(x, faces, edges, dist):
    pt, ee = set(), set()
    for v in range(x.shape[0]):
        ok = ~np.any(faces == v, axis=1)
        f = faces[ok]
        d = ref_point_triangle_sq(np.broadcast_to(x[v], (f.shape[0], 3)), x[f[:, 0]], x[f[:, 1]], x[f[:, 2]])
        pt |= {(v, *row) for row in f[d < dist**2].tolist()}
    for i, (a, b) in enumerate(edges.tolist()):
        other = edges[i + 1 :]
        ok = ~np.isin(other, [a, b]).any(axis=1)
        o = other[ok]
        xa, xb = np.broadcast_to(x[a], (o.shape[0], 3)), np.broadcast_to(x[b], (o.shape[0], 3))
        d = ref_edge_edge_sq(xa, xb, x[o[:, 0]], x[o[:, 1]])
        ee |= {(a, b, *row) for row in o[d < dist**2].tolist()}
    return pt, ee


def test_candidate_pairs_match_brute_force_and_exclude_incident_pairs():
    rng = np.random.default_rng(8)
    x, faces, edges = _crumpled_sheet(rng)
    dist = 0.12
    pairs = contact.find_contact_pairs(x, faces, dist, edges=edges, device=DEVICE)
    pt = {tuple(r) for r in pairs.point_triangle.numpy().tolist()}
    ee = {tuple(r) for r in pairs.edge_edge.numpy().tolist()}
    ref_pt, ref_ee = _brute_force_pairs(x, faces, edges, dist)
    assert len(ref_pt) >= 20 and len(ref_ee) >= 20
    assert pt == ref_pt and len(pt) == pairs.point_triangle.shape[0]
    assert ee == ref_ee and len(ee) == pairs.edge_edge.shape[0]
    # swept (CCD broad phase): a superset of the static pairs at both ends of the step
    dx = 0.1 * rng.normal(size=x.shape)
    swept = contact.find_contact_pairs(x, faces, 1e-3, edges=edges, dx=dx, device=DEVICE)
    spt = {tuple(r) for r in swept.point_triangle.numpy().tolist()}
    see = {tuple(r) for r in swept.edge_edge.numpy().tolist()}
    for y in (x, x + dx):
        end_pt, end_ee = _brute_force_pairs(y, faces, edges, 1e-3)
        assert end_pt <= spt and end_ee <= see


def test_mesh_step_bound_keeps_two_spots_apart():
    spot = wm.TriMesh.from_file(MESHES / "spot.obj")
    n = spot.vertex_count
    x = np.concatenate([spot.vertices, spot.vertices + [1.5, 0.2, 0.0]])
    faces = np.concatenate([spot.faces, spot.faces + n])
    dx = np.zeros_like(x)
    dx[n:] = [-1.2, 0.0, 0.05]  # the full step drives the second cow into the first
    search = contact.ContactSearch(faces, vertex_count=2 * n, device=DEVICE)
    assert search.intersecting_face_pairs(x).shape == (0, 2)
    assert search.intersecting_face_pairs(x + dx).shape[0] > 0
    t = search.max_step(x, dx)
    assert 0.2 < t < 1.0
    assert search.intersecting_face_pairs(x + t * dx).shape == (0, 2)
    # the same through the functions, with explicit pairs
    pairs = contact.find_contact_pairs(x, faces, 0.0, dx=dx, device=DEVICE)
    assert contact.max_step(x, dx, pairs.point_triangle, pairs.edge_edge, device=DEVICE) == t
    assert contact.max_step(x, np.zeros_like(x), pairs.point_triangle, pairs.edge_edge, device=DEVICE) == 1.0
    got = contact.intersecting_face_pairs(x + dx, faces, device=DEVICE)
    tri = (x + dx)[faces]
    assert got.shape[0] > 0 and np.all(triangles_intersect_np(tri[got[:, 0]], tri[got[:, 1]]))


def test_plane_step_bound():
    rng = np.random.default_rng(10)
    normal = np.array([0.1, 1.0, 0.2])
    unit = normal / np.linalg.norm(normal)
    origin = np.array([0.0, -1.0, 0.5])
    x = origin + rng.uniform(0.1, 1.0, size=(50, 1)) * unit + np.cross(unit, rng.normal(size=(50, 3)))
    dx = rng.normal(size=(50, 3)) - 3.0 * unit
    t = contact.plane_max_step(x, dx, origin, normal, device=DEVICE)
    heights = (x - origin) @ unit
    speeds = dx @ unit
    hit = speeds < 0
    np.testing.assert_allclose(t, min(1.0, 0.9 * np.min(heights[hit] / -speeds[hit])), rtol=1e-12)
    assert np.all(((x + t * dx) - origin) @ unit > 0)
    up = dx - 2.0 * np.outer(np.minimum(dx @ unit, 0.0), unit)  # normal components reflected: moving away
    assert contact.plane_max_step(x, up, origin, normal, device=DEVICE) == 1.0
    below = x.copy()
    below[3] = origin - 0.01 * unit
    assert contact.plane_max_step(below, dx, origin, normal, device=DEVICE) == 0.0


# ------------------------------------------------------------------------------ triangle-triangle intersection


# closed triangles with small integer coordinates (the predicates are exact): (t1, t2, intersect?)
KNOWN = [
    ([[0, 0, 0], [4, 0, 0], [0, 4, 0]], [[1, 1, -1], [1, 1, 1], [2, 2, 1]], True),  # an edge pierces the face
    ([[0, 0, 0], [4, 0, 0], [0, 4, 0]], [[1, 1, 1], [3, 1, 2], [1, 3, 2]], False),  # above the plane
    ([[0, 0, 0], [4, 0, 0], [0, 4, 0]], [[1, 1, 0], [3, 1, 2], [1, 3, 2]], True),  # a vertex touches the face
    ([[0, 0, 0], [4, 0, 0], [0, 4, 0]], [[5, 5, 0], [3, 5, 2], [5, 3, 2]], False),  # a vertex in the plane, outside
    ([[0, 0, 0], [4, 0, 0], [0, 4, 0]], [[2, 2, 0], [3, 3, 0], [2, 2, 3]], True),  # touches the hypotenuse
    ([[0, 0, 0], [4, 0, 0], [0, 4, 0]], [[2, -1, -1], [2, -1, 1], [2, 1, 0]], True),  # crossing edges
    ([[0, 0, 0], [4, 0, 0], [0, 4, 0]], [[2, -1, 1], [2, 2, 1], [2, -1, 3]], False),  # parallel plane
    ([[0, 0, 0], [4, 0, 0], [0, 4, 0]], [[1, 1, 0], [5, 1, 0], [1, 5, 0]], True),  # coplanar overlap
    ([[0, 0, 0], [4, 0, 0], [0, 4, 0]], [[3, 3, 0], [6, 3, 0], [3, 6, 0]], False),  # coplanar apart
    ([[0, 0, 0], [4, 0, 0], [0, 4, 0]], [[4, 0, 0], [6, 0, 0], [6, 2, 0]], True),  # coplanar, a shared corner point
    ([[0, 0, 0], [8, 0, 0], [0, 8, 0]], [[1, 1, 0], [2, 1, 0], [1, 2, 0]], True),  # coplanar, inside
    ([[1, 1, 0], [2, 1, 0], [1, 2, 0]], [[0, 0, 0], [8, 0, 0], [0, 8, 0]], True),  # coplanar, containing
    ([[0, 0, 0], [4, 0, 0], [0, 4, 0]], [[2, 2, 0], [2, 6, 0], [6, 2, 0]], True),  # coplanar, touching along an edge
    ([[0, 0, 0], [4, 0, 0], [0, 4, 0]], [[-1, 2, -1], [-1, 2, 1], [1, 2, 0]], True),  # T2 pierced by T1's edge
]


def test_triangle_intersection_known_configurations():
    t = np.array([np.concatenate([a, b]) for a, b, _ in KNOWN], dtype=np.float64)
    expected = np.array([e for _, _, e in KNOWN])
    got = _device_intersections(t)[:, 0]
    np.testing.assert_array_equal(got, expected)
    np.testing.assert_array_equal(triangles_intersect_np(t[:, :3], t[:, 3:]), expected)
    np.testing.assert_array_equal(ref_triangles_intersect_sat(t[:, :3], t[:, 3:]), expected)
    # symmetric in the two triangles and in the corner order
    swapped = np.concatenate([t[:, 3:], t[:, [1, 2, 0]]], axis=1)
    np.testing.assert_array_equal(_device_intersections(swapped)[:, 0], expected)


def test_triangle_intersection_random_against_separating_axes_and_segments():
    rng = np.random.default_rng(9)
    m = 20000
    t = rng.normal(size=(m, 6, 3))
    t[:, 3:] *= rng.uniform(0.2, 1.5, size=(m, 1, 1))
    t[: m // 4, 3:] = t[: m // 4, 3:] * 0.3 + t[: m // 4, :1]  # small triangles near a corner
    on_grid = np.round(rng.normal(size=(4000, 6, 3)) * 2)  # integer grid: exact, many touching and coplanar cases
    on_grid[:1000, 3:, 2] = on_grid[:1000, :3, 2].mean(1, keepdims=True).round()  # flat second triangle
    on_grid[:500, :3, 2] = on_grid[:500, 3:4, 2]  # coplanar pairs
    t = np.concatenate([t, on_grid])
    area = np.linalg.norm(np.cross(t[:, 1] - t[:, 0], t[:, 2] - t[:, 0]), axis=1) * np.linalg.norm(
        np.cross(t[:, 4] - t[:, 3], t[:, 5] - t[:, 3]), axis=1
    )
    t = t[area > 0]
    got = _device_intersections(t)
    ref = ref_triangles_intersect_sat(t[:, :3], t[:, 3:])
    assert 0.1 < ref.mean() < 0.9
    np.testing.assert_array_equal(got[:, 0], ref)
    np.testing.assert_array_equal(triangles_intersect_np(t[:, :3], t[:, 3:]), ref)
    # segment (corner 0 -> corner 1 of T1) against T2: the segment as a degenerate triangle (a, b, b) in the SAT test
    seg = np.stack([t[:, 0], t[:, 1], t[:, 1]], axis=1)
    np.testing.assert_array_equal(got[:, 1], ref_triangles_intersect_sat_segment(seg, t[:, 3:]))


def ref_triangles_intersect_sat_segment(seg, tri):
    """SAT for a segment (stored as (a, b, b)) against a triangle: triangle normal, edge x segment, in-plane normals."""
    d = seg[:, 1] - seg[:, 0]
    e = np.roll(tri, -1, axis=1) - tri
    n = np.cross(e[:, 0], e[:, 1])
    axes = [n] + [np.cross(d, e[:, j]) for j in range(3)] + [np.cross(n, e[:, j]) for j in range(3)] + [np.cross(n, d)]
    separated = np.zeros(seg.shape[0], dtype=bool)
    for ax in axes:
        p1 = np.einsum("mki,mi->mk", seg, ax)
        p2 = np.einsum("mki,mi->mk", tri, ax)
        scale = np.abs(p1).max(1) + np.abs(p2).max(1) + 1e-300
        gap = np.maximum(p2.min(1) - p1.max(1), p1.min(1) - p2.max(1))
        separated |= (gap > 1e-12 * scale) & (_dot(ax, ax) > 1e-24)
    return ~separated
