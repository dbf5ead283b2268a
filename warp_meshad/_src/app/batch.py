"""Running one app scene over a dataset of meshes: :func:`run_batch` (``warp-meshad batch``).

Each mesh is one run of the scene's config with ``mesh`` set to the file and ``output`` to ``<output>/<name>/``,
through the same :func:`~warp_meshad._src.app.runner.run_app` that ``warp-meshad run`` uses (final mesh,
``metrics.json``, ``convergence.png``; ``screenshot.png`` only when asked). The batch writes ``summary.csv`` (one row
per mesh: :data:`SUMMARY_COLUMNS`, rewritten after every chunk) and ``summary.png``. A mesh whose folder is complete
(its ``manifest.json`` lists the final mesh and ``metrics.json``, and every listed file has the listed size and hash:
:func:`~warp_meshad._src.app.output_set.verify_outputs`) is not run again, so an interrupted batch resumes where it
stopped, and a mesh whose outputs were damaged or removed since runs again. The batch holds the lock of its folder
(and each run the lock of its mesh's folder), so a second batch into the same folder refuses. A signal ends the batch
at once (:class:`~warp_meshad._src.app.interrupts.Interrupted`, saying how many meshes are finished): the mesh that
was running writes nothing, and a rerun resumes. A full disk (any ``OSError`` writing an output) stops it with an
:class:`~warp_meshad._src.app.output_set.OutputWriteError` naming the file. A bad
mesh or a failed solve is recorded in its row (status ``error``, or ``failed`` when ``check_final`` failed) and the
batch goes on; meshes with status ``error`` have no outputs and are tried again on a rerun. A failure that leaves the
process unable to go on (a Ray worker that dies, a CUDA context lost to a sticky error such as an illegal memory
access: :class:`DeviceLost`) costs no other mesh: on Ray the worker is replaced and the chunk's unfinished meshes run
again one per chunk, so only the mesh that kills its worker gets an error row; in this process the meshes not run
get rows saying so, and a rerun resumes with them.

Meshes go to the workers in chunks of ``batch_size`` (:func:`run_chunk`): where the app's steps batch (param with
projected Newton), a chunk's meshes are solved together, one kernel launch per term and one factorization per
iteration for all of them (:class:`~warp_meshad.ProblemBatch`); otherwise one after the other. With
``workers == 1`` and no ``address`` the chunks run in this process; otherwise on Ray (``pip install ray``, imported
only then): ``ray.init()`` starts a local Ray or joins the cluster at ``address``, and ``workers`` long-lived actors
(each keeps its Warp kernels loaded) take the chunks, each asking for ``1 / workers`` of a GPU when the cluster has
GPUs (several workers share one), one CPU otherwise.
"""

from __future__ import annotations

import csv
import functools
import glob
import json
import math
import os
import pathlib
import time
from dataclasses import dataclass, field

from warp_meshad._src.app.config import AppConfig, ConfigError, finish_config
from warp_meshad._src.app.folder_lock import FolderLock
from warp_meshad._src.app.interrupts import Interrupted
from warp_meshad._src.app.output_set import OutputWriteError, verify_outputs
from warp_meshad._src.app.outputs import check_output_folder
from warp_meshad._src.mesh.files import atomic_write
from warp_meshad._src.app.prefetch import Prefetch, default_build_jobs
from warp_meshad._src.app.progress import Progress, stderr_log
from warp_meshad._src.plural import plural

__all__ = ["SUMMARY_COLUMNS", "BatchReport", "DeviceLost", "find_meshes", "run_batch", "run_chunk", "start_ray"]

MESH_SUFFIXES = (".obj", ".off", ".ply")
SUMMARY_COLUMNS = ("name", "mesh", "vertices", "faces", "iterations", "final_energy", "energy_per_area", "seconds",
                   "status", "error", "ran")
WORKER_ENV = {"NCCL_NVLS_ENABLE": "0"}  # NVLink multicast off in every worker (NCCL hangs with it on some hosts)
RAY_HINT = "pip install 'warp-meshad[batch]' (or pip install ray); --workers 1 runs in this process without Ray"


