"""The files a run writes to its output folder: ``metrics.json``, ``convergence.png``, the final mesh; and the
output folder itself (its default name, and the check that it can be written before any work is done).

Every file is written atomically (temporary file, then ``os.replace``) with the permissions of an ordinary new file
(``0666`` less the umask). matplotlib is optional and imported only for the plot.
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
from warp_meshad._src.mesh.files import atomic_write
from warp_meshad._src.mesh.trimesh import TriMesh

__all__ = ["build_metrics", "check_output_folder", "convergence_figure", "json_safe", "output_folder", "save_mesh",
           "versions", "write_convergence_plot", "write_metrics"]


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


def _step_colors(count: int):
    """One colour per step (viridis, first step dark) and the colour map's normalization, for ``count`` steps."""
    from matplotlib import cm, colors

    norm = colors.Normalize(vmin=1, vmax=max(count, 2))
    return [cm.viridis(norm(k + 1)) for k in range(count)], norm


def convergence_figure(history: list[dict], title: str, per_step: bool):
    """The figure of ``convergence.png`` (a matplotlib ``Figure``, no pyplot state).

    Args:
        history: the app's step records (:attr:`App.history`): each with ``energies`` and ``gradient_norms`` per
            solver iteration (iteration 0 is the step's start).
        title: the figure's title (app, scene, solver, device).
        per_step: the steps are separate minimizations (time steps, continuation rounds): the left panel draws each
            step's energy above its own final value, E - E_end, against the iteration within the step (one line per
            step; the final point, 0, is left out of the log scale); the right panel the gradient norm per iteration
            with the steps one after the other and their boundaries marked. Else (one minimization over all steps)
            the energy and the gradient norm per iteration, steps concatenated.

    Returns:
        The figure: axes 0 the energy panel, axes 1 the gradient-norm panel (plus a colour-bar axes for more than
        8 steps).
    """
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    fig = Figure(figsize=(11, 4.2), layout="constrained")
    ax_e, ax_g = fig.subplots(1, 2)
    fig.suptitle(title)
    count = len(history)
    if per_step:
        colors, norm = _step_colors(count)
        legend_per_step = count <= 8
        offset = 0
        for k, (rec, color) in enumerate(zip(history, colors)):
            e, g = np.asarray(rec["energies"], dtype=np.float64), np.asarray(rec["gradient_norms"], dtype=np.float64)
            label = f"step {rec['step'] + 1}" + (f" (t = {rec['time']:.4g} s)" if "time" in rec else "")
            above = e[:-1] - e[-1]
            ax_e.semilogy(np.arange(above.size), np.where(above > 0.0, above, np.nan), "o-", color=color, lw=1.2,
                          ms=3, label=label if legend_per_step else None)
            if g.size:
                ax_g.semilogy(offset + np.arange(g.size), np.maximum(g, 1e-300), "o-", color=color, lw=1.2, ms=3)
                if k > 0:
                    ax_g.axvline(offset - 0.5, color="0.55", ls=":", lw=1.0,
                                 label="step boundary" if k == 1 else None)
                offset += g.size
        ax_e.set(title="energy above the end of its step, per step", xlabel="iteration within the step",
                 ylabel="E - E(end of step)")
        ax_g.set(title="gradient norm, steps one after the other", xlabel="iteration (all steps)",
                 ylabel="gradient norm |g|")
        if legend_per_step:
            ax_e.legend(fontsize="small")
        else:
            from matplotlib import cm

            fig.colorbar(cm.ScalarMappable(norm=norm, cmap="viridis"), ax=[ax_e, ax_g], label="step")
        if count > 1:
            ax_g.legend(fontsize="small", loc="best")
    else:
        energies, gnorms = [], []
        for rec in history:  # one minimization: each step starts where the last one ended (skip the repeat)
            skip = 1 if energies else 0
            energies.extend(rec["energies"][skip:])
            gnorms.extend(rec["gradient_norms"][skip:])
        e, g = np.asarray(energies, dtype=np.float64), np.asarray(gnorms, dtype=np.float64)
        ax_e.plot(np.arange(e.size), e, "o-" if e.size < 50 else "-", color="C0", lw=1.2, ms=3)
        if e.size and np.all(e > 0.0) and e.max() >= 10.0 * e.min():
            ax_e.set_yscale("log")
        if g.size:
            ax_g.semilogy(np.arange(g.size), np.maximum(g, 1e-300), "o-" if g.size < 50 else "-", color="C0",
                          lw=1.2, ms=3)
        ax_e.set(title="energy", xlabel="iteration", ylabel="energy E")
        ax_g.set(title="gradient norm", xlabel="iteration", ylabel="gradient norm |g|")
    for ax in (ax_e, ax_g):
        ax.grid(alpha=0.3)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    return fig


def write_convergence_plot(path: pathlib.Path, app: App) -> bool:
    """``convergence.png`` (:func:`convergence_figure`): per step for apps whose steps are separate minimizations
    (time steps), per iteration for one minimization. False if matplotlib is missing."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    c = app.config
    fig = convergence_figure(app.history, f"{app.name}/{c.scene or 'custom'} ({c.solver}, {app.device})",
                             per_step=not app.continuous_objective)
    atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", dpi=110))
    return True


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
