"""Projected Newton at scale: stable Neo-Hookean statics on a 1M-tet box, phases per iteration, cuDSS options.

Run on a GPU host (writes benchmarks/results/newton_tet.json and .png; issue 19 items 2-3):

    python -m benchmarks.newton_tet                          # boxes 12^3 (hybrid execution runs there) and 56^3
    python -m benchmarks.newton_tet --sizes 56 --variants cudss,cudss_f32
    python -m benchmarks.newton_tet --device cpu --sizes 4   # CPU smoke run (QDLDL / SciPy)

The problem: ``TetMesh.box(n, n, n)`` (6 (n - 1)^3 tets: 998,250 at n = 56, 175,616 vertices, 526,848 unknowns),
stable Neo-Hookean (``stable_neo_hookean_F`` through ``add_deformation_term`` with its analytic projection
``stable_neo_hookean_F_hessian_proj``), mu = 1e4, lambda = 4e4, float64. The x = 0 face is pinned where it is; the
x = 1 face is pinned turned by ``--twist`` degrees (90) about the box's axis and pulled out by ``--stretch`` (30 %):
both faces are Dirichlet ``fixed=`` variables, the interior starts at rest. Projected Newton (``wm.NewtonSolver``,
clamped projection, Armijo) runs to a Newton decrement of ``--tolerance`` (1e-9) times the start energy: 9
iterations at every size tried on the CPU (n = 6, 10, 16).

Variants (one process, the same start and tolerance; ``--variants`` picks them): on CUDA ``cudss`` (LU, what
``linear_solver="auto"`` picked before it took Cholesky for pinned projected systems), ``cudss_f32`` (``factor_dtype="float32"``: float32 factors refined in float64),
``cudss_reuse2`` and ``cudss_reuse3`` (``reuse_factorization=2, 3``: a factorization serves up to 2 or 3 Newton
iterations, the later ones by PCG preconditioned with it), ``cudss_spd`` (Cholesky: ``"auto"``'s ``spd_or_general`` here, the box being pinned), and ``cudss_hybrid``
(``execution="hybrid"``, cuDSS's hybrid execute mode for small systems; only up to ``--hybrid-max-unknowns``).
Also available: ``cudss_f32_reuse2``, ``cudss_reuse3_inexact`` (``refine_tol=1e-6``). On the CPU: ``qdldl``,
``qdldl_reuse2``, ``qdldl_reuse3``, ``scipy``, ``scipy_f32``. Variants that differ only in those refinement
options share one back-end instance (one cuDSS analysis, changed options, ``forget_factors()`` between runs), so
each analysis is paid once and reported apart (``analysis_ms``, first run of each instance).

Reported per variant and per Newton iteration: derivatives (``eval_with_hessian_proj``: energy, gradient, analytic
projection and Hessian assembly, one fused launch), the linear solve's wall time split by the back-end's
:class:`LinearSolveInfo` into analysis, numeric factorization and solve (cuDSS: host clocks around synchronized
calls, i.e. GPU time; a reused or float32 solve's refinement counts as solve), whether it factorized, refinement
iterations, the relative residual, and the line search (trial energies, tries, step). Per variant: Newton iterations,
final energy against the first variant's, max |x - x_first|, and the totals. Once per size, at the start point, the
derivatives split by ``time_warp`` (CUDA graphs): energy, + gradient, + Hessian assembly, + projection.
"""

from __future__ import annotations

import argparse
import statistics
import time
import traceback

import numpy as np
import warp as wp

from benchmarks.common import guard_cpu_out, record, run_sizes, time_warp, write

NAME = "newton_tet"
MU, LAM = 1.0e4, 4.0e4