@dataclass
class BatchReport:
    """What :func:`run_batch` did.

    Attributes:
        output: the batch's output folder.
        rows: one dict per mesh (keys :data:`SUMMARY_COLUMNS`), in the order of the mesh list.
        counts: number of rows by status (``done``, ``failed``, ``error``).
        ran: meshes run by this call (the others were complete from an earlier run).
        seconds: wall time of this call.
        files: ``summary`` (csv) and ``plot`` (png, absent without matplotlib).
        engine: ``"process"`` or ``"ray"``.
    """

    output: pathlib.Path
    rows: list
    counts: dict
    ran: int
    seconds: float
    files: dict = field(default_factory=dict)
    engine: str = "process"

    @property
    def ok(self) -> bool:
        """Every mesh done (check_final passed)."""
        return all(r["status"] == "done" for r in self.rows)


def find_meshes(source) -> list[pathlib.Path]:
    """The mesh files ``source`` names, in a fixed order.

    Args:
        source: a folder (its ``.obj``/``.off``/``.ply`` files, sorted by name), a glob pattern (``data/*.obj``,
            ``data/**/*.obj``; sorted), a ``.txt`` list (one path per line, relative to the list's folder; blank
            lines and ``#`` comments skipped; order kept), one mesh file, or a list of paths.

    Raises:
        ConfigError: key ``meshes``: nothing found, or a listed file missing.
    """
    if isinstance(source, (list, tuple)):
        paths = [pathlib.Path(p).expanduser() for p in source]
        where = "meshes"
    else:
        text = str(source)
        where = f"--meshes {text}"
        p = pathlib.Path(text).expanduser()
        if p.is_dir():
            paths = sorted(q for q in p.iterdir() if q.suffix.lower() in MESH_SUFFIXES and q.is_file())
        elif p.is_file() and p.suffix.lower() == ".txt":
            paths = []
            for line in p.read_text().splitlines():
                line = line.split("#", 1)[0].strip()
                if line:
                    q = pathlib.Path(line).expanduser()
                    paths.append(q if q.is_absolute() else p.parent / q)
        elif p.is_file():
            paths = [p]
        elif glob.has_magic(text):
            paths = sorted(pathlib.Path(q) for q in glob.glob(os.path.expanduser(text), recursive=True)
                           if pathlib.Path(q).suffix.lower() in MESH_SUFFIXES)
        else:
            raise ConfigError(where, "meshes", "expected a folder, a glob pattern, a .txt list or a mesh file; "
                                               "nothing exists there")
    if not paths:
        raise ConfigError(where, "meshes", f"no mesh files ({'/'.join(MESH_SUFFIXES)}) found")
    missing = [str(q) for q in paths if not q.is_file()]
    if missing:
        raise ConfigError(where, "meshes", f"{plural(len(missing), 'listed file')} not found: {missing[0]}")
    return [q.absolute() for q in paths]


def _items(meshes: list[pathlib.Path], output: pathlib.Path) -> list[dict]:
    """One work item per mesh: its name (the file's stem, made unique with ``_2``, ``_3``...), file and folder."""
    seen: dict[str, int] = {}
    items = []
    for m in meshes:
        name = m.stem
        seen[name] = seen.get(name, 0) + 1
        if seen[name] > 1:
            name = f"{name}_{seen[name]}"
        items.append({"name": name, "mesh": str(m), "folder": str(output / name)})
    return items


def _complete(item: dict, mesh_format: str) -> dict | None:
    """The metrics of a mesh whose outputs are complete (:func:`_check_complete`), else None."""
    return _check_complete(item, mesh_format)[0]


def _check_complete(item: dict, mesh_format: str) -> tuple[dict | None, str]:
    """``(metrics, "")`` of a mesh whose folder is complete: its manifest lists the final mesh and metrics.json and
    matches every listed file; else ``(None, why)``."""
    folder = pathlib.Path(item["folder"])
    if not folder.is_dir():
        return None, "not run yet"
    manifest, why = verify_outputs(folder, required=(f"final.{mesh_format}", "metrics.json"))
    if manifest is None:
        return None, why
    try:
        return json.loads((folder / "metrics.json").read_text()), ""
    except (OSError, ValueError):  # changed after the check: run it again
        return None, "metrics.json is unreadable"


