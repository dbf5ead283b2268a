"""Stable Neo-Hookean energy + gradient + sparse Hessian: a hand-written analytic kernel beside warp_meshad's dual paths.

Run on a GPU host (writes benchmarks/results/tet_hand.json and .png; issue 19 points 1 and 4):

    python -m benchmarks.tet_hand --sizes 27 56              # TetMesh.box(n, n, n): 105,456 and 998,250 tets
    python -m benchmarks.tet_hand --device cpu --sizes 2     # CPU smoke run (6 tets)

The mesh is ``TetMesh.box(n, n, n)`` (6 (n - 1)^3 tets), its vertices moved by noise (0.2 of an edge) and the bar
stretched by 10%; float64 throughout; mu = 1e4, lambda = 4e4 (as benchmarks/tet_elastic.py).

Methods (one process, the same mesh, the same BSR block slots):

* ``hand_snh``: one thread per tet computes F, psi, P = dpsi/dF and dP/dF in closed form
  (dP/dF = V (mu I + lambda g g^T + (lambda (J - 1) - mu) d2J/dF2), g = vec cof F, d2J/dF2 built from skew matrices of
  F's columns), applies the chain rule to the 12 x 12 Hessian as 16 blocks H_ab = sum_jm b_a[j] b_b[m] K_jm and adds
  them with ``atomic_add`` into the slots the Problem found (``problem.terms[0].slots``); element energies go to their
  own slots and are summed, as the Problem does. Checked against the Problem to 1e-12 (relative) before timing.
* ``warp_meshad_snh``: ``stable_neo_hookean`` over the corners (``add_term``, 12 duals), ``assemble_hessian``;
* ``warp_meshad_snh_F``: ``stable_neo_hookean_F`` (``add_deformation_term``, 9 duals, dF/dx applied in the kernel);
* ``..._proj``: the same with per-element PSD projection (``projection="clamp"``): of the 12 x 12 Hessian in x on the
  corner path, of the 9 x 9 Hessian in F on the F path (Jacobi eigen-decompositions);
* ``warp_meshad_snh_F_proj_analytic``: the F path with stable Neo-Hookean's analytic eigensystem
  (``add_deformation_term(..., projection=stable_neo_hookean_F_hessian_proj)``: the energy on 9 gradient duals, the
  projected 9 x 9 F Hessian in closed form from the SVD of F); checked against ``warp_meshad_snh_F_proj`` to 1e-9;
* ``..._atomic`` / ``..._tiled`` (F paths): the same Problem with ``assembly="atomic"`` (a thread per element, float
  atomics into the slots, as the hand-written kernel) or ``assembly="tiled"`` (a thread block per patch of block rows,
  every element evaluated once per patch it touches), whatever ``--assembly`` picks for the others.

The Problems use ``--assembly`` (default ``auto``: see ``Problem(assembly=...)``). ``--methods`` times a subset (the
checks of the F paths against the corner path still run).

Timing: CUDA-graph replays timed with events on a GPU (benchmarks/common.py), host timing on the CPU.
"""

from __future__ import annotations

import argparse

import numpy as np
import warp as wp

from benchmarks.common import guard_cpu_out, record, run_sizes, time_warp

NAME = "tet_hand"
MU, LAM = 1.0e4, 4.0e4


@wp.func
def _b(dinv: wp.mat33d, a: int):
    """dF/dx_a = I (x) b_a: row a - 1 of D_m^-1 for a >= 1, minus their sum for a = 0."""
    if a == 0:
        return -(dinv[0] + dinv[1] + dinv[2])
    return dinv[a - 1]