# variant -> (back-end, constructor options that need their own instance, refinement options set on it)
VARIANTS = {
    "cudss": ("cudss", {}, {}),
    "cudss_f32": ("cudss", {}, {"factor_dtype": "float32"}),
    "cudss_reuse2": ("cudss", {}, {"reuse_factorization": 2}),
    "cudss_reuse3": ("cudss", {}, {"reuse_factorization": 3}),
    "cudss_reuse3_inexact": ("cudss", {}, {"reuse_factorization": 3, "refine_tol": 1e-6}),
    "cudss_f32_reuse2": ("cudss", {}, {"factor_dtype": "float32", "reuse_factorization": 2}),
    "cudss_spd": ("cudss", {"matrix_type": "spd"}, {}),
    "cudss_hybrid": ("cudss", {"execution": "hybrid"}, {}),
    "qdldl": ("qdldl", {}, {}),
    "qdldl_reuse2": ("qdldl", {}, {"reuse_factorization": 2}),
    "qdldl_reuse3": ("qdldl", {}, {"reuse_factorization": 3}),
    "scipy": ("scipy", {}, {}),
    "scipy_f32": ("scipy", {}, {"factor_dtype": "float32"}),
}
DEFAULT_GPU = ["cudss", "cudss_f32", "cudss_reuse2", "cudss_reuse3", "cudss_spd", "cudss_hybrid"]
DEFAULT_CPU = ["qdldl", "qdldl_reuse2", "qdldl_reuse3", "scipy", "scipy_f32"]
REFINEMENT = {"reuse_factorization": 1, "factor_dtype": "float64", "refine_tol": 1e-10}  # the back-ends' defaults
COUNTERS = ("factorizations", "reused_solves", "early_refactorizations", "float64_fallbacks")


def build(n: int, device, twist_deg: float = 90.0, stretch: float = 0.3):
    """(mesh, problem, x0 (numpy), fixed indices): the stable Neo-Hookean box, x = 0 pinned, x = 1 turned and pulled."""
    import warp_meshad as wm
    from warp_meshad.kernels.energies import (
        StableNeoHookeanData,
        stable_neo_hookean_F,
        stable_neo_hookean_F_hessian_proj,
    )

    mesh = wm.TetMesh.box(n, n, n)
    X = mesh.vertices
    data = StableNeoHookeanData()
    data.rest_inverse = wp.array(mesh.rest_matrix_inverses(), dtype=wp.mat33d, device=device)
    data.volume = wp.array(mesh.volumes(), dtype=wp.float64, device=device)
    data.mu, data.lam = wp.float64(MU), wp.float64(LAM)
    problem = wm.Problem(mesh.vertex_count, 3, dtype=wp.float64, device=device)
    problem.add_deformation_term(mesh.tets, stable_neo_hookean_F, rest_inverse=data.rest_inverse, data=data,
                                 projection=stable_neo_hookean_F_hessian_proj)  # fmt: skip
    lo = np.flatnonzero(X[:, 0] < 1e-9)
    hi = np.flatnonzero(X[:, 0] > 1.0 - 1e-9)
    x0 = X.copy()
    t = np.deg2rad(twist_deg)
    y, z = X[hi, 1] - 0.5, X[hi, 2] - 0.5
    x0[hi] = np.stack([(1.0 + stretch) * X[hi, 0], 0.5 + np.cos(t) * y - np.sin(t) * z,
                       0.5 + np.sin(t) * y + np.cos(t) * z], axis=1)  # fmt: skip
    return mesh, problem, x0, np.concatenate([lo, hi])


class PhaseLog:
    """Times the Newton driver's calls into the problem and the linear back-end, in order: ``derivatives``
    (``eval_with_hessian_proj``), ``linear`` (``solve``, with its LinearSolveInfo and ``||b||``), ``energy`` (the
    line search's trial energies). Installed as instance attributes for one solve, removed after."""

    def __init__(self, problem, backend, device):
        self.problem, self.backend, self.device = problem, backend, device
        self.events: list[tuple] = []

    def _timed(self, kind, fn):
        def call(*args, **kwargs):
            t0 = time.perf_counter()
            out = fn(*args, **kwargs)
            wp.synchronize_device(self.device)
            ms = (time.perf_counter() - t0) * 1000.0
            if kind == "linear":  # ||b||, after the clock: the residual's scale
                self.events.append((kind, ms, out, float(wp.utils.array_inner(args[1], args[1])) ** 0.5))
            else:
                self.events.append((kind, ms))
            return out

        return call

    def __enter__(self):
        self.events.clear()
        p, b = self.problem, self.backend
        p.eval_with_hessian_proj = self._timed("derivatives", p.eval_with_hessian_proj)
        p.eval = self._timed("energy", p.eval)
        b.solve = self._timed("linear", b.solve)
        return self

    def __exit__(self, *exc):
        for obj, name in ((self.problem, "eval_with_hessian_proj"), (self.problem, "eval"), (self.backend, "solve")):
            obj.__dict__.pop(name, None)
        return False

    def iterations(self, result) -> list[dict]:
        """One row per Newton iteration (a derivative evaluation followed by a linear solve)."""
        rows = []
        for kind, ms, *rest in self.events:
            if kind == "derivatives":
                rows.append({"derivatives_ms": ms, "line_search_ms": 0.0, "line_search_evals": 0})
            elif kind == "linear" and rows:
                info, b_norm = rest
                rows[-1].update(linear_ms=ms, analysis_ms=info.analysis_ms, factor_ms=info.factor_ms,
                                solve_ms=info.solve_ms, factorized=info.factorized,
                                refinement_iterations=info.refinement_iterations, factor_dtype=info.factor_dtype,
                                relative_residual=info.residual_norm / b_norm if b_norm > 0 else 0.0)  # fmt: skip
            elif kind == "energy" and rows:
                rows[-1]["line_search_ms"] += ms
                rows[-1]["line_search_evals"] += 1
        rows = [r for r in rows if "linear_ms" in r]  # the last point's derivatives only test convergence
        for i, r in enumerate(rows):
            r["iteration"] = i
            r["energy"] = result.energies[i]
            r["gradient_norm"] = result.gradient_norms[i]
            if i < len(result.newton_decrements):
                r["newton_decrement"] = result.newton_decrements[i]
            if i < len(result.step_sizes):
                r["step"] = result.step_sizes[i]
                r["line_search_tries"] = result.line_search_tries[i]
        return rows


