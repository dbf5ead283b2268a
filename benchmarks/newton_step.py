"""Newton step on a mass-spring grid: linear back-ends side by side, and one whole step split in phases.

Run on a GPU host (writes benchmarks/results/newton_step.json):

    python -m benchmarks.newton_step                      # 1000 x 1000 grid (1M vertices, 3M unknowns)
    python -m benchmarks.newton_step --grid 300 --runs 3  # smaller
    python -m benchmarks.newton_step --device cpu         # CPU smoke run (SciPy / Warp CG, small grid)

The system is one implicit-Euler step of a cloth-like sheet: structural and shear springs
``k/2 (|xa - xb| - L)^2`` (per-element PSD projection) plus inertia ``m / (2 h^2) |x - y|^2``, with two pinned
corners (symmetric Dirichlet rows). For every linear back-end (cuDSS via nvmath-python, CuPy spsolve, Warp PCG with
block-Jacobi; SciPy on CPU) it records analysis (first call: pattern conversion, reordering, symbolic factorization),
numeric factorization and solve times, checks that all back-ends reach the same answer, then times one iteration of
the shared driver (``wm.NewtonSolver``, projected Newton, the two corners pinned) by its own phase timers:
derivatives (assembly), linear solve (of which constraints: ``rhs = -g`` and the Dirichlet pins; the back-end's
analysis, factorization and solve), line search.

CuPy's spsolve is cuSOLVER's sparse QR (``csrlsvqr``), whose fill-in makes it impractical on millions of unknowns, so
by default it runs on a smaller grid (``--cupy-grid``), where cuDSS and PCG run too for a same-system comparison.
Missing optional packages (nvmath-python/cuDSS, CuPy) are reported in the output and the JSON, never fatal.
"""

import argparse
import datetime
import json
import pathlib
import statistics
import time
import traceback
from typing import Any

import numpy as np
import warp as wp

RESULTS = pathlib.Path(__file__).resolve().parent / "results" / "newton_step.json"


@wp.struct
class SpringData:
    rest: wp.array(dtype=wp.float64)
    stiffness: wp.float64


@wp.struct
class InertiaData:
    predicted: wp.array(dtype=wp.vec3d)
    weight: wp.float64  # m / h^2


def _energies():
    from warp_meshad.kernels import ad

    @wp.func
    def spring(e: int, xa: Any, xb: Any, data: SpringData):
        s = ad.length(xa - xb) - data.rest[e]
        return wp.float64(0.5) * data.stiffness * s * s

    @wp.func
    def inertia(e: int, xa: Any, data: InertiaData):
        d = xa - data.predicted[e]
        return wp.float64(0.5) * data.weight * ad.dot(d, d)

    return spring, inertia


def build_problem(grid: int, device, seed: int = 0):
    """Mass-spring grid problem of ``grid * grid`` vertices, its start point and pinned corners."""
    from warp_meshad import Problem

    spring, inertia = _energies()
    n = grid * grid
    idx = np.arange(n).reshape(grid, grid)
    h = 1.0 / (grid - 1)
    u, v = np.meshgrid(np.linspace(0.0, 1.0, grid), np.linspace(0.0, 1.0, grid))
    rest_pos = np.stack([u.ravel(), v.ravel(), np.zeros(n)], axis=1)
    edges = np.concatenate(
        [
            np.stack([idx[:, :-1].ravel(), idx[:, 1:].ravel()], 1),  # structural
            np.stack([idx[:-1, :].ravel(), idx[1:, :].ravel()], 1),
            np.stack([idx[:-1, :-1].ravel(), idx[1:, 1:].ravel()], 1),  # shear
            np.stack([idx[:-1, 1:].ravel(), idx[1:, :-1].ravel()], 1),
        ]
    ).astype(np.int32)
    rest = np.linalg.norm(rest_pos[edges[:, 0]] - rest_pos[edges[:, 1]], axis=1)
    rng = np.random.default_rng(seed)
    x0 = rest_pos * np.array([1.1, 0.95, 1.0]) + rng.normal(scale=0.2 * h, size=(n, 3))
    dt = 1.0 / 60.0
    predicted = x0 + dt * dt * np.array([0.0, 0.0, -9.8])  # gravity over one step, at rest

    problem = Problem(n, 3, wp.float64, device)
    sd = SpringData()
    sd.rest = wp.array(rest, dtype=wp.float64, device=device)
    sd.stiffness = wp.float64(1.0e3)
    problem.add_term(edges, spring, sd)
    inert = InertiaData()
    inert.predicted = wp.array(predicted, dtype=wp.vec3d, device=device)
    inert.weight = wp.float64((1.0 / n) / (dt * dt))
    problem.add_term(np.arange(n, dtype=np.int32)[:, None], inertia, inert)
    x = wp.array(x0, dtype=wp.vec3d, device=device)
    pinned = np.array([idx[-1, 0], idx[-1, -1]])
    return problem, x, pinned


