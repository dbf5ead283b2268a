"""Running an app from its config: :func:`run_app` (build, run headless or in the viewer, check, write the outputs)
and :func:`warmup_app` (build and take one short step so that Warp compiles and caches the kernels, writing nothing).

Outputs go to ``output/<app>_<scene>/`` (``output/<app>_<scene>_test/`` for a ``test=True`` config) unless ``output``
says otherwise: the final mesh (``final.obj`` or ``final.ply``), ``metrics.json``, ``convergence.png`` (matplotlib)
and ``screenshot.png`` (Polyscope, headless EGL, where available), then ``manifest.json`` (their sizes and hashes),
as one unit (:class:`~warp_meshad._src.app.output_set.OutputSet`: nothing is in place until all are written). A run
holds its folder's lock (:class:`~warp_meshad._src.app.folder_lock.FolderLock`) from start to end; an interrupt
becomes :class:`~warp_meshad._src.app.interrupts.Interrupted` saying how far the run came. While an app is built and
run, the Warp modules it
compiles are announced on the log as each compile starts (:class:`~warp_meshad._src.codegen.module_loads.ModuleLoads`);
``metrics.json`` records the compile and load times and whether the kernel cache was warm. The app is built with
the content cache on (:mod:`~warp_meshad._src.mesh.content_cache`: a mesh file's parsed arrays and a Tutte start are
taken from disk when their inputs are the same).
"""

from __future__ import annotations

import collections
import contextlib
import gc
import pathlib
import time
from dataclasses import dataclass, field

import numpy as np

from warp_meshad._src.app import viewer as _viewer
from warp_meshad._src.app.base import App
from warp_meshad._src.app.config import AppConfig
from warp_meshad._src.app.folder_lock import FolderLock
from warp_meshad._src.app.interrupts import Interrupted
from warp_meshad._src.app.output_set import OutputSet, OutputWriteError
from warp_meshad._src.app.outputs import (
    build_metrics,
    check_output_folder,
    convergence_title,
    json_safe,
    output_folder,
    save_mesh,
    write_convergence_plot,
    write_metrics,
)
from warp_meshad._src.app.phases import RunPhases
from warp_meshad._src.app.plot import PlotWorker
from warp_meshad._src.app.progress import Progress, stderr_log
from warp_meshad._src.app.registry import app_class
from warp_meshad._src.codegen.module_loads import ModuleLoads
from warp_meshad._src.mesh import content_cache
from warp_meshad._src.plural import plural

__all__ = [
    "RunReport",
    "WarmupReport",
    "run_app",
    "run_apps_batched",
    "setup_objects_frozen",
    "step_apps_batched",
    "warmup_app",
]


@dataclass
class RunReport:
    """What :func:`run_app` did.

    Attributes:
        app: the app after the run.
        output: the output folder.
        files: the files written, by kind (``mesh``, ``metrics``, ``convergence``, ``screenshot``, ``manifest``).
        metrics: the content of ``metrics.json``.
        messages: notes (skipped outputs and why).
        phases: the wall time of the run's phases (:class:`~warp_meshad._src.app.phases.RunPhases`; its
            :meth:`~warp_meshad._src.app.phases.RunPhases.table` is what ``--profile`` prints), the outputs written
            after ``metrics.json`` included.
    """

    app: App
    output: pathlib.Path
    files: dict
    metrics: dict
    messages: list
    phases: RunPhases = field(default_factory=RunPhases)


class _StepClock:
    """When a run's steps end, in bounded memory: the first step's duration and the latest later ones."""

    KEPT = 1000

    def __init__(self):
        self.last = None
        self.first = None
        self.later = collections.deque(maxlen=self.KEPT)

    def tick(self) -> None:
        """The start of the steps (first call), then the end of each step."""
        now = time.perf_counter()
        if self.last is not None:
            if self.first is None:
                self.first = now - self.last
            else:
                self.later.append(now - self.last)
        self.last = now

    def summary(self) -> dict:
        """First step and median later step [s] (of the latest :attr:`KEPT`); None where there is none."""
        return {"first_step_s": self.first, "median_step_s": float(np.median(self.later)) if self.later else None}


