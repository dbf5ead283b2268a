"""Problem: derivatives, assembly, projection, products, Jacobians and input validation."""

from typing import Any

import numpy as np
import pytest
import warp as wp

import warp_meshad as wm
from warp_meshad.kernels import ad

# every test runs on the test device (the device fixture, or Warp's default device that conftest sets to it)
pytestmark = pytest.mark.device


@wp.struct
class SpringParams:
    rest: wp.array(dtype=wp.float64)
    k: wp.float64


@wp.func
def spring(e: int, xa: Any, xb: Any, data: SpringParams):
    """k/2 (|xa - xb| - rest_e)^2: non-convex when compressed."""
    l = ad.length(xa - xb)
    return data.k * 0.5 * (l - data.rest[e]) * (l - data.rest[e])


@wp.func
def bumpy_triangle(e: int, a: Any, b: Any, c: Any):
    """A smooth non-convex triangle energy exercising cross, log, sin, atan2, unary minus, indexing."""
    n = ad.cross(b - a, c - a)
    s = ad.log(ad.length_sq(n) + 1.0) + ad.sin(a[0] * b.y) - ad.atan2(c.z, a.x + 3.0)
    if s < -100.0:
        return -s
    return s


@wp.func
def pair_residual(e: int, a: Any, b: Any):
    """r = (a.b - 1, a_x b_z)."""
    return ad.vec2(ad.dot(a, b) - 1.0, a.x * b.z)


@wp.func
def scalar_chain(e: int, a: Any, b: Any):
    """(a - b)^4 + exp(a b): for scalar (variable_dim 1) variables."""
    d = a - b
    return d * d * d * d + ad.exp(a * b * 0.1)


@wp.func
def vector_out(e: int, a: Any, b: Any):
    return a - b


@wp.func
def inverted_is_infinite(e: int, a: Any, b: Any, c: Any):
    """Signed area in the xy-plane; +inf when the triangle is inverted."""
    u = b - a
    v = c - a
    area = u.x * v.y - u.y * v.x
    if area <= 0.0:
        return wp.float64(wp.inf)
    return -ad.log(area)


def dense(H):
    return wm.to_scipy(H).toarray()


def grid_mesh(n=4, seed=0):
    mesh = wm.TriMesh.grid(n, n)
    rng = np.random.default_rng(seed)
    x = mesh.vertices + 0.1 * rng.normal(size=mesh.vertices.shape)
    return mesh, x


def spring_problem(mesh, device, dtype=wp.float64):
    data = SpringParams()
    data.rest = wp.array(0.8 * mesh.edge_lengths(), dtype=wp.float64, device=device)
    data.k = wp.float64(3.0)
    p = wm.Problem(mesh.vertex_count, 3, dtype=dtype, device=device)
    p.add_term(mesh.edges, spring, data)
    p.add_term(mesh.faces, bumpy_triangle, weight=0.5)
    return p


def central_gradient(f, x, h=1e-6):
    g = np.zeros(x.size)
    flat = x.ravel()
    for i in range(x.size):
        e = np.zeros(x.size)
        e[i] = h
        g[i] = (f((flat + e).reshape(x.shape)) - f((flat - e).reshape(x.shape))) / (2 * h)
    return g


