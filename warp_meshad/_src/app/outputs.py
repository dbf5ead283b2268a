"""The files a run writes to its output folder: ``metrics.json``, ``convergence.png``, the final mesh; and the
output folder itself (its default name, and the check that it can be written before any work is done).

Every file is written atomically (temporary file, then ``os.replace``) with the permissions of an ordinary new file
(``0666`` less the umask). matplotlib is optional and imported only for the plot, whose figure is drawn by
:mod:`~warp_meshad._src.app.plot` (re-exported here: :func:`convergence_figure`).
"""

from __future__ import annotations

import errno
import json
import math
import os
import pathlib
import platform
import tempfile

import numpy as np

from warp_meshad._src.app.base import App
from warp_meshad._src.app.config import AppConfig, ConfigError
from warp_meshad._src.app.plot import convergence_figure, convergence_png
from warp_meshad._src.mesh.files import atomic_write
from warp_meshad._src.mesh.trimesh import TriMesh

__all__ = ["build_metrics", "check_output_folder", "convergence_figure", "convergence_title", "json_safe",
           "output_folder", "save_mesh", "versions", "write_convergence_plot", "write_metrics"]


def json_safe(v):
    """``v`` with numpy scalars and arrays, tuples and paths made JSON types; NaN and infinities become None."""
    if isinstance(v, dict):
        return {str(k): json_safe(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [json_safe(x) for x in v]
    if isinstance(v, (np.floating, float)):
        return float(v) if math.isfinite(v) else None
    if isinstance(v, np.integer):
        return int(v)
    if isinstance(v, np.ndarray):
        return json_safe(v.tolist())
    if isinstance(v, pathlib.Path):
        return str(v)
    return v


def versions() -> dict:
    """Versions of the toolkit and its main dependencies."""
    import warp as wp

    from warp_meshad import __version__

    out = {"warp_meshad": __version__, "warp": wp.config.version, "numpy": np.__version__,
           "python": platform.python_version(), "platform": platform.platform()}
    try:
        import scipy

        out["scipy"] = scipy.__version__
    except ImportError:
        pass
    return out


def build_metrics(app: App, times: dict, check: str) -> dict:
    """The content of ``metrics.json`` (non-finite numbers become null).

    Totals (``iterations``, the solver's ``time_ms``, ...) cover every step; ``per_step``, ``energy`` and
    ``gradient_norm`` the records the history kept (all of them unless the run took more than
    ``App.history_capacity + 1`` steps: then the first and the latest, ``per_step_dropped`` counting the others)."""
    c = app.config
    history = app.history
    energies, gnorms = [], []
    for rec in history:
        skip = 1 if app.continuous_objective and energies else 0
        energies.extend(rec["energies"][skip:])
        gnorms.extend(rec["gradient_norms"][skip:])
    phases = history.total("time_ms", {})
    m = app.mesh
    out = {
        "app": app.name,
        "scene": c.scene,
        "config_file": c.source,
        "device": app.device,
        "device_reason": app.device_reason,
        "dtype": c.dtype,
        "versions": versions(),
        "mesh": {"vertex_count": m.vertex_count, "face_count": m.face_count, "edge_count": m.edge_count},
        "steps": app.steps_done,
        "iterations": int(history.total("iterations")),
        "steepest_descent_fallbacks": int(history.total("steepest_descent_fallbacks")),
        "linear_solves_capped": int(history.total("linear_solves_capped")),
        "final_energy": app.energy,
        "final_gradient_norm": app.gradient_norm,
        "energy": energies,
        "gradient_norm": gnorms,
        "time_ms": {**{"solver_" + k: v for k, v in phases.items()}, **times},
        "per_step": list(history),
        "per_step_dropped": history.dropped,  # steps between the first and the kept records (a long run)
        "check_final": check,
        "config": c.model_dump(),
    }
    out.update(app.extra_metrics())
    return json_safe(out)


def write_metrics(path: pathlib.Path, metrics: dict) -> None:
    """``metrics`` as indented JSON at ``path``, atomically."""
    def w(tmp):
        with open(tmp, "w") as f:
            json.dump(metrics, f, indent=1, allow_nan=False)
            f.write("\n")

    atomic_write(path, w)


def write_convergence_plot(path: pathlib.Path, app: App) -> bool:
    """``convergence.png`` (:func:`convergence_figure`): per step for apps whose steps are separate minimizations
    (time steps), per iteration for one minimization. False if matplotlib is missing."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    png = convergence_png(app.history, convergence_title(app), per_step=not app.continuous_objective)
    atomic_write(path, lambda tmp: pathlib.Path(tmp).write_bytes(png))
    return True


def convergence_title(app: App) -> str:
    """The title of ``convergence.png``: app, scene, solver and device."""
    c = app.config
    return f"{app.name}/{c.scene or 'custom'} ({c.solver}, {app.device})"


def save_mesh(path: pathlib.Path, app: App) -> None:
    """The current positions on the app's mesh, atomically (:meth:`TriMesh.save` writes atomically)."""
    TriMesh(app.positions(), app.mesh.faces).save(path, **app.save_options())


def output_folder(config: AppConfig) -> pathlib.Path:
    """``config.output``, or ``output/<app>_<scene>`` under the current folder (``output/<app>_<scene>_test`` for a
    test-size run, so that it does not overwrite the full run's outputs)."""
    if config.output:
        return pathlib.Path(config.output).expanduser()
    return pathlib.Path("output") / f"{config.app}_{config.scene or 'custom'}{'_test' if config.test_run else ''}"


def check_output_folder(path, where: str = "output") -> pathlib.Path:
    """Create the output folder if needed and check that a file can be written in it, before any work is done.

    Args:
        path: the output folder.
        where: what set it (a config file, ``"--output"``), named in the error.

    Returns:
        The folder.

    Raises:
        ConfigError: key ``output``: the folder cannot be created (a file stands in its way, no permission) or a
            file cannot be written in it.
    """
    folder = pathlib.Path(path).expanduser()
    try:
        if folder.exists() and not folder.is_dir():
            raise NotADirectoryError(errno.ENOTDIR, "it is a file, not a folder", str(folder))
        folder.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".write-test.", dir=folder)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        reason = exc.strerror or str(exc)
        if exc.filename is not None and str(exc.filename) != str(folder):
            reason += f" ({exc.filename})"
        raise ConfigError(where, "output", f"cannot write the outputs to folder {str(folder)!r}: {reason}; choose "
                                           "another folder (--output DIR)") from None
    return folder