def _finish(app: App, config: AppConfig, out: pathlib.Path, times: dict, loads: ModuleLoads, clock: _StepClock,
            check: bool, log, messages: list, plot: bool = True, state: dict | None = None,
            phases: RunPhases | None = None, plotter: PlotWorker | None = None,
            shooter: _viewer.ScreenshotWorker | None = None) -> RunReport:
    """Check the app after its run, write its outputs (final mesh, convergence plot unless ``plot`` is False,
    screenshot, metrics.json, then the manifest) as one :class:`OutputSet` and return the report; a
    ``check_final`` failure is raised after the outputs are written. The screenshot's child process renders while this
    one writes the mesh and the plot; a ``plotter`` (:class:`~warp_meshad._src.app.plot.PlotWorker`) draws the plot
    while this process checks the app and writes the mesh, and its PNG is written here (drawn here instead when the
    worker gives none); a ``shooter`` (:class:`~warp_meshad._src.app.viewer.ScreenshotWorker`) renders the screenshot
    in its child started ahead. ``state["phase"]`` becomes ``"done"`` once the outputs are in place (a signal that came while
    they were renamed takes effect just after). The outputs' phases are added to ``phases``.

    Raises:
        OutputWriteError: an output could not be written (nothing of this run is left in ``out``).
        AssertionError: ``check_final`` failed (after the outputs are written).
    """
    phases = phases if phases is not None else RunPhases()
    phases.begin("outputs")
    if plot and plotter is not None:
        plotter.submit(app.history, convergence_title(app), per_step=not app.continuous_objective)
    failure = None
    status = "not run"
    t0 = time.perf_counter()
    if check:
        if app.steps_done < config.steps:
            status = f"skipped: {app.steps_done} of {plural(config.steps, 'step')} taken"
        else:
            try:
                app.check_final()
                status = "passed"
            except AssertionError as exc:
                status = f"failed: {exc}"
                failure = exc
    phases.add("outputs", "check", time.perf_counter() - t0)

    t0 = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    kinds = {}
    mesh_name = f"final.{config.mesh_format}"
    with OutputSet(out) as outputs:
        failed = []

        def write_plot():
            png, why = plotter.result() if plotter is not None else (None, "")
            if png is not None:
                written = outputs.write("convergence.png", lambda tmp: pathlib.Path(tmp).write_bytes(png))
            else:
                if why:
                    log(f"drawing convergence.png in this process: {why}")
                written = outputs.write("convergence.png", lambda tmp: write_convergence_plot(tmp, app))
            if written:
                kinds["convergence"] = "convergence.png"
            else:
                messages.append("convergence.png skipped: matplotlib is not installed (pip install matplotlib)")

        def mesh_and_plot():
            try:
                with phases.timed("outputs", "mesh"):
                    outputs.write(mesh_name, lambda tmp: save_mesh(tmp, app))
                kinds["mesh"] = mesh_name
                if plot:
                    with phases.timed("outputs", "plot"):
                        write_plot()
            except BaseException:
                failed.append(True)
                raise

        try:
            if config.screenshot:  # the screenshot's child renders while this process writes the mesh and the plot
                t_shot = time.perf_counter()
                try:
                    ok, why = _viewer.screenshot(app, outputs.temp_path("screenshot.png"),
                                                 while_rendering=mesh_and_plot, worker=shooter)
                except Exception as exc:  # the screenshot's own failure (the scene could not be read) costs only it
                    if failed or isinstance(exc, OSError):
                        raise
                    ok, why = False, f"{type(exc).__name__}: {exc}"
                    if "mesh" not in kinds:
                        mesh_and_plot()
                if ok and outputs.add("screenshot.png"):
                    kinds["screenshot"] = "screenshot.png"
                elif not ok:
                    messages.append(f"screenshot.png skipped: {why}")
                beside = phases.seconds("outputs", "mesh") + phases.seconds("outputs", "plot")
                phases.add("outputs", "screenshot", max(time.perf_counter() - t_shot - beside, 0.0))
            else:
                mesh_and_plot()
            times["outputs"] = (time.perf_counter() - t0) * 1000.0
            t_metrics = time.perf_counter()
            metrics = build_metrics(app, times, status)
            metrics["compile"] = json_safe({**loads.summary(), **clock.summary()})
            phases.add("outputs", "metrics", time.perf_counter() - t_metrics)
            metrics["phases_s"] = json_safe(phases.as_dict())
            metrics["phases_total_s"] = json_safe(phases.total_s(now=True))
            with phases.timed("outputs", "metrics write"):
                outputs.write("metrics.json", lambda tmp: write_metrics(tmp, metrics))
            kinds["metrics"] = "metrics.json"
            try:
                with phases.timed("outputs", "commit"):
                    paths = outputs.commit({"app": app.name, "scene": config.scene, "check_final": status})
            finally:
                if outputs.committed and state is not None:
                    state["phase"] = "done"
        except OSError as exc:  # one not raised by a write of the set (the screenshot's scene file): name its file
            if isinstance(exc, OutputWriteError):
                raise
            raise OutputWriteError(exc.filename or out, exc, out) from None
    phases.end("outputs")
    files = {kind: paths[name] for kind, name in kinds.items() if name in paths}
    files["manifest"] = paths["manifest.json"]
    for m in messages:
        log(m)
    log(f"{plural(app.steps_done, 'step')}, {plural(metrics['iterations'], 'iteration')}, final energy "
        f"{app.energy:.9g}, check_final {status}; wrote {', '.join(p.name for p in files.values())} to {out}")
    if failure is not None:
        raise failure
    return RunReport(app, out, files, metrics, messages, phases)