def _gpu_name(device) -> str:
    if device.is_cuda:
        return f"{device.name} ({device.alias})"
    import platform

    return f"cpu ({platform.processor() or platform.machine()})"


class Recorder:
    """Collects JSON records and rewrites the results file after each one (a partial run keeps its results)."""

    def __init__(self, path: pathlib.Path, device, out=True):
        self.path = path
        self.device = device
        self.records = []
        self.date = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        self.out = out

    def add(self, method: str, vertex_count: int, times_ms, **fields):
        times_ms = [t for t in (times_ms or []) if t is not None]
        record = {
            "benchmark": "newton_step",
            "method": method,
            "vertex_count": int(vertex_count),
            "dtype": "float64",
            "ms_median": statistics.median(times_ms) if times_ms else None,
            "ms_min": min(times_ms) if times_ms else None,
            "runs": len(times_ms),
            "device": _gpu_name(self.device),
            "date": self.date,
        }
        record.update({k: (float(v) if isinstance(v, (np.floating,)) else v) for k, v in fields.items()})
        self.records.append(record)
        if self.out:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.path.write_text(json.dumps(self.records, indent=1) + "\n")
        shown = {k: (float(f"{v:.4g}") if isinstance(v, float) else v) for k, v in record.items()
                 if k not in ("date", "device", "benchmark", "dtype")}
        print(json.dumps(shown), flush=True)


def _newton_system(problem, x, mask):
    """Assemble H, rhs = -g with Dirichlet pins; returns (f, g copy, H, rhs)."""
    from warp_meshad._src.solve.constraints import apply_dirichlet
    from warp_meshad._src.solve.vector_ops import scale_into

    f, g, H = problem.eval_with_hessian_proj(x)
    g_keep = wp.clone(g)
    rhs = wp.empty_like(g)
    scale_into(rhs, -1.0, g)
    apply_dirichlet(H, rhs, mask)
    wp.synchronize_device(problem.device)
    return f, g_keep, H, rhs


CUPY_METHOD = "spsolve"


def _make_backends(names, cg_tol: float):
    from warp_meshad import make_linear_solver

    out = {}
    for name in names:
        try:
            options = {"preconditioner": "block_jacobi", "tol": cg_tol, "maxiter": 20000} if name == "cg" else {}
            if name == "cupy":
                options = {"method": CUPY_METHOD, "tol": cg_tol}
            out[name] = make_linear_solver(name, **options)
        except Exception as exc:  # ImportError for a missing extra, ValueError on the wrong device
            out[name] = exc
    return out


