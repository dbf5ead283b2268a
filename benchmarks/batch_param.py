"""param over a dataset of patches: one mesh at a time against batched problems, in one process (issue 20).

Run on a GPU host (writes benchmarks/results/batch_param.json; the dataset from ``benchmarks/make_dataset.py``):

    python benchmarks/make_dataset.py --out /tmp/patches                        # 200 patches, 511 to 99,631 faces
    python -m benchmarks.batch_param --meshes /tmp/patches --device cuda:0 --batch-sizes 200 50 --ray-workers 2 4
    python -m benchmarks.batch_param --meshes assets/datasets/param_patches_small --device cpu --batch-sizes 20 \\
        --ray-workers 1 2                                                          # CPU: Ray with 1 against 2 workers

The scene is ``configs/param/patches.yaml`` (projected Newton on the symmetric Dirichlet energy from the area-scaled
Tutte embedding, Newton-decrement stop 1e-6, at most 200 iterations; ``linear_solver: auto``: cuDSS on a GPU, QDLDL on
the CPU), every app built exactly as ``warp-meshad run`` builds it. After a warm-up that compiles and loads every
kernel, each method runs the whole dataset:

* ``one_at_a_time``: per mesh, ``App(config)`` (mesh load, Tutte start, problem) then ``app.run()`` (its own
  NewtonSolver);
* ``batched_B``: the same apps in chunks of B, each chunk's steps as one :class:`~warp_meshad.ProblemBatch` solved by
  one :class:`~warp_meshad.BatchNewtonSolver` (``warp_meshad.app.step_batched``, what ``warp-meshad batch``
  does);
* ``runner_*``: ``run_batch`` end to end (outputs written: final.obj, metrics.json, summary.csv/png), in process
  one at a time and batched, and on Ray with ``--ray-workers`` workers (sharing the GPU: 1/N of it each). Ray is
  started once before those runs (the batch module's ``start_ray``, timed as ``ray_start``), as a batch finds it on
  a running cluster; each run starts its own workers within its time.

Every batched mesh is checked against its one-at-a-time run (E within 1e-8 relative, iterations within 1). Reported:
total wall time, its build / solve split, time per mesh, and the GPU utilisation sampled by ``nvidia-smi`` every
100 ms during the method (mean and p90 of the samples).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import subprocess
import tempfile
import threading
import time

import numpy as np

from benchmarks.common import out_dir

NAME = "batch_param"


class _GpuSampler:
    """``nvidia-smi`` utilisation samples [%] every 100 ms while active (none where there is no nvidia-smi)."""

    def __init__(self):
        self.samples: list[float] = []
        self._proc = None
        self._thread = None

    def __enter__(self):
        if shutil.which("nvidia-smi") is None:
            return self
        self._proc = subprocess.Popen(["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits",
                                       "-lms", "100", "-i", "0"], stdout=subprocess.PIPE, text=True)  # fmt: skip

        def read():
            for line in self._proc.stdout:
                try:
                    self.samples.append(float(line.strip()))
                except ValueError:
                    pass

        self._thread = threading.Thread(target=read, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        if self._proc is not None:
            self._proc.terminate()
            self._proc.wait()
            self._thread.join(timeout=2)

    def summary(self) -> dict:
        if not self.samples:
            return {"gpu_util_mean": None, "gpu_util_p90": None, "gpu_util_samples": 0}
        s = np.array(self.samples)
        return {"gpu_util_mean": float(s.mean()), "gpu_util_p90": float(np.percentile(s, 90)),
                "gpu_util_samples": int(s.size)}


class _Phases:
    """Wall time summed per phase while active: mesh file reads, Tutte embeddings, and the linear back-ends' own
    ``LinearSolveInfo`` (analysis / factorization / solve ms, calls), by wrapping those entry points (class and module
    attributes, looked up at call time). The rest of build and solve is what the apps and solvers do around them."""

    def __init__(self):
        self.sums: dict[str, float] = {}
        self._undo = []

    def _add(self, key, value):
        self.sums[key] = self.sums.get(key, 0.0) + value

    def _timed(self, owner, name, key):
        original = owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)
        fn = original.__func__ if isinstance(original, classmethod) else original

        def wrapper(*a, **kw):
            t0 = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                self._add(key + "_s", time.perf_counter() - t0)
                self._add(key + "_calls", 1)

        setattr(owner, name, classmethod(wrapper) if isinstance(original, classmethod) else wrapper)
        self._undo.append((owner, name, original))

    def _solver(self, cls):
        original = cls.__dict__["solve"]

        def solve(solver, A, b, x):
            t0 = time.perf_counter()
            info = original(solver, A, b, x)
            self._add("linear_wall_s", time.perf_counter() - t0)
            self._add("linear_calls", 1)
            self._add("analysis_s", info.analysis_ms / 1e3)
            self._add("analyses", float(info.analysis_ms > 0.0))
            self._add("factor_s", info.factor_ms / 1e3)
            self._add("triangular_solve_s", info.solve_ms / 1e3)
            return info

        cls.solve = solve
        self._undo.append((cls, "solve", original))

    def __enter__(self):
        import warp_meshad
        from warp_meshad import TriMesh
        from warp_meshad._src.solve import linear

        self._timed(TriMesh, "from_file", "mesh_read")
        self._timed(warp_meshad, "tutte_embedding", "tutte")
        self._solver(linear.reuse._ReusedFactors)  # the direct back-ends' solve (cuDSS, QDLDL, SciPy)
        self._timed(linear.CudssSolver, "_direct_solver", "cudss_plan")  # cuDSS analyses (reordering, symbolic)
        return self

    def __exit__(self, *exc):
        for owner, name, original in reversed(self._undo):
            setattr(owner, name, original)

    def summary(self) -> dict:
        return {k: round(v, 4) for k, v in sorted(self.sums.items())}


def _configs(flags, meshes, extra=None):
    from warp_meshad.app import load_config

    tmp = pathlib.Path(tempfile.mkdtemp(prefix="batch_param_"))
    return [load_config("param/patches", overrides={"mesh": str(m), "output": str(tmp / m.stem), **(extra or {})},
                        flags=flags) for m in meshes]  # fmt: skip


def _build(configs, ahead=None, first: int = 0):
    from warp_meshad.app import app_class

    cls = app_class("param")
    return [cls(c, None if ahead is None else ahead.get(first + k)) for k, c in enumerate(configs)]


def _per_mesh(apps) -> list[dict]:
    return [{"name": pathlib.Path(a.config.mesh).stem, "faces": int(a.mesh.face_count),
             "iterations": int(sum(r["iterations"] for r in a.history)), "energy": float(a.energy),
             "reason": a.history[-1]["reason"]} for a in apps]


def _ahead(configs, jobs: int):
    from warp_meshad.app import Prefetch

    return Prefetch(configs, jobs) if jobs else None


def one_at_a_time(configs, jobs: int = 0) -> tuple[dict, list[dict]]:
    """``jobs``: processes building ahead (``App.prepare``), 0: none (the app builds itself)."""
    build = solve = 0.0
    apps = []
    ahead = _ahead(configs, jobs)
    for i, c in enumerate(configs):
        t0 = time.perf_counter()
        app = _build([c], ahead, i)[0]
        t1 = time.perf_counter()
        app.run()
        t2 = time.perf_counter()
        build, solve = build + t1 - t0, solve + t2 - t1
        apps.append(app)
    if ahead is not None:
        ahead.close()
    return {"build_s": build, "solve_s": solve}, _per_mesh(apps)


def batched(configs, size: int, jobs: int = 0) -> tuple[dict, list[dict]]:
    from warp_meshad.app import step_batched

    build = solve = 0.0
    rows = []
    ahead = _ahead(configs, jobs)
    for i in range(0, len(configs), size):
        t0 = time.perf_counter()
        apps = _build(configs[i:i + size], ahead, i)
        t1 = time.perf_counter()
        if not step_batched(apps):
            raise RuntimeError("param's steps did not batch")
        t2 = time.perf_counter()
        build, solve = build + t1 - t0, solve + t2 - t1
        rows += _per_mesh(apps)
    if ahead is not None:
        ahead.close()
    return {"build_s": build, "solve_s": solve}, rows


def _check(reference: list[dict], rows: list[dict]) -> dict:
    """Each mesh's row against the reference's row of the same name (run_batch's rows come in its own order)."""
    by_name = {r["name"]: r for r in rows}
    missing = [a["name"] for a in reference if a["name"] not in by_name]
    pairs = [(a, by_name[a["name"]]) for a in reference if a["name"] in by_name]
    rel = [abs(a["energy"] - b["energy"]) / abs(a["energy"]) for a, b in pairs]
    its = [abs(a["iterations"] - b["iterations"]) for a, b in pairs]
    close = sum(1 for r, i in zip(rel, its) if r <= 1e-8 and i <= 1)
    return {"max_energy_rel_diff": float(max(rel)), "max_iteration_diff": int(max(its)), "compared": len(pairs),
            "missing": missing[:10], "meshes_same": close,
            "same": bool(not missing and max(rel) <= 1e-8 and max(its) <= 1)}


def _said(check: dict) -> str:
    """A :func:`_check` result in words."""
    return (f"same results: {check['same']} ({check['meshes_same']} of {check['compared']} meshes within 1e-8 and "
            f"+-1 iteration; largest E rel {check['max_energy_rel_diff']:.1e}, iterations "
            f"+-{check['max_iteration_diff']})")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--meshes", required=True, help="a folder of patches (benchmarks/make_dataset.py)")
    parser.add_argument("--device", default=None, help="cpu or cuda:0 (default: the first CUDA device, else cpu)")
    parser.add_argument("--count", type=int, default=None, help="use the first N meshes")
    parser.add_argument("--batch-sizes", type=int, nargs="*", default=[200, 50],
                        help="batch sizes of the batched runs (none: only the reference and the Ray runs)")
    parser.add_argument("--ray-workers", type=int, nargs="*", default=[], help="run_batch on Ray with these counts")
    parser.add_argument("--no-runner", action="store_true", help="skip the run_batch (outputs written) methods")
    parser.add_argument("--runner-batch-size", type=int, default=50)
    parser.add_argument("--max-faces", type=int, default=None, help="use only the meshes of at most this many faces")
    parser.add_argument("--build-jobs", type=int, nargs="*", default=[],
                        help="also run one_at_a_time and each batch size with this many processes building ahead")
    parser.add_argument("--skip-reference", action="store_true",
                        help="no one-at-a-time reference (compare with an earlier run's); with --build-jobs only the "
                             "batches built ahead")
    parser.add_argument("--ray-only", action="store_true",
                        help="only the Ray runs (e.g. 1 against 2 workers on the CPU), no one-at-a-time reference")
    parser.add_argument("--deterministic", action="store_true",
                        help="the scene with deterministic: true (no float atomics in the assembly)")
    parser.add_argument("--repeat-reference", action="store_true",
                        help="run the one-at-a-time reference twice and compare the runs (the GPU's run-to-run spread)")
    args = parser.parse_args(argv)

    import warp as wp

    wp.config.quiet = True
    from warp_meshad.app import find_meshes, load_config, run_batch

    meshes = find_meshes(args.meshes)
    if args.max_faces is not None:
        from warp_meshad import TriMesh

        meshes = [m for m in meshes if TriMesh.from_file(m).face_count <= args.max_faces]
    meshes = meshes[: args.count]
    flags = {"--device": {"device": args.device}} if args.device else {}
    extra = {"deterministic": True} if args.deterministic else {}
    base = load_config("param/patches", flags=flags, overrides=extra)
    configs = _configs(flags, meshes, extra)
    device = str(_build(configs[:1])[0].device)
    print(f"{NAME}: {len(meshes)} meshes from {args.meshes} on {device}", flush=True)

    # warm-up: every kernel of both paths compiled and loaded (two smallest meshes)
    small = sorted(configs, key=lambda c: pathlib.Path(c.mesh).stat().st_size)[:2]
    one_at_a_time(small[:1])
    batched(small, 2)

    records = []

    def run(method, fn, *a):
        with _GpuSampler() as gpu, _Phases() as phases:
            t0 = time.perf_counter()
            times, rows = fn(*a)
            total = time.perf_counter() - t0
        rec = {"method": method, "meshes": len(rows), "total_s": total, "per_mesh_ms": 1000.0 * total / len(rows),
               **times, **gpu.summary(), "phases": phases.summary()}
        records.append(rec)
        print(json.dumps(rec), flush=True)
        return rows

    reference = None
    if not args.ray_only and not args.skip_reference:
        reference = run("one_at_a_time", one_at_a_time, configs)
        faces = [r["faces"] for r in reference]
        its = [r["iterations"] for r in reference]
        print(f"  faces {min(faces)}-{max(faces)} (total {sum(faces)}), iterations {min(its)}-{max(its)} "
              f"(median {int(np.median(its))})", flush=True)
        if args.repeat_reference:
            rows = run("one_at_a_time_again", one_at_a_time, _configs(flags, meshes, extra))
            records[-1].update(_check(reference, rows))
            print(f"  the reference again: {_said(records[-1])}", flush=True)
    for jobs in ([] if args.ray_only or args.skip_reference else args.build_jobs):
        rows = run(f"one_at_a_time_ahead_{jobs}", one_at_a_time, configs, jobs)
        records[-1].update(_check(reference, rows))
        records[-1]["speedup_vs_one_at_a_time"] = records[0]["total_s"] / records[-1]["total_s"]
        print(f"  {records[-1]['method']}: {records[-1]['speedup_vs_one_at_a_time']:.2f}x", flush=True)
    runs = [(size, 0) for size in args.batch_sizes] + [(size, j) for j in args.build_jobs for size in args.batch_sizes]
    if args.skip_reference and args.build_jobs:
        runs = [r for r in runs if r[1]]
    for size, jobs in ([] if args.ray_only else runs):
        rows = run(f"batched_{size}" + (f"_ahead_{jobs}" if jobs else ""), batched, configs, size, jobs)
        if reference is None:
            continue
        records[-1].update(_check(reference, rows))
        records[-1]["speedup_vs_one_at_a_time"] = records[0]["total_s"] / records[-1]["total_s"]
        print(f"  {records[-1]['method']}: {records[-1]['speedup_vs_one_at_a_time']:.2f}x, {_said(records[-1])}",
              flush=True)

    def runner(method, **kw):
        out = pathlib.Path(tempfile.mkdtemp(prefix=f"{method}_"))

        def go():
            rep = run_batch(base, meshes, out, quiet=True, **kw)
            if rep.counts["done"] != len(meshes):
                raise RuntimeError(f"{method}: {rep.counts}")
            return {}, [{"name": r["name"], "energy": float(r["final_energy"]), "iterations": int(r["iterations"])}
                        for r in rep.rows]

        try:
            rows = run(method, lambda: go())
            if reference is not None:
                records[-1].update(_check(reference, rows))
                speedup = records[0]["total_s"] / records[-1]["total_s"]
                print(f"  {method}: {speedup:.2f}x against one at a time, {_said(records[-1])}", flush=True)
        except Exception as exc:  # Ray missing or failing: recorded, the rest goes on
            records.append({"method": method, "error": f"{type(exc).__name__}: {exc}"})
            print(json.dumps(records[-1]), flush=True)
        finally:
            shutil.rmtree(out, ignore_errors=True)

    if not args.no_runner and not args.ray_only:
        b = args.runner_batch_size
        runner("runner_one_at_a_time", batch_size=b, batched=False)
        runner(f"runner_batched_{b}", batch_size=b, batched=True)
    if args.ray_workers:
        # Ray started once, apart: the runs below are what a batch costs on a running cluster (as with --address);
        # each run still starts its workers (Warp import, kernel loads) inside its time
        from warp_meshad._src.app.batch import start_ray

        t0 = time.perf_counter()
        try:
            start_ray()
            records.append({"method": "ray_start", "total_s": time.perf_counter() - t0})
        except Exception as exc:
            records.append({"method": "ray_start", "error": f"{type(exc).__name__}: {exc}"})
        print(json.dumps(records[-1]), flush=True)
    for w in args.ray_workers:
        b = max(1, min(args.runner_batch_size, -(-len(meshes) // w)))
        runner(f"runner_ray_{w}_workers_batched_{b}", batch_size=b, batched=True, workers=w)
    ray = [r for r in records if r["method"].startswith("runner_ray_") and "total_s" in r]
    if len(ray) > 1:
        print("  Ray: " + ", ".join(f"{r['method']} {ray[0]['total_s'] / r['total_s']:.2f}x" for r in ray[1:])
              + f" against {ray[0]['method']}", flush=True)

    path = out_dir() / f"{NAME}.json"
    payload = {"benchmark": NAME, "device": device, "deterministic": bool(args.deterministic), "meshes": len(meshes), "source": str(args.meshes),
               "date": time.strftime("%Y-%m-%d"), "records": records, "per_mesh_reference": reference}
    if not str(device).startswith("cuda"):
        path = out_dir() / f"{NAME}_cpu.json"
    path.write_text(json.dumps(payload, indent=1))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
