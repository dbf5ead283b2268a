"""Command line: run the apps from YAML configs.

    warp-meshad run [CONFIG] [--device DEV] [--steps N] [--output DIR] [--wait] [--set KEY=VALUE ...]
                    [--test] [--headless | --viewer] [--profile] [--quiet] [--verbose]
    warp-meshad warmup [CONFIG] [--device DEV] [--set KEY=VALUE ...] [--test] [--quiet] [--verbose]
    warp-meshad batch [CONFIG] --meshes DIR|GLOB|LIST.txt --output DIR [--workers N] [--address ADDR]
                      [--batch-size B] [--one-at-a-time] [--build-jobs J] [--device DEV] [--set KEY=VALUE ...]
                      [--test] [--screenshots] [--wait] [--quiet]
    warp-meshad list

CONFIG is a YAML file or a name under configs/ such as ``cloth/hanging`` (the default). ``python -m warp_meshad`` is
the same command. ``warmup`` builds the scene and takes one short step without writing anything, so that Warp
compiles and caches the kernels a run of it uses (a cold start compiles each module once: seconds per module).
``batch`` runs CONFIG on every mesh of a dataset (one output folder each, ``summary.csv`` and ``summary.png``),
resuming where an earlier batch stopped; ``--workers N`` (N > 1) or ``--address`` run it on Ray.

A run's outputs appear together, with ``manifest.json`` (sizes and hashes) last, or not at all; one process writes to
an output folder at a time (``--wait`` waits for the other one). SIGINT (Ctrl-C) and SIGTERM end a run or a batch
with one line saying what was finished and how to resume, exit status 130 / 143, and no output written after the
signal.

A run's ``metrics.json`` holds the wall time of each phase (``phases_s``: the process's start and imports, the
setup's config, mesh read, checks, start point, problem and solver, the first and later steps, the outputs);
``--profile`` also prints them as a table at the end.
"""

from __future__ import annotations

import time

_MAIN_STARTED = time.perf_counter()  # the command's first line: what came before is Python's start