def derivative_split(problem, x, device, runs: int) -> dict:
    """Milliseconds (median) at x of: energy, energy + gradient, + Hessian assembly, + analytic projection."""
    out = {}
    for key, fn in (("energy_ms", lambda: problem.assemble_energy(x)),
                    ("gradient_ms", lambda: problem.assemble_gradient(x)),
                    ("hessian_ms", lambda: problem.assemble_hessian(x)),
                    ("hessian_proj_ms", lambda: problem.assemble_hessian(x, projection="clamp"))):  # fmt: skip
        out[key] = float(statistics.median(time_warp(fn, device, runs=runs, warmup=2)))
    out["projection_ms"] = out["hessian_proj_ms"] - out["hessian_ms"]
    return out


def _backend(name, structural, cache):
    """The shared back-end instance for (name, structural options)."""
    import warp_meshad as wm

    key = (name, tuple(sorted(structural.items())))
    if key not in cache:
        cache[key] = wm.make_linear_solver(name, **structural)
    return cache[key], key


def run_variant(variant, problem, x0, fixed, tolerance, max_iterations, cache, analysed):
    import warp_meshad as wm

    name, structural, refinement = VARIANTS[variant]
    backend, key = _backend(name, structural, cache)
    for option, default in REFINEMENT.items():
        if hasattr(backend, option) or option in refinement:
            setattr(backend, option, refinement.get(option, default))
    if hasattr(backend, "forget_factors"):
        backend.forget_factors()
    before = {c: getattr(backend, c, 0) for c in COUNTERS}
    solver = wm.NewtonSolver(problem, linear_solver=backend, fixed=fixed)
    log = PhaseLog(problem, backend, problem.device)
    with log:
        result = solver.solve(x0, max_iterations=max_iterations, tolerance=tolerance)
    rows = log.iterations(result)
    counters = {c: getattr(backend, c, 0) - before[c] for c in COUNTERS}
    first_of_instance = key not in analysed
    analysed.add(key)
    return result, rows, counters, first_of_instance


def summarize(variant, result, rows, counters, first_of_instance, reference) -> dict:
    analysis = sum(r["analysis_ms"] for r in rows)
    per_iteration = [r["derivatives_ms"] + r["linear_ms"] - r["analysis_ms"] + r["line_search_ms"] for r in rows]
    t = result.time_ms
    out = {
        "newton_iterations": result.iterations,
        "reason": result.reason,
        "converged": result.converged,
        "energy_start": result.energies[0],
        "energy_final": result.energies[-1],
        "total_ms": t["total"],
        "total_ms_without_analysis": t["total"] - analysis,
        "analysis_ms": analysis,
        "analysis_is_first_of_instance": first_of_instance,
        "derivatives_ms_total": t["derivatives"],
        "linear_solve_ms_total": t["linear_solve"],
        "line_search_ms_total": t["line_search"],
        "factor_ms_total": sum(r["factor_ms"] for r in rows),
        "solve_ms_total": sum(r["solve_ms"] for r in rows),
        "constraints_ms_total": t["linear_solve"] - sum(r["linear_ms"] for r in rows),  # rhs = -g, Dirichlet rows
        "median_ms": {k: float(statistics.median(r[k] for r in rows)) for k in
                      ("derivatives_ms", "linear_ms", "factor_ms", "solve_ms", "line_search_ms")} if rows else {},
        "factorized_iterations": sum(bool(r["factorized"]) for r in rows),
        "refinement_iterations_total": sum(r["refinement_iterations"] for r in rows),
        "max_relative_residual": max((r["relative_residual"] for r in rows), default=0.0),
        "linear_iterations": list(result.linear_iterations),
        **counters,
        "per_iteration_ms": per_iteration,
        "iterations_detail": rows,
    }
    if reference is not None:
        e_ref, x_ref = reference
        out["energy_minus_first"] = result.energies[-1] - e_ref
        out["max_abs_x_minus_first"] = float(np.abs(result.x.numpy() - x_ref).max())
    return out


