"""Mass-spring gradient + Hessian on an n x n grid, side by side.

Run on a GPU host (writes benchmarks/results/mass_spring.json and .png):

    python -m benchmarks.mass_spring --sizes 10 100 500 1000 2000
    python -m benchmarks.mass_spring --device cpu --sizes 10 30   # CPU smoke run

Methods (same springs, same float32 data, one process, one GPU):

* ``warp_meshad``: ``Problem.assemble_hessian`` of the built-in ``mass_spring`` energy (float32) (dual numbers), default
  settings (``assembly="auto"``: tiled where the grid fills the GPU, else atomic; the tiled kernel of these
  float32 springs sums in the deterministic plan's rounds, the launches of ``warp_meshad_deterministic``), captured
  in a CUDA graph;
* ``warp_meshad_atomic``: the same with ``assembly="atomic"`` (atomic block adds into topology-precomputed slots);
  the reference every other method is checked against;
* ``warp_meshad_deterministic`` (``deterministic=True``, tiled rounds without atomics) and
  ``warp_meshad_deterministic_buffers`` (``assembly="atomic"``: per-element buffers summed in a fixed order), both
  checked for identical bits over 10 runs;
* ``warp_meshad_tiled``: the same energy with ``assembly="tiled"`` (a thread block per patch of consecutive
  rows, blocks summed in shared memory, written out coalesced); ``warp_meshad_tiled_morton`` /
  ``warp_meshad_atomic_morton``: tiled / atomic on the grid renumbered along a Morton curve
  (``TriMesh.reordered()``); results are mapped back and checked against ``warp_meshad``;
* ``warp_meshad_proj``: the atomic assembly with per-element PSD projection;
* ``handwritten_warp``: an analytic Warp kernel writing the same energy, gradient and 3x3 blocks into the same
  slots with ``atomic_add`` (CUDA graph);
* ``torch_vmap_coo``: ``torch.func.vmap(torch.func.hessian(f))`` per edge, then a sparse COO tensor and
  ``coalesce`` (the IndexedSum approach), gradient by ``vmap(grad)`` and ``index_add_``;
* ``jax_vmap_segment_sum``: ``jit(vmap(hessian(f)))`` + ``segment_sum`` into the precomputed block slots;
* ``warp_tape_gradient``: gradient only, reverse mode with ``wp.Tape`` (compare with ``warp_meshad_gradient``).

All methods are checked against warp_meshad's assembled Hessian and gradient first (relative Frobenius error).
The warp_meshad methods also record ``setup_s``: building the Problem with its Hessian pattern and tile plan
(``setup_problem``; both built on the device).
"""

from __future__ import annotations

import argparse
import os
import traceback

import numpy as np
import warp as wp

from benchmarks.common import guard_cpu_out, record, time_host, time_torch, time_warp, write

NAME = "mass_spring"
STIFFNESS = 10.0


@wp.kernel(enable_backward=False)
def _handwritten_spring(
    edges: wp.array2d(dtype=wp.int32),
    x: wp.array(dtype=wp.vec3f),
    rest: wp.array(dtype=wp.float32),
    k: wp.float32,
    slots: wp.array2d(dtype=wp.int32),
    energy: wp.array(dtype=wp.float32),
    grad: wp.array(dtype=wp.vec3f),
    hvals: wp.array(dtype=wp.mat33f),
):
    # one thread per spring: analytic energy (to its own slot), gradient and exact 3x3 Hessian blocks
    e = wp.tid()
    a = edges[e, 0]
    b = edges[e, 1]
    d = x[a] - x[b]
    l = wp.length(d)
    n = d / l
    s = l - rest[e]
    energy[e] = 0.5 * k * s * s
    g = (k * s) * n
    wp.atomic_add(grad, a, g)
    wp.atomic_sub(grad, b, g)
    nn = wp.outer(n, n)
    K = k * (nn + (s / l) * (wp.identity(n=3, dtype=wp.float32) - nn))
    wp.atomic_add(hvals, slots[e, 0], K)
    wp.atomic_sub(hvals, slots[e, 1], K)
    wp.atomic_sub(hvals, slots[e, 2], K)
    wp.atomic_add(hvals, slots[e, 3], K)


