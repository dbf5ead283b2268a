"""Where a cuDSS linear solve's time goes inside a Newton iteration (issue 19 item 2, issue 20): one process.

    python -m benchmarks.cudss_calls            # CUDA only

For three systems (the projected Hessian of param/armadillo at its Tutte start, 64k unknowns; elastic/bunny's first
time step, 3k unknowns; 50 patches of the 200-patch dataset as one ProblemBatch, if ``--patches`` is given), it runs
the host loop's ``NewtonSolver`` for a few iterations and counts the cuDSS plans (reordering + symbolic
factorization) and CSR rebuilds made, then times ``CudssSolver.solve`` alone on the last Hessian (wall ms per call,
its ``LinearSolveInfo`` split), the raw ``nvmath`` ``factorize`` + ``solve`` calls (wall, and GPU time between CUDA
events), the same without the residual check, and hybrid execution. Prints one JSON line per system.

    python -m benchmarks.cudss_calls --reorderings-only    # analysis variants (reordering algorithm, Cholesky, ...)
    python -m benchmarks.cudss_calls --orderings           # user orderings: cuDSS's own handed back, METIS, natural
    python -m benchmarks.cudss_calls --patches /tmp/patches --threads 4 8   # analyses of 50 meshes in threads
    python -m benchmarks.cudss_calls --factorizations      # cuDSS's factorization/solve algorithms, ND levels

``--factorizations`` times, for elastic/bunny's first Hessian (Cholesky, 3k unknowns), param/bunny_cut's and
param/armadillo's at their Tutte starts (LU, 20k and 64k), each ``CudssSolver(config=...)`` variant of
``FACTORIZATION_VARIANTS``: the GPU time (CUDA events) and wall time of a whole ``solve`` (refill, factorization,
solve, residual check) after a first one, and the relative residual.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import time

import numpy as np
import warp as wp


def _counted(cls, name, counts, key):
    original = getattr(cls, name)

    def wrapper(*a, **kw):
        counts[key] = counts.get(key, 0) + 1
        return original(*a, **kw)

    setattr(cls, name, wrapper)
    return original


def _events_ms(fn, device, runs=20):
    """(median wall ms, median GPU ms between events) of ``fn()``."""
    walls, gpus = [], []
    for _ in range(runs):
        wp.synchronize_device(device)
        start, end = wp.Event(device, enable_timing=True), wp.Event(device, enable_timing=True)
        t0 = time.perf_counter()
        wp.record_event(start)
        fn()
        wp.record_event(end)
        wp.synchronize_device(device)
        walls.append((time.perf_counter() - t0) * 1e3)
        gpus.append(wp.get_event_elapsed_time(start, end))
    return statistics.median(walls), statistics.median(gpus)


def probe(name, problem, x0, device, fixed=None) -> dict:
    import warp_meshad as wm
    from warp_meshad._src.solve import linear

    counts: dict = {}
    undo = [(linear.CudssSolver, "_direct_solver", _counted(linear.CudssSolver, "_direct_solver", counts, "plans")),
            (linear.CudssSolver, "_build", _counted(linear.CudssSolver, "_build", counts, "csr_builds"))]
    try:
        solver = wm.NewtonSolver(problem, linear_solver="cudss", projection=wm.Projection(), fixed=fixed)
        infos = []
        backend_solve = solver.linear_solver.solve

        def kept(A, b, x):
            infos.append(backend_solve(A, b, x))
            return infos[-1]

        solver.linear_solver.solve = kept
        t0 = time.perf_counter()
        res = solver.solve(x0, max_iterations=8, tolerance=0.0, energy_tolerance=0.0)
        newton_ms = (time.perf_counter() - t0) * 1e3
        rec = {"system": name, "unknowns": problem.variable_count * problem.variable_dim,
               "newton_iterations": res.iterations,
               "newton_ms": newton_ms, "newton_phases_ms": res.time_ms, "counts_in_newton": dict(counts),
               "plan_ms": infos[0].analysis_ms}
        infos.clear()  # the same solver again (planned): the host loop's steady state, each solve's own times
        t0 = time.perf_counter()
        again = solver.solve(x0, max_iterations=8, tolerance=0.0, energy_tolerance=0.0)
        rec["newton_again_ms_per_iteration"] = (time.perf_counter() - t0) * 1e3 / max(again.iterations, 1)
        per_it = max(again.iterations, 1)
        rec["newton_again_phases_ms_per_iteration"] = {k: v / per_it for k, v in again.time_ms.items()}
        rec["newton_again_linear_info_median_ms"] = {
            k: statistics.median(getattr(i, k) for i in infos) for k in ("analysis_ms", "factor_ms", "solve_ms")}
        _, g, H = problem.eval_with_hessian_proj(res.x)
        b = wp.clone(g)
        x = wp.zeros_like(g)
        counts.clear()
        for label, kw in (("cudss", {}), ("cudss_no_residual", {"compute_residual": False}),
                          ("cudss_hybrid", {"execution": "hybrid"})):
            try:
                ls = linear.CudssSolver(**kw)
                ls.solve(H, b, x)  # plan
                infos = []
                wall, gpu = _events_ms(lambda: infos.append(ls.solve(H, b, x)), device)
                rec[label] = {"wall_ms": wall, "gpu_ms": gpu,
                              "analysis_ms": statistics.median(i.analysis_ms for i in infos),
                              "factor_ms": statistics.median(i.factor_ms for i in infos),
                              "solve_ms": statistics.median(i.solve_ms for i in infos)}
                if label == "cudss":  # the raw nvmath calls on the same planned solver
                    stream = wp.get_stream(device).cuda_stream
                    dctx, sctx = ls._stream(device)
                    with dctx, sctx:
                        rec["nvmath_factorize"] = dict(zip(("wall_ms", "gpu_ms"), _events_ms(
                            lambda: ls._solver.factorize(stream=stream), device)))
                        rec["nvmath_solve"] = dict(zip(("wall_ms", "gpu_ms"), _events_ms(
                            lambda: ls._solver.solve(stream=stream), device)))
                        rec["csr_update"] = dict(zip(("wall_ms", "gpu_ms"), _events_ms(
                            lambda: ls._csr.update_values(H), device)))
            except Exception as exc:
                rec[label] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
        rec["counts_in_timed_solves"] = dict(counts)
        rec["assemble_hessian"] = dict(zip(("wall_ms", "gpu_ms"), _events_ms(
            lambda: problem.eval_with_hessian_proj(res.x), device)))
        return rec
    finally:
        for cls, name_, original in undo:
            setattr(cls, name_, original)


ANALYSIS_VARIANTS = {  # CudssSolver options that may shorten the analysis (reordering on the host)
    "default": {}, "reordering_3": {"reordering": 3}, "spd": {"matrix_type": "spd"},
    "no_matching": {"use_matching": False}, "host_threads_8": {"host_threads": 8},
    "spd_host_threads_8": {"matrix_type": "spd", "host_threads": 8},
}


FACTORIZATION_VARIANTS = {
    "default": {},
    **{f"factorization_alg_{a}": {"factorization_alg": a} for a in (1, 2, 3, 4, 5)},
    **{f"solve_alg_{a}": {"solve_alg": a} for a in (1, 2, 3)},
    **{f"nd_nlevels_{n}": {"nd_nlevels": n} for n in (1, 2, 4, 6)},
    "superpanels_off": {"use_superpanels": 0},
}


def factorizations(name, problem, x0, device, matrix_type="general", variants=FACTORIZATION_VARIANTS) -> dict:
    """Per ``config`` of ``variants``: a new ``CudssSolver(matrix_type, config=...)`` on the projected Hessian at
    ``x0``, a first solve (the plan), then the median GPU and wall ms of 15 whole solves and the relative residual."""
    from warp_meshad._src.solve import linear

    H, b, x, b_norm = _projected_system(problem, x0)
    rec = {"system": name, "unknowns": problem.variable_count * problem.variable_dim, "matrix_type": matrix_type,
           "variants": {}}
    for label, config in variants.items():
        try:
            ls = linear.CudssSolver(matrix_type=matrix_type, config=config, analysis_cache=None)
            first = ls.solve(H, b, x)
            wall, gpu = _events_ms(lambda: ls.solve(H, b, x), device, runs=15)
            info = ls.solve(H, b, x)
            rec["variants"][label] = {"gpu_ms": gpu, "wall_ms": wall, "analysis_ms": first.analysis_ms,
                                      "relative_residual": info.residual_norm / b_norm}
        except Exception as exc:
            rec["variants"][label] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
    return rec


def _projected_system(problem, x0):
    """(H, b, x, ||b||): the projected Hessian at ``x0``, its gradient as right-hand side, a zero solution buffer."""
    _, g, H = problem.eval_with_hessian_proj(x0)
    b = wp.clone(g)
    return H, b, wp.zeros_like(g), float(np.linalg.norm(b.numpy()))


def _time_variant(H, b, x, b_norm, **options) -> tuple[dict, object]:
    """A new ``CudssSolver(**options)`` on ``H x = b``: its first solve (wall ms and ``analysis_ms``), then the median
    factorization and solve ms of 10 more, the relative residual and the factors' non-zeros; and the solver."""
    from warp_meshad._src.solve import linear

    ls = linear.CudssSolver(**options)
    t0 = time.perf_counter()
    first = ls.solve(H, b, x)
    first_ms = (time.perf_counter() - t0) * 1e3
    infos = [ls.solve(H, b, x) for _ in range(10)]
    out = {"first_solve_ms": first_ms, "analysis_ms": first.analysis_ms,
           "factor_ms": statistics.median(i.factor_ms for i in infos),
           "solve_ms": statistics.median(i.solve_ms for i in infos),
           "relative_residual": infos[-1].residual_norm / b_norm, "matrix_type": ls.active_matrix_type}
    try:
        out["lu_nnz"] = int(ls._solver.factorization_info.lu_nnz)
    except Exception as exc:
        out["lu_nnz"] = f"{type(exc).__name__}: {exc}"[:120]
    return out, ls


