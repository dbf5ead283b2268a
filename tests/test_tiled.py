"""Tiled (shared-memory, patch-per-block) Hessian assembly and the locality ordering."""

from typing import Any

import numpy as np
import pytest
import warp as wp

import warp_meshad as wm
from warp_meshad._src.problem.pattern import build_hessian_pattern
from warp_meshad._src.problem.tiled import TileConfig, build_tile_plan, tile_capacity
from warp_meshad.kernels import ad


@wp.struct
class Springs:
    rest: wp.array(dtype=wp.float64)
    k: wp.float64


@wp.func
def spring(e: int, xa: Any, xb: Any, data: Springs):
    l = ad.length(xa - xb)
    return data.k * 0.5 * (l - data.rest[e]) * (l - data.rest[e])


@wp.func
def wavy_triangle(e: int, a: Any, b: Any, c: Any):
    n = ad.cross(b - a, c - a)
    return ad.log(ad.length_sq(n) + 1.0) + ad.sin(a[0] * b.y) * c.z


@wp.struct
class Springs32:
    rest: wp.array(dtype=wp.float32)


@wp.func
def spring32(e: int, xa: Any, xb: Any, data: Springs32):
    d = ad.length(xa - xb) - data.rest[e]
    return 2.0 * d * d


def build(mesh, device, assembly):
    p = wm.Problem(mesh.vertex_count, 3, device=device, assembly=assembly)
    p.add_term(mesh.edges, spring, build_data(mesh, device))
    p.add_term(mesh.faces, wavy_triangle, weight=0.5)
    return p


def positions(mesh, seed):
    rng = np.random.default_rng(seed)
    return mesh.vertices + 0.1 / np.sqrt(mesh.vertex_count) * rng.normal(size=mesh.vertices.shape)