def print_iterations(variant, rows):
    print(f"   {variant}: it  energy            decrement  deriv   factor    solve  refine  fact  lsearch  "
          "rel.res")  # fmt: skip
    for r in rows:
        print(f"   {'':{len(variant)}s}  {r['iteration']:2d}  {r['energy']:.10e}  {r.get('newton_decrement', 0.0):9.2e}"
              f"  {r['derivatives_ms']:6.2f}  {r['factor_ms']:7.2f}  {r['solve_ms']:7.2f}  {r['refinement_iterations']:6d}"
              f"  {'y' if r['factorized'] else 'n':>4s}  {r['line_search_ms']:7.2f}  {r['relative_residual']:.1e}")


def print_table(n, summaries):
    print(f"-- box {n}^3 summary (ms; 'per it' excludes analysis)")
    print(f"   {'variant':22s} {'its':>3s} {'total':>9s} {'analysis':>9s} {'per it':>8s} {'deriv':>7s} {'factor':>8s} "
          f"{'solve':>8s} {'lsearch':>7s} {'fact':>4s} {'reuse':>5s} {'refine':>6s} {'dE vs first':>11s} "
          f"{'max dx':>8s}")  # fmt: skip
    for variant, s in summaries.items():
        if "error" in s:
            print(f"   {variant:22s} error: {s['error'].splitlines()[-1]}")
            continue
        m = s["median_ms"]
        print(f"   {variant:22s} {s['newton_iterations']:3d} {s['total_ms']:9.1f} {s['analysis_ms']:9.1f} "
              f"{statistics.median(s['per_iteration_ms']) if s['per_iteration_ms'] else 0.0:8.2f} "
              f"{m.get('derivatives_ms', 0.0):7.2f} {m.get('factor_ms', 0.0):8.2f} {m.get('solve_ms', 0.0):8.2f} "
              f"{m.get('line_search_ms', 0.0):7.2f} {s['factorized_iterations']:4d} {s['reused_solves']:5d} "
              f"{s['refinement_iterations_total']:6d} {s.get('energy_minus_first', 0.0):11.2e} "
              f"{s.get('max_abs_x_minus_first', 0.0):8.1e}")  # fmt: skip


def warm_up(device, args, variants):
    """Every selected variant's Newton loop on a 3 x 3 x 3 box, twice, unrecorded: compiles and loads the kernels
    the timed runs meet (energy, CSR conversion, Dirichlet rows, the refinement's vector operations and SpMV), so
    that no compile lands in a timed phase."""
    t0 = time.perf_counter()
    mesh, problem, x0_np, fixed = build(3, device, args.twist, args.stretch)
    x0 = wp.array(x0_np, dtype=wp.vec3d, device=device)
    e0 = problem.eval(x0)
    cache = {}
    for variant in variants:
        for _ in range(2):
            try:
                run_variant(variant, problem, x0, fixed, args.tolerance * e0, 3, cache, set())
            except Exception:  # reported where the variant runs for real
                break
    for backend in cache.values():
        backend.invalidate_pattern()
    print(f"warm-up (3^3 box, {len(variants)} variants): {time.perf_counter() - t0:.1f} s")


def selected_variants(args, device) -> list[str]:
    variants = args.variants or (DEFAULT_GPU if wp.get_device(device).is_cuda else DEFAULT_CPU)
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        raise SystemExit(f"unknown variants {unknown}; expected some of {sorted(VARIANTS)}")
    return variants