def reorderings(name, problem, x0, device, variants=ANALYSIS_VARIANTS) -> dict:
    """Per ``CudssSolver`` option set of ``variants`` (reordering algorithm, matrix type, matching, host threads):
    the analysis of the projected Hessian at ``x0`` (first solve's ``analysis_ms``, timed synchronized), then the
    median factorization and solve of 10 more solves, and the relative residual (:func:`_time_variant`)."""
    H, b, x, b_norm = _projected_system(problem, x0)
    rec = {"system": name, "unknowns": problem.variable_count * problem.variable_dim, "reorderings": {}}
    for label, options in variants.items():
        try:
            rec["reorderings"][label] = _time_variant(H, b, x, b_norm, **options)[0]
        except Exception as exc:
            rec["reorderings"][label] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
    return rec


def block_nested_dissection(A) -> np.ndarray:
    """METIS nested dissection (pymetis) of a square BSR matrix's block graph, expanded to its scalar rows (each
    block's rows together): entry ``i`` is the row placed at position ``i``."""
    import pymetis

    nrow, bs = A.nrow, A.block_shape[0]
    offsets = A.offsets.numpy()[: nrow + 1].astype(np.int64)
    columns = A.columns.numpy()[: offsets[-1]].astype(np.int64)
    rows = np.repeat(np.arange(nrow, dtype=np.int64), np.diff(offsets))
    off = rows != columns  # METIS: no self loops, each edge both ways
    key = np.unique(np.concatenate([rows[off] * nrow + columns[off], columns[off] * nrow + rows[off]]))
    a, b = key // nrow, key % nrow
    xadj = np.zeros(nrow + 1, dtype=np.int32)
    np.cumsum(np.bincount(a, minlength=nrow), out=xadj[1:])
    perm, _ = pymetis.nested_dissection(pymetis.CSRAdjacency(xadj, b.astype(np.int32)))
    return (np.asarray(perm, dtype=np.int64)[:, None] * bs + np.arange(bs)).reshape(-1).astype(np.int32)