@wp.kernel(enable_backward=False)
def _snh_hand(
    elements: wp.array2d(dtype=wp.int32),
    x: wp.array(dtype=wp.vec3d),
    rest_inverse: wp.array(dtype=wp.mat33d),
    volume: wp.array(dtype=wp.float64),
    mu: wp.float64,
    lam: wp.float64,
    slots: wp.array2d(dtype=wp.int32),
    energy: wp.array(dtype=wp.float64),
    grad: wp.array(dtype=wp.vec3d),
    hvals: wp.array(dtype=wp.mat33d),
):
    """One thread per tet: energy, gradient and the 16 Hessian blocks of stable Neo-Hookean, in closed form."""
    t = wp.tid()
    dinv = rest_inverse[t]
    x0 = x[elements[t, 0]]
    F = wp.matrix_from_cols(x[elements[t, 1]] - x0, x[elements[t, 2]] - x0, x[elements[t, 3]] - x0) @ dinv
    f1 = wp.vec3d(F[0, 0], F[1, 0], F[2, 0])
    f2 = wp.vec3d(F[0, 1], F[1, 1], F[2, 1])
    f3 = wp.vec3d(F[0, 2], F[1, 2], F[2, 2])
    c1 = wp.cross(f2, f3)  # columns of cof F = dJ/dF
    c2 = wp.cross(f3, f1)
    c3 = wp.cross(f1, f2)
    jm1 = wp.dot(f1, c1) - wp.float64(1.0)
    v = volume[t]
    half = wp.float64(0.5)
    energy[t] = v * (half * mu * (wp.ddot(F, F) - wp.float64(3.0)) - mu * jm1 + half * lam * jm1 * jm1)
    s = lam * jm1 - mu  # P = V (mu F + s cof F)
    p1 = v * (mu * f1 + s * c1)
    p2 = v * (mu * f2 + s * c2)
    p3 = v * (mu * f3 + s * c3)
    # dP/dF in 3 x 3 blocks K_jm between columns j and m: V (mu delta_jm I + lam c_j c_m^T + s d2J/df_j df_m)
    vs = v * s
    vl = v * lam
    k11 = vl * wp.outer(c1, c1) + v * mu * wp.identity(n=3, dtype=wp.float64)
    k22 = vl * wp.outer(c2, c2) + v * mu * wp.identity(n=3, dtype=wp.float64)
    k33 = vl * wp.outer(c3, c3) + v * mu * wp.identity(n=3, dtype=wp.float64)
    k12 = vl * wp.outer(c1, c2) - vs * wp.skew(f3)
    k13 = vl * wp.outer(c1, c3) + vs * wp.skew(f2)
    k23 = vl * wp.outer(c2, c3) - vs * wp.skew(f1)
    k21 = wp.transpose(k12)
    k31 = wp.transpose(k13)
    k32 = wp.transpose(k23)
    for a in range(4):
        ba = _b(dinv, a)
        wp.atomic_add(grad, elements[t, a], p1 * ba[0] + p2 * ba[1] + p3 * ba[2])
        # T_a,m = sum_j b_a[j] K_jm, then H_ab = sum_m T_a,m b_b[m]
        t1 = ba[0] * k11 + ba[1] * k21 + ba[2] * k31
        t2 = ba[0] * k12 + ba[1] * k22 + ba[2] * k32
        t3 = ba[0] * k13 + ba[1] * k23 + ba[2] * k33
        for b in range(4):
            bb = _b(dinv, b)
            wp.atomic_add(hvals, slots[t, a * 4 + b], t1 * bb[0] + t2 * bb[1] + t3 * bb[2])


METHODS = (
    "hand_snh",
    "warp_meshad_snh",
    "warp_meshad_snh_F",
    "warp_meshad_snh_F_atomic",
    "warp_meshad_snh_F_tiled",
    "warp_meshad_snh_proj",
    "warp_meshad_snh_F_proj",
    "warp_meshad_snh_F_proj_analytic",
    "warp_meshad_snh_F_proj_analytic_atomic",
    "warp_meshad_snh_F_proj_analytic_tiled",
)


def build(n: int, device, assembly: str, seed: int = 0):
    """The mesh, the perturbed positions, the data and the Problems: ``"corners"`` (12 variables) and the F paths
    ``"F"`` and ``"F_analytic"`` (the analytic projection) under ``assembly``, and under ``"atomic"`` and ``"tiled"``
    (keys ``"F_atomic"``, ``"F_analytic_tiled"``, ...)."""
    import warp_meshad as wm
    from warp_meshad.kernels.energies import (
        StableNeoHookeanData,
        stable_neo_hookean,
        stable_neo_hookean_F,
        stable_neo_hookean_F_hessian_proj,
    )

    mesh = wm.TetMesh.box(n, n, n)
    rng = np.random.default_rng(seed)
    h = 1.0 / (n - 1)
    X = mesh.vertices * np.array([1.1, 1.0, 1.0]) + 0.2 * h * rng.uniform(-0.5, 0.5, size=mesh.vertices.shape)
    data = StableNeoHookeanData()
    data.rest_inverse = wp.array(mesh.rest_matrix_inverses(), dtype=wp.mat33d, device=device)
    data.volume = wp.array(mesh.volumes(), dtype=wp.float64, device=device)
    data.mu, data.lam = wp.float64(MU), wp.float64(LAM)
    problems = {"corners": wm.Problem(mesh.vertex_count, 3, dtype=wp.float64, device=device, assembly=assembly)}
    problems["corners"].add_term(mesh.tets, stable_neo_hookean, data)
    for suffix, how in (("", assembly), ("_atomic", "atomic"), ("_tiled", "tiled")):
        for name, proj in (("F", None), ("F_analytic", stable_neo_hookean_F_hessian_proj)):
            p = wm.Problem(mesh.vertex_count, 3, dtype=wp.float64, device=device, assembly=how)
            p.add_deformation_term(mesh.tets, stable_neo_hookean_F, rest_inverse=data.rest_inverse, data=data,
                                   projection=proj)  # fmt: skip
            problems[name + suffix] = p
    return mesh, X, data, problems


def rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-300))


