"""Tiled assembly knobs at one size: threads per block and shared memory per tile (mass-spring, float32).

    python -m benchmarks.tile_sweep --n 1000

Prints the median time of ``Problem.assemble_hessian`` (CUDA graph) for each (block_dim, shared bytes) pair, on
the grid numbering and on a Morton numbering, and writes ``tile_sweep.json``. The defaults of
``warp_meshad._src.tiled`` come from this sweep.
"""

from __future__ import annotations

import argparse

import warp as wp

from benchmarks.common import record, time_warp, write
from benchmarks.mass_spring import build

NAME = "tile_sweep"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=1000)
    ap.add_argument("--device", default=None)
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--block-dims", type=int, nargs="+", default=[64, 128, 256, 512])
    ap.add_argument("--shared-kb", type=int, nargs="+", default=[9, 18, 36])
    args = ap.parse_args(argv)
    wp.config.log_level = wp.LOG_WARNING
    wp.init()
    device = args.device or ("cuda:0" if wp.get_cuda_device_count() else "cpu")
    from warp_meshad._src import tiled

    records = []
    for morton in (False, True):
        for kb in args.shared_kb:
            for bd in args.block_dims:
                tiled.TILE_BLOCK_DIM, tiled._SHARED_BYTES = bd, kb * 1024
                try:
                    mesh, _, _, problem, _, x = build(args.n, device, assembly="tiled", morton=morton)
                    problem.assemble_hessian(x)
                    plan = problem._tiles[1]
                    times = time_warp(lambda: problem.assemble_hessian(x), device, args.runs)
                    r = record(NAME, f"tiled_bd{bd}_{kb}kb{'_morton' if morton else ''}", mesh.vertex_count, "float32",
                               times, str(wp.get_device(device)), block_dim=bd, shared_kb=kb, morton=morton,
                               patches=plan.patch_count, evaluations_per_element=plan.evaluations[0] / mesh.edge_count)
                    records.append(r)
                    print(f"morton={morton} shared={kb:3d} KB block_dim={bd:4d}: {r['ms_median']:.4f} ms "
                          f"({plan.patch_count} patches, {r['evaluations_per_element']:.3f} evaluations per spring)",
                          flush=True)
                except Exception as exc:  # a configuration the device refuses: report and go on
                    print(f"morton={morton} shared={kb} KB block_dim={bd}: failed: {exc}", flush=True)
    write(NAME, records)


if __name__ == "__main__":
    main()
