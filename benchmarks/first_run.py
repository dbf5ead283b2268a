"""What a user waits for around the solve: whole ``warp-meshad run`` processes, one cold and several warm, phase by
phase, and the package's import.

    python -m benchmarks.first_run                                     # param/armadillo, cloth/hanging on cuda:0
    python -m benchmarks.first_run param/armadillo --warm 10 --set screenshot=false
    BENCH_OUT=/tmp/first_run python -m benchmarks.first_run cloth/hanging:test --device cpu --warm 2   # CPU smoke run

Per scene (``app/scene``, or ``app/scene:test`` for its test size): one cold process, whose ``WARP_CACHE_PATH`` and
``WARP_MESHAD_CACHE_PATH`` are new empty folders (Warp's kernel cache, the generated dual modules and the content
cache of mesh reads and start points: what a new user meets), then ``--warm`` processes with the folders the cold one
filled. Each is ``python -m warp_meshad run SCENE --device DEV --headless --quiet --output TMP`` (plus ``--set``), timed
by the wall clock around the subprocess; its ``metrics.json`` gives the phases (``phases_s``: start, setup, steps,
outputs; see warp_meshad/_src/app/phases.py), their total from the process's start, the solver's time and the compile
summary. ``python -c "import warp_meshad"`` and ``python -c "import warp_meshad.app"`` are timed ``--warm`` times too.

Writes ``first_run.json`` to ``$BENCH_OUT`` (default benchmarks/results; a CPU run without it: ``$TMPDIR/bench_cpu``):
one record per process, and per scene one ``warm median`` record (the wall, the total and every phase: medians over
the warm processes). Prints a table: cold and warm wall, then the warm medians phase by phase.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from benchmarks.common import guard_cpu_out, out_dir

NAME = "first_run"
DEFAULT_SCENES = ("param/armadillo", "cloth/hanging")
ROOT = pathlib.Path(__file__).resolve().parents[1]


def _env(cache: pathlib.Path) -> dict:
    return dict(os.environ, WARP_CACHE_PATH=str(cache / "warp"), WARP_MESHAD_CACHE_PATH=str(cache / "warp_meshad"))


def run_process(scene: str, test: bool, device: str, sets: list[str], cache: pathlib.Path, output: pathlib.Path,
                kind: str, index: int) -> dict:
    """One ``warp-meshad run`` process: its wall time and what its metrics.json says of its phases."""
    cmd = [sys.executable, "-m", "warp_meshad", "run", scene, "--device", device, "--headless", "--quiet",
           "--output", str(output)] + (["--test"] if test else [])
    for s in sets:
        cmd += ["--set", s]
    shutil.rmtree(output, ignore_errors=True)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=_env(cache), capture_output=True, text=True, cwd=ROOT)
    wall = time.perf_counter() - t0
    rec = {"benchmark": NAME, "scene": scene, "test_size": test, "device": device, "set": sets, "run": kind,
           "index": index, "wall_s": round(wall, 4), "rc": proc.returncode}
    metrics = output / "metrics.json"
    if proc.returncode != 0 or not metrics.is_file():
        rec["error"] = (proc.stderr or proc.stdout)[-3000:]
        return rec
    m = json.loads(metrics.read_text())
    rec["phases_s"] = m.get("phases_s", {})
    rec["phases_total_s"] = m.get("phases_total_s")
    times = m.get("time_ms", {})
    rec["solver_ms"] = {k: v for k, v in times.items() if k.startswith("solver_")}
    rec["time_ms"] = {k: v for k, v in times.items() if not k.startswith("solver_")}  # setup, run, outputs, compile
    c = m.get("compile", {})
    rec["compile"] = {k: c.get(k) for k in ("cache_warm", "modules_loaded", "modules_compiled", "compile_s", "load_s",
                                             "first_step_s", "median_step_s")}
    rec.update(steps=m.get("steps"), iterations=m.get("iterations"), check_final=m.get("check_final"),
               outputs=sorted(p.name for p in output.iterdir() if not p.name.startswith(".")))
    return rec


def time_import(module: str, runs: int) -> dict:
    """Wall time of ``python -c "import MODULE"`` (warm: the files are in the page cache after the first)."""
    walls = []
    for _ in range(runs + 1):
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True, text=True, cwd=ROOT)
        walls.append(time.perf_counter() - t0)
        if proc.returncode != 0:
            return {"benchmark": NAME, "run": "import", "module": module, "error": proc.stderr[-2000:]}
    walls = walls[1:]
    return {"benchmark": NAME, "run": "import", "module": module, "wall_s": [round(w, 4) for w in walls],
            "median_s": round(statistics.median(walls), 4), "min_s": round(min(walls), 4)}


def warm_median(records: list[dict]) -> dict | None:
    """The medians over the warm processes of one scene: wall, total and every phase (``{group: {phase: s}}``)."""
    ok = [r for r in records if r["run"] == "warm" and "error" not in r]
    if not ok:
        return None
    phases: dict = {}
    for r in ok:
        for group, named in r.get("phases_s", {}).items():
            for name in named:
                phases.setdefault(group, {}).setdefault(name, [])
    for group, named in phases.items():
        for name in named:
            named[name] = round(statistics.median(r.get("phases_s", {}).get(group, {}).get(name, 0.0) for r in ok), 4)
    totals = [r["phases_total_s"] for r in ok if r.get("phases_total_s") is not None]
    first = ok[0]
    times = {k: round(statistics.median(r.get("time_ms", {}).get(k, 0.0) for r in ok), 2)
             for k in dict.fromkeys(k for r in ok for k in r.get("time_ms", {}))}
    return {"benchmark": NAME, "scene": first["scene"], "test_size": first["test_size"], "device": first["device"],
            "set": first["set"], "run": "warm median", "runs": len(ok), "time_ms": times,
            "wall_s": round(statistics.median(r["wall_s"] for r in ok), 4),
            "phases_total_s": round(statistics.median(totals), 4) if totals else None, "phases_s": phases}


def table(records: list[dict]) -> str:
    """Cold and warm wall per scene, then the warm medians phase by phase."""
    lines = []
    scenes = list(dict.fromkeys((r["scene"], r["test_size"]) for r in records if "scene" in r))
    for scene, test in scenes:
        mine = [r for r in records if r.get("scene") == scene and r.get("test_size") == test]
        cold = next((r for r in mine if r["run"] == "cold"), None)
        med = next((r for r in mine if r["run"] == "warm median"), None)
        label = scene + (" (test size)" if test else "")
        lines.append(f"{label}: cold {cold['wall_s'] if cold else '-'} s wall"
                     + (f" (error)" if cold and "error" in cold else "")
                     + (f", warm median {med['wall_s']} s wall over {med['runs']} runs" if med else ", no warm run"))
        if med:
            for group, named in med["phases_s"].items():
                for name, s in named.items():
                    lines.append(f"  {group:<8} {name:<16} {s:8.3f}")
                lines.append(f"  {'':<8} {'(' + group + ')':<16} {sum(named.values()):8.3f}")
            if med["phases_total_s"] is not None:
                lines.append(f"  {'total':<8} {'(metrics.json)':<16} {med['phases_total_s']:8.3f}")
    for r in records:
        if r.get("run") == "import" and "median_s" in r:
            lines.append(f"python -c 'import {r['module']}': median {r['median_s']} s, min {r['min_s']} s")
    return "\n".join(lines)


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("scenes", nargs="*", default=list(DEFAULT_SCENES), help="app/scene or app/scene:test")
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--warm", type=int, default=5, help="warm processes per scene (default 5)")
    ap.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                    help="passed to every run (e.g. screenshot=false)")
    ap.add_argument("--test", action="store_true", help="every scene at its test size")
    ap.add_argument("--no-cold", action="store_true", help="skip the cold process (the warm ones fill the caches)")
    args = ap.parse_args(argv)
    guard_cpu_out(args.device.startswith("cuda"))
    root = pathlib.Path(tempfile.mkdtemp(prefix="first_run_"))
    host = {"host": platform.node(), "cpus": os.cpu_count(), "python": platform.python_version(),
            "date": datetime.date.today().isoformat()}
    records: list[dict] = []
    try:
        for name in args.scenes:
            scene, _, size = name.partition(":")
            test = args.test or size == "test"
            cache = root / ("cache_" + scene.replace("/", "_"))
            output = root / ("out_" + scene.replace("/", "_"))
            mine = []
            kinds = ([] if args.no_cold else ["cold"]) + ["warm"] * args.warm
            for i, kind in enumerate(kinds):
                r = run_process(scene, test, args.device, args.sets, cache, output, kind, i)
                r.update(host)
                mine.append(r)
                print(json.dumps({k: r[k] for k in ("scene", "run", "index", "wall_s", "rc", "phases_total_s")
                                  if k in r}), flush=True)
                if "error" in r:
                    print(r["error"], file=sys.stderr)
            med = warm_median(mine)
            records += mine + ([{**med, **host}] if med else [])
            shutil.rmtree(cache, ignore_errors=True)
        for module in ("warp_meshad", "warp_meshad.app"):
            records.append({**time_import(module, max(args.warm, 1)), "device": args.device, **host})
    finally:
        shutil.rmtree(root, ignore_errors=True)
    path = out_dir() / f"{NAME}.json"
    path.write_text(json.dumps(records, indent=1) + "\n")
    print(table(records))
    print(f"wrote {path}")
    return records


if __name__ == "__main__":
    main()