def orderings(name, problem, x0, device) -> dict:
    """Where the analysis's ordering comes from (``CudssSolver(permutation=...)``), on the projected Hessian at
    ``x0``: cuDSS's own (LU, a second solver planned after it, 8 host threads, Cholesky with and without matching),
    cuDSS's ordering handed back to a new solver (what an on-disk cache of orderings would give) and its inverse (the
    convention check), METIS on the block graph (pymetis), and the natural order (cuDSS honours a user ordering:
    its factors grow). Per variant: the first solve's wall ms and analysis ms (CSR build + ordering + plan), the
    ordering's host ms, the median factorization and solve ms of 10 more solves, the factors' non-zeros and the
    relative residual. The big systems skip the inverse and natural orders (minutes of fill)."""
    H, b, x, b_norm = _projected_system(problem, x0)
    rec = {"system": name, "unknowns": problem.variable_count * problem.variable_dim, "orderings": {}}
    kept = {}

    def run(label, ordering_ms=0.0, **options):
        try:
            out, ls = _time_variant(H, b, x, b_norm, **options)
            out["ordering_ms"] = ordering_ms
            if label == "default":
                kept["perm"] = np.array(ls._solver.plan_info.row_permutation, dtype=np.int32, copy=True)
            rec["orderings"][label] = out
        except Exception as exc:
            rec["orderings"][label] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
        print(label, json.dumps(rec["orderings"][label], default=float)[:300], flush=True)

    small = rec["unknowns"] <= 100_000
    run("default")
    run("default_again")  # the same analysis once cuDSS is initialised in the process
    run("host_threads_8", host_threads=8)
    run("spd_or_general", matrix_type="spd_or_general")
    run("spd_no_matching", matrix_type="spd_or_general", use_matching=False)
    if "perm" in kept:
        run("cudss_perm_handed_back", permutation=kept["perm"])
        if small:
            run("cudss_perm_inverse", permutation=np.argsort(kept["perm"]).astype(np.int32))
    if small:
        run("natural_order", permutation=np.arange(rec["unknowns"], dtype=np.int32))
    try:
        t0 = time.perf_counter()
        perm = block_nested_dissection(H)
        run("metis", ordering_ms=(time.perf_counter() - t0) * 1e3, permutation=perm)
    except ImportError as exc:
        rec["orderings"]["metis"] = {"error": f"{exc}"}
    return rec