def _result(problem, x, device, projection=None):
    f, g, H = problem.assemble_hessian(x) if projection is None else problem.assemble_hessian(x, projection=projection)
    wp.synchronize_device(device)
    return float(f.numpy()[0]), g.numpy().copy(), H.values.numpy()[: H.nnz].copy()


def _error(got, ref) -> float:
    return max(rel([got[0]], [ref[0]]), rel(got[1], ref[1]), rel(got[2], ref[2]))


def run_size(n, device, runs, records, assembly, methods=METHODS):
    mesh, X, data, problems = build(n, device, assembly)
    corners = problems["corners"]
    x = wp.array(X, dtype=wp.vec3d, device=device)
    dev = str(wp.get_device(device))
    print(f"-- box {n}^3 vertices: {mesh.tet_count} tets, {mesh.vertex_count} vertices, "
          f"{corners.hessian_block_count} blocks")  # fmt: skip
    ref = _result(corners, x, device)
    tets = corners.terms[0].elements
    slots = corners.terms[0].slots
    e_el = wp.zeros(mesh.tet_count, dtype=wp.float64, device=device)
    e_sum = wp.zeros(1, dtype=wp.float64, device=device)
    g_h = wp.zeros(mesh.vertex_count, dtype=wp.vec3d, device=device)
    h_h = wp.zeros(corners.hessian_block_count, dtype=wp.mat33d, device=device)

    def hand():
        g_h.zero_()
        h_h.zero_()
        wp.launch(_snh_hand, dim=mesh.tet_count, device=device,
                  inputs=[tets, x, data.rest_inverse, data.volume, data.mu, data.lam, slots, e_el, g_h, h_h])  # fmt: skip
        wp.utils.array_sum(e_el, out=e_sum)

    # every path's energy, gradient and Hessian against the 12-variable one (the analytic projections against the
    # Jacobi projection of the F Hessian)
    hand()
    wp.synchronize_device(device)
    errs = {"hand_snh": _error((float(e_sum.numpy()[0]), g_h.numpy(), h_h.numpy()), ref)}
    for suffix in ("", "_atomic", "_tiled"):
        if f"warp_meshad_snh_F{suffix}" in methods or not suffix:
            errs[f"warp_meshad_snh_F{suffix}"] = _error(_result(problems["F" + suffix], x, device), ref)
    for method, err in errs.items():
        print(f"   {method} vs warp_meshad_snh: relative error {err:.2e}")
        assert err < 1e-12, (method, err)
    analytic = [m for m in methods if "analytic" in m]
    if analytic:
        ref_proj = _result(problems["F"], x, device, "clamp")
        for m in analytic:
            key = "F_analytic" + m[len("warp_meshad_snh_F_proj_analytic"):]
            errs[m] = _error(_result(problems[key], x, device, "clamp"), ref_proj)
            print(f"   {m} vs warp_meshad_snh_F_proj: relative error {errs[m]:.2e}")
            assert errs[m] < 1e-9, (m, errs[m])

    def add(method, fn):
        if method not in methods:
            return
        extra = {"check_rel_error": errs[method]} if method in errs else {}
        r = record(NAME, method, mesh.vertex_count, "float64", time_warp(fn, device, runs), dev, tets=mesh.tet_count,
                   assembly=assembly, **extra)  # fmt: skip
        records.append(r)
        print(f"   {method:40s} median {r['ms_median']:9.3f} ms  min {r['ms_min']:9.3f} ms", flush=True)

    def timed(key, projection=None):
        p = problems[key]
        return (lambda: p.assemble_hessian(x)) if projection is None else (
            lambda: p.assemble_hessian(x, projection=projection))  # fmt: skip

    add("hand_snh", hand)
    add("warp_meshad_snh", timed("corners"))
    for suffix in ("", "_atomic", "_tiled"):
        add(f"warp_meshad_snh_F{suffix}", timed("F" + suffix))
    add("warp_meshad_snh_proj", timed("corners", "clamp"))
    add("warp_meshad_snh_F_proj", timed("F", "clamp"))
    for suffix in ("", "_atomic", "_tiled"):
        add(f"warp_meshad_snh_F_proj_analytic{suffix}", timed("F_analytic" + suffix, "clamp"))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[27, 56], help="vertices per side: TetMesh.box(n, n, n)")
    ap.add_argument("--device", default=None)
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--assembly", default="auto", choices=["auto", "atomic", "tiled"],
                    help="the Problems' Hessian assembly (the hand-written kernel always adds atomically)")  # fmt: skip
    ap.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS, metavar="METHOD",
                    help=f"the methods to time (default: all of {', '.join(METHODS)})")
    args = ap.parse_args(argv)
    wp.config.log_level = wp.LOG_WARNING
    wp.init()
    device = args.device or ("cuda:0" if wp.get_cuda_device_count() else "cpu")
    guard_cpu_out(wp.get_device(device).is_cuda)
    return run_sizes(NAME, args.sizes, lambda n, records: run_size(n, device, args.runs, records, args.assembly,
                                                                   args.methods))


if __name__ == "__main__":
    main()
