"""Atomic vs tiled vs tiled-rounds Hessian assembly per element kind and dtype: what ``assembly="auto"`` should pick.

    python -m benchmarks.assembly_auto                          # on a GPU host: writes results/assembly_auto.json
    python -m benchmarks.assembly_auto --device cpu --small     # CPU smoke run (small meshes, correctness only)

For each case, the same term under three Problems: ``assembly="atomic"`` (a thread per element, float atomics into the
block slots), ``assembly="tiled"`` (a thread block per patch of block rows, shared-memory atomics, coalesced stores;
each element evaluated once per patch owning one of its rows) and ``assembly="tiled", deterministic=True`` (the
plan's conflict-free rounds: plain shared-memory adds). Each Hessian is checked against the atomic one, then
``assemble_hessian`` is timed (CUDA graph replays, median). The plan's evaluations per element are recorded
(``evaluations_per_element``): the figure ``warp_meshad._src.problem.assembly.auto_uses_tiles`` compares with
``AUTO_MAX_EVALUATIONS``.

Cases (``--small`` shrinks the meshes):

* ``tet_F``: stable Neo-Hookean over F (``add_deformation_term``, k = 9, float64) on ``TetMesh.box(56, 56, 56)``
  (998,250 tets; the mesh and positions of ``benchmarks/tet_hand.py``);
* ``tet_F_analytic``: the same with its analytic projection (``projection="clamp"``);
* ``tet_corners``: stable Neo-Hookean over the corners (k = 12, float64; no rounds: the plan is the same);
* ``membrane_F_f64``: the Neo-Hookean membrane over F (3 x 2, k = 9, float64) on a stretched 1000 x 1000 grid;
* ``springs_f64`` / ``springs_f32``: mass-spring on the 1000 x 1000 grid's edges (k = 6).
"""

from __future__ import annotations

import argparse

import numpy as np
import warp as wp

from benchmarks.common import record, setup_run, time_warp, write

NAME = "assembly_auto"
CASES = ("tet_F", "tet_F_analytic", "tet_corners", "membrane_F_f64", "springs_f64", "springs_f32")
VARIANTS = (("atomic", "atomic", False), ("tiled", "tiled", False), ("rounds", "tiled", True))


def _tets(n, device, kind):
    import warp_meshad as wm
    from warp_meshad.kernels import energies as en

    mesh = wm.TetMesh.box(n, n, n)
    rng = np.random.default_rng(0)
    h = 1.0 / (n - 1)
    X = mesh.vertices * np.array([1.1, 1.0, 1.0]) + 0.2 * h * rng.uniform(-0.5, 0.5, size=mesh.vertices.shape)
    data = en.StableNeoHookeanData()
    data.rest_inverse = wp.array(mesh.rest_matrix_inverses(), dtype=wp.mat33d, device=device)
    data.volume = wp.array(mesh.volumes(), dtype=wp.float64, device=device)
    data.mu, data.lam = wp.float64(1.0e4), wp.float64(4.0e4)

    def make(assembly, deterministic):
        p = wm.Problem(mesh.vertex_count, 3, dtype=wp.float64, device=device, assembly=assembly,
                       deterministic=deterministic)  # fmt: skip
        if kind == "corners":
            p.add_term(mesh.tets, en.stable_neo_hookean, data)
        else:
            proj = en.stable_neo_hookean_F_hessian_proj if kind == "F_analytic" else None
            p.add_deformation_term(mesh.tets, en.stable_neo_hookean_F, rest_inverse=data.rest_inverse, data=data,
                                   projection=proj)  # fmt: skip
        return p

    x = wp.array(X, dtype=wp.vec3d, device=device)
    return make, x, mesh.vertex_count, mesh.tet_count, ("clamp" if kind == "F_analytic" else None)