def bench_linear(rec: Recorder, grid: int, device, backends, runs: int, cg_tol: float):
    """Same system, every back-end: analysis (first call), factorization and solve; answers compared."""
    from warp_meshad._src.solve.constraints import fixed_mask_from_indices

    t0 = time.perf_counter()
    problem, x, pinned = build_problem(grid, device)
    mask = fixed_mask_from_indices(pinned, problem.variable_count, device)
    f, g, H, rhs = _newton_system(problem, x, mask)
    n = problem.variable_count
    print(f"[grid {grid}] {n} vertices, {problem.hessian_block_count} Hessian blocks, "
          f"setup + first assembly {1000 * (time.perf_counter() - t0):.0f} ms", flush=True)
    solutions = {}
    for name, solver in _make_backends(backends, cg_tol).items():
        method = f"linear_{name}"
        if isinstance(solver, Exception):
            rec.add(method, n, [], error=f"{type(solver).__name__}: {solver}")
            continue
        try:
            d = wp.zeros_like(rhs)
            first = solver.solve(H, rhs, d)
            infos = []
            for _ in range(runs):
                d.zero_()
                infos.append(solver.solve(H, rhs, d))
        except Exception as exc:
            rec.add(method, n, [], error=f"{type(exc).__name__}: {exc}")
            traceback.print_exc()
            continue
        sol = d.numpy().reshape(-1)
        solutions[name] = sol
        rec.add(
            method,
            n,
            [i.factor_ms + i.solve_ms for i in infos],
            backend=solver.name,
            unknowns=3 * n,
            hessian_blocks=int(problem.hessian_block_count),
            analysis_ms=first.analysis_ms,
            first_call_ms=first.analysis_ms + first.factor_ms + first.solve_ms,
            factor_ms=statistics.median(i.factor_ms for i in infos),
            solve_ms=statistics.median(i.solve_ms for i in infos),
            iterations=infos[-1].iterations,
            residual_norm=infos[-1].residual_norm,
            rhs_norm=float(np.linalg.norm(rhs.numpy())),
        )
    # all back-ends against the first direct one (or the first that ran)
    if solutions:
        ref_name = next((k for k in ("cudss", "scipy", "cupy") if k in solutions), next(iter(solutions)))
        ref = solutions[ref_name]
        for name, sol in solutions.items():
            if name != ref_name:
                rel = float(np.linalg.norm(sol - ref) / max(np.linalg.norm(ref), 1e-300))
                rec.add(f"agreement_{name}_vs_{ref_name}", n, [], relative_difference=rel)
    return problem, x, pinned


def _recording(backend):
    """``backend`` wrapped so that each solve's :class:`~warp_meshad.LinearSolveInfo` and wall time are kept."""
    import warp_meshad as wm

    class Recording(wm.LinearSolver):
        name = backend.name
        cudss_skipped_reason = backend.cudss_skipped_reason

        def __init__(self):
            super().__init__()
            self.infos, self.wall_ms = [], []

        def solve(self, A, b, x):
            t = time.perf_counter()
            info = backend.solve(A, b, x)
            wp.synchronize_device(A.device)
            self.wall_ms.append(1000.0 * (time.perf_counter() - t))
            self.infos.append(info)
            return info

    return Recording()


