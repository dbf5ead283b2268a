"""Tet elasticity: energy + gradient + sparse Hessian of stable Neo-Hookean and ARAP, warp_meshad against JAX.

Run on a GPU host (writes benchmarks/results/tet_elastic.json and .png):

    python -m benchmarks.tet_elastic --cells 26 55          # 105,456 and 998,250 tets
    python -m benchmarks.tet_elastic --device cpu --cells 4 --runs 3   # CPU smoke run

The mesh is ``TetMesh.box(n + 1, n + 1, n + 1)`` (6 n^3 tets), its vertices moved by noise (0.2 of an edge, so no
singular value is repeated and no tet inverts) and the whole bar stretched by 10%; float64 throughout.

Methods, per energy (``snh``: ``stable_neo_hookean``, ``arap``: ``arap_tet``):

* ``warp_meshad_<e>``: ``Problem.assemble_hessian`` (dual numbers, default assembly), CUDA graph;
* ``warp_meshad_<e>_proj``: the same with per-element PSD projection (``projection="clamp"``);
* ``jax_<e>``: ``jit`` of ``vmap(hessian(psi))`` over the tets, ``vmap(grad(psi))``, then ``segment_sum`` of the
  4 x 4 blocks of 3 x 3 into warp_meshad's block slots (and of the gradients into the vertices): the same energy,
  written with jax.numpy (ARAP's signed singular value sum by the same two Newton steps on the invariants, with
  ``stop_gradient`` where the Warp code drops value parts), the same sparse layout.

Every method is checked against ``warp_meshad_<e>`` first (relative error of energy, gradient and Hessian values).
"""

from __future__ import annotations

import argparse
import os
import traceback

import numpy as np
import warp as wp

from benchmarks.common import guard_cpu_out, record, run_sizes, time_host, time_warp

NAME = "tet_elastic"
MU, LAM = 1.0e4, 4.0e4


def build(n: int, energy: str, device, seed: int = 0):
    import warp_meshad as wm
    from warp_meshad.kernels.energies import ArapTetData, StableNeoHookeanData, arap_tet, stable_neo_hookean

    mesh = wm.TetMesh.box(n + 1, n + 1, n + 1)
    rng = np.random.default_rng(seed)
    X = mesh.vertices * np.array([1.1, 1.0, 1.0]) + 0.2 / n * rng.uniform(-0.5, 0.5, size=mesh.vertices.shape)
    if energy == "snh":
        data = StableNeoHookeanData()
        data.lam = wp.float64(LAM)
        fn = stable_neo_hookean
    else:
        data = ArapTetData()
        fn = arap_tet
    data.rest_inverse = wp.array(mesh.rest_matrix_inverses(), dtype=wp.mat33d, device=device)
    data.volume = wp.array(mesh.volumes(), dtype=wp.float64, device=device)
    data.mu = wp.float64(MU)
    problem = wm.Problem(mesh.vertex_count, 3, dtype=wp.float64, device=device)
    problem.add_term(mesh.tets, fn, data)
    return mesh, X, problem


def rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-300))


def jax_energy(energy: str):
    import jax
    import jax.numpy as jnp

    def deformation(p, dinv):
        ds = jnp.stack([p[1] - p[0], p[2] - p[0], p[3] - p[0]], axis=1)  # columns e1, e2, e3
        return ds @ dinv

    def snh(p, dinv, vol):
        F = deformation(p, dinv)
        ic = jnp.sum(F * F)
        jm1 = jnp.linalg.det(F) - 1.0
        return vol * (0.5 * MU * (ic - 3.0) - MU * jm1 + 0.5 * LAM * jm1 * jm1)

    def arap(p, dinv, vol):
        F = deformation(p, dinv)
        f1, f2, f3 = F[:, 0], F[:, 1], F[:, 2]
        c1, c2, c3 = jnp.cross(f2, f3), jnp.cross(f3, f1), jnp.cross(f1, f2)
        ic = jnp.sum(F * F)
        ii = jnp.dot(c1, c1) + jnp.dot(c2, c2) + jnp.dot(c3, c3)
        j = jnp.dot(f1, c1)
        s = jnp.linalg.svd(jax.lax.stop_gradient(F), compute_uv=False)
        sg = jax.lax.stop_gradient
        a = s[0] + s[1] + jnp.where(sg(j) < 0.0, -s[2], s[2])  # signed: the smallest flips for det F < 0
        p_ = a * a - ic
        step = (p_ * p_ - 8.0 * j * a - 4.0 * ii) / (4.0 * a * p_ - 8.0 * j)
        r = a - (step - sg(step))
        p_ = r * r - ic
        step = (p_ * p_ - 8.0 * j * r - 4.0 * ii) / (4.0 * r * p_ - 8.0 * j)
        i1 = r - (step - sg(step))
        return MU * vol * (ic - 2.0 * i1 + 3.0)

    return snh if energy == "snh" else arap