def _interrupted_run(exc: BaseException, config: AppConfig, out: pathlib.Path, phase: str, app: App | None,
                     ) -> Interrupted:
    """The :class:`Interrupted` of a run stopped in ``phase`` (``"build"``, ``"steps"``, ``"outputs"``, ``"done"``),
    saying what was finished, what was not and how to start again."""
    scene = f"{config.app}/{config.scene or 'custom'}"
    done = app.steps_done if app is not None else 0
    again = "run the same command again to start over (a run does not resume)"
    if phase == "done":
        what = f"{scene} had finished; its outputs in {out} are complete"
    elif phase == "outputs":
        what = (f"{scene}: all {plural(done, 'step')} finished, stopped while writing the outputs; nothing of this "
                f"run was written to {out}; {again}")
    elif phase == "steps":
        what = (f"{scene}: {done} of {plural(config.steps, 'step')} finished, stopped in step {done + 1}; no outputs "
                f"written to {out}; {again}")
    else:
        what = f"{scene}: stopped while building the app, no step taken; no outputs written to {out}; {again}"
    signum = Interrupted.of(exc).signum
    return Interrupted(signum, what)


@contextlib.contextmanager
def setup_objects_frozen():
    """Keep the objects alive before the steps out of the garbage collector's full collections while they run.

    ``gc.freeze()`` moves every object the process holds (Warp's and warp_meshad's modules, the app's build) to the
    collector's permanent generation, and ``gc.unfreeze()`` returns them after the steps, so nothing is kept from
    collection for good. A full (generation 2) collection otherwise scans all of them: one fell in the first step of
    ``elastic/bunny`` and took 139 ms of its 420 ms on a 2-core CPU host (``benchmarks/first_step.py``). Reference
    counting still frees objects as usual. Nothing is changed where the collector is disabled or objects are already
    frozen (the caller manages it).
    """
    own = gc.isenabled() and gc.get_freeze_count() == 0
    if own:
        gc.freeze()
    try:
        yield
    finally:
        if own:
            gc.unfreeze()