def _row(item: dict, metrics: dict | None = None, error: str = "", seconds: float | None = None,
         ran: str = "now") -> dict:
    row = dict.fromkeys(SUMMARY_COLUMNS, "")
    row.update(name=item["name"], mesh=item["mesh"], ran=ran, error=error)
    if metrics is None:
        row.update(status="error", seconds=seconds)
        return row
    check = str(metrics.get("check_final", ""))
    t = metrics.get("time_ms", {})
    row.update(vertices=metrics["mesh"]["vertex_count"], faces=metrics["mesh"]["face_count"],
               iterations=metrics["iterations"], final_energy=metrics["final_energy"],
               energy_per_area=metrics.get("energy_per_area", ""),
               seconds=sum(t.get(k, 0.0) for k in ("setup", "run", "outputs")) / 1000.0,
               status="done" if check == "passed" else "failed",
               error="" if check == "passed" else check.removeprefix("failed: "))
    return row


def _mesh_config(base: AppConfig, item: dict) -> AppConfig:
    """The base config with ``mesh`` set to the item's file and ``output`` to its folder (as ``run --set mesh=``)."""
    config = base.model_copy(update={
        "mesh": item["mesh"], "output": item["folder"],
        "origins": {**base.origins, "mesh": f"--meshes {item['mesh']}", "output": f"--output {item['folder']}"}})
    return finish_config(config)


def _outcome_row(item: dict, outcome, mesh_format: str, seconds: float) -> dict:
    """A mesh's summary row from its run's outcome: a RunReport, or the exception that stopped it."""
    if isinstance(outcome, AssertionError):  # check_final failed: outputs written, metrics say why
        row = _row(item, _complete(item, mesh_format))
        if row["status"] == "error":
            row["error"] = "check_final failed and metrics.json is unreadable"
        return row
    if isinstance(outcome, ConfigError):  # a bad mesh (the MeshError's message) or folder
        return _row(item, error=outcome.detail if outcome.key == "mesh" else str(outcome), seconds=seconds)
    if isinstance(outcome, Exception):  # a failed solve: keep going
        return _row(item, error=f"{type(outcome).__name__}: {outcome}", seconds=seconds)
    return _row(item, outcome.metrics)


class DeviceLost(RuntimeError):
    """A mesh's failure left this process's CUDA context unusable (a sticky error, such as an illegal memory
    access): no later mesh can run in the process. Raised by :func:`run_chunk` after the failed mesh's row;
    :attr:`rows` holds the chunk's rows up to it."""

    def __init__(self, message: str, rows: list[dict]):
        super().__init__(message)
        self.rows = rows


def _device_lost() -> str | None:
    """Why this process's CUDA devices can run no more work (a sticky error), or None (no CUDA, or all is well)."""
    import warp as wp

    if wp.get_cuda_device_count() == 0:
        return None
    try:
        wp.synchronize()
    except RuntimeError as exc:
        return str(exc)
    return None


def _batchable(config: AppConfig) -> bool:
    from warp_meshad._src.app.base import App
    from warp_meshad._src.app.registry import app_class

    return app_class(config.app, config.origin("app")).batch_step_parts is not App.batch_step_parts


