"""First run against later runs: each scene run twice in fresh processes, first with empty kernel caches (Warp's and
warp_meshad's generated sources: what a new user meets), then with the caches the first run filled.

    python -m benchmarks.cold_warm param/bunny_cut cloth/hanging shells/spot_drop:test --device cuda:0
    python -m benchmarks.cold_warm cloth/hanging --device cpu --test          # CPU smoke run

A scene written ``app/scene:test`` runs at its test size (``--test``: every scene).

Per run it records the process's wall time and the ``compile`` block of the run's metrics.json (modules compiled
and loaded, seconds spent compiling and loading, first and median step time; see warp_meshad/_src/codegen/module_loads.py).
Writes ``cold_warm.json`` to ``$BENCH_OUT`` (default benchmarks/results).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time

from benchmarks.common import guard_cpu_out, out_dir

NAME = "cold_warm"


def run_scene(scene: str, device: str, cache: pathlib.Path, output: pathlib.Path, test: bool) -> dict:
    env = dict(os.environ, WARP_CACHE_PATH=str(cache), WARP_MESHAD_CACHE_PATH=str(cache / "gen"))
    cmd = [sys.executable, "-m", "warp_meshad", "run", scene, "--device", device, "--headless", "--quiet",
           "--output", str(output)] + (["--test"] if test else [])  # fmt: skip
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    out = {"scene": scene, "device": device, "test_size": test, "wall_s": round(wall, 3), "rc": proc.returncode}
    metrics = output / "metrics.json"
    if proc.returncode != 0 or not metrics.is_file():
        out["error"] = (proc.stderr or proc.stdout)[-2000:]
        return out
    m = json.loads(metrics.read_text())
    c = m.get("compile", {})
    for key in ("cache_warm", "modules_loaded", "modules_compiled", "compile_s", "load_s", "first_step_s", "median_step_s"):
        out[key] = c.get(key)
    out["steps"] = m.get("steps")
    out["check_final"] = m.get("check_final")
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("scenes", nargs="+")
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--test", action="store_true", help="the scenes' test size")
    args = ap.parse_args(argv)
    guard_cpu_out(args.device.startswith("cuda"))
    root = pathlib.Path(tempfile.mkdtemp(prefix="cold_warm_"))
    records = []
    for name in args.scenes:
        scene, _, size = name.partition(":")
        test = args.test or size == "test"
        cache = root / ("cache_" + scene.replace("/", "_"))
        for phase in ("cold", "warm"):
            r = run_scene(scene, args.device, cache, root / f"{scene.replace('/', '_')}_{phase}", test)
            r["phase"] = phase
            records.append(r)
            print(json.dumps(r))
        shutil.rmtree(cache, ignore_errors=True)
    path = out_dir() / f"{NAME}.json"
    path.write_text(json.dumps(records, indent=1) + "\n")
    print(f"wrote {path}")
    return records


if __name__ == "__main__":
    main()
