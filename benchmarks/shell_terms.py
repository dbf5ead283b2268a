"""The shells scene's derivatives + assembly, kernel by kernel: where the time of ``eval_with_hessian_proj`` goes.

Run on a GPU host (writes $BENCH_OUT or benchmarks/results/shell_terms.json):

    python -m benchmarks.shell_terms                                     # spot_pile's 700 Spots
    python -m benchmarks.shell_terms --set layout=[4,1,1] --device cpu --runs 2   # CPU smoke run

The scene is built as ``shells_pile`` builds it (no step taken; the contact pairs of the initial positions are
set, which for spot_pile's 1 cm gaps are none; ``--noise`` deforms the shells first). Three variants of the same evaluation are timed:
``hessian_proj`` with the unrolled Jacobi (literal indices on the packed upper triangle; the CUDA default for
k <= 12), ``hessian_proj`` with the loop Jacobi (runtime indices on a k x k matrix in local memory), and
``hessian`` (no projection: the dual evaluation and assembly alone); and the first once more with the contact
pairs set again before each evaluation, as the app does every Newton iteration (the evaluation then merges the
interaction blocks into the pattern on the device, even when there are none). Each is checked first: both projections
give the same matrix (relative difference of the BSR values, printed), and the plain Hessian's gradient and
energy equal the projected one's.

Per variant: the wall time of a synchronized ``eval_with_hessian_proj`` (median of ``--runs``), and the GPU
time of each kernel from Warp's activity timing (``wp.timing_begin``; summed over the launches of one
evaluation, median over the runs), so the element kernels of the membrane, the bending, the inertia and the
contact terms show apart from the pattern merge, the clears and the energy sum.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import time

import numpy as np
import warp as wp

from benchmarks.common import guard_cpu_out, out_dir, record

NAME = "shell_terms"
VARIANTS = ("hessian_proj unrolled", "hessian_proj loop", "hessian", "hessian_proj unrolled, pairs set each time")


def _evaluate(problem, x, variant):
    if variant == "hessian":
        return problem.eval_with_hessian(x)
    return problem.eval_with_hessian_proj(x)


def _set_variant(problem, variant):
    problem.unrolled_projection = variant != "hessian_proj loop"
    for t in problem.terms:
        t.kernels.clear()


def _before(app, variant):
    """What the app does before each evaluation: set the contact pairs (so the next Hessian evaluation merges
    the interaction blocks into the pattern again), for the last variant only; untimed."""
    if variant.endswith("pairs set each time"):
        app.set_contact_pairs(app.search.find_pairs(app.x, app.d_hat))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="shells/spot_pile")
    ap.add_argument("--device", default=None)
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--set", nargs="*", default=[], help="config overrides key=value")
    ap.add_argument("--noise", type=float, default=0.0,
                    help="move every vertex by a uniform random vector of up to this length [m] first (a deformed state)")
    args = ap.parse_args(argv)
    from warp_meshad._src.app.loader import parse_set
    from warp_meshad.app import app_class, load_config

    flags = {"--device": {"device": args.device}} if args.device else {}
    config = load_config(args.config, parse_set(args.set), flags=flags)
    app = app_class(config.app, config.source)(config)
    dev = wp.get_device(app.device)
    guard_cpu_out(dev.is_cuda)
    print(app.describe(), flush=True)
    p, x = app.problem, app.x
    if args.noise > 0.0:
        rng = np.random.default_rng(0)
        xn = x.numpy() + rng.uniform(-args.noise, args.noise, (x.shape[0], 3))
        wp.copy(x, wp.array(xn, dtype=x.dtype, device=x.device))
    counts = app.set_contact_pairs(app.search.find_pairs(x, app.d_hat))
    print(f"pairs: point-triangle {counts[0]}, edge-edge {counts[1]}", flush=True)
    sizes = {t.label: int(t.count) for t in p.terms}
    print("elements: " + ", ".join(f"{k} {v}" for k, v in sizes.items()), flush=True)

    results, values = {}, {}
    for variant in VARIANTS:
        _set_variant(p, variant)
        _before(app, variant)
        t0 = time.perf_counter()
        f, g, H = _evaluate(p, x, variant)  # compiles (or loads) the variant's kernels
        wp.synchronize_device(dev)
        first_ms = 1e3 * (time.perf_counter() - t0)
        nnz = int(H.nnz_sync())
        values[variant] = (float(f), g.numpy().copy(), H.values.numpy()[:nnz].copy(),
                           np.concatenate([H.offsets.numpy(), H.columns.numpy()[:nnz]]))
        walls, per_kernel = [], collections.defaultdict(list)
        for _ in range(args.runs):
            _evaluate(p, x, variant)
            _before(app, variant)
            wp.synchronize_device(dev)
            t0 = time.perf_counter()
            if dev.is_cuda:
                wp.timing_begin(cuda_filter=wp.TIMING_KERNEL)
            _evaluate(p, x, variant)
            wp.synchronize_device(dev)
            walls.append(1e3 * (time.perf_counter() - t0))
            if dev.is_cuda:
                sums = collections.Counter()
                for r in wp.timing_end():
                    sums[r.name] += r.elapsed
                for name, ms in sums.items():
                    per_kernel[name].append(ms)
        kernels = {name: statistics.median(v) for name, v in per_kernel.items()}
        results[variant] = dict(wall_ms=walls, first_call_ms=first_ms, kernel_ms=kernels)
        print(f"{variant}: wall median {statistics.median(walls):.2f} ms (first call {first_ms:.0f} ms)", flush=True)
        for name, ms in sorted(kernels.items(), key=lambda kv: -kv[1])[:12]:
            print(f"    {ms:9.3f} ms  {name}", flush=True)

    # correctness: the two projections agree; the plain Hessian has the same energy and gradient; merging the
    # (empty) interaction blocks again leaves the pattern and the values as they were
    def rel(a, b):
        return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-300))

    fu, gu, hu, pu = values["hessian_proj unrolled"]
    fl, _, hl, pl = values["hessian_proj loop"]
    fh, gh, _, _ = values["hessian"]
    fr, gr, hr, pr = values["hessian_proj unrolled, pairs set each time"]
    proj_diff, grad_diff = rel(hu, hl), rel(gu, gh)
    same_pattern = np.array_equal(pu, pl) and np.array_equal(pu, pr)
    rebuilt_diff = rel(hr, hu) if same_pattern else np.inf
    print(f"unrolled vs loop projection: max |dH| / max |H| = {proj_diff:.2e}; gradient (proj vs plain) {grad_diff:.2e}; "
          f"pattern rebuilt each time vs kept: {rebuilt_diff:.2e}; energies {fu:.12e} {fl:.12e} {fh:.12e} {fr:.12e}",
          flush=True)
    energies_agree = all(np.isclose(f_, fh, rtol=1e-12) for f_ in (fu, fl, fr))
    if not (same_pattern and proj_diff < 1e-8 and grad_diff < 1e-12 and rebuilt_diff < 1e-12 and rel(gr, gu) < 1e-12
            and energies_agree):
        raise SystemExit("variants disagree: timings not recorded")

    recs = [
        record(NAME, variant, app.mesh.vertex_count, "float64", r["wall_ms"], str(app.device),
               first_call_ms=r["first_call_ms"], kernel_ms=r["kernel_ms"], elements=sizes,
               pairs=dict(point_triangle=counts[0], edge_edge=counts[1]), objects=app.count,
               projection_max_rel_diff=proj_diff, noise=args.noise)
        for variant, r in results.items()
    ]
    path = out_dir() / f"{NAME}.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(recs, indent=1))
    os.replace(tmp, path)
    print(f"wrote {path}", flush=True)
    return recs


if __name__ == "__main__":
    main()