def _membrane(n, device):
    import warp_meshad as wm
    from warp_meshad.kernels import energies as en

    mesh = wm.TriMesh.grid(n, n)
    P = np.asarray(mesh.vertices, np.float64)
    rest = np.stack([P[mesh.faces[:, 1], :2] - P[mesh.faces[:, 0], :2], P[mesh.faces[:, 2], :2] - P[mesh.faces[:, 0], :2]],
                    axis=2)  # fmt: skip
    data = en.NeoHookeanMembraneData()
    data.rest_inverse = wp.array(np.linalg.inv(rest), dtype=wp.mat22d, device=device)
    data.area = wp.array(0.5 * np.abs(np.linalg.det(rest)), dtype=wp.float64, device=device)
    data.mu, data.lam, data.thickness = wp.float64(1.0e4), wp.float64(4.0e4), wp.float64(1.0e-3)
    X = 1.1 * P + 0.2 / n * np.random.default_rng(0).normal(size=P.shape)

    def make(assembly, deterministic):
        p = wm.Problem(mesh.vertex_count, 3, dtype=wp.float64, device=device, assembly=assembly,
                       deterministic=deterministic)  # fmt: skip
        p.add_deformation_term(mesh.faces, en.neo_hookean_membrane_F, rest_inverse=data.rest_inverse, data=data)
        return p

    return make, wp.array(X, dtype=wp.vec3d, device=device), mesh.vertex_count, mesh.face_count, None


def _springs(n, device, dtype):
    import warp_meshad as wm
    from warp_meshad.kernels import energies as en

    mesh = wm.TriMesh.grid(n, n)
    npt = np.float32 if dtype == wp.float32 else np.float64
    X = (mesh.vertices + 0.2 / n * np.random.default_rng(0).normal(size=mesh.vertices.shape)).astype(npt)
    rest = wp.array((0.9 * mesh.edge_lengths()).astype(npt), dtype=dtype, device=device)
    data = en.MassSpringData(dtype, rest=rest, stiffness=10.0)

    def make(assembly, deterministic):
        p = wm.Problem(mesh.vertex_count, 3, dtype=dtype, device=device, assembly=assembly, deterministic=deterministic)
        p.add_term(mesh.edges, en.mass_spring, data)
        return p

    x = wp.array(X, dtype=wp.vec3f if dtype == wp.float32 else wp.vec3d, device=device)
    return make, x, mesh.vertex_count, mesh.edge_count, None


def build_case(case, device, small=False):
    """(make(assembly, deterministic) -> Problem, x, vertex count, element count, projection) of one case."""
    if case.startswith("tet_"):
        return _tets(6 if small else 56, device, case[4:])
    if case == "membrane_F_f64":
        return _membrane(12 if small else 1000, device)
    return _springs(12 if small else 1000, device, wp.float64 if case == "springs_f64" else wp.float32)


def run_case(case, device, runs, records, small=False, check_only=False) -> dict:
    """Check and time the variants of one case; returns {variant: relative Hessian error vs the atomic one}."""
    make, x, nv, count, projection = build_case(case, device, small)
    errors, ref = {}, None
    for label, assembly, det in VARIANTS:
        if case == "tet_corners" and label == "rounds":
            continue
        p = make(assembly, det)

        def run(p=p):
            return p.assemble_hessian(x, projection=projection)

        _, _, H = run()
        wp.synchronize_device(device)
        values = H.values.numpy()[: H.nnz].astype(np.float64)
        ref = values if ref is None else ref
        errors[label] = float(np.linalg.norm(values - ref) / np.linalg.norm(ref))
        plan = p.tile_plan
        per_element = sum(plan.evaluations) / count if plan is not None else 1.0
        if check_only:
            continue
        r = record(NAME, f"{case}_{label}", nv, "float32" if case == "springs_f32" else "float64", time_warp(run, device, runs),
                   str(wp.get_device(device)), case=case, assembly=label, elements=count,
                   evaluations_per_element=per_element, check_rel_error=errors[label])  # fmt: skip
        records.append(r)
        print(f"   {case:16s} {label:7s} median {r['ms_median']:8.3f} ms  min {r['ms_min']:8.3f} ms  "
              f"evaluations per element {per_element:.2f}  vs atomic {errors[label]:.1e}", flush=True)  # fmt: skip
    tol = 1e-5 if case == "springs_f32" else 1e-12
    assert max(errors.values()) < tol, (case, errors)
    return errors


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", nargs="+", default=list(CASES), choices=CASES)
    ap.add_argument("--device", default=None)
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--small", action="store_true", help="small meshes (a smoke run)")
    args = ap.parse_args(argv)
    device = setup_run(args.device, args.runs)
    records = []
    for case in args.cases:
        run_case(case, device, args.runs, records, args.small)
        write(NAME, records)
    print(f"wrote {len(records)} records")
    return records


if __name__ == "__main__":
    main()