def run_app(config: AppConfig, quiet: bool = False, viewer: bool | None = None, check: bool = True,
            log=None, plot: bool = True, prepared=None, wait: bool = False, phases: RunPhases | None = None,
            start_children: bool = False) -> RunReport:
    """Build the config's app, run it (headless, or in the viewer), check it, and write its outputs.

    The output folder is checked for writing and locked first (one writer per folder: another process's run or
    batch there makes this one refuse, or wait with ``wait``); the outputs go in place together at the end, with
    ``manifest.json`` last, or not at all. Each Warp module compiled while the app is built and run is
    announced on ``log`` as the compile starts; ``metrics.json["compile"]`` records the compiles and loads
    (:meth:`~warp_meshad._src.codegen.module_loads.ModuleLoads.summary`), ``cache_warm``, and the first and the median later
    step time (``first_step_s``, ``median_step_s``: the first step pays for the compiles of a cold cache). The
    steps run inside :func:`setup_objects_frozen` (no full garbage collection over the objects built before them).
    ``metrics.json["phases_s"]`` holds the wall time of each phase of the run (setup, steps, outputs:
    :mod:`~warp_meshad._src.app.phases`) and ``phases_total_s`` their sum from the run's (or, given ``phases`` from
    the command line, the process's) start.

    Args:
        config: an app config (from :func:`load_config`, or built directly).
        quiet: no progress bar and no messages.
        viewer: open the interactive viewer; None: ``config.viewer``.
        check: run ``check_final`` (its failure is raised after the outputs are written).
        log: ``log(text)`` for messages; default: print to stderr unless quiet.
        plot: write ``convergence.png`` (matplotlib).
        prepared: :meth:`App.prepare`'s dict for this config (built ahead, e.g. by
            :class:`~warp_meshad._src.app.prefetch.Prefetch`), or a callable returning it (or None); None: the app
            builds everything itself.
        wait: when another process holds the output folder, wait for it instead of refusing.
        phases: the phases timed before this call (the command line's start, imports and config), to which the run
            adds its own; None: a new :class:`~warp_meshad._src.app.phases.RunPhases`.
        start_children: start, with the run, the child processes that draw ``convergence.png``
            (:class:`~warp_meshad._src.app.plot.PlotWorker`) and render ``screenshot.png``
            (:class:`~warp_meshad._src.app.viewer.ScreenshotWorker`): they import matplotlib and Polyscope and start
            EGL while the app builds and steps (the command line does this). False: the plot is drawn in this
            process and the screenshot's child starts when the outputs are written.

    Returns:
        :class:`RunReport`.

    Raises:
        ConfigError: a bad config, mesh (key ``mesh``) or output folder (key ``output``; ``FolderBusy`` when another
            process writes there).
        OutputWriteError: an output could not be written (a full disk, ...); none of this run's are left.
        Interrupted: SIGINT / SIGTERM (or Ctrl-C), saying how far the run came; no outputs written.
        AssertionError: ``check_final`` failed (after the outputs are written).
        ViewerError: the viewer was asked for and its window cannot open (no display: before the app is built).
    """
    if log is None:
        log = stderr_log(quiet)
    phases = phases if phases is not None else RunPhases()
    if config.viewer if viewer is None else viewer:
        _viewer.check_display()  # before anything is built: no display, no run
    phases.begin("setup")
    t0 = time.perf_counter()
    out = check_output_folder(output_folder(config), config.origin("output"))
    with contextlib.ExitStack() as stack:
        stack.enter_context(FolderLock(out, config.origin("output"), wait=wait, log=log))
        phases.add("setup", "output folder", time.perf_counter() - t0)
        state = {"phase": "build", "app": None}
        try:
            plotter = shooter = None
            headless = not (config.viewer if viewer is None else viewer)
            if start_children and headless:
                with phases.timed("setup", "children"):  # their starts; they import while the run works
                    if plot and PlotWorker.available():
                        plotter = stack.enter_context(PlotWorker()).start()
                    if config.screenshot and _viewer.ScreenshotWorker.available():
                        shooter = stack.enter_context(_viewer.ScreenshotWorker()).start()
            return _run_locked(config, out, quiet, viewer, check, log, plot, prepared, state, phases, plotter,
                               shooter)
        except KeyboardInterrupt as exc:
            raise _interrupted_run(exc, config, out, state["phase"], state["app"]) from None