@wp.kernel
def _spring_energy(
    edges: wp.array2d(dtype=wp.int32),
    x: wp.array(dtype=wp.vec3f),
    rest: wp.array(dtype=wp.float32),
    k: wp.float32,
    energy: wp.array(dtype=wp.float32),
):
    # one thread per spring (reverse mode through wp.Tape)
    e = wp.tid()
    s = wp.length(x[edges[e, 0]] - x[edges[e, 1]]) - rest[e]
    wp.atomic_add(energy, 0, 0.5 * k * s * s)


def build(n, device, seed=0, assembly="atomic", morton=False, deterministic=False):
    import warp_meshad as wm
    from warp_meshad.kernels.energies import MassSpringData

    mesh = wm.TriMesh.grid(n, n)
    rng = np.random.default_rng(seed)
    X = (mesh.vertices + 0.2 / n * rng.normal(size=mesh.vertices.shape)).astype(np.float32)
    if morton:  # the same springs, vertices numbered along a Morton curve
        mesh = mesh.reordered()
        X = X[mesh.vertex_map]
    rest = (0.9 * mesh.edge_lengths()).astype(np.float32)
    data = MassSpringData(wp.float32, rest=wp.array(rest, dtype=wp.float32, device=device), stiffness=STIFFNESS)
    problem = setup_problem(mesh.vertex_count, mesh.edges, data, device, assembly, deterministic)
    x = wp.array(X, dtype=wp.vec3f, device=device)
    return mesh, X, rest, problem, data, x


def setup_problem(nv, edges, data, device, assembly="atomic", deterministic=False):
    """The springs' Problem with its Hessian pattern and tile plan built; ``problem.setup_s`` is the wall time of
    that setup (construction, add_term, pattern, plan, synchronized; no kernel is compiled or run)."""
    import time

    import warp_meshad as wm
    from warp_meshad.kernels.energies import mass_spring

    wp.synchronize_device(device)
    t0 = time.perf_counter()
    problem = wm.Problem(nv, 3, dtype=wp.float32, device=device, assembly=assembly, deterministic=deterministic)
    problem.add_term(edges, mass_spring, data)
    problem.tile_plan  # noqa: B018 (builds the pattern and the tile plan: part of the setup time)
    wp.synchronize_device(device)
    problem.setup_s = time.perf_counter() - t0
    return problem


def warm_setup(device):
    """Build small problems of every assembly once, so that the measured setups load no module (the pattern and
    plan kernels compile or load on first use: ~1.5 s on an H200 with a cold cache)."""
    for asm, det in (("atomic", False), ("auto", False), ("tiled", False), ("auto", True), ("atomic", True)):
        mesh, _, _, problem, _, _ = build(64, device, assembly=asm, deterministic=det)
        del problem


