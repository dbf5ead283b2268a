"""The split projection (``Problem.split_projection``, ``contract.KernelVariant.split``): a projected Hessian whose
element projection runs in the projection kernel of the term's shape equals the one projected inside the term's
kernel (bitwise on the CPU, where both kernels do the same operations in the same order; to round-off on a GPU,
whose compiler may contract the weight multiply into the projection differently in one kernel and in two), for
corner energies, residual terms, deformation terms, scalar variables, float32 and the deterministic mode."""

from typing import Any

import numpy as np
import pytest
import warp as wp

import warp_meshad as wm
from warp_meshad._src.codegen import kernel_cache
from warp_meshad.kernels import ad

pytestmark = pytest.mark.device


@wp.struct
class Springs:
    rest: wp.array(dtype=wp.float64)
    k: wp.float64


@wp.func
def spring(e: int, xa: Any, xb: Any, data: Springs):
    """k/2 (|xa - xb| - rest_e)^2: indefinite where compressed, so the projection changes the Hessian."""
    d = ad.length(xa - xb) - data.rest[e]
    return data.k * 0.5 * d * d


@wp.func
def bent_pair(e: int, a: Any, b: Any):
    """r = (a.b - 1, a_x b_z - 0.1): a residual term, projected as the dual of 1/2 |r|^2."""
    return ad.vec2(ad.dot(a, b) - 1.0, a.x * b.z - 0.1)


@wp.func
def scalar_triple(e: int, a: Any, b: Any, c: Any):
    """sin(a b) + (b - c)^3 for scalar variables: indefinite almost everywhere."""
    d = b - c
    return ad.sin(a * b) + d * d * d


@wp.func
def log_neo_hookean_F(e: int, F: Any):
    """mu / 2 (|F|^2 - 3) - mu log J + lam / 2 (log J)^2 with mu = 1, lam = 4; +inf for J <= 0."""
    j = ad.det(F)
    if j <= 0.0:
        return wp.float64(wp.inf)
    lj = ad.log(j)
    return 0.5 * (ad.frobenius_sq(F) - 3.0) - lj + 2.0 * lj * lj


def _spring_problem(device, deterministic=False):
    mesh = wm.TriMesh.grid(4, 4)
    rng = np.random.default_rng(3)
    data = Springs()
    data.rest = wp.array(1.3 * mesh.edge_lengths(), dtype=wp.float64, device=device)
    data.k = wp.float64(2.0)
    p = wm.Problem(mesh.vertex_count, 3, device=device, deterministic=deterministic)
    p.add_term(mesh.edges, spring, data, weight=1.5)
    p.add_residual_term(mesh.edges, bent_pair, weight=0.5)
    x = mesh.vertices + 0.05 * rng.normal(size=mesh.vertices.shape)
    return p, wp.array(x, dtype=wp.vec3d, device=device)


def _scalar_problem(device):
    rng = np.random.default_rng(4)
    faces = wm.TriMesh.grid(3, 3).faces
    p = wm.Problem(16, 1, dtype=wp.float32, device=device)
    p.add_term(faces, scalar_triple)
    return p, wp.array(rng.normal(size=16).astype(np.float32), dtype=wp.float32, device=device)


def _tet_problem(device):
    mesh = wm.TetMesh.box(2, 2, 2)
    rng = np.random.default_rng(5)
    p = wm.Problem(mesh.vertex_count, 3, device=device)
    p.add_deformation_term(mesh.tets, log_neo_hookean_F, mesh.rest_matrix_inverses())
    x = mesh.vertices * np.array([1.9, 1.7, 1.0]) + 0.03 * rng.normal(size=mesh.vertices.shape)  # J > e: indefinite
    return p, wp.array(x, dtype=wp.vec3d, device=device)


PROBLEMS = {
    "springs_and_residual": lambda device: _spring_problem(device),
    "springs_and_residual_deterministic": lambda device: _spring_problem(device, deterministic=True),
    "scalar_float32": _scalar_problem,
    "tet_deformation": _tet_problem,
}


def _projected(build, device, split: bool, mode: str):
    p, x = build(device)
    p.unrolled_projection = True
    p.split_projection = split
    f, g, H = p.eval_with_hessian_proj(x, mode=mode, eps=1e-6)
    return p, f, g.numpy().copy(), H.values.numpy().copy()