def bench_newton_step(rec: Recorder, problem, x, pinned, backends, runs: int, cg_tol: float):
    """One projected-Newton iteration of the shared driver, from the same point each run, split in the driver's
    phases, with each back-end."""
    import warp_meshad as wm

    n = problem.variable_count
    for name, backend in _make_backends(backends, cg_tol).items():
        method = f"newton_step_{name}"
        if isinstance(backend, Exception):
            rec.add(method, n, [], error=f"{type(backend).__name__}: {backend}")
            continue
        recording = _recording(backend)
        solver = wm.NewtonSolver(problem, linear_solver=recording, fixed=pinned)
        phases = {k: [] for k in ("derivatives_ms", "constraints_ms", "analysis_ms", "factor_ms", "solve_ms",
                                  "linear_solve_ms", "line_search_ms")}
        totals = []
        try:
            for run in range(runs + 1):  # run 0 warms up (kernel compilation, symbolic analysis)
                # one iteration: the callback stops the solve after its first accepted step (no further evaluation)
                result = solver.solve(x, max_iterations=1, tolerance=0.0, gradient_tolerance=0.0,
                                      energy_tolerance=0.0, callback=lambda *_: True)
                t, info = result.time_ms, recording.infos[-1]
                if run == 0:
                    first_total, first_analysis = t["total"], info.analysis_ms
                    continue
                for key, value in (("derivatives_ms", t["derivatives"]),
                                   ("constraints_ms", t["linear_solve"] - recording.wall_ms[-1]),
                                   ("analysis_ms", info.analysis_ms), ("factor_ms", info.factor_ms),
                                   ("solve_ms", info.solve_ms), ("linear_solve_ms", t["linear_solve"]),
                                   ("line_search_ms", t["line_search"])):
                    phases[key].append(value)
                totals.append(t["total"])
        except Exception as exc:
            rec.add(method, n, [], error=f"{type(exc).__name__}: {exc}")
            traceback.print_exc()
            continue
        rec.add(
            method,
            n,
            totals,
            backend=backend.name,
            first_step_ms=first_total,
            first_analysis_ms=first_analysis,
            **{k: statistics.median(v) for k, v in phases.items()},
            energy_before=result.energies[0],
            energy_after=result.energies[-1],
            step_size=result.step_sizes[0] if result.step_sizes else 0.0,
            line_search_tries=result.line_search_tries[0] if result.line_search_tries else 0,
            reason=result.reason,
        )


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default=None, help="Warp device (default: cuda:0 if present, else cpu)")
    parser.add_argument("--grid", type=int, default=None, help="grid side (default 1000 on GPU, 40 on CPU)")
    parser.add_argument("--cupy-grid", type=int, default=200,
                        help="grid side of the same-system comparison that includes CuPy spsolve (0: skip)")
    parser.add_argument("--backends", default=None, help="comma list (default: cudss,cupy,cg on GPU; scipy,cg on CPU)")
    parser.add_argument("--runs", type=int, default=5, help="timed repetitions after one warm-up")
    parser.add_argument("--cg-tol", type=float, default=1e-8, help="relative tolerance of Warp PCG")
    parser.add_argument("--output", default=str(RESULTS), help="JSON output file")
    parser.add_argument("--cupy-method", default="spsolve", choices=["spsolve", "cg"],
                        help="CuPy back-end: cuSOLVER sparse QR (spsolve) or Jacobi-preconditioned CG (cg); "
                        "with cg, CuPy also runs on the full grid")
    args = parser.parse_args(argv)
    global CUPY_METHOD
    CUPY_METHOD = args.cupy_method
    if args.cupy_method == "cg":
        args.cupy_grid = 0

    wp.config.log_level = wp.LOG_WARNING
    wp.init()
    device = wp.get_device(args.device or ("cuda:0" if wp.get_cuda_device_count() > 0 else "cpu"))
    on_gpu = device.is_cuda
    grid = args.grid or (1000 if on_gpu else 40)
    backends = args.backends.split(",") if args.backends else (["cudss", "cupy", "cg"] if on_gpu else ["scipy", "cg"])
    rec = Recorder(pathlib.Path(args.output), device)
    print(f"device {_gpu_name(device)}, grid {grid}, back-ends {backends}", flush=True)

    with wp.ScopedDevice(device):
        small = args.cupy_grid if ("cupy" in backends and args.cupy_grid and args.cupy_grid < grid) else 0
        if small:
            problem, x, pinned = bench_linear(rec, small, device, backends, args.runs, args.cg_tol)
            bench_newton_step(rec, problem, x, pinned, backends, args.runs, args.cg_tol)
            del problem, x
        big = [b for b in backends if not (small and b == "cupy")]
        problem, x, pinned = bench_linear(rec, grid, device, big, args.runs, args.cg_tol)
        bench_newton_step(rec, problem, x, pinned, big, args.runs, args.cg_tol)
    print(f"wrote {len(rec.records)} records to {args.output}")


if __name__ == "__main__":
    main()
