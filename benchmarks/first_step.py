"""Where an app's first step goes, against its later steps (issue 19: elastic/bunny's 40 steps, 0.4 s).

    python -m benchmarks.first_step elastic/bunny --device cuda:0
    python -m benchmarks.first_step elastic/bunny --device cuda:0 --set device_loop=false --top 40
    python -m benchmarks.first_step elastic/bunny --device cuda:0 --loop conditional=false --loop trials=2

The app is built as ``warp-meshad run`` builds it (config, mesh, problem: the ``setup`` time), then its steps run one
by one. Step 0 runs under cProfile; the later steps do not. Prints, for step 0 and the median of the later steps:
the step's wall time, the solver's phases (``time_ms`` of its record) and iterations; then the cProfile functions of
step 0 with the largest cumulative time, and ``--out FILE`` writes the numbers as JSON. ``--linear KEY=VALUE`` hands
a back-end option to the app's ``NewtonSolver`` (``linear_solver_options``); the JSON then has the linear
iterations per solve (a histogram) and the reuse counters of back-ends that keep factors. Module loading is counted
apart by wrapping Warp's ``Module.load`` (the cache look-up and the CUDA module load of a cached binary).
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import json
import pstats
import statistics
import time


def _histogram(values) -> dict:
    out: dict = {}
    for v in values:
        out[int(v)] = out.get(int(v), 0) + 1
    return dict(sorted(out.items()))


def _gc_summary(pauses) -> dict:
    """Garbage collections per generation and their total pause in ms."""
    return {"collections": _histogram(g for g, _ in pauses), "ms": round(sum(ms for _, ms in pauses), 2),
            "gen2_ms": round(sum(ms for g, ms in pauses if g == 2), 2)}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("scene", help="app/scene, e.g. elastic/bunny")
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override")
    parser.add_argument("--loop", action="append", default=[], metavar="FIELD=VALUE",
                        help="a DeviceLoop option of the app's captured loop (int or true/false), e.g. trials=2")
    parser.add_argument("--linear", action="append", default=[], metavar="KEY=VALUE",
                        help="a linear back-end option for the app's NewtonSolver (linear_solver_options; a number, "
                             "true/false or a string), e.g. matrix_type=symmetric")
    parser.add_argument("--gc-freeze", action="store_true",
                        help="gc.freeze() after the app's setup: later collections skip what setup made")
    parser.add_argument("--top", type=int, default=30, help="cProfile lines of step 0")
    parser.add_argument("--out", help="write the numbers as JSON here")
    args = parser.parse_args(argv)

    t0 = time.perf_counter()
    import warp as wp

    from warp_meshad import app as appmod
    from warp_meshad._src.app.loader import parse_set

    wp.config.log_level = wp.LOG_WARNING  # as warp-meshad run: no module-load lines
    wp.init()
    loads = {"calls": 0, "s": 0.0}
    from warp_meshad._src.codegen.warp_compat import install_module_hooks

    def timing(original):
        def timed_load(self, *a, **kw):
            start = time.perf_counter()
            try:
                return original(self, *a, **kw)
            finally:
                loads["calls"] += 1
                loads["s"] += time.perf_counter() - start

        return timed_load

    install_module_hooks(timing)
    if args.loop:  # the app's DeviceLoop with other options
        import dataclasses

        from warp_meshad.app import AppConfig

        fields = {}
        for item in args.loop:
            name, text = item.split("=", 1)
            fields[name] = {"true": True, "false": False}.get(text.lower(), None)
            if fields[name] is None:
                fields[name] = int(text)
        option = AppConfig.device_loop_option

        def with_fields(self, device):
            loop = option(self, device)
            return dataclasses.replace(loop, **fields) if dataclasses.is_dataclass(loop) else loop

        AppConfig.device_loop_option = with_fields
    from warp_meshad import NewtonSolver

    if args.linear:  # options the app's config does not expose, handed to every NewtonSolver it makes
        linear = {}
        for item in args.linear:
            name, text = item.split("=", 1)
            linear[name] = {"true": True, "false": False}.get(text.lower(), text)
            if isinstance(linear[name], str):
                try:
                    linear[name] = float(text) if any(c in text for c in ".e") else int(text)
                except ValueError:
                    pass
        init = NewtonSolver.__init__

        def with_options(self, *a, **kw):
            kw["linear_solver_options"] = {**(kw.get("linear_solver_options") or {}), **linear}
            init(self, *a, **kw)

        NewtonSolver.__init__ = with_options
    results = []  # each solve's SolveResult (for its Armijo tries)
    solve = NewtonSolver.solve

    def kept(self, *a, **kw):
        results.append(solve(self, *a, **kw))
        return results[-1]

    NewtonSolver.solve = kept
    overrides = {"screenshot": False, "device": args.device, **parse_set(args.set)}
    config = appmod.load_config(args.scene, overrides=overrides)
    t_import = time.perf_counter() - t0
    t0 = time.perf_counter()
    app = appmod.app_class(config.app)(config)
    wp.synchronize_device(args.device)
    setup_s = time.perf_counter() - t0
    loads_setup = dict(loads)

    if args.gc_freeze:
        gc.freeze()
    gc_pauses = []  # (generation, ms) of every garbage collection during the steps
    gc_start = {}

    def gc_timer(phase, info):
        if phase == "start":
            gc_start["t"] = time.perf_counter()
        else:
            gc_pauses.append((info["generation"], (time.perf_counter() - gc_start.pop("t", time.perf_counter())) * 1e3))

    gc.callbacks.append(gc_timer)
    steps = []
    profile = cProfile.Profile()
    for i in range(config.steps):
        start = time.perf_counter()
        if i == 0:
            profile.enable()
        rec = app.step()
        wp.synchronize_device(args.device)
        if i == 0:
            profile.disable()
            gc_step0 = list(gc_pauses)
        steps.append({"wall_ms": (time.perf_counter() - start) * 1000.0, "iterations": rec.get("iterations"),
                      "tries": list(results[-1].line_search_tries) if results else [],
                      "time_ms": {k: round(v, 3) for k, v in rec.get("time_ms", {}).items()}})
    later = steps[1:] or steps
    summary = {
        "benchmark": "first_step", "scene": args.scene, "device": args.device, "overrides": args.set, "loop": args.loop,
        "linear": args.linear,
        "import_s": round(t_import, 3), "setup_s": round(setup_s, 3),
        "module_loads_setup": loads_setup, "module_loads_step0": {"calls": loads["calls"] - loads_setup["calls"],
                                                                  "s": round(loads["s"] - loads_setup["s"], 4)},
        "step0": steps[0], "later_median_wall_ms": round(statistics.median(s["wall_ms"] for s in later), 3),
        "later_phases_median_ms": {k: round(statistics.median(s["time_ms"].get(k, 0.0) for s in later), 3)
                                   for k in steps[0]["time_ms"]},
        "run_ms": round(sum(s["wall_ms"] for s in steps), 1), "steps": len(steps), "final_energy": app.energy,
        "matrix_type": getattr(getattr(getattr(app, "solver", None), "linear_solver", None), "active_matrix_type", None),
        "linear_iterations": _histogram(v for r in results for v in r.linear_iterations),
        "linear_counters": {name: getattr(getattr(getattr(app, "solver", None), "linear_solver", None), name, None)
                            for name in ("factorizations", "reused_solves", "early_refactorizations")},
        "iterations": sum(s["iterations"] or 0 for s in steps),
        "tries_histogram": _histogram(t for s in steps for t in s["tries"]),
        "gc_freeze": args.gc_freeze, "gc_step0": _gc_summary(gc_step0), "gc_run": _gc_summary(gc_pauses),
    }
    print(json.dumps(summary))
    text = io.StringIO()
    pstats.Stats(profile, stream=text).sort_stats("cumulative").print_stats(args.top)
    print(text.getvalue())
    if args.out:
        with open(args.out, "w") as f:
            json.dump({**summary, "steps_all": steps}, f, indent=1)
    return summary


if __name__ == "__main__":
    main()