import argparse  # noqa: E402
import gc  # noqa: E402
import sys  # noqa: E402

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="warp-meshad",
        description="Run warp_meshad apps (cloth, smoothing, ...) from YAML configs, headless or in the viewer.",
    )
    sub = parser.add_subparsers(dest="command", metavar="{run,warmup,batch,list}")
    sub.required = True

    run = sub.add_parser("run", help="run one config", description="Run one app config and write its outputs.")
    warmup = sub.add_parser(
        "warmup", help="compile a config's kernels ahead of time",
        description="Build one app config and take one short step (at most 2 solver iterations) without writing "
                    "anything, so that Warp compiles the kernels a run of it uses and keeps them in its kernel cache; "
                    "later runs start without compiling. Says what compiled and how long it took.")
    batch = sub.add_parser(
        "batch", help="run a config on every mesh of a dataset",
        description="Run one app config on every mesh of a dataset: each mesh gets its own output folder (final "
                    "mesh, metrics.json) under --output, the batch a summary.csv (one row per mesh) and summary.png. "
                    "Meshes whose outputs are complete are skipped, so a rerun resumes an interrupted batch; a bad "
                    "mesh or failed solve is recorded in its row and the batch goes on. Exit status 1 when any mesh "
                    "failed or had an error.")
    for p in (run, warmup, batch):
        p.add_argument("config", nargs="?", default="cloth/hanging",
                       help="a YAML file, or a name under configs/ like 'cloth/hanging' (default)")
        p.add_argument("--device", help="Warp device: cpu, cuda, cuda:N (default: the first CUDA device, else cpu)")
        p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                       help="override a config key (dotted for nested keys, value in YAML: --set grid.nx=8); "
                            "repeatable")
        p.add_argument("--test", action="store_true",
                       help="apply the config's test block (small size, seconds on a CPU)")
    batch.add_argument("--meshes", required=True, metavar="DIR|GLOB|LIST.txt",
                       help="a folder of .obj/.off/.ply files, a quoted glob ('data/**/*.obj'), a .txt list (one "
                            "path a line, relative to the list) or one mesh file")
    batch.add_argument("--output", required=True, metavar="DIR", help="the batch's folder (one subfolder per mesh)")
    batch.add_argument("--workers", type=int, default=1,
                       help="1 (default): run in this process; N > 1: N Ray workers (pip install 'warp-meshad[batch]'), "
                            "sharing the GPUs (1/N of a GPU each) or one CPU each")
    batch.add_argument("--address", metavar="ADDR",
                       help="join this Ray cluster ('auto', 'ray://host:10001') instead of starting a local one")
    batch.add_argument("--batch-size", type=int, default=4, metavar="B",
                       help="meshes per chunk a worker takes (default 4); a chunk is solved as one batched problem "
                            "where the app allows (param with Newton)")
    batch.add_argument("--one-at-a-time", action="store_true",
                       help="solve a chunk's meshes one after the other instead of as one batched problem")
    batch.add_argument("--build-jobs", type=int, default=None, metavar="J",
                       help="in this process: J processes read the next meshes and compute their start points while "
                            "the device solves (default: one per core beyond two, at most 8 and one per 4 meshes; "
                            "0: none)")
    batch.add_argument("--screenshots", action="store_true", help="render screenshot.png and convergence.png for each mesh (slow)")
    run.add_argument("--steps", type=int, help="number of steps (overrides the config)")
    run.add_argument("--output", metavar="DIR",
                     help="output folder (default: output/<app>_<scene>, output/<app>_<scene>_test with --test)")
    for p in (run, batch):
        p.add_argument("--wait", action="store_true",
                       help="when another warp-meshad process writes to the output folder, wait for it to finish "
                            "(default: refuse at once, naming its PID)")
    run.add_argument("--profile", action="store_true",
                     help="print where the run's seconds went (start, imports, setup phases, steps, outputs) as a "
                          "table at the end; metrics.json holds them in any case (phases_s)")
    view = run.add_mutually_exclusive_group()
    view.add_argument("--viewer", action="store_true", help="open the interactive Polyscope viewer")
    view.add_argument("--headless", action="store_true", help="no viewer, even if the config asks for one")
    for p in (run, warmup, batch):
        p.add_argument("--quiet", "-q", action="store_true", help="no progress bar and no messages")
        p.add_argument("--verbose", "-v", action="store_true", help="also show Warp's messages (module loads)")

    sub.add_parser("list", help="list the apps and their configs", description="List the apps and their configs.")
    return parser


def _list(out) -> int:
    from warp_meshad._src.app.registry import DEFAULT_CONFIG, configs_root
    from warp_meshad.app import available_apps, available_configs

    apps = available_apps()
    configs = available_configs()
    root = configs_root()
    print("apps:", file=out)
    for name in apps:
        print(f"  {name}", file=out)
    print(f"configs ({root}):", file=out)
    for app, files in configs.items():
        for f in files:
            mark = " (default)" if f"{app}/{f.stem}" == DEFAULT_CONFIG else ""
            print(f"  {app}/{f.stem}{mark}", file=out)
    return 0


def _config(args):
    from warp_meshad._src.app.loader import parse_set
    from warp_meshad.app import load_config

    flags = {}
    if args.device is not None:
        flags["--device"] = {"device": args.device}
    if getattr(args, "steps", None) is not None:
        flags["--steps"] = {"steps": args.steps}
    if getattr(args, "output", None) is not None:
        flags["--output"] = {"output": args.output}
    return load_config(args.config, overrides=parse_set(args.overrides), test=args.test, flags=flags)


def _run(args, phases) -> int:
    from warp_meshad.app import run

    phases.begin("setup")
    t0 = time.perf_counter()
    config = _config(args)
    phases.add("setup", "config", time.perf_counter() - t0)
    viewer = True if args.viewer else (False if args.headless else None)
    report = run(config, quiet=args.quiet, viewer=viewer, wait=args.wait, phases=phases, start_children=True)
    if args.profile:
        print(report.phases.table(f"warp-meshad: where the seconds of {config.app}/{config.scene or 'custom'} went "
                                  "(wall time):"), file=sys.stderr, flush=True)
    return 0