@pytest.mark.parametrize("projection", [None, "clamp"])
def test_tiled_assembly_equals_atomic_over_many_patches(device, projection):
    mesh = wm.TriMesh.grid(24, 20)
    x = wp.array(positions(mesh, 0), dtype=wp.vec3d, device=device)
    atomic, tiled = build(mesh, device, "atomic"), build(mesh, device, "tiled")
    outs = []
    for p in (atomic, tiled):
        e, g, H = p.assemble_hessian(x, projection=projection)
        outs.append((e.numpy()[0], g.numpy().copy(), wm.to_scipy(H).toarray()))
    plan = tiled.tile_plan
    assert plan is not None and plan.patch_count > 3  # rows spread over several tiles
    assert atomic.tile_plan is None
    np.testing.assert_allclose(outs[1][0], outs[0][0], rtol=1e-12)
    np.testing.assert_allclose(outs[1][1], outs[0][1], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(outs[1][2], outs[0][2], rtol=1e-11, atol=1e-11)
    # a second evaluation overwrites (no accumulation across calls: nothing is cleared beforehand)
    e2, g2, H2 = tiled.assemble_hessian(x, projection=projection)
    np.testing.assert_allclose(wm.to_scipy(H2).toarray(), outs[0][2], rtol=1e-11, atol=1e-11)


def test_tile_plan_lists_each_element_once_per_patch_of_its_rows(device):
    mesh = wm.TriMesh.grid(30, 30)
    p = build(mesh, device, "tiled")
    offsets = build_hessian_pattern(p.variable_count, [t.elements_np for t in p.terms]).offsets
    plan = build_tile_plan(offsets, [t.elements_np for t in p.terms], p.block_type, device)
    bstart = plan.block_start.numpy()
    assert bstart[0] == 0 and bstart[-1] == offsets[-1]
    assert np.all(np.diff(bstart) <= tile_capacity(p.block_type)) and np.all(np.diff(bstart) > 0)
    # row -> patch, from the block ranges (each patch is a run of whole rows)
    row_patch = np.searchsorted(bstart, offsets[:-1], side="right") - 1
    for t, entries, starts in zip(p.terms, plan.entries, plan.entry_start):
        entries, starts = entries.numpy(), starts.numpy()
        seen = set()
        for q in range(plan.patch_count):
            for e in entries[starts[q]:starts[q + 1]]:
                seen.add((q, int(e)))
        expected = {(int(row_patch[v]), e) for e, row in enumerate(t.elements_np) for v in row}
        assert seen == expected
        assert len(entries) == len(expected)


def test_locality_order_and_reordered_mesh():
    mesh = wm.TriMesh.grid(16, 16)
    order = wm.locality_order(mesh.vertices)
    assert sorted(order.tolist()) == list(range(mesh.vertex_count))
    # a Morton curve on a 16 x 16 grid visits 2 x 2 cells first: (0,0), (1,0), (0,1), (1,1)
    np.testing.assert_array_equal(order[:4], [0, 1, 16, 17])
    r = mesh.reordered()
    np.testing.assert_array_equal(r.vertex_map, order)
    np.testing.assert_allclose(r.vertices, mesh.vertices[order])
    np.testing.assert_allclose(np.sort(r.face_areas()), np.sort(mesh.face_areas()))
    assert r.edge_count == mesh.edge_count
    # consecutive new vertices are closer on average than consecutive grid vertices across rows
    step = np.linalg.norm(np.diff(r.vertices, axis=0), axis=1)
    assert np.median(step) <= np.median(np.linalg.norm(np.diff(mesh.vertices, axis=0), axis=1)) + 1e-12
    with pytest.raises(ValueError, match=r"shape \(n, 2\) or \(n, 3\)"):
        wm.locality_order(np.zeros((4, 5)))
    with pytest.raises(ValueError, match="non-finite"):
        wm.locality_order(np.array([[0.0, 1.0, np.nan]]))
    with pytest.raises(wm.MeshError, match="permutation"):
        mesh.reordered(np.zeros(mesh.vertex_count, dtype=int))


def test_reordered_problem_gives_the_same_energy_and_permuted_derivatives(device):
    mesh = wm.TriMesh.grid(12, 12)
    r = mesh.reordered()
    x = positions(mesh, 3)
    p, q = build(mesh, device, "atomic"), build(r, device, "tiled")
    f, g, H = p.eval_with_hessian(wp.array(x, dtype=wp.vec3d, device=device))
    g, Hd = g.numpy().copy(), wm.to_scipy(H).toarray()
    fq, gq, Hq = q.eval_with_hessian(wp.array(x[r.vertex_map], dtype=wp.vec3d, device=device))
    np.testing.assert_allclose(fq, f, rtol=1e-12)
    np.testing.assert_allclose(gq.numpy(), g[r.vertex_map], rtol=1e-10, atol=1e-12)
    idx = (3 * r.vertex_map[:, None] + np.arange(3)).ravel()
    np.testing.assert_allclose(wm.to_scipy(Hq).toarray(), Hd[np.ix_(idx, idx)], rtol=1e-10, atol=1e-11)


def test_bad_assembly_option_is_refused():
    with pytest.raises(ValueError, match=r"assembly=.*'auto', 'atomic', 'tiled'.*'shared'"):
        wm.Problem(4, 3, assembly="shared")


def test_deterministic_tiled_rounds_never_add_twice_to_one_entry(device):
    mesh = wm.TriMesh.grid(20, 18)
    p = build(mesh, device, "tiled")
    pattern = build_hessian_pattern(p.variable_count, [t.elements_np for t in p.terms])
    plan = build_tile_plan(pattern.offsets, [t.elements_np for t in p.terms], p.block_type, device,
                           rounds=True, var_type=p.variable_type, config=TileConfig(block_dim=32))
    assert plan.deterministic and plan.patch_count > 3
    bstart = plan.block_start.numpy()
    for t, slots, entries, rstart, prs in zip(p.terms, pattern.slots, plan.entries, plan.round_start,
                                              plan.patch_round_start):
        entries, rstart, prs = entries.numpy(), rstart.numpy(), prs.numpy()
        assert rstart[-1] == len(entries) and prs[-1] == len(rstart) - 1
        for q in range(plan.patch_count):
            lo, hi = bstart[q], bstart[q + 1]
            listed = []
            for r in range(prs[q], prs[q + 1]):
                members = entries[rstart[r]:rstart[r + 1]]
                assert 0 < len(members) <= 32
                listed += members.tolist()
                s = slots[members]
                for col in range(s.shape[1]):  # one tile_scatter_add call per pair position
                    owned = s[:, col][(s[:, col] >= lo) & (s[:, col] < hi)]
                    assert len(np.unique(owned)) == len(owned)
            rows = np.flatnonzero((pattern.offsets[:-1] >= lo) & (pattern.offsets[:-1] < hi))
            expected = np.flatnonzero(np.isin(t.elements_np, rows).any(axis=1))
            np.testing.assert_array_equal(np.sort(listed), expected)


@pytest.mark.parametrize("stencil", ["edges", "shuffled_faces", "edge_diamonds"])
def test_plan_built_on_the_device_lists_what_the_numpy_build_lists(device, stencil):
    """The device build of the plan (sorts, scans, a thread per element position) against the numpy build it
    replaced (tests/tiled_reference.py): the same patches and the same elements per patch; with rounds, valid
    rounds (no two elements of a round add to one tile entry), as few as the numpy build's within 2%, and the
    same plan when built twice."""
    import tiled_reference

    mesh = wm.TriMesh.grid(60, 40)
    el = {"edges": mesh.edges, "shuffled_faces": mesh.faces, "edge_diamonds": mesh.edge_diamonds}[stencil]
    if stencil == "shuffled_faces":
        el = el[np.random.default_rng(3).permutation(el.shape[0])]
    el = np.ascontiguousarray(el, dtype=np.int32)
    pattern = build_hessian_pattern(mesh.vertex_count, [el])
    block, bd = wp.types.matrix((3, 3), wp.float32), 64
    for rounds in (False, True):
        plan = build_tile_plan(pattern.offsets, [wp.array(el, dtype=wp.int32, device=device)], block, device, rounds=rounds,
                               var_type=wp.vec3f, config=TileConfig(block_dim=bd))  # fmt: skip
        bounds = plan.row_start.numpy().astype(np.int64)
        ref = tiled_reference.plan_terms(pattern.offsets.astype(np.int64), bounds, [el],
                                         pattern.slots if rounds else None, bd)  # fmt: skip
        starts, entries = plan.entry_start[0].numpy(), plan.entries[0].numpy()
        np.testing.assert_array_equal(starts, ref["starts"][0])
        assert plan.evaluations == ref["evals"] and plan.patch_count > 10
        for q in range(plan.patch_count):
            np.testing.assert_array_equal(np.sort(entries[starts[q]:starts[q + 1]]),
                                          np.sort(ref["entries"][0][starts[q]:starts[q + 1]]))  # fmt: skip
        if not rounds:
            continue
        assert plan.round_count[0] <= 1.02 * ref["round_total"]
        rstart, prs, bstart = plan.round_start[0].numpy(), plan.patch_round_start[0].numpy(), plan.block_start.numpy()
        assert rstart[-1] == entries.size and prs[-1] == rstart.size - 1 and np.all(np.diff(rstart) <= bd)
        for q in range(plan.patch_count):
            for r in range(prs[q], prs[q + 1]):
                assert starts[q] <= rstart[r] < rstart[r + 1] <= starts[q + 1]
                s = pattern.slots[0][entries[rstart[r]:rstart[r + 1]]]
                for col in range(s.shape[1]):
                    owned = s[:, col][(s[:, col] >= bstart[q]) & (s[:, col] < bstart[q + 1])]
                    assert len(np.unique(owned)) == len(owned)
        again = build_tile_plan(pattern.offsets, [el], block, device, rounds=True, var_type=wp.vec3f,
                                config=TileConfig(block_dim=bd))
        np.testing.assert_array_equal(again.entries[0].numpy(), entries)
        np.testing.assert_array_equal(again.round_start[0].numpy(), rstart)


def test_deterministic_plan_takes_three_rounds_per_patch_of_a_spring_grid(device):
    # three springs start at each grid vertex and three end there: 3 layers is the least. A patch is
    # shorter than a grid row: each row (vertex) adds two springs to its layers of vertical and of
    # diagonal springs, so the plan cuts patches of 128 rows, where no layer outgrows a round of 256
    mesh = wm.TriMesh.grid(300, 12)
    p = wm.Problem(mesh.vertex_count, 3, dtype=wp.float32, device=device, deterministic=True, assembly="tiled")
    data = Springs32()
    data.rest = wp.array(mesh.edge_lengths().astype(np.float32), device=device)
    p.add_term(mesh.edges, spring32, data)
    offsets = build_hessian_pattern(p.variable_count, [p.terms[0].elements_np]).offsets
    plan = build_tile_plan(offsets, [p.terms[0].elements_np], p.block_type, device, rounds=True,
                           var_type=p.variable_type)
    rows = np.diff(plan.row_start.numpy())
    assert plan.row_cap == 128 and rows.max() == 128
    # both shared tiles fit the shared memory the kernels use (36 KB)
    assert 36 * plan.cap + 12 * plan.row_cap <= 36 * 1024 and plan.cap >= 7 * plan.row_cap
    rounds = np.diff(plan.patch_round_start[0].numpy())
    assert plan.patch_count >= 20 and rounds.max() == 3
    assert np.all(np.diff(plan.round_start[0].numpy()) <= 256)


def test_deterministic_tiled_matches_atomic_and_repeats_bitwise(device):
    """deterministic=True (tiled rounds) agrees with the atomic assembly and repeats bitwise.

    On CUDA the input is one where the atomic assembly does not repeat: every spring is listed 64 times, each copy
    with its own rest length, so each gradient entry and Hessian block sums hundreds of contributions that float
    atomics add in the order threads arrive. The test asserts that the atomic runs do differ in their last bits
    (the input can tell a reordered sum from a fixed-order one), then that the deterministic runs do not. On the
    CPU a launch runs its threads one after another in index order, so atomic runs repeat bitwise as well: there
    the bitwise comparison cannot catch an order-dependent sum, and the springs are listed once (the tiled kernels
    are slow on the CPU); only agreement with the atomic assembly and repetition are checked.
    """
    cuda = wp.get_device(device).is_cuda
    repeat, count = (64, 5) if cuda else (1, 3)
    mesh = wm.TriMesh.grid(22, 16)
    x = wp.array(positions(mesh, 5), dtype=wp.vec3d, device=device)
    springs = Springs()
    rest = np.random.default_rng(6).uniform(0.5, 1.0, repeat * mesh.edge_count) * np.tile(mesh.edge_lengths(), repeat)
    springs.rest = wp.array(rest, dtype=wp.float64, device=device)
    springs.k = wp.float64(3.0)

    def runs(**options):
        p = wm.Problem(mesh.vertex_count, 3, device=device, **options)
        p.add_term(np.tile(mesh.edges, (repeat, 1)), spring, springs)
        p.add_term(mesh.faces, wavy_triangle, weight=0.5)
        out = []
        for _ in range(count):
            e, g, H = p.assemble_hessian(x, projection="clamp")
            out.append((e.numpy().copy(), g.numpy().copy(), H.values.numpy().copy()))
        return p, out, wm.to_scipy(H).toarray()

    def same(a, b):
        return all(np.array_equal(u, v) for u, v in zip(a, b))

    atomic, atomic_runs, ref = runs(assembly="atomic")
    q, det_runs, dense = runs(deterministic=True, assembly="tiled")
    assert q.tile_plan.deterministic and q._storage.det is None  # rounds in shared memory, no contribution buffers
    np.testing.assert_allclose(det_runs[0][0][0], atomic_runs[0][0][0], rtol=1e-12)
    np.testing.assert_allclose(det_runs[0][1], atomic_runs[0][1], rtol=1e-11, atol=1e-12)
    np.testing.assert_allclose(dense, ref, rtol=1e-11, atol=1e-11)
    if cuda:
        assert not all(same(r, atomic_runs[0]) for r in atomic_runs[1:]), (
            f"the atomic assembly repeated bitwise in {count} runs: this input cannot show a reordered sum")
    for r in det_runs[1:]:
        assert same(r, det_runs[0])


def test_auto_sums_small_float32_elements_in_rounds(device, monkeypatch):
    """assembly="auto" gives float32 elements of <= 6 variables the round-ordered tiled kernels (faster on an
    H200) without deterministic=True; explicit "tiled", float64 and larger elements keep the plain kernels."""
    from warp_meshad._src.problem.assembly import Assembler, rounds_default

    assert rounds_default(6, wp.float32) and not rounds_default(9, wp.float32) and not rounds_default(6, wp.float64)
    mesh = wm.TriMesh.grid(22, 16)
    data = Springs32()
    data.rest = wp.array(0.8 * mesh.edge_lengths(), dtype=wp.float32, device=device)

    def problem(assembly, dtype=wp.float32):
        p = wm.Problem(mesh.vertex_count, 3, dtype=dtype, device=device, assembly=assembly)
        if dtype == wp.float32:
            p.add_term(mesh.edges, spring32, data)
        else:
            p.add_term(mesh.edges, spring, build_data(mesh, device))
        return p

    assert problem("auto")._assembler.rounds_default()
    assert not problem("tiled")._assembler.rounds_default()
    assert not problem("auto", wp.float64)._assembler.rounds_default()
    x = wp.array(positions(mesh, 7).astype(np.float32), dtype=wp.vec3f, device=device)
    e, g, H = problem("atomic").assemble_hessian(x)
    ref = (e.numpy()[0], g.numpy().copy(), wm.to_scipy(H).toarray())
    plain = problem("tiled")
    plain.assemble_hessian(x)
    assert not plain.tile_plan.deterministic
    # the CPU never picks the tiled assembly under "auto": take the "auto" rule's branch on an explicit "tiled"
    monkeypatch.setattr(Assembler, "rounds_default", lambda self: True)
    q = problem("tiled")
    runs = [tuple(a.numpy().copy() for a in (e, g, H.values)) for e, g, H in (q.assemble_hessian(x) for _ in range(2))]
    assert q.tile_plan.deterministic and q._storage.det is None and not q.deterministic
    np.testing.assert_allclose(runs[0][0][0], ref[0], rtol=1e-5)
    np.testing.assert_allclose(runs[0][1], ref[1], rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(wm.to_scipy(q.assemble_hessian(x)[2]).toarray(), ref[2], rtol=1e-4, atol=1e-3)
    for a, b in zip(runs[1], runs[0]):
        assert np.array_equal(a, b)


@wp.func
def tet_spread(e: int, a: Any, b: Any, c: Any, d: Any):
    return ad.length_sq(a + b - c - d)


def test_auto_assembles_atomically_where_patches_repeat_elements(device):
    """assembly="auto" keeps a tiled plan only where it has a patch per multiprocessor and, unless it sums in rounds,
    its patches evaluate the elements at most AUTO_MAX_EVALUATIONS times each on average: tets in a box exceed that (the
    atomic assembly measured faster there), springs and triangles on a grid do not."""
    from warp_meshad._src.problem.assembly import AUTO_MAX_EVALUATIONS, auto_uses_tiles

    def tet_problem(n, assembly, deterministic=False):
        tets = wm.TetMesh.box(n, n, n)
        p = wm.Problem(tets.vertex_count, 3, device=device, assembly=assembly, deterministic=deterministic)
        p.add_term(tets.tets, tet_spread)
        return p, tets.tet_count

    p, count = tet_problem(10, "tiled")
    plan = p.tile_plan
    assert not plan.deterministic and sum(plan.evaluations) > AUTO_MAX_EVALUATIONS * count  # 2.3 per tet (3.0 at 56^3)
    assert not auto_uses_tiles(plan, count, 1)
    rounds = tet_problem(10, "tiled", deterministic=True)[0].tile_plan
    assert rounds.deterministic and auto_uses_tiles(rounds, count, 1)  # a plan with rounds stays
    grid = wm.TriMesh.grid(40, 40)
    q = build(grid, device, "tiled")  # springs on the edges and a triangle term
    count = grid.edge_count + grid.face_count
    assert sum(q.tile_plan.evaluations) <= AUTO_MAX_EVALUATIONS * count
    assert auto_uses_tiles(q.tile_plan, count, 1)
    assert not auto_uses_tiles(q.tile_plan, count, q.tile_plan.patch_count + 1)  # too few patches
    assert not auto_uses_tiles(None, count, 1)
    # what "auto" picks (on the CPU always the atomic assembly)
    cuda = wp.get_device(device).is_cuda
    assert tet_problem(30, "auto")[0].tile_plan is None  # ~790 patches, 2.9 evaluations per tet
    assert (tet_problem(30, "auto", deterministic=True)[0].tile_plan is not None) == cuda
    assert (build(wm.TriMesh.grid(200, 200), device, "auto").tile_plan is not None) == cuda


def build_data(mesh, device):
    data = Springs()
    data.rest = wp.array(0.8 * mesh.edge_lengths(), dtype=wp.float64, device=device)
    data.k = wp.float64(3.0)
    return data


@wp.func
def scalar_pair(e: int, a: Any, b: Any):
    d = a - b
    return d * d * d * d + ad.exp(a * b * 0.1)


@wp.func
def planar_spring(e: int, a: Any, b: Any):
    l = ad.length(a - b)
    return (l - 0.05) * (l - 0.05) * ad.sqrt(ad.length_sq(a) + 1.0)


@pytest.mark.parametrize("dim", [1, 2])
def test_tiled_assembly_with_scalar_and_planar_variables(device, dim):
    mesh = wm.TriMesh.grid(40, 36)
    rng = np.random.default_rng(dim)
    x = rng.normal(size=(mesh.vertex_count, dim)) if dim > 1 else rng.normal(size=mesh.vertex_count)
    vec = wp.float64 if dim == 1 else wp.vec2d
    xw = wp.array(x, dtype=vec, device=device)
    out = []
    for assembly in ("atomic", "tiled"):
        p = wm.Problem(mesh.vertex_count, dim, device=device, assembly=assembly)
        p.add_term(mesh.edges, scalar_pair if dim == 1 else planar_spring)
        e, g, H = p.assemble_hessian(xw)
        out.append((e.numpy()[0], g.numpy().copy(), wm.to_scipy(H).toarray()))
    assert p.tile_plan.patch_count > 1
    np.testing.assert_allclose(out[1][0], out[0][0], rtol=1e-12)
    np.testing.assert_allclose(out[1][1], out[0][1], rtol=1e-11, atol=1e-12)
    np.testing.assert_allclose(out[1][2], out[0][2], rtol=1e-11, atol=1e-11)


_ALL_LANES = r"""
import numpy as np, warp as wp
wp.config.quiet = True
wp.config.enable_cpu_blocks = True  # every lane of a block runs (as fibers), as on a GPU
import warp_meshad as wm
from warp_meshad._src.problem.tiled import TileConfig
from test_tiled import build, positions
mesh = wm.TriMesh.grid(24, 20)
x = wp.array(positions(mesh, 0), dtype=wp.vec3d, device="cpu")
ref = build(mesh, "cpu", "atomic")
e, g, H = ref.assemble_hessian(x)
R = (e.numpy()[0], g.numpy().copy(), wm.to_scipy(H).toarray())
for det in (False, True):
    q = wm.Problem(mesh.vertex_count, 3, device="cpu", assembly="tiled", deterministic=det,
                   tile_config=TileConfig(block_dim=32))
    for t in ref.terms:
        q.add_term(t.elements_np, t.energy, t.data, weight=t.weight)
    runs = [tuple(a.numpy().copy() for a in (e, g, H.values)) for e, g, H in (q.assemble_hessian(x) for _ in range(2))]
    assert q.tile_plan.patch_count > 3
    np.testing.assert_allclose(runs[0][0][0], R[0], rtol=1e-12)
    np.testing.assert_allclose(runs[0][1], R[1], rtol=1e-11, atol=1e-12)
    np.testing.assert_allclose(wm.to_scipy(q.assemble_hessian(x)[2]).toarray(), R[2], rtol=1e-11, atol=1e-11)
    if det:
        assert all(np.array_equal(a, b) for a, b in zip(runs[0], runs[1]))
print("ALL LANES OK")
"""


def test_tiled_kernels_with_every_lane_of_a_block_running():
    """The cooperative code (tile scatter, rounds, write-out loops) with 32 lanes per block (CPU fibers)."""
    if not wp.is_cpu_available():
        pytest.skip("CPU fiber mode needs Warp's CPU compiler, which this Warp build lacks")
    import os
    import pathlib
    import subprocess
    import sys

    here = pathlib.Path(__file__).resolve().parent
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(here), str(here.parent), os.environ.get("PYTHONPATH", "")]))
    res = subprocess.run([sys.executable, "-c", _ALL_LANES], capture_output=True, text=True, env=env, timeout=900)
    assert res.returncode == 0 and "ALL LANES OK" in res.stdout, res.stdout[-2000:] + res.stderr[-4000:]