def test_gradient_and_hessian_match_central_differences(device):
    mesh, x = grid_mesh(3)
    p = spring_problem(mesh, device)
    vec = lambda y: wp.array(y, dtype=wp.vec3d, device=device)
    f, g, H = p.eval_with_hessian(vec(x))
    g = g.numpy().ravel().copy()
    Hd = dense(H)
    assert np.isfinite(f)
    np.testing.assert_allclose(f, p.eval(vec(x)), rtol=1e-12)
    fd = central_gradient(lambda y: p.eval(vec(y)), x)
    np.testing.assert_allclose(g, fd, rtol=1e-6, atol=1e-7)
    grad = lambda y: p.eval_with_gradient(vec(y))[1].numpy().ravel().copy()
    fdH = np.stack([(grad(x + 1e-6 * e.reshape(x.shape)) - grad(x - 1e-6 * e.reshape(x.shape))) / 2e-6 for e in np.eye(x.size)])
    np.testing.assert_allclose(Hd, fdH, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(Hd, Hd.T, atol=1e-12)


def test_assembled_hessian_equals_dense_sum_of_element_blocks(device):
    mesh, x = grid_mesh(3, seed=1)
    p = spring_problem(mesh, device)
    xw = wp.array(x, dtype=wp.vec3d, device=device)
    _, _, H = p.eval_with_hessian(xw)
    Hd = dense(H)
    n = mesh.vertex_count
    expected = np.zeros((3 * n, 3 * n))
    rest = 0.8 * mesh.edge_lengths()
    for elements, energy, weight, data_rows in ((mesh.edges, spring, 1.0, True), (mesh.faces, bumpy_triangle, 0.5, False)):
        for j, el in enumerate(elements):
            q = wm.Problem(n, 3, device=device)
            if data_rows:
                d = SpringParams()
                d.rest = wp.array(rest[j : j + 1], dtype=wp.float64, device=device)
                d.k = wp.float64(3.0)
                q.add_term(el[None, :], energy, d, weight=weight)
            else:
                q.add_term(el[None, :], energy, weight=weight)
            _, _, Hj = q.eval_with_hessian(xw)
            local = dense(Hj)
            idx = np.concatenate([np.arange(3 * v, 3 * v + 3) for v in el])
            # only the element's own rows and columns are non-zero
            mask = np.zeros(3 * n, bool)
            mask[idx] = True
            assert np.all(local[~mask] == 0) and np.all(local[:, ~mask] == 0)
            expected += local
    np.testing.assert_allclose(Hd, expected, rtol=1e-12, atol=1e-12)


def test_exact_block_count_on_fixture_mesh(device):
    mesh = wm.TriMesh.grid(5, 4)
    n, E = mesh.vertex_count, mesh.edge_count
    assert E == 3 * 5 * 4 - 2 * 5 - 2 * 4 + 1
    p = wm.Problem(n, 3, device=device)
    data = SpringParams()
    data.rest = wp.zeros(E, dtype=wp.float64, device=device)
    data.k = wp.float64(1.0)
    p.add_term(mesh.edges, spring, data)
    assert p.hessian_block_count == n + 2 * E
    p.add_term(mesh.faces, bumpy_triangle)  # face pairs are edge pairs: no new blocks
    assert p.hessian_block_count == n + 2 * E
    # diamonds add the pairs of opposite vertices
    opposite = {tuple(sorted(r)) for r in mesh.edge_diamonds[:, 2:]} - {tuple(r) for r in mesh.edges}
    p.add_term(mesh.edge_diamonds[:, [2, 3]], spring, data)
    assert p.hessian_block_count == n + 2 * E + 2 * len(opposite)
    _, _, H = p.eval_with_hessian(wp.array(mesh.vertices, dtype=wp.vec3d, device=device))
    assert H.nnz == n + 2 * E + 2 * len(opposite)


def test_outputs_are_preallocated_and_reused(device):
    mesh, x = grid_mesh(3)
    p = spring_problem(mesh, device)
    xw = wp.array(x, dtype=wp.vec3d, device=device)
    _, g1, H1 = p.eval_with_hessian(xw)
    ptrs = (g1.ptr, H1.values.ptr, H1.columns.ptr)
    _, g2, H2 = p.eval_with_hessian(xw)
    assert (g2.ptr, H2.values.ptr, H2.columns.ptr) == ptrs


def test_hessian_vector_product_equals_H_times_v(device):
    mesh, x = grid_mesh(4, seed=2)
    p = spring_problem(mesh, device)
    xw = wp.array(x, dtype=wp.vec3d, device=device)
    _, _, H = p.eval_with_hessian(xw)
    Hd = dense(H)
    v = np.random.default_rng(3).normal(size=x.shape)
    hv = p.hessian_vector_product(xw, wp.array(v, dtype=wp.vec3d, device=device)).numpy().ravel()
    np.testing.assert_allclose(hv, Hd @ v.ravel(), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("mode", ["clamp", "abs"])
def test_projected_hessian_is_psd(device, mode):
    mesh, x = grid_mesh(4, seed=4)
    p = spring_problem(mesh, device)
    xw = wp.array(x, dtype=wp.vec3d, device=device)
    _, _, H = p.eval_with_hessian(xw)
    assert np.linalg.eigvalsh(dense(H)).min() < -1e-3  # the test needs a non-convex state
    f, g, Hp = p.eval_with_hessian_proj(xw, mode=mode, eps=1e-9)
    P = dense(Hp)
    np.testing.assert_allclose(P, P.T, atol=1e-10)
    assert np.linalg.eigvalsh(P).min() >= -1e-9
    np.testing.assert_allclose(f, p.eval(xw), rtol=1e-12)


def test_projection_keeps_psd_element_hessians(device):
    mesh = wm.TriMesh.grid(3, 3)
    x = mesh.vertices * 1.5  # stretched springs: each element Hessian is PSD
    data = SpringParams()
    data.rest = wp.array(mesh.edge_lengths(), dtype=wp.float64, device=device)
    data.k = wp.float64(2.0)
    p = wm.Problem(mesh.vertex_count, 3, device=device)
    p.add_term(mesh.edges, spring, data)
    xw = wp.array(x, dtype=wp.vec3d, device=device)
    H = dense(p.eval_with_hessian(xw)[2])
    P = dense(p.eval_with_hessian_proj(xw, eps=0.0)[2])
    np.testing.assert_allclose(P, H, atol=1e-9)


def test_residual_jacobian_and_gauss_newton(device):
    mesh, x = grid_mesh(3, seed=5)
    p = wm.Problem(mesh.vertex_count, 3, device=device)
    w = 2.0
    p.add_residual_term(mesh.edges, pair_residual, weight=w)
    vec = lambda y: wp.array(y, dtype=wp.vec3d, device=device)
    r, J = p.eval_residuals_with_jacobian(vec(x))
    r = r.numpy().copy()
    Jd = wm.to_scipy(J).toarray()
    assert Jd.shape == (2 * mesh.edge_count, 3 * mesh.vertex_count)
    # residuals against a direct evaluation: sqrt(w) * (a.b - 1, a_x b_z)
    a, b = x[mesh.edges[:, 0]], x[mesh.edges[:, 1]]
    direct = np.sqrt(w) * np.stack([np.sum(a * b, 1) - 1.0, a[:, 0] * b[:, 2]], 1).ravel()
    np.testing.assert_allclose(r, direct, rtol=1e-12)
    res = lambda y: p.eval_residuals(vec(y)).numpy().copy()
    fdJ = np.stack([(res(x + 1e-6 * e.reshape(x.shape)) - res(x - 1e-6 * e.reshape(x.shape))) / 2e-6 for e in np.eye(x.size)], 1)
    np.testing.assert_allclose(Jd, fdJ, rtol=1e-6, atol=1e-8)
    # energy 1/2 |r|^2, gradient J^T r, Gauss-Newton Hessian J^T J
    f, g, H = p.eval_gauss_newton(vec(x))
    np.testing.assert_allclose(f, 0.5 * r @ r, rtol=1e-12)
    np.testing.assert_allclose(g.numpy().ravel(), Jd.T @ r, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(dense(H), Jd.T @ Jd, rtol=1e-10, atol=1e-12)
    f2, g2 = p.eval_with_gradient(vec(x))
    np.testing.assert_allclose(f2, f, rtol=1e-12)
    np.testing.assert_allclose(g2.numpy().ravel(), Jd.T @ r, rtol=1e-10, atol=1e-12)


def test_scalar_variables(device):
    n = 6
    el = np.array([[0, 1], [1, 2], [2, 3], [3, 4], [4, 5], [5, 0], [0, 3]])
    p = wm.Problem(n, 1, device=device)
    p.add_term(el, scalar_chain)
    x = np.random.default_rng(6).normal(size=n)
    vec = lambda y: wp.array(y, dtype=wp.float64, device=device)
    f, g, H = p.eval_with_hessian(vec(x))
    a, b = x[el[:, 0]], x[el[:, 1]]
    np.testing.assert_allclose(f, np.sum((a - b) ** 4 + np.exp(0.1 * a * b)), rtol=1e-12)
    fd = central_gradient(lambda y: p.eval(vec(y)), x)
    np.testing.assert_allclose(g.numpy(), fd, rtol=1e-6, atol=1e-8)
    Hd = dense(H)
    grad = lambda y: p.eval_with_gradient(vec(y))[1].numpy().copy()
    fdH = np.stack([(grad(x + 1e-6 * e) - grad(x - 1e-6 * e)) / 2e-6 for e in np.eye(n)])
    np.testing.assert_allclose(Hd, fdH, rtol=1e-5, atol=1e-6)


def test_float32_problem_matches_float64(device):
    mesh, x = grid_mesh(3, seed=7)
    p64 = spring_problem(mesh, device)
    # same energies, float32 variables (the data struct stays float64: it is read-only input)
    p32 = wm.Problem(mesh.vertex_count, 3, dtype=wp.float32, device=device)
    p32.add_term(mesh.faces, bumpy_triangle, weight=0.5)
    p64b = wm.Problem(mesh.vertex_count, 3, device=device)
    p64b.add_term(mesh.faces, bumpy_triangle, weight=0.5)
    f32, g32, H32 = p32.eval_with_hessian(wp.array(x, dtype=wp.vec3f, device=device))
    f64, g64, H64 = p64b.eval_with_hessian(wp.array(x, dtype=wp.vec3d, device=device))
    np.testing.assert_allclose(f32, f64, rtol=1e-5)
    np.testing.assert_allclose(g32.numpy(), g64.numpy(), rtol=1e-3, atol=1e-4)
    np.testing.assert_allclose(dense(H32), dense(H64), rtol=1e-3, atol=1e-3)
    assert p64.eval(wp.array(x, dtype=wp.vec3d, device=device)) > 0


def test_variables_on_faces_with_edge_face_stencil(device):
    mesh = wm.TriMesh.grid(4, 4)
    ef = mesh.edge_faces
    p = wm.Problem(mesh.face_count, 2, device=device)
    p.add_residual_term(ef, face_difference)
    x = np.random.default_rng(8).normal(size=(mesh.face_count, 2))
    f, g = p.eval_with_gradient(wp.array(x, dtype=wp.vec2d, device=device))
    d = x[ef[:, 0]] - x[ef[:, 1]]
    np.testing.assert_allclose(f, 0.5 * np.sum(d * d), rtol=1e-12)
    expected = np.zeros_like(x)
    np.add.at(expected, ef[:, 0], d)
    np.add.at(expected, ef[:, 1], -d)
    np.testing.assert_allclose(g.numpy(), expected, rtol=1e-12, atol=1e-12)


@wp.func
def face_difference(e: int, a: Any, b: Any):
    return a - b


def test_infinite_energy_is_reported(device):
    p = wm.Problem(3, 3, device=device)
    p.add_term(np.array([[0, 1, 2]]), inverted_is_infinite)
    good = np.array([[0.0, 0, 0], [1, 0, 0], [0, 1, 0]])
    assert np.isfinite(p.eval(wp.array(good, dtype=wp.vec3d, device=device)))
    assert p.eval(wp.array(good[[0, 2, 1]], dtype=wp.vec3d, device=device)) == np.inf


# --- bad input --------------------------------------------------------------------------------


def make_data(device, m):
    d = SpringParams()
    d.rest = wp.zeros(m, dtype=wp.float64, device=device)
    d.k = wp.float64(1.0)
    return d


def test_add_term_rejects_index_out_of_range(device):
    p = wm.Problem(4, 3, device=device)
    with pytest.raises(ValueError, match=r"elements.*out of range \[0, 4\).*elements\[1, 1\] = 4"):
        p.add_term(np.array([[0, 1], [2, 4]]), spring, make_data(device, 2))
    with pytest.raises(ValueError, match=r"out of range"):
        p.add_term(np.array([[0, -1]]), spring, make_data(device, 1))


def test_add_term_rejects_bad_elements_shape_and_dtype(device):
    p = wm.Problem(4, 3, device=device)
    with pytest.raises(ValueError, match=r"elements.*shape \(m, valence\).*got shape \(3,\)"):
        p.add_term(np.array([0, 1, 2]), spring, make_data(device, 3))
    with pytest.raises(TypeError, match=r"elements.*integer dtype.*float64"):
        p.add_term(np.array([[0.0, 1.0]]), spring, make_data(device, 1))
    with pytest.raises(ValueError, match=r"elements.*empty"):
        p.add_term(np.zeros((0, 2), dtype=np.int32), spring, make_data(device, 1))
    with pytest.raises(ValueError, match=r"valence 4.*5 arguments.*takes 4: \(e, xa, xb, data\)"):
        p.add_term(np.array([[0, 1, 2, 3]]), spring)
    with pytest.raises(ValueError, match=r"(?s)energy=spring.*does not compile.*`k` is not an attribute of 'data'"):
        p.add_term(np.array([[0, 1, 2]]), spring)  # 4 arguments: taken as 3 variables without data


def test_add_term_rejects_non_scalar_energy_and_bad_arguments(device):
    p = wm.Problem(4, 3, device=device)
    with pytest.raises(ValueError, match=r"energy=vector_out.*must return a scalar of dtype float64.*vec3d"):
        p.add_term(np.array([[0, 1]]), vector_out)
    with pytest.raises(TypeError, match=r"energy.*@wp.func"):
        p.add_term(np.array([[0, 1]]), lambda e, a, b: 0.0)
    with pytest.raises(TypeError, match=r"data.*@wp.struct"):
        p.add_term(np.array([[0, 1]]), spring, {"rest": 1.0})
    with pytest.raises(ValueError, match=r"weight.*finite"):
        p.add_term(np.array([[0, 1]]), spring, make_data(device, 1), weight=float("nan"))
    assert p.terms == []  # nothing was added by the failed calls


def test_problem_rejects_bad_construction():
    with pytest.raises(ValueError, match=r"variable_count.*positive int"):
        wm.Problem(0)
    with pytest.raises(ValueError, match=r"dtype.*wp.float32 or wp.float64.*int32"):
        wm.Problem(3, 3, dtype=wp.int32)


def test_eval_rejects_wrong_x(device):
    p = wm.Problem(4, 3, device=device)
    p.add_term(np.array([[0, 1], [1, 2]]), spring, make_data(device, 2))
    want = r"shape \(4,\), dtype vec3d, on device " + device
    with pytest.raises(TypeError, match=want + r"; got ndarray"):
        p.eval(np.zeros((4, 3)))
    with pytest.raises(ValueError, match=want + r"; got shape \(5,\)"):
        p.eval(wp.zeros(5, dtype=wp.vec3d, device=device))
    with pytest.raises(ValueError, match=want + r"; got dtype vec3f"):
        p.eval_with_gradient(wp.zeros(4, dtype=wp.vec3f, device=device))
    with pytest.raises(ValueError, match=r"hessian_vector_product\(v=.*got shape \(3,\)"):
        p.hessian_vector_product(wp.zeros(4, dtype=wp.vec3d, device=device), wp.zeros(3, dtype=wp.vec3d, device=device))
    if device != "cpu":
        with pytest.raises(ValueError, match=r"got device cpu"):
            p.eval(wp.zeros(4, dtype=wp.vec3d, device="cpu"))


def test_eval_without_terms_or_residuals_fails_clearly(device):
    p = wm.Problem(4, 3, device=device)
    with pytest.raises(RuntimeError, match="no terms"):
        p.eval_with_hessian(wp.zeros(4, dtype=wp.vec3d, device=device))
    p.add_term(np.array([[0, 1]]), spring, make_data(device, 1))
    with pytest.raises(RuntimeError, match="no residual terms"):
        p.eval_residuals_with_jacobian(wp.zeros(4, dtype=wp.vec3d, device=device))


def test_deterministic_mode_matches_atomic_mode_and_repeats_bitwise(device):
    mesh, x = grid_mesh(5, seed=9)
    p = spring_problem(mesh, device)
    q = wm.Problem(mesh.vertex_count, 3, device=device, deterministic=True)
    for t in p.terms:
        q.add_term(t.elements_np, t.energy, t.data, weight=t.weight)
    xw = wp.array(x, dtype=wp.vec3d, device=device)
    v = wp.array(np.random.default_rng(10).normal(size=x.shape), dtype=wp.vec3d, device=device)
    f, g, H = p.eval_with_hessian(xw)
    g, Hd = g.numpy().copy(), dense(H)
    hv = p.hessian_vector_product(xw, v).numpy().copy()
    runs = []
    for _ in range(3):
        fq, gq, Hq = q.eval_with_hessian(xw)
        fe, ge = q.eval_with_gradient(xw)
        runs.append((fq, gq.numpy().copy(), Hq.values.numpy().copy(), q.eval(xw), fe, ge.numpy().copy(),
                     q.hessian_vector_product(xw, v).numpy().copy()))
    np.testing.assert_allclose(runs[0][0], f, rtol=1e-12)
    np.testing.assert_allclose(runs[0][1], g, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(dense(Hq), Hd, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(runs[0][3], f, rtol=1e-12)
    np.testing.assert_allclose(runs[0][6], hv, rtol=1e-12, atol=1e-12)
    for r in runs[1:]:
        for a, b in zip(r, runs[0]):
            assert np.array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize("mode", ["clamp", "abs"])
def test_unrolled_projection_matches_loop_projection(device, mode):
    mesh, x = grid_mesh(3, seed=11)
    xw = wp.array(x, dtype=wp.vec3d, device=device)
    data = SpringParams()
    data.rest = wp.array(0.8 * mesh.edge_lengths(), dtype=wp.float64, device=device)
    data.k = wp.float64(3.0)
    loop = wm.Problem(mesh.vertex_count, 3, device=device)
    loop.add_term(mesh.edges, spring, data)
    loop.unrolled_projection = False
    unrolled = wm.Problem(mesh.vertex_count, 3, device=device)
    unrolled.add_term(mesh.edges, spring, data)
    unrolled.unrolled_projection = True
    P1 = dense(loop.eval_with_hessian_proj(xw, mode=mode)[2])
    P2 = dense(unrolled.eval_with_hessian_proj(xw, mode=mode)[2])
    np.testing.assert_allclose(P2, P1, rtol=1e-9, atol=1e-9)


@wp.func
def spring_with_warp_builtins(e: int, xa: Any, xb: Any):
    """Same as a unit spring, written with wp.length / wp.sqrt / wp.abs instead of ad.*."""
    l = wp.sqrt(wp.dot(xa - xb, xa - xb))
    return 0.5 * (wp.abs(l) - 1.0) * (l - 1.0) + 0.0 * wp.length(xa)


def test_energy_may_use_warp_builtin_spellings(device):
    mesh, x = grid_mesh(3, seed=12)
    p = wm.Problem(mesh.vertex_count, 3, device=device)
    p.add_term(mesh.edges, spring_with_warp_builtins)
    xw = wp.array(x, dtype=wp.vec3d, device=device)
    f, g = p.eval_with_gradient(xw)
    l = np.linalg.norm(x[mesh.edges[:, 0]] - x[mesh.edges[:, 1]], axis=1)
    np.testing.assert_allclose(f, np.sum(0.5 * (l - 1.0) ** 2), rtol=1e-12)
    fd = central_gradient(lambda y: p.eval(wp.array(y, dtype=wp.vec3d, device=device)), x)
    np.testing.assert_allclose(g.numpy().ravel(), fd, rtol=1e-6, atol=1e-7)


def test_term_name_with_any_characters(device):
    p = wm.Problem(3, 3, device=device)
    p.add_term(np.array([[0, 1], [1, 2]]), spring, make_data(device, 2), name="my spring term #1")
    x = wp.array(np.eye(3), dtype=wp.vec3d, device=device)
    np.testing.assert_allclose(p.eval(x), 0.5 * 2.0 * 2.0)  # two springs of length sqrt(2), rest 0, k = 1


def test_device_pattern_build_equals_host_build(device):
    from warp_meshad._src.problem.pattern import build_hessian_pattern
    from warp_meshad._src.problem.pattern_device import build_hessian_pattern_device

    mesh = wm.TriMesh.grid(13, 9)
    els = [mesh.edges, mesh.faces, mesh.edge_diamonds, np.array([[5, 5]], dtype=np.int32)]
    a = build_hessian_pattern(mesh.vertex_count, els)
    b = build_hessian_pattern_device(mesh.vertex_count, els, device)
    np.testing.assert_array_equal(b.offsets, a.offsets)
    np.testing.assert_array_equal(b.columns, a.columns)
    for x, y in zip(b.slots, a.slots):
        np.testing.assert_array_equal(x, y)


# -- energy and gradient with the energy summed per thread block (one memset and one launch per term) -------------


def area_reference(X, faces):
    """Total area 1/2 sum |(x1 - x0) x (x2 - x0)| and its gradient in float64 (dA/dx1 = 1/2 e2 x n, dA/dx2 =
    1/2 n x e1, dA/dx0 = -(dA/dx1 + dA/dx2), n the unit normal)."""
    X = np.asarray(X, np.float64)
    x0, e1, e2 = X[faces[:, 0]], X[faces[:, 1]] - X[faces[:, 0]], X[faces[:, 2]] - X[faces[:, 0]]
    c = np.cross(e1, e2)
    l = np.linalg.norm(c, axis=1)
    n = c / l[:, None]
    g1, g2 = 0.5 * np.cross(e2, n), 0.5 * np.cross(n, e1)
    g = np.zeros_like(X)
    np.add.at(g, faces[:, 1], g1)
    np.add.at(g, faces[:, 2], g2)
    np.add.at(g, faces[:, 0], -(g1 + g2))
    return 0.5 * l.sum(), g


def spring_reference(X, edges, rest, k):
    """sum k/2 (|xa - xb| - rest)^2 and its gradient in float64."""
    X = np.asarray(X, np.float64)
    d = X[edges[:, 0]] - X[edges[:, 1]]
    l = np.linalg.norm(d, axis=1)
    ga = (k * (l - rest) / l)[:, None] * d
    g = np.zeros_like(X)
    np.add.at(g, edges[:, 0], ga)
    np.add.at(g, edges[:, 1], -ga)
    return 0.5 * k * np.sum((l - rest) ** 2), g


def bumpy_grid(n, seed=3):
    mesh = wm.TriMesh.grid(n, n)
    X = mesh.vertices.copy()
    X[:, 2] = 0.3 / (n - 1) * np.random.default_rng(seed).normal(size=mesh.vertex_count)
    return mesh, X


def assert_energy_and_gradient(f, g, ref_f, ref_g, rtol):
    np.testing.assert_allclose(f, ref_f, rtol=rtol)
    np.testing.assert_allclose(np.asarray(g, np.float64).reshape(ref_g.shape), ref_g, rtol=rtol,
                               atol=rtol * np.abs(ref_g).max())  # fmt: skip


# faces 2 (one partial block), 288 (nine full blocks of 32; one full block of 256 and a partial one), 1058 (many
# blocks, the last one partial); block None: 256 threads on a GPU, one element per block on the CPU; block 32 on the
# CPU runs its lanes as fibers (wp.config.enable_cpu_blocks), as a GPU does
@pytest.mark.parametrize("n", [2, 13, 24])
@pytest.mark.parametrize("block", [None, 32])
@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize("dtype", [wp.float32, wp.float64])
def test_energy_and_gradient_equal_a_float64_reference(device, monkeypatch, n, block, deterministic, dtype):
    monkeypatch.setattr(wp.config, "enable_cpu_blocks", block is not None)
    from warp_meshad.kernels.energies import surface_area

    mesh, X = bumpy_grid(n)
    p = wm.Problem(mesh.vertex_count, 3, dtype=dtype, device=device, deterministic=deterministic)
    p._assembler.reduced_block_dim = block
    p.add_term(mesh.faces, surface_area)
    x = wp.array(X, dtype=wp.vec3f if dtype == wp.float32 else wp.vec3d, device=device)
    ref_f, ref_g = area_reference(X.astype(np.float32) if dtype == wp.float32 else X, mesh.faces)
    rtol = 2e-5 if dtype == wp.float32 else 1e-12
    for _ in range(2):  # the second call starts from the first one's outputs: they must be cleared
        f, g = p.eval_with_gradient(x)
        assert_energy_and_gradient(f, g.numpy(), ref_f, ref_g, rtol)
        np.testing.assert_allclose(p.eval(x), ref_f, rtol=rtol)
    e, g = p.assemble_gradient(x)
    assert e.shape == (1,) and e.device == p.device
    assert_energy_and_gradient(e.numpy()[0], g.numpy(), ref_f, ref_g, rtol)
    np.testing.assert_allclose(p.assemble_energy(x).numpy()[0], ref_f, rtol=rtol)


@pytest.mark.parametrize("deterministic", [False, True])
def test_two_terms_energy_and_gradient_equal_the_sum_of_references(device, deterministic):
    from warp_meshad.kernels.energies import MassSpringData, mass_spring, surface_area

    mesh, X = bumpy_grid(17, seed=5)
    rest = 0.9 * mesh.edge_lengths()
    p = wm.Problem(mesh.vertex_count, 3, dtype=wp.float64, device=device, deterministic=deterministic)
    p.add_term(mesh.faces, surface_area, weight=2.0)
    data = MassSpringData(wp.float64, rest=wp.array(rest, dtype=wp.float64, device=device), stiffness=3.0)
    p.add_term(mesh.edges, mass_spring, data, weight=0.5)
    fa, ga = area_reference(X, mesh.faces)
    fs, gs = spring_reference(X, mesh.edges, rest, 3.0)
    ref_f, ref_g = 2.0 * fa + 0.5 * fs, 2.0 * ga + 0.5 * gs
    x = wp.array(X, dtype=wp.vec3d, device=device)
    f_h, g_h, _ = p.eval_with_hessian(x)  # Hessian modes sum element energies in a fixed order
    assert_energy_and_gradient(f_h, g_h.numpy(), ref_f, ref_g, 1e-12)
    f, g = p.eval_with_gradient(x)
    assert_energy_and_gradient(f, g.numpy(), ref_f, ref_g, 1e-12)
    np.testing.assert_allclose(p.eval(x), ref_f, rtol=1e-12)
    if deterministic:  # no float atomics: the same bits every run
        runs = [(p.eval(x), *[a.numpy().copy() for a in p.assemble_gradient(x)]) for _ in range(3)]
        for r in runs[1:]:
            for a, b in zip(r, runs[0]):
                assert np.array_equal(a, b)


def _count_device_work(monkeypatch):
    """Counts of kernel launches, memsets and host reads (copies, synchronizations, numpy reads) from now on."""
    counts = {"launch": 0, "memset": 0, "read": 0}

    def counting(obj, name, kind):
        original = getattr(obj, name)

        def wrapper(*args, **kwargs):
            if not kwargs.get("record_cmd"):  # recording a launch runs nothing
                counts[kind] += 1
            return original(*args, **kwargs)

        monkeypatch.setattr(obj, name, wrapper)

    for name in ("launch", "launch_tiled"):
        counting(wp, name, "launch")
    counting(wp.Launch, "launch", "launch")
    counting(wp.array, "zero_", "memset")
    counting(wp.array, "fill_", "memset")
    for name in ("copy", "synchronize", "synchronize_device", "synchronize_stream"):
        counting(wp, name, "read")
    counting(wp.array, "numpy", "read")
    return counts


def test_gradient_and_energy_take_one_memset_and_one_launch_per_term(device, monkeypatch):
    from warp_meshad.kernels.energies import MassSpringData, mass_spring, surface_area

    mesh, X = bumpy_grid(6)
    p = wm.Problem(mesh.vertex_count, 3, dtype=wp.float32, device=device)
    p.add_term(mesh.faces, surface_area)
    x = wp.array(X, dtype=wp.vec3f, device=device)
    for terms in (1, 2):
        p.assemble_gradient(x)
        p.assemble_energy(x)  # kernels built and launches recorded
        counts = _count_device_work(monkeypatch)
        p.assemble_gradient(x)
        assert counts == {"launch": terms, "memset": 1, "read": 0}
        counts.update(launch=0, memset=0)
        p.assemble_energy(x)
        assert counts == {"launch": terms, "memset": 1, "read": 0}
        monkeypatch.undo()
        data = MassSpringData(wp.float32, rest=wp.array(mesh.edge_lengths(), dtype=wp.float32, device=device),
                              stiffness=1.0)  # fmt: skip
        p.add_term(mesh.edges, mass_spring, data)


def test_recorded_launches_follow_changed_data_and_arrays(device):
    from warp_meshad.kernels.energies import MassSpringData, mass_spring

    mesh, X = bumpy_grid(5, seed=7)
    rest = mesh.edge_lengths()
    data = MassSpringData(wp.float64, rest=wp.array(rest, dtype=wp.float64, device=device), stiffness=2.0)
    p = wm.Problem(mesh.vertex_count, 3, dtype=wp.float64, device=device)
    p.add_term(mesh.edges, mass_spring, data)
    x = wp.array(X, dtype=wp.vec3d, device=device)
    f, g = p.eval_with_gradient(x)
    assert_energy_and_gradient(f, g.numpy(), *spring_reference(X, mesh.edges, rest, 2.0), 1e-12)
    data.stiffness = wp.float64(5.0)  # a scalar field of the data struct
    f, g = p.eval_with_gradient(x)
    assert_energy_and_gradient(f, g.numpy(), *spring_reference(X, mesh.edges, rest, 5.0), 1e-12)
    data.rest = wp.array(0.5 * rest, dtype=wp.float64, device=device)  # an array field replaced
    f, g = p.eval_with_gradient(x)
    assert_energy_and_gradient(f, g.numpy(), *spring_reference(X, mesh.edges, 0.5 * rest, 5.0), 1e-12)
    Y = X + 0.05 * np.random.default_rng(1).normal(size=X.shape)
    f, g = p.eval_with_gradient(wp.array(Y, dtype=wp.vec3d, device=device))  # another x
    assert_energy_and_gradient(f, g.numpy(), *spring_reference(Y, mesh.edges, 0.5 * rest, 5.0), 1e-12)
    np.testing.assert_allclose(p.eval(x), spring_reference(X, mesh.edges, 0.5 * rest, 5.0)[0], rtol=1e-12)