def _batch(args) -> int:
    from warp_meshad._src.app.loader import parse_set
    from warp_meshad.app import load_config, run_batch

    flags = {"--device": {"device": args.device}} if args.device is not None else {}
    config = load_config(args.config, overrides=parse_set(args.overrides), test=args.test, flags=flags)
    report = run_batch(config, args.meshes, args.output, workers=args.workers, address=args.address,
                       batch_size=args.batch_size, screenshots=args.screenshots, quiet=args.quiet,
                       verbose=args.verbose, batched=not args.one_at_a_time, build_jobs=args.build_jobs,
                       wait=args.wait)
    return 0 if report.ok else 1


def _warmup(args) -> int:
    from warp_meshad.app import warmup

    warmup(_config(args), quiet=args.quiet)
    return 0


def _say(text: str) -> None:
    """One line on stderr (on a terminal, first clearing the line where the progress bar may stand)."""
    clear = "\r\x1b[K" if getattr(sys.stderr, "isatty", lambda: False)() else ""
    print(f"{clear}warp-meshad: {text}", file=sys.stderr, flush=True)


def main(argv=None) -> int:
    """Entry point of ``warp-meshad`` and ``python -m warp_meshad``; returns the exit status.

    Exit status: 0 on success, 2 for a bad command line, config, mesh or output folder (the message names the file
    and the key; no traceback), for an output folder another process writes to, and for an output that could not be
    written (a full disk: the message names the file and the cause); 1 when ``check_final`` fails; 130 / 143 when
    SIGINT / SIGTERM ended it (one line: what was finished, what was not, how to resume).

    Called without ``argv`` (as the program: ``warp-meshad``, ``python -m warp_meshad``) it ends with ``gc.freeze()``,
    so that the interpreter's garbage collections at exit skip the objects the command leaves (atexit handlers run,
    and objects are freed by reference counting, as usual; only reference cycles are left to the end of the
    process).
    """
    args = build_parser().parse_args(argv)
    from warp_meshad._src.app.interrupts import Interrupted, handling_signals

    try:
        with handling_signals():
            return _main(args)
    except KeyboardInterrupt as exc:  # Interrupted, or a Ctrl-C before the handlers were in place
        stop = Interrupted.of(exc)
        if not stop.what:
            stop = Interrupted(stop.signum, f"{args.command} stopped before it started its work; nothing written")
        _say(stop.message)
        return stop.exit_status
    finally:
        if argv is None:  # the process's own command line: it ends next, and its objects need no collection
            gc.freeze()   # (the interpreter's collections at exit over Warp's objects: 0.3 s on a 2-core CPU host)


def _main(args) -> int:
    from warp_meshad._src.app.phases import RunPhases

    phases = RunPhases.from_process_start()
    if phases.started is None:  # the process's start is not known here: count from the command's first line
        phases.started = _MAIN_STARTED
    phases.add("start", "python", max(_MAIN_STARTED - phases.started, 0.0))
    import warp as wp

    if not getattr(args, "verbose", False):
        wp.config.log_level = wp.LOG_WARNING  # before Warp initializes: no banner, no module-load lines
    from warp_meshad import MeshError
    from warp_meshad.app import ConfigError, OutputWriteError, ViewerError

    phases.add("start", "imports", time.perf_counter() - _MAIN_STARTED)
    try:
        if args.command == "list":
            return _list(sys.stdout)
        if args.command == "warmup":
            return _warmup(args)
        if args.command == "batch":
            return _batch(args)
        return _run(args, phases)
    except (ConfigError, MeshError, ViewerError, OutputWriteError) as exc:  # the input's or the disk's fault: say
        _say(f"error: {exc}")                                                 # what, without a traceback
        return 2
    except AssertionError as exc:
        _say(f"check_final failed: {exc}")
        return 1
    except ImportError as exc:
        if "pip install" not in str(exc):  # a missing optional extra: say which; anything else is a bug
            raise
        _say(f"error: {exc}")
        return 2


if __name__ == "__main__":
    sys.exit(main())