def _run_locked(config, out, quiet, viewer, check, log, plot, prepared, state, phases, plotter, shooter,
                ) -> RunReport:
    """:func:`run_app` once the folder is locked; ``state`` tells an interrupt how far it came."""
    times = {}
    t0 = time.perf_counter()
    import warp as wp

    if wp.config.log_level < wp.LOG_WARNING and quiet:
        wp.config.log_level = wp.LOG_WARNING
    messages = []
    clock = _StepClock()
    with ModuleLoads(log=None if quiet else log) as loads:
        t1 = time.perf_counter()
        cls = app_class(config.app, config.origin("app"))
        phases.add("setup", "app import", time.perf_counter() - t1)
        t1 = time.perf_counter()
        ahead = _resolved(prepared)
        if prepared is not None:
            phases.add("setup", "prepared", time.perf_counter() - t1)
        with content_cache.enabled():  # the mesh file's arrays and a Tutte start, by content, on disk
            app = cls(config, ahead)
        app.lap("other")
        phases.update("setup", app.setup_phases)
        state.update(app=app, phase="steps")
        log(app.describe())
        times["setup"] = (time.perf_counter() - t0) * 1000.0
        phases.end("setup")

        phases.begin("steps")
        t0 = time.perf_counter()
        use_viewer = config.viewer if viewer is None else viewer
        if use_viewer:
            _viewer.show(app, log=log)
        else:
            progress = Progress(config.steps, quiet=quiet)
            progress.update(0, "")
            clock.tick()

            def after_step(a, rec):
                clock.tick()
                progress.update(a.steps_done, f"E={a.energy:.6g} it={rec['iterations']}")

            with setup_objects_frozen():
                app.run(after_step)
        times["run"] = (time.perf_counter() - t0) * 1000.0
        if use_viewer:
            phases.add("steps", "viewer", times["run"] / 1000.0)
        elif clock.first is not None:
            phases.add("steps", "first", clock.first)
            phases.add("steps", "rest", max(clock.last - t0 - clock.first, 0.0))
        phases.end("steps")
    times["compile"] = loads.compile_s * 1000.0
    if loads.compiled:
        log(loads.describe())
    state["phase"] = "outputs"
    return _finish(app, config, out, times, loads, clock, check, log, messages, plot, state, phases, plotter, shooter)


def _resolved(prepared):
    return prepared() if callable(prepared) else prepared


def step_apps_batched(apps: list[App]) -> bool:
    """Take the remaining steps of many apps of one scene (one per mesh) as batched solves: per step, their problems
    as one :class:`~warp_meshad.ProblemBatch` and one :class:`~warp_meshad.BatchNewtonSolver` solve.

    Returns:
        False (nothing done) when an app's step cannot be batched (:meth:`App.batch_step_parts` is None).
    """
    from warp_meshad._src.problem.batch import ProblemBatch
    from warp_meshad._src.solve.batch_solver import BatchNewtonSolver

    parts = [a.batch_step_parts() for a in apps]
    if not apps or any(p is None for p in parts):
        return False
    batch = ProblemBatch([p.problem for p in parts])
    solver = BatchNewtonSolver.like(parts[0].solver, batch, fixed=[p.fixed for p in parts])
    steps = apps[0].config.steps
    while apps[0].steps_done < steps:
        x = batch.join([p.x for p in parts])
        t0, c0 = time.perf_counter(), time.process_time()
        result = solver.solve(x, **parts[0].solve)
        seconds, cpu = (time.perf_counter() - t0) / len(apps), (time.process_time() - c0) / len(apps)
        for app, r in zip(apps, result.results):
            app.finish_batch_step(r, seconds, cpu)
        parts = [a.batch_step_parts() for a in apps]
    return True