def run_size(n, device, args, records):
    mesh, problem, x0_np, fixed = build(n, device, args.twist, args.stretch)
    x0 = wp.array(x0_np, dtype=wp.vec3d, device=device)
    dev = str(wp.get_device(device))
    unknowns = 3 * mesh.vertex_count
    t0 = time.perf_counter()
    e0 = problem.eval(x0)  # compiles and loads the energy kernels
    problem.eval_with_hessian_proj(x0)
    wp.synchronize_device(device)
    warm_s = time.perf_counter() - t0
    print(f"-- box {n}^3: {mesh.tet_count} tets, {mesh.vertex_count} vertices, {unknowns} unknowns, "
          f"{problem.hessian_block_count} Hessian blocks, {len(fixed)} pinned; start energy {e0:.6e}; "
          f"first evaluations {warm_s:.1f} s")  # fmt: skip
    split = derivative_split(problem, x0, device, args.runs)
    print("   derivatives at the start: " + ", ".join(f"{k} {v:.3f}" for k, v in split.items()))
    base = dict(tets=mesh.tet_count, unknowns=unknowns, size=n, twist_deg=args.twist, stretch=args.stretch,
                tolerance=args.tolerance * e0)  # fmt: skip
    records.append(record(NAME, "derivatives_split", mesh.vertex_count, "float64", [split["hessian_proj_ms"]], dev,
                          **base, **split))  # fmt: skip
    cache, analysed, summaries, reference = {}, set(), {}, None
    for variant in selected_variants(args, device):
        if VARIANTS[variant][1].get("execution") == "hybrid" and unknowns > args.hybrid_max_unknowns:
            print(f"   {variant}: skipped ({unknowns} unknowns > --hybrid-max-unknowns {args.hybrid_max_unknowns})")
            continue
        t0 = time.perf_counter()
        try:
            result, rows, counters, first = run_variant(variant, problem, x0, fixed, args.tolerance * e0,
                                                        args.max_iterations, cache, analysed)  # fmt: skip
        except Exception:
            traceback.print_exc()
            summaries[variant] = {"error": traceback.format_exc(limit=4)}
            records.append({"benchmark": NAME, "method": variant, "vertex_count": mesh.vertex_count, "device": dev,
                            **base, "error": summaries[variant]["error"]})  # fmt: skip
            write(NAME, records)
            continue
        if reference is None:
            reference = (result.energies[-1], result.x.numpy())
        s = summarize(variant, result, rows, counters, first, reference)
        summaries[variant] = s
        print(f"   {variant}: {s['newton_iterations']} iterations ({s['reason']}) in {time.perf_counter() - t0:.1f} s, "
              f"analysis {s['analysis_ms']:.0f} ms")  # fmt: skip
        print_iterations(variant, rows)
        records.append(record(NAME, variant, mesh.vertex_count, "float64", s["per_iteration_ms"] or [float("nan")],
                              dev, backend=VARIANTS[variant][0], options={**VARIANTS[variant][1],
                              **VARIANTS[variant][2]}, **base, **s))  # fmt: skip
        write(NAME, records)
    for backend in cache.values():  # free the factors (GPU memory) before the next size
        backend.invalidate_pattern()
    print_table(n, summaries)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=None,
                    help="vertices per side, TetMesh.box(n, n, n) (default: 12 56 on CUDA, 6 on the CPU)")
    ap.add_argument("--device", default=None)
    ap.add_argument("--variants", type=lambda s: s.split(","), default=None,
                    help=f"comma list of {', '.join(VARIANTS)} (default: {','.join(DEFAULT_GPU)} on CUDA, "
                         f"{','.join(DEFAULT_CPU)} on the CPU)")  # fmt: skip
    ap.add_argument("--twist", type=float, default=90.0, help="turn of the x = 1 face [degrees]")
    ap.add_argument("--stretch", type=float, default=0.3, help="pull of the x = 1 face, a fraction of the length")
    ap.add_argument("--tolerance", type=float, default=1e-9, help="Newton decrement tolerance, times the start energy")
    ap.add_argument("--max-iterations", type=int, default=40)
    ap.add_argument("--runs", type=int, default=10, help="repetitions of the derivative split's timings")
    ap.add_argument("--hybrid-max-unknowns", type=int, default=100_000,
                    help="largest system the hybrid-execution variant runs on")  # fmt: skip
    ap.add_argument("--no-warm-up", action="store_true", help="skip the unrecorded run on a 3^3 box first")
    args = ap.parse_args(argv)
    wp.config.log_level = wp.LOG_WARNING
    wp.init()
    device = args.device or ("cuda:0" if wp.get_cuda_device_count() else "cpu")
    guard_cpu_out(wp.get_device(device).is_cuda)
    sizes = args.sizes or ([12, 56] if wp.get_device(device).is_cuda else [6])
    if not args.no_warm_up:
        warm_up(device, args, selected_variants(args, device))
    return run_sizes(NAME, sizes, lambda n, records: run_size(n, device, args, records))


if __name__ == "__main__":
    main()