def test_tile_write_out_by_number_or_block_and_register_cap(device):
    """Both write-outs of the tile give the atomic assembly's Hessian (float32 springs, k = 6); such a kernel asks
    the CUDA compiler for 4 blocks per SM, a float64 one (whose dual Hessian would spill under the cap) for none."""
    from warp_meshad._src.codegen.kernel_cache import term_kernel
    from warp_meshad._src.problem import tiled as tiled

    mesh = wm.TriMesh.grid(24, 20)
    x = wp.array(positions(mesh, 1).astype(np.float32), dtype=wp.vec3f, device=device)

    def springs32(assembly, config=tiled.TileConfig()):
        p = wm.Problem(mesh.vertex_count, 3, dtype=wp.float32, device=device, assembly=assembly, tile_config=config)
        data = Springs32()
        data.rest = wp.array(0.8 * mesh.edge_lengths().astype(np.float32), device=device)
        p.add_term(mesh.edges, spring32, data)
        return p

    ref = wm.to_scipy(springs32("atomic").assemble_hessian(x)[2]).toarray()
    for store in ("number", "block"):
        config = tiled.TileConfig(store=store)
        p = springs32("tiled", config)
        np.testing.assert_allclose(wm.to_scipy(p.assemble_hessian(x)[2]).toarray(), ref, rtol=2e-5, atol=1e-4)
        variant = p._assembler.tile_variant(p.terms[0], "hessian", p.tile_plan)
        kern = term_kernel(p.terms[0], "hessian", p.kernel_facts, variant)
        assert kern.options["launch_bounds"] == (config.block_dim, config.min_blocks)
    assert tiled.min_blocks(6, wp.float32) == tiled.TileConfig().min_blocks > 0
    assert tiled.min_blocks(6, wp.float64) == tiled.min_blocks(9, wp.float32) == 0
    assert tiled.min_blocks(6, wp.float32, projected=True) == 0