def run_chunk(config: AppConfig, items: list[dict], on_row=None, batched: bool = True, prepared=None) -> list[dict]:
    """Run the meshes of one chunk with ``config`` and return their summary rows (the unit of work of a worker).

    With ``batched`` and an app whose steps batch (param with projected Newton): the chunk's meshes are solved
    together (:func:`~warp_meshad._src.app.runner.run_apps_batched`: one :class:`~warp_meshad.ProblemBatch`, one
    launch per term for all meshes, one factorization of the block-diagonal system per iteration); otherwise each
    mesh is one :func:`~warp_meshad._src.app.runner.run_app` (quiet). Either way each mesh's error is caught into its
    row (status ``error``), except an :class:`OutputWriteError` (a full disk), which is raised; a ``check_final``
    failure gives status ``failed`` with the outputs written. After a
    mesh's error the CUDA devices are checked: if the error left the context unusable, :class:`DeviceLost` is raised
    (with the rows so far) instead of running the next meshes into the same error.

    Args:
        config: the scene's config (``mesh`` and ``output`` are replaced per mesh).
        items: ``{"name", "mesh", "folder"}`` per mesh.
        on_row: ``on_row(row)`` after each mesh (after the whole chunk when batched).
        batched: solve the chunk's meshes together where the app allows.
        prepared: per item, a callable returning :meth:`App.prepare`'s dict built ahead (or None), or None: each
            app builds itself.
    """
    from warp_meshad._src.app import runner

    if batched and len(items) > 1 and _batchable(config):
        t0 = time.perf_counter()
        outcomes = runner.run_apps_batched([_mesh_config(config, item) for item in items], check=True,
                                           plot=config.screenshot, prepared=prepared)
        share = (time.perf_counter() - t0) / len(items)
        rows = [_outcome_row(item, oc, config.mesh_format, share) for item, oc in zip(items, outcomes)]
        for row in rows:
            if on_row is not None:
                on_row(row)
        if any(isinstance(oc, Exception) for oc in outcomes):
            _raise_if_device_lost(items, rows)
        return rows
    rows = []
    for k, item in enumerate(items):
        t0 = time.perf_counter()
        try:
            outcome = runner.run_app(_mesh_config(config, item), quiet=True, check=True, plot=config.screenshot,
                                     prepared=prepared[k] if prepared else None)
        except OutputWriteError:  # a full disk: the next meshes cannot write either
            raise
        except Exception as exc:
            outcome = exc
        row = _outcome_row(item, outcome, config.mesh_format, time.perf_counter() - t0)
        rows.append(row)
        if on_row is not None:
            on_row(row)
        if isinstance(outcome, Exception):
            _raise_if_device_lost(items[: k + 1], rows)
    return rows


def _raise_if_device_lost(items: list[dict], rows: list[dict]) -> None:
    why = _device_lost()
    if why is not None:
        raise DeviceLost(f"the CUDA context was lost after mesh {items[-1]['name']!r} failed ({why})", rows)


# -- engines -----------------------------------------------------------------------------------------------------------


def _chunks(items: list, size: int) -> list[list]:
    return [items[i:i + size] for i in range(0, len(items), size)]


def _config_payload(config: AppConfig) -> tuple[str, dict]:
    """The config as (app name, plain dict): rebuilt in a worker without pickling the app's class."""
    return config.app, config.model_dump()


def _config_from_payload(payload: tuple[str, dict]) -> AppConfig:
    from warp_meshad._src.app.registry import app_class

    name, data = payload
    return app_class(name).config_class(**data)


class _BatchWorker:
    """A Ray actor's body: builds the config once, then runs chunk after chunk (kernels stay loaded)."""

    def __init__(self, payload, verbose: bool = False, batched: bool = True):
        os.environ.update(WORKER_ENV)
        self.batched = batched
        import warp as wp

        if not verbose:
            wp.config.log_level = wp.LOG_WARNING
        self.config = _config_from_payload(payload)

    def run(self, items: list[dict]) -> tuple[list[dict], str | None, OutputWriteError | None]:
        """The chunk's rows, None and None; or, when a mesh's failure lost the CUDA context, the rows up to it and why
        (the driver then replaces this worker); or, when an output could not be written, no rows and the error (the
        driver stops the batch with it)."""
        try:
            return run_chunk(self.config, items, batched=self.batched), None, None
        except DeviceLost as exc:
            return exc.rows, str(exc), None
        except OutputWriteError as exc:
            return [], None, exc