def run_apps_batched(configs: list[AppConfig], check: bool = True, plot: bool = True, prepared=None) -> list:
    """Run configs of one scene that differ in their mesh (``warp-meshad batch``): the apps are built one by one,
    their steps run batched (:func:`step_apps_batched`; mesh by mesh where the app's step cannot be batched, or when
    the batched solve raises), then each is checked and writes its outputs as :func:`run_app` does. Quiet.

    Each mesh's ``metrics.json`` gets its own setup and output times and, as its run time, its share of the batched
    steps' wall time (the batch's time divided by the number of meshes). ``plot``: write each ``convergence.png``.
    ``prepared``: per config, :meth:`App.prepare`'s dict or a callable returning it (None: built here), as
    :func:`run_app` takes it.

    Each mesh's folder is locked from its build to its outputs (a folder another process holds gives that mesh a
    ``FolderBusy``).

    Returns:
        Per config, in order: a :class:`RunReport`, or the exception that stopped that mesh (a ``ConfigError`` for a
        bad mesh or output folder; an ``AssertionError`` from ``check_final``, raised after its outputs were written;
        any other error of its build or solve). One mesh's error never stops the others.

    Raises:
        OutputWriteError: a mesh's outputs could not be written (a full disk): the meshes after it are not written.
        KeyboardInterrupt: an interrupt; no outputs are written after it.
    """
    import warp as wp

    if wp.config.log_level < wp.LOG_WARNING:
        wp.config.log_level = wp.LOG_WARNING
    log = stderr_log(True)
    outcomes: list = [None] * len(configs)
    built = []
    with contextlib.ExitStack() as locks, ModuleLoads(log=None) as loads:
        for i, config in enumerate(configs):
            t0 = time.perf_counter()
            try:
                out = check_output_folder(output_folder(config), config.origin("output"))
                lock = FolderLock(out, config.origin("output")).acquire()
                locks.callback(lock.release)
                ahead = _resolved(prepared[i]) if prepared else None
                app = app_class(config.app, config.origin("app"))(config, ahead)
            except Exception as exc:  # a bad mesh or folder: recorded, the others go on
                outcomes[i] = exc
                continue
            built.append((i, app, out, {"setup": (time.perf_counter() - t0) * 1000.0}))
        t0 = time.perf_counter()
        apps = [b[1] for b in built]
        try:
            with setup_objects_frozen():
                batched = step_apps_batched(apps)
        except Exception:  # e.g. a linear solve of the whole batch failed: mesh by mesh instead, from new apps
            batched = False
            built = [(i, app_class(a.config.app, a.config.origin("app"))(a.config), out, times)
                     for i, a, out, times in built]
        run_share = (time.perf_counter() - t0) * 1000.0 / max(1, len(built))
        if not batched:
            for i, app, _, times in list(built):
                t1 = time.perf_counter()
                try:
                    with setup_objects_frozen():
                        app.run()
                except Exception as exc:
                    outcomes[i] = exc
                    built = [b for b in built if b[0] != i]
                times["run"] = (time.perf_counter() - t1) * 1000.0
        for i, app, out, times in built:
            times.setdefault("run", run_share)
            times["compile"] = loads.compile_s * 1000.0 / max(1, len(built))
            try:
                outcomes[i] = _finish(app, app.config, out, times, loads, _StepClock(), check, log, [], plot)
            except OutputWriteError:  # a full disk stops the chunk: the next meshes cannot write either
                raise
            except Exception as exc:  # check_final failed (outputs written)
                outcomes[i] = exc
    return outcomes


@dataclass
class WarmupReport:
    """What :func:`warmup_app` did.

    Attributes:
        app: the app after its warm-up step.
        loads: the module loads seen (:class:`~warp_meshad._src.codegen.module_loads.ModuleLoads`).
        seconds: wall time of the warm-up (build and step).
    """

    app: App
    loads: ModuleLoads
    seconds: float


def warmup_app(config: AppConfig, quiet: bool = False, log=None, iterations: int = 2) -> WarmupReport:
    """Compile (or load from Warp's kernel cache) the kernels of a config's run ahead of time, writing nothing.

    Builds the app at the config's size (its kernels' compile-time sizes, e.g. the GPU tile plans, depend on it; use
    a ``test=True`` config for the small size) and takes one step capped at ``iterations`` solver iterations: the
    kernels Warp builds on first use (each energy term in each evaluation mode the solver uses, the assembly, the
    linear solver, the line search) are then compiled and cached. Kernels that a run first needs later (e.g. contact
    terms before any contact) still compile when they are first used, with a message.

    Args:
        config: an app config (from :func:`load_config`).
        quiet: no messages.
        log: ``log(text)`` for messages; default: print to stderr unless quiet.
        iterations: the solver iteration cap of the warm-up step (>= 1).

    Returns:
        :class:`WarmupReport`.
    """
    if log is None:
        log = stderr_log(quiet)
    config = config.model_copy(update={"steps": 1, "iterations": max(1, min(config.iterations, int(iterations)))})
    t0 = time.perf_counter()
    with ModuleLoads(log=None if quiet else log) as loads:
        with content_cache.enabled():
            app = app_class(config.app, config.origin("app"))(config)
        log(f"warming up {app.describe()}; one step of at most {plural(config.iterations, 'solver iteration')}, no "
            "outputs")
        app.step()
    seconds = time.perf_counter() - t0
    log(f"{loads.describe()}; warm-up took {seconds:.1f} s")
    return WarmupReport(app, loads, seconds)
