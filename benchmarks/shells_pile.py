"""Elastic shells with IPC contact (``configs/shells/spot_pile.yaml``): time per step and per phase.

Run on a GPU host (writes $BENCH_OUT or benchmarks/results/shells_pile.json after every step, so a run cut
short keeps the steps it took):

    python -m benchmarks.shells_pile --steps 20
    python -m benchmarks.shells_pile --config shells/spot_drop --device cpu --steps 2   # CPU smoke run

A run longer than one call of the lent GPU host continues where the last stopped: with ``--checkpoint DIR`` the
state after every step (positions, velocities, the steps' records) is saved in DIR, and a later run with the same
DIR resumes from it (``resumed_at`` in the record says where; the kernels load from Warp's cache by then):

    python -m benchmarks.shells_pile --steps 20 --checkpoint /tmp/pile_ckpt     # call 1, stopped after step 16
    python -m benchmarks.shells_pile --steps 20 --checkpoint /tmp/pile_ckpt     # call 2: steps 17-19

Per step it records the wall time and the app's split into contact detection, derivatives+assembly, linear
solve and line search (``phase_ms``, synchronized clocks), the Newton iterations, the contact pair counts and
the number of intersecting face pairs (must stay 0). ``ms_median`` of the record is the median step time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import numpy as np
import warp as wp

from benchmarks.common import guard_cpu_out, out_dir, record

NAME = "shells_pile"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="shells/spot_pile")
    ap.add_argument("--device", default=None)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--set", nargs="*", default=[], help="config overrides key=value")
    ap.add_argument("--checkpoint", default=None, help="folder: save the state after every step, resume from it")
    ap.add_argument("--projection", choices=("auto", "unrolled", "loop"), default="auto",
                    help="PSD projection of the element Hessians: the device's default, or forced "
                         "(Problem.unrolled_projection)")
    args = ap.parse_args(argv)
    # Warp prints each module load, "(compiled)" or "(cached)", so a compile inside a step shows in the log
    wp.config.log_level = wp.LOG_INFO
    from warp_meshad._src.app.loader import parse_set
    from warp_meshad.app import app_class, load_config

    flags = {"--steps": {"steps": args.steps}}
    if args.device:
        flags["--device"] = {"device": args.device}
    config = load_config(args.config, parse_set(args.set), flags=flags)
    t0 = time.perf_counter()
    app = app_class(config.app, config.source)(config)
    setup_ms = 1e3 * (time.perf_counter() - t0)
    if args.projection != "auto":
        app.problem.unrolled_projection = args.projection == "unrolled"
    print(app.describe(), flush=True)
    print(f"setup {setup_ms:.0f} ms", flush=True)
    steps = []
    guard_cpu_out(wp.get_device(app.device).is_cuda)
    path = out_dir() / f"{NAME}.json"
    dev = str(app.device)
    resumed_at = _resume(app, args.checkpoint, steps)
    if resumed_at:
        print(f"resumed after step {resumed_at - 1} from {args.checkpoint}", flush=True)
    for k in range(resumed_at, args.steps):
        t = time.perf_counter()
        rec = app.step()
        wall = 1e3 * (time.perf_counter() - t)
        ph = rec["phase_ms"]
        tot = sum(ph.values())
        steps.append(dict(step=k, wall_ms=wall, phase_ms=ph, iterations=rec["iterations"], reason=rec["reason"],
                          intersections=rec["intersections"], point_triangle_pairs=rec["point_triangle_pairs"],
                          edge_edge_pairs=rec["edge_edge_pairs"], linear_iterations=rec["linear_iterations"]))
        print(f"step {k}: {wall:.0f} ms, {rec['iterations']} it ({rec['reason']}), pairs pt {rec['point_triangle_pairs']} "
              f"ee {rec['edge_edge_pairs']}, intersections {rec['intersections']}, cg {rec['linear_iterations']}, "
              + ", ".join(f"{key} {v:.0f} ms ({100 * v / max(tot, 1e-9):.1f}%)" for key, v in ph.items()), flush=True)
        _save(app, args.checkpoint, steps)
        r = _write(app, path, steps, setup_ms, resumed_at, dev)
    if not steps:
        raise SystemExit("no step taken")
    if resumed_at >= args.steps:  # every step was taken by earlier runs: the record of what they took
        r = _write(app, path, steps, setup_ms, resumed_at, dev)
    walls = [s["wall_ms"] for s in steps]
    frac = r["phase_fraction"]
    print("phase fractions: " + ", ".join(f"{k} {100 * v:.1f}%" for k, v in frac.items()), flush=True)
    print(f"median step {statistics.median(walls):.0f} ms over {len(walls)} steps", flush=True)
    try:
        app.check_final()
        print("check_final passed", flush=True)
    except AssertionError as exc:
        print(f"check_final FAILED: {exc}", flush=True)
    return r


def _write(app, path, steps, setup_ms, resumed_at, dev) -> dict:
    """The run's record (all steps so far, resumed ones included), written atomically to ``path``."""
    walls = [s["wall_ms"] for s in steps]
    totals = {key: sum(s["phase_ms"][key] for s in steps) for key in steps[0]["phase_ms"]}
    all_ms = sum(totals.values())
    r = record(NAME, "warp_meshad", app.mesh.vertex_count, "float64", walls, dev, steps_taken=len(steps),
               setup_ms=setup_ms, resumed_at=resumed_at, objects=app.count, phase_ms_total=totals,
               phase_fraction={key: v / all_ms for key, v in totals.items()} if all_ms else {},
               linear_solver=getattr(app.linear_solver, "name", None),
               unrolled_projection=app.problem.unrolled_projection, steps=steps)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps([r], indent=1))
    os.replace(tmp, path)
    return r


def _save(app, folder, steps):
    """State after the last step: positions, velocities, the app's history and this run's step records."""
    if not folder:
        return
    os.makedirs(folder, exist_ok=True)
    tmp = os.path.join(folder, "state.tmp.npz")
    np.savez(tmp, x=app.x.numpy(), v=app.v.numpy(), steps_done=app.steps_done,
             history=json.dumps(app.history), steps=json.dumps(steps))
    os.replace(tmp, os.path.join(folder, "state.npz"))


def _resume(app, folder, steps) -> int:
    """Load a saved state into ``app`` (and its step records into ``steps``); the number of steps done."""
    path = os.path.join(folder, "state.npz") if folder else None
    if not path or not os.path.exists(path):
        return 0
    st = np.load(path)
    if st["x"].shape != (app.mesh.vertex_count, 3):
        raise SystemExit(f"{path}: positions of shape {st['x'].shape}, expected {(app.mesh.vertex_count, 3)} "
                         "(another scene?)")
    wp.copy(app.x, wp.array(st["x"], dtype=wp.vec3d, device=app.device))
    app.v = wp.array(st["v"], dtype=wp.vec3d, device=app.device)
    app.history = json.loads(str(st["history"]))
    app.steps_done = int(st["steps_done"])
    steps.extend(json.loads(str(st["steps"])))
    return app.steps_done


if __name__ == "__main__":
    main()