def _import_ray():
    try:
        import ray
    except ImportError:
        raise ImportError(f"--workers > 1 and --address run the batch on Ray, which is not installed: "
                          f"{RAY_HINT}") from None
    return ray


def start_ray(address: str | None = None, verbose: bool = False) -> bool:
    """Start a local Ray (or join the cluster at ``address``) as :func:`run_batch` does, unless Ray already runs in
    this process; batches run later in the process then use it without starting or stopping it (their workers get
    the same environment: Warp's and warp_meshad's cache folders, ``PYTHONPATH``, NVLink multicast off).

    Returns:
        Whether this call started it (``ray.shutdown()`` stops it).

    Raises:
        ImportError: Ray is not installed; the message says how to install it.
    """
    ray = _import_ray()
    if ray.is_initialized():
        return False
    env = {**WORKER_ENV, **{k: os.environ[k] for k in ("WARP_CACHE_PATH", "WARP_MESHAD_CACHE_PATH", "PYTHONPATH")
                            if k in os.environ}}
    ray.init(address=address, runtime_env={"env_vars": env}, include_dashboard=False, log_to_driver=verbose,
             logging_level="ERROR")
    return True


def _run_ray(config: AppConfig, chunks: list[list[dict]], workers: int, address: str | None, on_rows, log,
             verbose: bool, batched: bool = True) -> None:
    ray = _import_ray()
    started = start_ray(address, verbose)
    try:
        gpus = float(ray.cluster_resources().get("GPU", 0.0))
        workers = max(1, min(workers, len(chunks)))
        options = {"num_cpus": 1}
        if gpus > 0:
            options = {"num_cpus": 1, "num_gpus": min(1.0, gpus / workers)}
        log(f"Ray: {plural(workers, 'worker')} ({'%.3g GPU' % options['num_gpus'] if gpus else '1 CPU'} each), "
            f"{plural(len(chunks), 'chunk')}")
        actor_cls = ray.remote(**options)(_BatchWorker)
        payload = _config_payload(config)
        actors = [actor_cls.remote(payload, verbose, batched) for _ in range(workers)]
        queue = list(chunks)
        pending = {}
        for actor in actors:
            if queue:
                chunk = queue.pop(0)
                pending[actor.run.remote(chunk)] = (actor, chunk)
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            for ref in done:
                actor, chunk = pending.pop(ref)
                try:
                    rows, lost, write_error = ray.get(ref)
                except ray.exceptions.RayError as exc:  # the worker died (a crash in native code, out of memory)
                    rows, lost, write_error = [], f"the worker process died ({type(exc).__name__}: " \
                                                  f"{str(exc).splitlines()[0]})", None
                if write_error is not None:  # a full disk: stop (the meshes written so far are complete)
                    raise write_error
                if lost is not None:
                    log(f"Ray: a worker lost its device or died in a chunk of {plural(len(chunk), 'mesh', 'meshes')}; "
                        f"a new worker takes over: {lost}")
                    _kill(ray, actor)
                    actors.remove(actor)
                    actor = actor_cls.remote(payload, verbose, batched)
                    actors.append(actor)
                    rows, again = _after_lost_worker(chunk, rows, lost, config.mesh_format)
                    queue[:0] = again
                on_rows(rows)
                if queue:
                    chunk = queue.pop(0)
                    pending[actor.run.remote(chunk)] = (actor, chunk)
        for actor in actors:
            _kill(ray, actor)
    finally:
        if started:
            ray.shutdown()


def _kill(ray, actor) -> None:
    try:
        ray.kill(actor)
    except Exception:  # noqa: BLE001 (already gone)
        pass


def _after_lost_worker(chunk: list[dict], rows: list[dict], why: str, mesh_format: str):
    """After a worker died or lost its device in ``chunk`` (``rows``: what it returned): the rows to record now, and
    the chunks to run again. Meshes whose outputs are complete are recorded from them; a chunk of one mesh gets its
    error row (the mesh that kills a worker by itself); the other unfinished meshes run again, one per chunk, so that
    one bad mesh cannot take the others down with it."""
    have = {r["name"]: r for r in rows}
    out, again = [], []
    for item in chunk:
        if item["name"] in have:
            out.append(have[item["name"]])
            continue
        metrics = _complete(item, mesh_format)
        if metrics is not None:
            out.append(_row(item, metrics))
        elif len(chunk) == 1:
            out.append(_row(item, error=why))
        else:
            again.append([item])
    return out, again


