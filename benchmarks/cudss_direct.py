"""What a cuDSS solve costs around cuDSS itself, and what the analysis costs a second time (issue 19 item 2): one process.

    python -m benchmarks.cudss_direct            # CUDA only

Systems: the projected Hessians of param/armadillo at its Tutte start (64k unknowns) without a pin (LU) and with
vertex 0 pinned (``spd_or_general``: Cholesky), and of elastic/bunny's first step (3k unknowns, its pins, Cholesky).
Per system, one JSON line with:

- ``calls``: ``CudssSolver.solve`` through nvmath's ``factorize``/``solve`` against direct cuDSS calls
  (``direct_calls``), each timed three ways: synchronized per call (wall and GPU ms between CUDA events), and
  queued 20 at a time with ``solve_deferred`` (host ms to queue one call; total ms per call once the device is idle);
- ``capture``: whether a direct-call solve (CSR refill, factorization, solve) can be captured in a CUDA graph
  (``wp.ScopedCapture``), the replay's GPU ms, and the relative difference of a replay on new values from an
  uncaptured solve on them;
- ``analysis_cache``: a plan without the cache, the plan that writes it (miss) and one that takes it back (hit):
  analysis ms, factorization ms, factors' non-zeros, relative residual.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time

import numpy as np
import warp as wp

from benchmarks.cudss_calls import _events_ms


def _system(problem, x0, pinned):
    """(H, b, ||b||): the projected Hessian at ``x0`` and ``-g``, with ``pinned`` rows made Dirichlet rows."""
    from warp_meshad._src.solve.constraints import apply_dirichlet, fixed_mask_from_indices
    from warp_meshad._src.solve.vector_ops import scale_into

    _, g, H = problem.eval_with_hessian_proj(x0)
    b = wp.empty_like(g)
    scale_into(b, -1.0, g)
    if pinned is not None:
        mask = fixed_mask_from_indices(np.asarray(pinned, dtype=np.int32), problem.variable_count, problem.device,
                                       what="pinned")
        apply_dirichlet(H, b, mask)
    return H, b, float(np.linalg.norm(b.numpy()))


def _scale(H, factor):
    v = H.values.numpy()
    H.values.assign(v * factor)


def calls(H, b, device, matrix_type) -> dict:
    from warp_meshad._src.solve import linear

    out = {}
    for label, direct in (("nvmath_calls", False), ("direct_calls", True)):
        ls = linear.CudssSolver(matrix_type=matrix_type, direct_calls=direct)
        x = wp.zeros_like(b)
        ls.solve(H, b, x)
        wall, gpu = _events_ms(lambda: ls.solve(H, b, x), device, runs=30)
        residual_sq = wp.zeros(1, dtype=wp.float64, device=device)
        wp.synchronize_device(device)
        queued = []
        t0 = time.perf_counter()
        for _ in range(20):
            t1 = time.perf_counter()
            ls.solve_deferred(H, b, x, residual_sq)
            queued.append((time.perf_counter() - t1) * 1e3)
        wp.synchronize_device(device)
        total = (time.perf_counter() - t0) * 1e3 / 20
        out[label] = {"sync_wall_ms": wall, "sync_gpu_ms": gpu, "queue_ms_per_call": statistics.median(queued),
                      "deferred_total_ms_per_call": total, "active_matrix_type": ls.active_matrix_type}
        print(label, json.dumps(out[label]), flush=True)
    return out


def capture(H, b, device, matrix_type) -> dict:
    from warp_meshad._src.solve import linear

    ls = linear.CudssSolver(matrix_type=matrix_type)
    x = wp.zeros_like(b)
    residual_sq = wp.zeros(1, dtype=wp.float64, device=device)
    ls.solve(H, b, x)  # plan, descriptors, first-factorization check
    rec = {"capturable_for": ls.capturable_for(H)}
    try:
        with wp.ScopedCapture(device, force_module_load=False) as cap:
            ls.solve_deferred(H, b, x, residual_sq)
        graph = cap.graph
    except Exception as exc:  # noqa: BLE001 (the finding)
        rec["captured"] = False
        rec["error"] = f"{type(exc).__name__}: {exc}"[:400]
        return rec
    rec["captured"] = True
    _, rec["replay_gpu_ms"] = _events_ms(lambda: wp.capture_launch(graph), device, runs=30)
    _scale(H, 1.7)
    x.zero_()
    wp.capture_launch(graph)
    wp.synchronize_device(device)
    replayed = x.numpy().copy()
    fresh = linear.CudssSolver(matrix_type=matrix_type)
    x2 = wp.zeros_like(b)
    fresh.solve(H, b, x2)
    want = x2.numpy()
    rec["replay_vs_fresh_rel_diff"] = float(np.abs(replayed - want).max() / max(np.abs(want).max(), 1e-300))
    rec["replay_residual_rel"] = float(np.sqrt(max(residual_sq.numpy()[0], 0.0)) / max(np.linalg.norm(b.numpy()), 1e-300))
    _scale(H, 1.0 / 1.7)
    return rec


def analysis_cache(H, b, b_norm, device, matrix_type) -> dict:
    from warp_meshad._src.solve import linear

    rec = {}
    with tempfile.TemporaryDirectory() as folder:
        for label, cache in (("no_cache", False), ("miss", folder), ("hit", folder), ("hit_again", folder)):
            ls = linear.CudssSolver(matrix_type=matrix_type, analysis_cache=cache)
            x = wp.zeros_like(b)
            wp.synchronize_device(device)
            t0 = time.perf_counter()
            first = ls.solve(H, b, x)
            first_ms = (time.perf_counter() - t0) * 1e3
            infos = [ls.solve(H, b, x) for _ in range(10)]
            rec[label] = {"first_solve_ms": first_ms, "analysis_ms": first.analysis_ms, "hit": ls.analysis_cache_hit,
                          "factor_ms": statistics.median(i.factor_ms for i in infos),
                          "solve_ms": statistics.median(i.solve_ms for i in infos),
                          "lu_nnz": int(ls._solver.factorization_info.lu_nnz),
                          "relative_residual": infos[-1].residual_norm / b_norm,
                          "active_matrix_type": ls.active_matrix_type}
            print(label, json.dumps(rec[label]), flush=True)
    return rec


def main(argv=None) -> int:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parts", nargs="*", default=["calls", "capture", "analysis_cache"])
    args = ap.parse_args(argv)
    wp.config.quiet = True
    from warp_meshad.app import app_class, load_config

    device = wp.get_device("cuda:0")
    flags = {"--device": {"device": "cuda:0"}}
    a = app_class("param")(load_config("param/armadillo", flags=flags))
    e = app_class("elastic")(load_config("elastic/bunny", flags=flags))
    systems = [("param/armadillo, no pin", a.problem, a.uv, None, "general"),
               ("param/armadillo, vertex 0 pinned", a.problem, a.uv, [0], "spd_or_general"),
               ("elastic/bunny first step", e.problem, e.x, e.pinned if e.pinned.size else None, "spd_or_general")]
    for name, problem, x0, pinned, mtype in systems:
        H, b, b_norm = _system(problem, x0, pinned)
        rec = {"system": name, "unknowns": problem.variable_count * problem.variable_dim, "matrix_type": mtype}
        for key, fn in (("calls", lambda: calls(H, b, device, mtype)), ("capture", lambda: capture(H, b, device, mtype)),
                        ("analysis_cache", lambda: analysis_cache(H, b, b_norm, device, mtype))):
            if key not in args.parts:
                continue
            try:
                rec[key] = fn()
            except Exception as exc:  # noqa: BLE001 (one failing part must not lose the others)
                rec[key] = {"error": f"{type(exc).__name__}: {exc}"[:400]}
        print(json.dumps(rec, default=float), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