def add_jax(energy, mesh, X, slots, nnz, ref, add, runs):
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    import jax

    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp

    psi = jax_energy(energy)
    nv = mesh.vertex_count
    tets = jnp.asarray(mesh.tets.astype(np.int32))
    dinv = jnp.asarray(mesh.rest_matrix_inverses())
    vol = jnp.asarray(mesh.volumes())
    sl = jnp.asarray(slots.reshape(-1))  # (m * 16,): pair (a, b) of tet t at t * 16 + a * 4 + b
    vid = tets.reshape(-1)
    x = jnp.asarray(X)

    @jax.jit
    def run(x):
        p = x[tets]  # (m, 4, 3)
        e = jax.vmap(psi)(p, dinv, vol).sum()
        gl = jax.vmap(jax.grad(psi))(p, dinv, vol).reshape(-1, 3)
        g = jax.ops.segment_sum(gl, vid, num_segments=nv)
        hl = jax.vmap(jax.hessian(psi))(p, dinv, vol)  # (m, 4, 3, 4, 3)
        hb = jnp.transpose(hl, (0, 1, 3, 2, 4)).reshape(-1, 3, 3)  # (m * 16, 3, 3), (a, b) major
        h = jax.ops.segment_sum(hb, sl, num_segments=nnz)
        return e, g, h

    e, g, h = jax.block_until_ready(run(x))
    errs = (rel([float(e)], [ref[0]]), rel(np.asarray(g), ref[1]), rel(np.asarray(h), ref[2]))
    print(f"   jax_{energy} vs warp_meshad: energy {errs[0]:.2e} gradient {errs[1]:.2e} hessian {errs[2]:.2e}")
    assert max(errs) < 1e-8, errs
    add(f"jax_{energy}", time_host(lambda: jax.block_until_ready(run(x)), runs), check_rel_error=max(errs))


def run_size(n, device, energies, runs, records, jax_on=True):
    for energy in energies:
        mesh, X, problem = build(n, energy, device)
        x = wp.array(X, dtype=wp.vec3d, device=device)
        dev = str(wp.get_device(device))
        print(f"-- {energy}, {n}^3 cells: {mesh.tet_count} tets, {mesh.vertex_count} vertices, "
              f"{problem.hessian_block_count} blocks")  # fmt: skip
        f, g, H = problem.assemble_hessian(x)
        wp.synchronize_device(device)
        ref = (float(f.numpy()[0]), g.numpy().copy(), H.values.numpy()[: H.nnz].copy())
        slots = problem.terms[0].slots.numpy()

        def add(method, times, **extra):
            r = record(NAME, method, mesh.vertex_count, "float64", times, dev, tets=mesh.tet_count, **extra)
            records.append(r)
            print(f"   {method:26s} median {r['ms_median']:9.3f} ms  min {r['ms_min']:9.3f} ms")

        add(f"warp_meshad_{energy}", time_warp(lambda: problem.assemble_hessian(x), device, runs))
        add(f"warp_meshad_{energy}_proj",
            time_warp(lambda: problem.assemble_hessian(x, projection="clamp"), device, runs))  # fmt: skip
        if jax_on:
            try:
                add_jax(energy, mesh, X, slots, H.nnz, ref, add, runs)
            except Exception:
                traceback.print_exc()
                records.append({"benchmark": NAME, "method": f"jax_{energy}", "tets": mesh.tet_count,
                                "error": traceback.format_exc(limit=3)})  # fmt: skip
        del problem, H, g


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cells", type=int, nargs="+", default=[26, 55], help="cells per side (6 n^3 tets)")
    ap.add_argument("--energies", nargs="+", default=["snh", "arap"], choices=["snh", "arap"])
    ap.add_argument("--device", default=None)
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--no-jax", action="store_true")
    args = ap.parse_args(argv)
    wp.config.log_level = wp.LOG_WARNING
    wp.init()
    device = args.device or ("cuda:0" if wp.get_cuda_device_count() else "cpu")
    guard_cpu_out(wp.get_device(device).is_cuda)
    return run_sizes(NAME, args.cells, lambda n, records: run_size(n, device, args.energies, args.runs, records,
                                                                   jax_on=not args.no_jax), key="cells")


if __name__ == "__main__":
    main()