@pytest.mark.parametrize("mode", ["clamp", "abs"])
@pytest.mark.parametrize("case", sorted(PROBLEMS))
def test_split_projection_equals_the_projection_in_the_term_kernel(device, case, mode):
    if case == "tet_deformation" and mode == "abs":
        pytest.skip("one projection mode suffices for the largest kernel (compile time)")
    build = PROBLEMS[case]
    _, f0, g0, h0 = _projected(build, device, False, mode)
    p, f1, g1, h1 = _projected(build, device, True, mode)
    assert any(kernel_cache.splits(t, "hessian_proj", p.kernel_facts, False) for t in p.terms)
    if wp.get_device(device).is_cpu:
        assert f1 == f0
        assert np.array_equal(g1, g0)
        assert np.array_equal(h1, h0)
    else:
        scale = np.abs(h0).max()
        np.testing.assert_allclose(f1, f0, rtol=1e-12)
        np.testing.assert_allclose(g1, g0, rtol=1e-12, atol=1e-12 * np.abs(g0).max())
        np.testing.assert_allclose(h1, h0, rtol=1e-10, atol=1e-12 * scale)
    # the projection did something: the unprojected Hessian differs
    h_plain = p.eval_with_hessian(p_x := PROBLEMS[case](device)[1])[2].values.numpy()
    assert not np.allclose(h_plain, h1)
    # a second evaluation replays both launches and gives the same values
    again = p.eval_with_hessian_proj(p_x, mode=mode, eps=1e-6)[2].values.numpy()
    assert np.array_equal(again, h1)


def test_one_projection_kernel_serves_every_energy_of_a_shape(device):
    p, _ = _spring_problem(device)
    q = wm.Problem(p.variable_count, 3, device=device)
    q.add_residual_term(p.terms[1].elements_np, bent_pair)
    for problem in (p, q):
        problem.unrolled_projection = True
        problem.split_projection = True
    a = kernel_cache.projection_kernel(p.terms[0], p.kernel_facts)
    b = kernel_cache.projection_kernel(q.terms[0], q.kernel_facts)
    assert a is b  # springs and the residual pair: valence 2, vec3, float64
    assert a.module is not kernel_cache.term_kernel(p.terms[0], "hessian_proj", p.kernel_facts, split=True).module


def test_what_is_split(device):
    p, _ = _tet_problem(device)  # k = 9 duals (F of a tet)
    t = p.terms[0]
    assert p.split_projection is None
    facts = lambda cuda, **kw: kernel_cache.KernelFacts(wp.float64, wp.vec3d, 3, cuda=cuda, **kw)  # noqa: E731
    assert kernel_cache.splits(t, "hessian_proj", facts(True), False)  # the GPU default from k = 9
    assert not kernel_cache.splits(t, "hessian_proj", facts(False), False)  # the CPU's loop projection (k > 6)
    assert not kernel_cache.splits(t, "hessian_proj", facts(False, split_projection=True), False)  # nothing unrolled
    assert kernel_cache.splits(t, "hessian_proj", facts(False, split_projection=True, unrolled_projection=True), False)
    assert not kernel_cache.splits(t, "hessian_proj", facts(True, split_projection=False), False)
    assert not kernel_cache.splits(t, "hessian_proj", facts(True), True)  # tiled
    assert not kernel_cache.splits(t, "hessian", facts(True), False)  # not projected
    assert kernel_cache.split_default(9, True) and kernel_cache.split_default(12, True)
    assert not kernel_cache.split_default(6, True) and not kernel_cache.split_default(12, False)


def test_interaction_terms_are_not_split(device):
    p = wm.Problem(8, 3, device=device)
    p.unrolled_projection = True
    p.split_projection = True
    data = Springs()
    data.rest = wp.array(np.ones(4), dtype=wp.float64, device=device)
    data.k = wp.float64(1.0)
    i = p.add_interaction_term(spring, 2, data=data, capacity=4)
    assert not kernel_cache.splits(p.terms[i], "hessian_proj", p.kernel_facts, False)


@pytest.mark.parametrize("value", ["yes", 1, 0.0])
def test_split_projection_takes_none_or_a_bool(device, value):
    p = wm.Problem(4, 3, device=device)
    with pytest.raises(ValueError, match="split_projection must be None, True or False"):
        p.split_projection = value
    with pytest.raises(ValueError, match="unrolled_projection must be None, True or False"):
        p.unrolled_projection = value