def analyses_in_threads(apps, device, workers=(1, 4, 8)) -> dict:
    """Whether cuDSS's analyses (host reordering) of several meshes run in parallel in threads of one process: each
    mesh's projected Hessian at its start is solved by a new ``CudssSolver`` (CSR build, analysis, factorization,
    solve), in the order of ``workers``: 1 is one after the other (no analysis cache), 0 the same with one shared cuDSS
    handle, -1 the same with an analysis cache in a fresh folder (misses the first time, hits after), n > 1 a thread
    pool of n (crashed the process on the H200 with 4)
    (nvmath's binding releases the GIL around cuDSS's calls). Per pool size: the wall s for all meshes, the sum of
    the analyses' ms, and the largest relative difference of the solutions from the one-after-the-other run."""
    from concurrent.futures import ThreadPoolExecutor

    from warp_meshad._src.solve import linear

    systems = []
    for a in apps:
        _, g, H = a.problem.eval_with_hessian_proj(a.uv)
        systems.append((H, wp.clone(g)))
    wp.synchronize_device(device)

    shared = {}

    import tempfile

    cache_dir = tempfile.mkdtemp(prefix="cudss_analysis_cache_")

    def first_solve(system, handle=None, cache=False):
        H, b = system
        x = wp.zeros_like(b)
        info = linear.CudssSolver(handle=handle, analysis_cache=cache).solve(H, b, x)
        return info.analysis_ms, x.numpy()

    rec = {"meshes": len(apps), "unknowns": int(sum(a.problem.variable_count * 2 for a in apps)), "pools": {}}
    reference = None
    for k, n in enumerate(workers):
        t0 = time.perf_counter()
        if n == 0:  # one after the other, every plan on one shared cuDSS handle
            if "handle" not in shared:
                from nvmath.bindings import cudss

                shared["handle"] = cudss.create()
            out = [first_solve(sy, shared["handle"]) for sy in systems]
        elif n == -1:  # one after the other with an analysis cache: a miss for each mesh the first time, then hits
            out = [first_solve(sy, cache=cache_dir) for sy in systems]
        elif n == 1:
            out = [first_solve(sy) for sy in systems]
        else:
            with ThreadPoolExecutor(n) as pool:
                out = list(pool.map(first_solve, systems))
        wp.synchronize_device(device)
        wall = time.perf_counter() - t0
        xs = [x for _, x in out]
        if reference is None:
            reference = xs
        diff = max(float(np.abs(x - r).max() / max(np.abs(r).max(), 1e-300)) for x, r in zip(xs, reference))
        key = f"{k}: " + {0: "1 thread, one shared handle", -1: "1 thread, analysis cache"}.get(
            n, f"{n} thread" + ("s" if n > 1 else ""))
        rec["pools"][key] = {"wall_s": wall, "analysis_ms_sum": float(sum(ms for ms, _ in out)),
                             "max_rel_diff_vs_serial": diff}
        print(f"{key}: {json.dumps(rec['pools'][key])}", flush=True)
    return rec


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--patches", default=None, help="folder of the 200-patch dataset (the batch system)")
    ap.add_argument("--batch", type=int, default=50)
    ap.add_argument("--reorderings-only", action="store_true", help="only the reordering algorithms' times")
    ap.add_argument("--orderings", action="store_true", help="only the orderings' sources (METIS, cuDSS's own, natural)")
    ap.add_argument("--factorizations", action="store_true",
                    help="only cuDSS's factorization/solve algorithms and ND levels (FACTORIZATION_VARIANTS)")
    ap.add_argument("--threads", type=int, nargs="*", default=None,
                    help="only the analyses of --patches meshes one after the other and in thread pools of these sizes")
    args = ap.parse_args(argv)
    wp.config.quiet = True
    from warp_meshad.app import app_class, load_config

    device = wp.get_device("cuda:0")
    flags = {"--device": {"device": "cuda:0"}}
    if args.threads is not None:
        if not args.patches:
            ap.error("--threads needs --patches")
        meshes = sorted(pathlib.Path(args.patches).glob("*.obj"))[: args.batch]
        apps = [app_class("param")(load_config("param/patches", flags=flags, overrides={"mesh": str(m)}))
                for m in meshes]
        # serial, serial with one handle, serial again (drift), serial with an analysis cache twice (misses, then
        # hits), then the pools (last: they crashed once); the plain runs with the cache off
        rec = analyses_in_threads(apps, device, [1, 0, 1, -1, -1] + [n for n in args.threads if n > 1])
        print(json.dumps(rec, default=float), flush=True)
        return 0
    if args.factorizations:
        e = app_class("elastic")(load_config("elastic/bunny", flags=flags))
        print(json.dumps(factorizations("elastic/bunny", e.problem, e.x, device, "spd"), default=float), flush=True)
        for scene in ("param/bunny_cut", "param/armadillo"):
            a = app_class("param")(load_config(scene, flags=flags))
            print(json.dumps(factorizations(scene, a.problem, a.uv, device), default=float), flush=True)
        return 0
    a = app_class("param")(load_config("param/armadillo", flags=flags))
    if args.orderings:
        print(json.dumps(orderings("param/armadillo", a.problem, a.uv, device), default=float), flush=True)
        e = app_class("elastic")(load_config("elastic/bunny", flags=flags))
        print(json.dumps(orderings("elastic/bunny", e.problem, e.x, device), default=float), flush=True)
    elif args.reorderings_only:
        print(json.dumps(reorderings("param/armadillo", a.problem, a.uv, device), default=float), flush=True)
    else:
        print(json.dumps(probe("param/armadillo", a.problem, a.uv, device), default=float), flush=True)
        e = app_class("elastic")(load_config("elastic/bunny", flags=flags))
        pinned = e.pinned if e.pinned.size else None
        print(json.dumps(probe("elastic/bunny", e.problem, e.x, device, fixed=pinned), default=float), flush=True)
    if args.patches:
        from warp_meshad import ProblemBatch

        meshes = sorted(pathlib.Path(args.patches).glob("*.obj"))[: args.batch]
        apps = [app_class("param")(load_config("param/patches", flags=flags, overrides={"mesh": str(m)}))
                for m in meshes]
        batch = ProblemBatch([p.problem for p in apps])
        x0 = batch.join([p.uv for p in apps])
        label = f"param batch of {len(apps)}"
        if args.orderings:
            rec = orderings(label, batch.problem, x0, device)
        else:
            rec = (reorderings if args.reorderings_only else probe)(label, batch.problem, x0, device)
        print(json.dumps(rec, default=float), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
