"""Tiled assembly knobs at one size: threads per block and shared memory per tile (mass-spring, float32).

    python -m benchmarks.tile_sweep --n 1000

Prints the median time of ``Problem.assemble_hessian`` (CUDA graph) for each setting of the knobs of
``warp_meshad._src.problem.tiled`` (threads per block, shared memory per tile, write-out of the tile by number or by
block, thread blocks per SM asked of the compiler), on the grid numbering (``--morton 1``: Morton numbering),
and writes ``tile_sweep.json``. Each setting's Hessian is first compared with the atomic assembly's. The defaults
of ``warp_meshad._src.problem.tiled`` come from this sweep.
"""

from __future__ import annotations

import argparse
import itertools

import warp as wp

from benchmarks.common import record, time_warp, write
from benchmarks.mass_spring import build, rel

NAME = "tile_sweep"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=1000)
    ap.add_argument("--device", default=None)
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--block-dims", type=int, nargs="+", default=[128, 256, 512])
    ap.add_argument("--shared-kb", type=int, nargs="+", default=[18, 36])
    ap.add_argument("--stores", nargs="+", default=["number", "block"], choices=["number", "block"])
    ap.add_argument("--min-blocks", type=int, nargs="+", default=[0, 4], help="0: no __launch_bounds__")
    ap.add_argument("--morton", type=int, nargs="+", default=[0], help="1: vertices in Morton order")
    args = ap.parse_args(argv)
    wp.config.log_level = wp.LOG_WARNING
    wp.init()
    device = args.device or ("cuda:0" if wp.get_cuda_device_count() else "cpu")
    from warp_meshad import TileConfig

    records = []
    for morton in map(bool, args.morton):
        mesh, _, _, problem, _, x = build(args.n, device, assembly="atomic", morton=morton)
        ref = problem.assemble_hessian(x)[2].values.numpy().copy()
        problem.assembly = "tiled"
        for kb, bd, store, mb in itertools.product(args.shared_kb, args.block_dims, args.stores, args.min_blocks):
            # a new plan and kernels for these knobs (the kernels are looked up by them)
            problem.tile_config = TileConfig(block_dim=bd, shared_bytes=kb * 1024, store=store, min_blocks=mb)
            what = f"morton={int(morton)} shared={kb:3d} KB block_dim={bd:4d} store={store:6s} min_blocks={mb}"
            try:
                err = rel(problem.assemble_hessian(x)[2].values.numpy(), ref)
                if not err < 1e-5:
                    raise RuntimeError(f"Hessian differs from the atomic assembly's: relative error {err:.2e}")
                plan = problem.tile_plan
                times = time_warp(lambda: problem.assemble_hessian(x), device, args.runs)
                method = f"tiled_bd{bd}_{kb}kb_{store}" + (f"_min{mb}" if mb else "") + ("_morton" if morton else "")
                r = record(NAME, method, mesh.vertex_count, "float32", times, str(wp.get_device(device)), block_dim=bd,
                           shared_kb=kb, store=store, rel_error=err, min_blocks=mb, morton=morton, patches=plan.patch_count,
                           evaluations_per_element=plan.evaluations[0] / mesh.edge_count)
                records.append(r)
                print(f"{what}: {r['ms_median']:.4f} ms ({plan.patch_count} patches, "
                      f"{r['evaluations_per_element']:.3f} evaluations per spring)", flush=True)
            except Exception as exc:  # a configuration the device refuses: report and go on
                print(f"{what}: failed: {exc}", flush=True)
            write(NAME, records)


if __name__ == "__main__":
    main()