# -- summary -----------------------------------------------------------------------------------------------------------


def _write_atomic(path: pathlib.Path, write) -> None:
    """``atomic_write`` (the temporary file removed on failure), an ``OSError`` raised as :class:`OutputWriteError`."""
    try:
        atomic_write(path, write)
    except OSError as exc:
        kept = f"the {path.name} written before is kept" if path.exists() else f"no {path.name} was written"
        raise OutputWriteError(path, exc, path.parent, f"{kept} (no temporary file left); the meshes finished "
                                                       "before keep their complete outputs") from None


def write_summary_csv(path: pathlib.Path, rows: list[dict]) -> None:
    """``summary.csv``: :data:`SUMMARY_COLUMNS`, one row per mesh, atomically.

    Raises:
        OutputWriteError: it could not be written (the earlier ``summary.csv`` is kept, no temporary file left).
    """
    def write(tmp):
        with open(tmp, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=SUMMARY_COLUMNS)
            w.writeheader()
            for r in rows:
                w.writerow({k: ("" if r.get(k) is None else r.get(k)) for k in SUMMARY_COLUMNS})

    _write_atomic(path, write)


def write_summary_plot(path: pathlib.Path, rows: list[dict], title: str) -> bool:
    """``summary.png``: the final E / A (else final energy) histogram, time against face count (failures as red
    crosses), and the count of each status. False when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False

    def num(v):
        try:
            x = float(v)
        except (TypeError, ValueError):
            return math.nan
        return x

    ok = [r for r in rows if r["status"] == "done"]
    bad = [r for r in rows if r["status"] != "done"]
    use_ratio = any(math.isfinite(num(r["energy_per_area"])) for r in ok)
    key, label = ("energy_per_area", "final E / A") if use_ratio else ("final_energy", "final energy")
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    vals = [num(r[key]) for r in ok]
    vals = [v for v in vals if math.isfinite(v)]
    ax = axes[0]
    if vals:
        ax.hist(vals, bins=min(40, max(5, len(vals) // 3)), color="tab:blue")
    ax.set_xlabel(label)
    ax.set_ylabel("meshes")
    ax.set_title(f"{label} of {plural(len(vals), 'finished mesh', 'finished meshes')}")
    ax = axes[1]
    xs, ys = [num(r["faces"]) for r in ok], [num(r["seconds"]) for r in ok]
    ax.scatter(xs, ys, s=12, color="tab:blue", label="done")
    fx = [num(r["faces"]) for r in bad]
    fy = [num(r["seconds"]) for r in bad]
    fx = [x if math.isfinite(x) else (min(xs) if xs else 1.0) for x in fx]  # unknown size: at the left edge
    if bad:
        ax.scatter(fx, fy, s=40, marker="x", color="tab:red", label="failed / error")
        ax.legend()
    if xs or fx:
        ax.set_xscale("log")
        ax.set_yscale("log")
    ax.set_xlabel("faces")
    ax.set_ylabel("time per mesh [s]")
    ax.set_title("time against mesh size")
    ax = axes[2]
    statuses = ["done", "failed", "error"]
    counts = [sum(r["status"] == s for r in rows) for s in statuses]
    bars = ax.bar(statuses, counts, color=["tab:blue", "tab:orange", "tab:red"])
    ax.bar_label(bars)
    ax.set_title(f"status of {plural(len(rows), 'mesh', 'meshes')}")
    fig.suptitle(title)
    fig.tight_layout()
    try:
        _write_atomic(path, lambda tmp: fig.savefig(tmp, dpi=100, format="png"))
    finally:
        plt.close(fig)
    return True


# -- the batch -----------------------------------------------------------------------------------------------------------


def run_batch(config: AppConfig, meshes, output, workers: int = 1, address: str | None = None, batch_size: int = 4,
              screenshots: bool = False, quiet: bool = False, verbose: bool = False, log=None,
              batched: bool = True, build_jobs: int | None = None, wait: bool = False) -> BatchReport:
    """Run ``config`` (a scene) on every mesh of ``meshes`` and write the per-mesh outputs and the summary.

    Args:
        config: the scene's config (from :func:`~warp_meshad._src.app.loader.load_config`; its ``mesh`` and
            ``output`` are replaced per mesh).
        meshes: a folder, a glob, a ``.txt`` list, one file, or a list of paths (:func:`find_meshes`).
        output: the batch's folder: ``<output>/<name>/`` per mesh, ``summary.csv``, ``summary.png``.
        workers: 1: in this process (unless ``address``); more: that many Ray actors.
        address: a Ray cluster to join (``"auto"``, ``"ray://host:10001"``); None: a local Ray when ``workers > 1``.
        batch_size: meshes per chunk (a worker's unit of work; solved together where the app's steps batch).
        screenshots: render each mesh's ``screenshot.png`` and ``convergence.png`` (slow; off by default).
        quiet: no progress bar and no messages.
        verbose: show Warp's messages and, on Ray, the workers' output.
        log: ``log(text)`` for messages; default: stderr unless quiet.
        batched: solve a chunk's meshes together (see :func:`run_chunk`); False: one after the other.
        build_jobs: in this process, processes that build the next meshes ahead (:meth:`App.prepare`: mesh file,
            start point) while the device solves (:class:`~warp_meshad._src.app.prefetch.Prefetch`); None:
            :func:`~warp_meshad._src.app.prefetch.default_build_jobs`, at most one per 4 meshes to run; 0: none. Ray
            workers build their own.
        wait: when another process holds the batch's folder, wait for it instead of refusing.

    Returns:
        :class:`BatchReport`.

    Raises:
        ConfigError: bad ``meshes``, ``output``, ``workers`` or ``batch_size`` (nothing run); ``FolderBusy``: another
            process writes to ``output``.
        OutputWriteError: an output could not be written (a full disk); the meshes finished before stay complete.
        Interrupted: SIGINT / SIGTERM (or Ctrl-C): how many meshes are finished; a rerun resumes.
        ImportError: Ray is needed (``workers > 1`` or ``address``) and not installed; the message says how.
    """
    if log is None:
        log = stderr_log(quiet)
    if not (isinstance(workers, int) and workers >= 1):
        raise ConfigError("--workers", "workers", f"expected an int >= 1, got {workers!r}")
    if not (isinstance(batch_size, int) and batch_size >= 1):
        raise ConfigError("--batch-size", "batch_size", f"expected an int >= 1, got {batch_size!r}")
    if build_jobs is not None and not (isinstance(build_jobs, int) and build_jobs >= 0):
        raise ConfigError("--build-jobs", "build_jobs", f"expected an int >= 0, got {build_jobs!r}")
    use_ray = workers > 1 or address is not None
    if use_ray:
        _import_ray()  # before any work: say how to install it
    out = check_output_folder(output, "--output")
    paths = find_meshes(meshes)
    with FolderLock(out, "--output", wait=wait, log=log):
        return _run_batch_locked(config, paths, out, use_ray, workers, address, batch_size, screenshots, quiet, verbose,
                                 log, batched, build_jobs)


def _run_batch_locked(config, paths, out, use_ray, workers, address, batch_size, screenshots, quiet, verbose, log,
                      batched, build_jobs) -> BatchReport:
    """:func:`run_batch` once its folder is locked."""
    config = config.model_copy(update={"screenshot": bool(screenshots), "viewer": False})
    items = _items(paths, out)
    rows: dict[str, dict] = {}
    todo = []
    damaged = []
    for item in items:
        metrics, why = _check_complete(item, config.mesh_format)
        if metrics is None:
            todo.append(item)
            if pathlib.Path(item["folder"]).is_dir() and why != "no manifest.json":
                damaged.append(f"{item['name']} ({why})")
        else:
            rows[item["name"]] = _row(item, metrics, ran="earlier")
    t0 = time.perf_counter()
    log(f"{config.app}/{config.scene}: {plural(len(items), 'mesh', 'meshes')}, {len(rows)} complete from an earlier "
        f"run, {len(todo)} to run {'on Ray' if use_ray else 'in this process'} -> {out}")
    if damaged:
        log(f"run again, their outputs do not match their manifest: {', '.join(damaged[:5])}"
            + (f" and {len(damaged) - 5} more" if len(damaged) > 5 else ""))
    summary = out / "summary.csv"
    progress = Progress(len(items), quiet=quiet, unit="mesh")
    progress.update(len(rows), "")
    order = [it["name"] for it in items]

    def ordered():
        return [rows[n] for n in order if n in rows]

    def on_rows(new):
        for r in new:
            rows[r["name"]] = r
        bad = sum(r["status"] != "done" for r in rows.values())
        progress.update(len(rows), f"{bad} failed" if bad else "")
        write_summary_csv(summary, ordered())  # after every chunk: an interrupted batch keeps its table

    if use_ray:  # largest first (file size for mesh size): the last chunks to finish are the short ones
        todo = sorted(todo, key=lambda it: -os.path.getsize(it["mesh"]))
    chunks = _chunks(todo, batch_size)
    try:
        if use_ray and chunks:
            _run_ray(config, chunks, workers, address, on_rows, log, verbose, batched)
        else:
            jobs = build_jobs
            if jobs is None:  # a spawned process starts in about a second: worth it from a few meshes per process
                jobs = min(default_build_jobs(), len(todo) // 4)
            with Prefetch([_mesh_config(config, it) for chunk in chunks for it in chunk], jobs) as ahead:
                first = 0
                try:
                    for chunk in chunks:
                        prepared = [functools.partial(ahead.get, first + k) for k in range(len(chunk))]
                        run_chunk(config, chunk, on_row=lambda r: on_rows([r]), batched=batched, prepared=prepared)
                        first += len(chunk)
                except DeviceLost as exc:  # nothing more runs in this process: say so in the rows of the rest
                    left = [it for it in todo if it["name"] not in rows]
                    log(f"{exc}; {plural(len(left), 'mesh', 'meshes')} not run: run the batch again to resume")
                    on_rows([_row(it, error=f"not run: {exc}; run the batch again to resume") for it in left])
    except KeyboardInterrupt as exc:
        finished = sum(r["status"] != "error" for r in rows.values())  # their folders are complete
        now = sum(r["status"] != "error" and r["ran"] == "now" for r in rows.values())
        what = (f"{config.app}/{config.scene}: {finished} of {plural(len(items), 'mesh', 'meshes')} finished with "
                f"complete outputs ({now} in this run, {finished - now} earlier), {len(items) - finished} not; "
                f"{summary.name} lists those before the signal; run the same command again to resume (finished "
                "meshes are skipped)")
        raise Interrupted(Interrupted.of(exc).signum, what) from None
    final = ordered()
    write_summary_csv(summary, final)
    files = {"summary": summary}
    plot = out / "summary.png"
    title = f"{config.app}/{config.scene}: {plural(len(final), 'mesh', 'meshes')}"
    if write_summary_plot(plot, final, title):
        files["plot"] = plot
    else:
        log("summary.png skipped: matplotlib is not installed (pip install matplotlib)")
    counts = {s: sum(r["status"] == s for r in final) for s in ("done", "failed", "error")}
    seconds = time.perf_counter() - t0
    log(f"{counts['done']} done, {counts['failed']} failed, {counts['error']} errors; {len(todo)} run now in "
        f"{seconds:.1f} s; wrote {', '.join(p.name for p in files.values())} to {out}")
    for r in final:
        if r["status"] != "done":
            log(f"  {r['name']}: {r['status']}: {r['error']}")
    return BatchReport(out, final, counts, len(todo), seconds, files, "ray" if use_ray else "process")
