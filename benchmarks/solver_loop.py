"""Newton's host loop against the device loop (and the captured one on CUDA): one problem, one process.

    python -m benchmarks.solver_loop                          # CUDA: 300 x 300 grid, cuDSS ("auto")
    python -m benchmarks.solver_loop --device cpu --grid 12   # CPU smoke run (QDLDL)

The problem is the param app's: symmetric Dirichlet of a bumpy height field (``--grid`` vertices a side), flattened
from its xy projection by projected Newton (``--iterations`` at most, tolerance 1e-9, no energy-change test, as the
app). For each loop (``host``: ``NewtonSolver``'s host loop; ``device``: ``device_loop=True``; on CUDA also
``captured``: ``DeviceLoop(capture=True)`` and ``captured_no_poll``: ``DeviceLoop(capture=True, poll=False)``) a new
solver's first solve is timed apart (kernel loads, the linear back-end's analysis, graph capture) from ``--repeats``
later solves from the same start (steady state). Per loop: wall ms per iteration (median over the repeats), the
iteration count, the final energy, and the solver's phase times per iteration; on CUDA the device loops' phases are
GPU time between CUDA events (kernels and cuDSS), so ``wall - gpu`` is what the loop adds. The host loop's phases
are host clocks around synchronized phases. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np
import warp as wp


def param_problem(grid: int, device):
    """(problem, uv0): symmetric Dirichlet of a grid x grid height field, uv0 its xy projection."""
    import warp_meshad as wm
    from warp_meshad.kernels.energies import SymmetricDirichletData, symmetric_dirichlet

    flat = wm.TriMesh.grid(grid, grid)
    v = flat.vertices.copy()
    v[:, 2] = 0.15 * np.sin(3.0 * np.pi * v[:, 0]) * np.cos(2.0 * np.pi * v[:, 1])
    mesh = wm.TriMesh(v, flat.faces)
    data = SymmetricDirichletData(
        wp.float64,
        rest_inverse=wp.array(mesh.face_rest_frame_inverses(), dtype=wp.mat22d, device=device),
        area=wp.array(mesh.face_areas(), dtype=wp.float64, device=device),
    )
    problem = wm.Problem(mesh.vertex_count, 2, wp.float64, device)
    problem.add_term(mesh.faces, symmetric_dirichlet, data)
    return problem, wp.array(v[:, :2], dtype=wp.vec2d, device=device)


def time_loop(problem, uv0, loop, args) -> dict:
    import warp_meshad as wm

    def solve(solver):
        t0 = time.perf_counter()
        result = solver.solve(uv0, max_iterations=args.iterations, tolerance=1e-9, energy_tolerance=0.0)
        return result, (time.perf_counter() - t0) * 1000.0

    solver = wm.NewtonSolver(problem, linear_solver=args.linear_solver, device_loop=loop)
    first, first_ms = solve(solver)
    walls, phases = [], []
    for _ in range(args.repeats):
        result, ms = solve(solver)
        walls.append(ms / max(result.iterations, 1))
        phases.append({k: v / max(result.iterations, 1) for k, v in result.time_ms.items() if k != "total"})
    median_phases = {k: statistics.median(p[k] for p in phases) for k in phases[0]}
    return {
        "first_call_ms": first_ms,
        "first_call_iterations": first.iterations,
        "iterations": result.iterations,
        "reason": result.reason,
        "energy": result.energies[-1],
        "wall_ms_per_iteration": statistics.median(walls),
        "phase_ms_per_iteration": median_phases,
        "phase_sum_ms_per_iteration": sum(median_phases.values()),
        "x": result.x.numpy(),
    }


def main(argv=None) -> dict:
    from warp_meshad import DeviceLoop

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default=None, help="Warp device (default: Warp's default)")
    parser.add_argument("--grid", type=int, default=None, help="vertices a side (default 300 on CUDA, 12 on CPU)")
    parser.add_argument("--iterations", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--linear-solver", default="auto")
    args = parser.parse_args(argv)
    wp.config.log_level = wp.LOG_WARNING
    device = wp.get_device(args.device)
    grid = args.grid or (300 if device.is_cuda else 12)
    problem, uv0 = param_problem(grid, device)
    loops = {"host": False, "device": True}
    if device.is_cuda:
        loops["captured"] = DeviceLoop(capture=True)
        loops["captured_no_poll"] = DeviceLoop(capture=True, poll=False)
    out = {"benchmark": "solver_loop", "device": str(device), "grid": grid, "vertex_count": problem.variable_count,
           "linear_solver": args.linear_solver, "iterations_cap": args.iterations, "loops": {}}
    x_host = None
    for name, loop in loops.items():
        try:
            rec = time_loop(problem, uv0, loop, args)
        except Exception as exc:  # a loop that fails here is reported, the others still run
            out["loops"][name] = {"error": f"{type(exc).__name__}: {exc}"}
            continue
        x = rec.pop("x")
        if x_host is None:
            x_host = x
        rec["max_abs_x_vs_host"] = float(np.abs(x - x_host).max())
        out["loops"][name] = rec
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