def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def run_size(n, device, methods, runs, records):
    mesh, X, rest, problem, data, x = build(n, device)
    nv = mesh.vertex_count
    dev = str(wp.get_device(device))
    base = dict(benchmark=NAME, vertex_count=nv, dtype="float32", device=dev)
    print(f"-- {n}x{n}: {nv} vertices, {mesh.edge_count} springs, {problem.hessian_block_count} blocks")

    energy, g, H = problem.assemble_hessian(x)
    wp.synchronize_device(device)
    ref_f = float(energy.numpy()[0])
    ref_g = g.numpy().copy()
    ref_h = H.values.numpy()[: H.nnz].copy()
    import warp_meshad as wm

    ref_csr = wm.to_scipy(H)  # before later methods overwrite the buffers

    def add(method, times, **extra):
        r = record(NAME, method, nv, "float32", times, dev, **extra)
        records.append(r)
        print(f"   {method:24s} median {r['ms_median']:9.4f} ms  min {r['ms_min']:9.4f} ms")

    print(f"   setup (pattern + plan): atomic {problem.setup_s:.3f} s")
    if "warp_meshad_atomic" in methods:
        add("warp_meshad_atomic", time_warp(lambda: problem.assemble_hessian(x), device, runs), assembly="atomic",
            setup_s=problem.setup_s)
    variants = (("warp_meshad", "auto", False), ("warp_meshad_tiled", "tiled", False),
                ("warp_meshad_tiled_morton", "tiled", True), ("warp_meshad_atomic_morton", "atomic", True))
    for method, asm, morton in variants:
        if method not in methods:
            continue
        m2, _, _, q, _, xq = build(n, device, assembly=asm, morton=morton)
        fq, gq, Hq = q.assemble_hessian(xq)
        wp.synchronize_device(device)
        # back to the grid numbering: new vertex k is grid vertex vertex_map[k]
        vm = m2.vertex_map
        gq_np = np.zeros_like(ref_g)
        gq_np[vm] = gq.numpy()
        Hs = wm.to_scipy(Hq).tocoo()
        Hg = type(Hs)((Hs.data, (3 * vm[Hs.row // 3] + Hs.row % 3, 3 * vm[Hs.col // 3] + Hs.col % 3)), shape=Hs.shape).tocsr()
        err = (rel(fq.numpy(), [ref_f]), rel(gq_np, ref_g), float(abs(Hg - ref_csr).max() / abs(ref_csr).max()))
        print(f"   {method} vs warp_meshad: energy {err[0]:.2e} gradient {err[1]:.2e} hessian {err[2]:.2e}")
        assert max(err) < 1e-4, err
        extra = {}
        plan = q.tile_plan
        if plan is not None:
            asm = "tiled"
            extra = dict(patches=plan.patch_count, evaluations=plan.evaluations[0], elements=mesh.edge_count)
            print(f"   {method}: {plan.patch_count} patches, {plan.evaluations[0] / mesh.edge_count:.3f} evaluations per spring")
        print(f"   {method}: setup {q.setup_s:.3f} s")
        add(method, time_warp(lambda: q.assemble_hessian(xq), device, runs), assembly=asm, check_rel_error=max(err),
            setup_s=q.setup_s, **extra)
        del q
    for det_method, det_asm in (("warp_meshad_deterministic", "auto"), ("warp_meshad_deterministic_buffers", "atomic")):
        if det_method not in methods:
            continue
        q = setup_problem(nv, mesh.edges, data, device, det_asm, deterministic=True)
        outs = []
        for _ in range(10 if n <= 1000 else 3):
            fq, gq, Hq = q.assemble_hessian(x)
            outs.append((fq.numpy().copy(), gq.numpy().copy(), Hq.values.numpy()[: Hq.nnz].copy()))
        same = all(all(np.array_equal(a, b) for a, b in zip(o, outs[0])) for o in outs[1:])
        err = (rel(outs[0][0], [ref_f]), rel(outs[0][1], ref_g), rel(outs[0][2], ref_h))
        print(f"   deterministic vs atomic: energy {err[0]:.2e} gradient {err[1]:.2e} hessian {err[2]:.2e}; bitwise repeat: {same}")
        assert max(err) < 1e-4 and same, (err, same)
        tiled_det = q.tile_plan is not None
        print(f"   {det_method}: setup {q.setup_s:.3f} s")
        add(det_method, time_warp(lambda: q.assemble_hessian(x), device, runs), bitwise_repeat=same,
            assembly="tiled" if tiled_det else "buffers", setup_s=q.setup_s)
        del q
    if "warp_meshad_proj" in methods:
        add("warp_meshad_proj", time_warp(lambda: problem.assemble_hessian(x, projection="clamp"), device, runs),
            assembly="atomic")
    if "warp_meshad_gradient" in methods:
        add("warp_meshad_gradient", time_warp(lambda: problem.assemble_gradient(x), device, runs))

    edges = wp.array(mesh.edges, dtype=wp.int32, device=device)
    slots = problem.terms[0].slots
    rest_w = data.rest
    if "handwritten_warp" in methods:
        from warp_meshad._src.problem.reduce import ordered_total, partial_count

        m = mesh.edge_count
        e_el = wp.zeros(m, dtype=wp.float32, device=device)
        part = wp.zeros(partial_count(m, device), dtype=wp.float32, device=device)
        e2 = wp.zeros(1, dtype=wp.float32, device=device)
        g2 = wp.zeros(nv, dtype=wp.vec3f, device=device)
        h2 = wp.zeros(H.nnz, dtype=wp.mat33f, device=device)

        def hand():
            g2.zero_()
            h2.zero_()
            wp.launch(_handwritten_spring, dim=m, inputs=[edges, x, rest_w, wp.float32(STIFFNESS), slots, e_el, g2, h2], device=device)
            ordered_total(e_el, m, part, e2, device)

        hand()
        err = (rel(e2.numpy(), [ref_f]), rel(g2.numpy(), ref_g), rel(h2.numpy(), ref_h))
        print(f"   handwritten vs warp_meshad: energy {err[0]:.2e} gradient {err[1]:.2e} hessian {err[2]:.2e}")
        assert max(err) < 1e-4, err
        add("handwritten_warp", time_warp(hand, device, runs), check_rel_error=max(err))

    if "warp_tape_gradient" in methods:
        xt = wp.array(X, dtype=wp.vec3f, device=device, requires_grad=True)
        et = wp.zeros(1, dtype=wp.float32, device=device, requires_grad=True)
        tape = wp.Tape()

        def tape_grad():
            et.zero_()
            tape.reset()
            with tape:
                wp.launch(_spring_energy, dim=mesh.edge_count, inputs=[edges, xt, rest_w, wp.float32(STIFFNESS), et], device=device)
            tape.backward(loss=et)

        tape_grad()
        err = rel(xt.grad.numpy(), ref_g)
        print(f"   wp.Tape gradient vs warp_meshad: {err:.2e}")
        assert err < 1e-4, err
        try:
            times = time_warp(tape_grad, device, runs)
        except Exception:
            times = time_warp(tape_grad, device, runs, graph=False)
        add("warp_tape_gradient", times, check_rel_error=err)

    cuda = wp.get_device(device).is_cuda
    if "torch_vmap_coo" in methods and n <= 1000:
        try:
            add_torch(mesh, X, rest, ref_f, ref_g, ref_csr, add, runs, cuda)
        except Exception:
            traceback.print_exc()
            records.append({**base, "method": "torch_vmap_coo", "error": traceback.format_exc(limit=2)})
    if "jax_vmap_segment_sum" in methods:
        try:
            add_jax(mesh, X, rest, ref_f, ref_g, ref_h, slots.numpy(), H.nnz, add, runs)
        except Exception:
            traceback.print_exc()
            records.append({**base, "method": "jax_vmap_segment_sum", "error": traceback.format_exc(limit=2)})


def add_torch(mesh, X, rest, ref_f, ref_g, B, add, runs, cuda):
    import torch
    from torch.func import grad, hessian, vmap

    dev = "cuda" if cuda else "cpu"
    xe = torch.tensor(X, device=dev)
    ed = torch.tensor(mesh.edges.astype(np.int64), device=dev)
    rs = torch.tensor(rest, device=dev)
    n3 = 3 * mesh.vertex_count

    def f(p, r):
        s = torch.linalg.norm(p[0] - p[1]) - r
        return 0.5 * STIFFNESS * s * s

    # COO indices of each element's 6x6 block: rows 3*v_a + i, cols 3*v_b + j
    comp = (3 * ed[:, :, None] + torch.arange(3, device=dev)).reshape(-1, 6)  # (m, 6)
    rows = comp[:, :, None].expand(-1, 6, 6).reshape(-1)
    cols = comp[:, None, :].expand(-1, 6, 6).reshape(-1)
    idx = torch.stack([rows, cols])
    hfn = vmap(hessian(f))
    gfn = vmap(grad(f))
    ffn = vmap(f)

    def run():
        p = xe[ed]  # (m, 2, 3)
        e = ffn(p, rs).sum()
        gl = gfn(p, rs).reshape(-1)
        g = torch.zeros(n3, device=dev).index_add_(0, comp.reshape(-1), gl)
        hl = hfn(p, rs).reshape(-1)
        Hs = torch.sparse_coo_tensor(idx, hl, (n3, n3)).coalesce()
        return e, g, Hs

    e, g, Hs = run()
    if cuda:
        torch.cuda.synchronize()
    import scipy.sparse as sp

    ind = Hs.indices().cpu().numpy()
    A = sp.csr_matrix((Hs.values().cpu().numpy(), (ind[0], ind[1])), shape=(n3, n3))
    diff = (A - B).data
    err_h = float(np.linalg.norm(diff) / np.linalg.norm(B.data)) if diff.size else 0.0
    errs = (rel([e.item()], [ref_f]), rel(g.cpu().numpy(), ref_g.ravel()), err_h)
    print(f"   torch vs warp_meshad: energy {errs[0]:.2e} gradient {errs[1]:.2e} hessian {errs[2]:.2e}")
    err = max(errs)
    assert err < 1e-4, err
    add("torch_vmap_coo", time_torch(run, runs) if cuda else time_host(run, runs), check_rel_error=err)
    del Hs, e, g
    if cuda:
        torch.cuda.empty_cache()


def add_jax(mesh, X, rest, ref_f, ref_g, ref_h, slots, nnz, add, runs):
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    import jax
    import jax.numpy as jnp

    nv = mesh.vertex_count
    xe = jnp.asarray(X)
    ed = jnp.asarray(mesh.edges)
    rs = jnp.asarray(rest)
    sl = jnp.asarray(slots.reshape(-1))  # (m*4,): pair (a, b) of element e at e*4 + a*2 + b
    vid = ed.reshape(-1)

    def f(p, r):
        s = jnp.linalg.norm(p[0] - p[1]) - r
        return 0.5 * STIFFNESS * s * s

    @jax.jit
    def run(x):
        p = x[ed]
        e = jax.vmap(f)(p, rs).sum()
        gl = jax.vmap(jax.grad(f))(p, rs).reshape(-1, 3)
        g = jax.ops.segment_sum(gl, vid, num_segments=nv)
        hl = jax.vmap(jax.hessian(f))(p, rs)  # (m, 2, 3, 2, 3)
        hb = jnp.transpose(hl, (0, 1, 3, 2, 4)).reshape(-1, 3, 3)  # (m*4, 3, 3), (a, b) major
        h = jax.ops.segment_sum(hb, sl, num_segments=nnz)
        return e, g, h

    e, g, h = jax.block_until_ready(run(xe))
    errs = (rel([float(e)], [ref_f]), rel(np.asarray(g), ref_g), rel(np.asarray(h), ref_h))
    print(f"   jax vs warp_meshad: energy {errs[0]:.2e} gradient {errs[1]:.2e} hessian {errs[2]:.2e}")
    err = max(errs)
    assert err < 1e-4, err
    add("jax_vmap_segment_sum", time_host(lambda: jax.block_until_ready(run(xe)), runs), check_rel_error=err)


ALL = ["warp_meshad", "warp_meshad_atomic", "warp_meshad_tiled", "warp_meshad_tiled_morton", "warp_meshad_atomic_morton", "warp_meshad_deterministic", "warp_meshad_deterministic_buffers", "warp_meshad_proj", "warp_meshad_gradient", "handwritten_warp", "warp_tape_gradient", "torch_vmap_coo", "jax_vmap_segment_sum"]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[10, 100, 500, 1000, 2000])
    ap.add_argument("--device", default=None)
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--methods", nargs="+", default=ALL, choices=ALL)
    args = ap.parse_args(argv)
    wp.config.log_level = wp.LOG_WARNING
    wp.init()
    device = args.device or ("cuda:0" if wp.get_cuda_device_count() else "cpu")
    guard_cpu_out(wp.get_device(device).is_cuda)
    warm_setup(device)
    records = []
    for n in args.sizes:
        try:
            run_size(n, device, args.methods, args.runs, records)
        except Exception:
            traceback.print_exc()
            records.append({"benchmark": NAME, "vertex_count": n * n, "error": traceback.format_exc(limit=3)})
        write(NAME, records)
    print(f"wrote {len(records)} records")
    return records


if __name__ == "__main__":
    main()
