"""The first-order solvers' loops side by side: host loop, device loop with a read per iteration, the whole solve as
one CUDA graph; per solve the wall time, the GPU time and the host time per iteration beyond the kernels.

Run on a GPU host (writes benchmarks/results/first_order_loop.json, or $BENCH_OUT):

    python -m benchmarks.first_order_loop                       # manifold_opt spot and sphere, smoothing spot
    BENCH_OUT=/tmp/bench_smoke python -m benchmarks.first_order_loop --device cpu --runs 1 --iterations 20   # CPU

Each case is an app built from its scene config (the app's problem, start and solver settings) whose solver is
rebuilt with each loop; a solve is ``solver.solve(x0, max_iterations, tolerance)`` from the app's start (manifold_opt:
v = 0 in the start's tangent spaces, one re-centering's solve). Loops:

* ``host``: ``device_loop=False`` (reads every energy, dot product and trial back to the host);
* ``device_poll``: ``DeviceLoop(capture=True, poll=True)``: each iteration a CUDA graph, one small read per iteration;
* ``device_graph``: ``DeviceLoop(capture=True, poll=False)``: the whole solve one CUDA graph (a while node over the
  iterations, the line search a nested while node where CUDA allows it), one read at the end.

Per solve: ``wall_ms`` (host clock around ``solve``, the device synchronized after), ``gpu_ms`` (the sum of the
solve's CUDA-event phases, ``SolveResult.time_ms`` without ``total``; 0 for the host loop, which times on the host),
the iterations, and ``host_us_per_iteration`` = (wall - gpu) / iterations: what the host adds beyond the kernels.
Correctness first: each device loop's final energy must match the host loop's to ``--energy-rtol`` (default 1e-9)
with the same iteration count, else the record says so and is not counted as a match. One untimed solve per loop
first (kernel loads, graph capture), then ``--runs`` timed ones (median, min).
"""

from __future__ import annotations

import argparse
import math
import statistics
import time

import numpy as np
import warp as wp

from benchmarks.common import guard_cpu_out, record, write

NAME = "first_order_loop"
CASES = {  # scene: iterations per solve (None: the config's)
    "manifold_opt/spot_lbfgs": None,
    "manifold_opt/sphere_lbfgs": None,
    "smoothing/spot_area": 200,  # gradient descent on spot's area
}
LOOPS = ["host", "device_poll", "device_graph"]


def _loop_option(loop: str, device):
    from warp_meshad import DeviceLoop

    if loop == "host":
        return False
    if not wp.get_device(device).is_cuda:
        return DeviceLoop(poll=(loop == "device_poll"))
    return DeviceLoop(capture=True, poll=(loop == "device_poll"))


def _solver(app, option):
    """The app's solver rebuilt with ``device_loop=option`` (same settings)."""
    import warp_meshad as wm

    s = app.solver
    if isinstance(s, wm.LBFGSSolver):
        return wm.LBFGSSolver(app.problem, history=s.history, initial_step=s.initial_step, fixed=s.fixed_indices,
                              device_loop=option)
    return wm.GradientDescentSolver(app.problem, step=s.step, fixed=s.fixed_indices, device_loop=option)


def _start(app):
    return app.v if hasattr(app, "v") else app.x


def run_case(scene: str, device: str, runs: int, iterations: int | None, energy_rtol: float) -> list[dict]:
    import warp_meshad.app as appmod

    overrides = {"screenshot": False, "device": device, "device_loop": False}
    config = appmod.load_config(scene, overrides=overrides)
    app = appmod.app_class(config.app)(config)
    x0 = wp.clone(_start(app))
    cap = iterations if iterations is not None else CASES.get(scene)
    max_it = int(cap if cap is not None else config.iterations)
    tol = float(config.tolerance)
    records, reference = [], None
    for loop in LOOPS:
        solver = _solver(app, _loop_option(loop, device))
        solver.solve(x0, max_iterations=max_it, tolerance=tol)  # untimed: loads kernels, captures graphs
        walls, gpus, results = [], [], []
        for _ in range(runs):
            wp.synchronize_device(device)
            t0 = time.perf_counter()
            result = solver.solve(x0, max_iterations=max_it, tolerance=tol)
            wp.synchronize_device(device)
            walls.append((time.perf_counter() - t0) * 1000.0)
            gpus.append(sum(v for k, v in result.time_ms.items() if k != "total") if loop != "host" else 0.0)
            results.append(result)
        last = results[-1]
        energy = float(last.energies[-1])
        if reference is None:
            reference = last
        rel = abs(energy - reference.energies[-1]) / max(1.0, abs(reference.energies[-1]))
        matches = bool(rel <= energy_rtol and last.iterations == reference.iterations)
        per_it = [(w - g) * 1000.0 / max(1, r.iterations) for w, g, r in zip(walls, gpus, results)]
        rec = record(NAME, loop, app.problem.variable_count, "float64", walls, str(wp.get_device(device).name),
                     scene=scene, iterations=int(last.iterations), reason=last.reason, final_energy=energy,
                     energy_rel_to_host=rel, matches_host=matches, gpu_ms_median=float(statistics.median(gpus)),
                     host_us_per_iteration_median=float(statistics.median(per_it)),
                     iterations_every_run=[int(r.iterations) for r in results])
        records.append(rec)
        print(f"{scene:28s} {loop:13s} {rec['ms_median']:9.2f} ms  gpu {rec['gpu_ms_median']:9.2f} ms  "
              f"it {last.iterations:4d}  host {rec['host_us_per_iteration_median']:8.1f} us/it  "
              f"E {energy:.12g}  match {matches}")
    return records


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument("--cases", nargs="+", default=list(CASES))
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--iterations", type=int, default=None, help="cap per solve (default: the config's)")
    parser.add_argument("--energy-rtol", type=float, default=1e-9)
    parser.add_argument("--fused-max", type=int, default=None,
                        help="FirstOrderLoopRunner.fused_two_loop_max_scalars (0: the two-loop recursion as launches "
                             "per pair; default: the library's)")
    args = parser.parse_args(argv)
    if args.fused_max is not None:
        from warp_meshad._src.solve.first_order_loop import FirstOrderLoopRunner

        FirstOrderLoopRunner.fused_two_loop_max_scalars = args.fused_max
    wp.config.quiet = True
    wp.init()
    guard_cpu_out(wp.get_device(args.device).is_cuda)
    records = []
    for scene in args.cases:
        records += run_case(scene, args.device, args.runs, args.iterations, args.energy_rtol)
        write(NAME, records)
    return records


if __name__ == "__main__":
    main()
