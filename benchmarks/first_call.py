"""The first call in a process with a warm kernel cache: where its Python-side module work goes.

    WARP_CACHE_PATH=/work/main/.warp_cache python -m benchmarks.first_call --device cpu
    python -m benchmarks.first_call --device cuda:0 --case tet          # one case
    python -m benchmarks.first_call --device cpu --profile               # also print the top of a cProfile

Each case runs twice in fresh processes (the first one fills the kernel cache if it is cold; the second is timed):

* ``tet``: ``TetMesh.box(6, 6, 6)``, ``stable_neo_hookean``, float64: ``Problem`` + ``add_term`` (the return-type
  probe), then the first ``eval_with_hessian_proj`` and a second one;
* ``bunny_cut``: ``warp-meshad run param/bunny_cut --test --headless --set iterations=2`` in process (the scene's
  solve with its first derivatives; output writing is not timed apart).

The first call is split by wrapping functions (exclusive time, nested calls go to the inner category):

* ``warp_hash_s``: Warp's module hashing (``wp.Module.get_module_hash``: every adjoint's references resolved);
* ``warp_codegen_s``: Warp code generation outside a compile (the add_term probe's ``generate_module_code``);
* ``warp_load_s``: the rest of ``wp.Module.load`` (cache look-up, reading the object/cubin, a compile on a miss);
* ``dual_import_s``: importing the generated dual-number modules (every ``@wp.func`` parsed and registered);
* ``kernel_build_s``: warp_meshad's own kernel building (energy rewrite, kernel text, ``wp.Kernel``, key look-ups);
* ``module_work_s``: the sum of the five above: the Python-side module work of the first call.

Prints one JSON line (``{"benchmark": "first_call", "device": ..., "cases": [{"case": ..., "first_s": ...,
"module_work_s": ..., ...}, ...]}``); ``--out FILE`` also writes the case records as a JSON list.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

CASES = ("tet", "bunny_cut")
_CATEGORIES = ("warp_hash_s", "warp_codegen_s", "warp_load_s", "dual_import_s", "kernel_build_s")


class _Timers:
    """Exclusive wall time per category: a wrapped call charges its time to its category minus nested calls."""

    def __init__(self):
        self.total = dict.fromkeys(_CATEGORIES, 0.0)
        self.stack = []  # [category, start, time of nested wrapped calls]
        self.calls = dict.fromkeys(_CATEGORIES, 0)

    def wrap(self, owner, name: str, category: str):
        original = getattr(owner, name)

        def timed(*args, **kwargs):
            frame = [category, time.perf_counter(), 0.0]
            self.stack.append(frame)
            try:
                return original(*args, **kwargs)
            finally:
                self.stack.pop()
                dt = time.perf_counter() - frame[1]
                self.total[category] += dt - frame[2]
                self.calls[category] += 1
                if self.stack:
                    self.stack[-1][2] += dt

        setattr(owner, name, timed)


def _install_timers() -> _Timers:
    import warp as wp

    from warp_meshad.kernels import _dualgen
    from warp_meshad._src.codegen import energy_rewrite, kernel_cache, kernel_source, warp_compat

    t = _Timers()
    t.wrap(wp.Module, "get_module_hash", "warp_hash_s")
    t.wrap(wp.Module, "hash_module", "warp_hash_s")
    t.wrap(wp.Module, "load", "warp_load_s")
    t.wrap(warp_compat, "generate_module_code", "warp_codegen_s")
    kernel_cache.generate_module_code = warp_compat.generate_module_code
    t.wrap(_dualgen, "load", "dual_import_s")
    kernel_cache._dualgen = _dualgen
    for owner, name in ((kernel_cache, "term_kernel"), (kernel_cache, "probe_return_type"),
                        (energy_rewrite, "instantiate"), (kernel_source, "make_kernel")):  # fmt: skip
        t.wrap(owner, name, "kernel_build_s")
    kernel_cache.instantiate = energy_rewrite.instantiate
    kernel_cache.make_kernel = kernel_source.make_kernel
    # the problem modules imported the kernel_cache functions by name: point them at the wrappers
    from warp_meshad._src.problem import assembly, terms

    assembly.term_kernel = kernel_cache.term_kernel
    terms.probe_return_type = kernel_cache.probe_return_type
    return t


def _tet(device: str) -> dict:
    import numpy as np
    import warp as wp

    import warp_meshad as wm
    from warp_meshad.kernels.energies import StableNeoHookeanData, stable_neo_hookean

    t0 = time.perf_counter()
    mesh = wm.TetMesh.box(6, 6, 6)
    data = StableNeoHookeanData()
    data.lam, data.mu = wp.float64(10.0), wp.float64(1.0)
    data.rest_inverse = wp.array(mesh.rest_matrix_inverses(), dtype=wp.mat33d, device=device)
    data.volume = wp.array(mesh.volumes(), dtype=wp.float64, device=device)
    problem = wm.Problem(mesh.vertex_count, 3, dtype=wp.float64, device=device)
    problem.add_term(mesh.tets, stable_neo_hookean, data)
    x = wp.array(mesh.vertices * np.array([1.1, 1.0, 1.0]), dtype=wp.vec3d, device=device)
    t1 = time.perf_counter()
    first = problem.eval_with_hessian_proj(x)
    wp.synchronize_device(device)
    t2 = time.perf_counter()
    problem.eval_with_hessian_proj(x)
    wp.synchronize_device(device)
    t3 = time.perf_counter()
    energy = float(first[0]) if isinstance(first, tuple) else float(getattr(first, "energy", float("nan")))
    return {"setup_s": t1 - t0, "first_s": t2 - t0, "first_eval_s": t2 - t1, "second_eval_s": t3 - t2,
            "energy": energy}  # fmt: skip


def _bunny_cut(device: str) -> dict:
    import tempfile

    from warp_meshad.__main__ import main

    out = tempfile.mkdtemp(prefix="first_call_")
    t0 = time.perf_counter()
    rc = main(["run", "param/bunny_cut", "--test", "--headless", "--quiet", "--device", device,
               "--set", "iterations=2", "--output", out])  # fmt: skip
    t1 = time.perf_counter()
    with open(os.path.join(out, "metrics.json")) as f:
        m = json.load(f)
    ms = m.get("time_ms", {})
    return {"rc": rc, "first_s": t1 - t0, "solve_s": ms.get("solver_total", 0.0) / 1e3,
            "setup_s": ms.get("setup", 0.0) / 1e3, "final_energy": m.get("final_energy"),
            "iterations": m.get("iterations"), "modules_loaded": m.get("compile", {}).get("modules_loaded"),
            "modules_compiled": m.get("compile", {}).get("modules_compiled")}  # fmt: skip


def _child(case: str, device: str, profile: bool) -> dict:
    """One case in this (fresh) process."""
    t0 = time.perf_counter()
    import warp as wp

    wp.config.log_level = wp.LOG_WARNING
    wp.init()
    import warp_meshad  # noqa: F401

    import_s = time.perf_counter() - t0
    timers = _install_timers()
    prof = None
    if profile:
        import cProfile

        prof = cProfile.Profile()
        prof.enable()
    out = (_tet if case == "tet" else _bunny_cut)(device)
    if prof is not None:
        import pstats

        prof.disable()
        pstats.Stats(prof, stream=sys.stderr).sort_stats("cumulative").print_stats(30)
    out = {"case": case, "device": device, "import_s": import_s, **out, **timers.total}
    out["module_work_s"] = sum(timers.total[c] for c in _CATEGORIES)
    out["calls"] = timers.calls
    out["kernel_cache"] = wp.config.kernel_cache_dir
    out["profiled"] = profile
    return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in out.items()}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--case", choices=CASES, action="append", help="a case (repeatable; default: all)")
    ap.add_argument("--profile", action="store_true", help="cProfile the timed run (slower; numbers inflate)")
    ap.add_argument("--no-warmup", action="store_true", help="skip the run that fills the kernel cache")
    ap.add_argument("--out", help="also write the records to this JSON file")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print("FIRST_CALL " + json.dumps(_child(args.child, args.device, args.profile)))
        return None
    records = []
    for case in args.case or CASES:
        cmd = [sys.executable, "-m", "benchmarks.first_call", "--child", case, "--device", args.device]
        if not args.no_warmup:
            subprocess.run(cmd, capture_output=True, text=True)
        proc = subprocess.run(cmd + (["--profile"] if args.profile else []), capture_output=True, text=True)
        line = next((s for s in proc.stdout.splitlines() if s.startswith("FIRST_CALL ")), None)
        if args.profile:
            print(proc.stderr[-8000:], file=sys.stderr)
        rec = json.loads(line[len("FIRST_CALL "):]) if line else {"case": case, "device": args.device,
                                                                     "error": proc.stderr[-3000:]}  # fmt: skip
        records.append(rec)
    print(json.dumps({"benchmark": "first_call", "device": args.device, "cases": records}), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(records, f, indent=1)
    return records


if __name__ == "__main__":
    main()
