"""Default tiled assembly vs the deterministic tiled plan, on more than one energy (which should `auto` pick?).

    python -m benchmarks.assembly_choice --n 1000            # on a GPU host: writes results/assembly_choice.json
    python -m benchmarks.assembly_choice --device cpu --n 6  # CPU smoke run (correctness checks, no real timing)

For each case, two problems on the same data: ``Problem(...)`` (``assembly="auto"``: on a GPU the tiled kernel,
shared-memory atomics into the tile, global atomics for the gradient) and ``Problem(..., deterministic=True)``
(the tiled plan's conflict-free rounds, plain shared-memory adds in a fixed order, gradient summed in shared memory).
Energy, gradient and Hessian of the two are compared first (relative Frobenius error), then ``assemble_hessian`` is
timed (CUDA graph replays, median).

Cases (float32, n x n grid):

* ``mass_spring``: the built-in ``mass_spring`` (float32) on the grid's edges (3D variables, k = 6);
* ``mass_spring_proj``: the same with per-element PSD projection (``projection="clamp"``);
* ``symmetric_dirichlet``: the parametrization energy of ``apps/param.py`` on the faces (2D variables, k = 6),
  with the uv point of ``benchmarks/param_hvp.py``;
* ``symmetric_dirichlet_proj``: the same, projected.
"""

from __future__ import annotations

import argparse

import numpy as np
import warp as wp

from benchmarks import mass_spring, param_hvp
from benchmarks.common import record, setup_run, time_warp, write
from benchmarks.mass_spring import rel

NAME = "assembly_choice"
CASES = ["mass_spring", "mass_spring_proj", "symmetric_dirichlet", "symmetric_dirichlet_proj"]
METHODS = (("default", False), ("deterministic", True))  # (method, Problem's deterministic flag)


def _build(case, n, device, deterministic):
    """(problem, x) of one case: the problems and data of the mass_spring and param_hvp benchmarks."""
    if case.startswith("mass_spring"):
        _, _, _, problem, _, x = mass_spring.build(n, device, assembly="auto", deterministic=deterministic)
        return problem, x
    grid = param_hvp.Case(n, device)
    return param_hvp._problem(grid, deterministic=deterministic)[0], grid.u


def run_case(case, n, device, runs, records, check_only=False):
    import warp_meshad as wm

    projection = "clamp" if case.endswith("_proj") else None
    results, keep = {}, []
    for method, det in METHODS:
        problem, x = _build(case, n, device, det)
        keep.append((problem, x))
        f, g, H = problem.assemble_hessian(x, projection=projection)
        wp.synchronize_device(device)
        results[method] = (f.numpy().copy(), g.numpy().copy(), wm.to_scipy(H))
    (f0, g0, H0), (f1, g1, H1) = results["default"], results["deterministic"]
    err = (rel(f1, f0), rel(g1, g0), float(abs(H1 - H0).max() / abs(H0).max()))
    print(f"-- {case} {n}x{n}: deterministic vs default: energy {err[0]:.2e} gradient {err[1]:.2e} hessian {err[2]:.2e}")
    assert max(err) < 1e-4, (case, err)
    if check_only:
        return err
    dev = str(wp.get_device(device))
    nv = keep[0][0].variable_count
    for (method, _), (problem, x) in zip(METHODS, keep):
        tiled = problem.tile_plan is not None
        times = time_warp(lambda p=problem, xx=x: p.assemble_hessian(xx, projection=projection), device, runs)
        r = record(NAME, f"{case}_{method}", nv, "float32", times, dev, case=case, assembly="tiled" if tiled else "atomic",
                   check_rel_error=max(err))  # fmt: skip
        records.append(r)
        print(f"   {method:14s} ({r['assembly']}) median {r['ms_median']:8.4f} ms  min {r['ms_min']:8.4f} ms")
    return err


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, nargs="+", default=[1000])
    ap.add_argument("--device", default=None)
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--cases", nargs="+", default=CASES, choices=CASES)
    args = ap.parse_args(argv)
    device = setup_run(args.device, args.runs)
    records = []
    for n in args.n:
        for case in args.cases:
            run_case(case, n, device, args.runs, records)
            write(NAME, records)
    for case in args.cases:
        for n in args.n:
            rs = {r["method"].rsplit("_", 1)[1]: r["ms_median"] for r in records
                  if r["case"] == case and r["vertex_count"] == n * n}  # fmt: skip
            if len(rs) == 2:
                print(f"{case:26s} {n:5d}^2  default {rs['default']:.4f}  deterministic {rs['deterministic']:.4f} ms"
                      f"  ratio {rs['deterministic'] / rs['default']:.3f}")


if __name__ == "__main__":
    main()
