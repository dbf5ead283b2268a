"""``convergence.png``: the figure (:func:`convergence_figure`, :func:`convergence_png`) and :class:`PlotWorker`, a
child process that imports matplotlib while a run builds and steps, then draws the figure when the run ends.

matplotlib's import is the larger part of a plot's cost (about 0.5 s on a 2-core CPU host, against 0.2-0.4 s for
the drawing), and a run's command line pays it anew in every process. The worker pays it in another process while
the run works: it starts with the run, imports matplotlib and, unless the run already asks for its figure, draws one
small figure (its fonts and its mathematical-text parser are then loaded), then waits on its standard input for the
run's step records; it draws the figure and writes the PNG's bytes to its standard output. The run writes those
bytes to its output folder itself, as one of its outputs (:class:`~warp_meshad._src.app.output_set.OutputSet`): the
child writes no file. A worker that fails (no matplotlib, a crash, over time) makes the run draw the figure in its
own process instead.

This file imports numpy only; matplotlib when a figure is drawn. The worker runs this file by path (not as
``warp_meshad._src.app.plot``), so that it imports neither Warp nor the rest of the toolkit.
"""

from __future__ import annotations

import io
import json
import os
import pathlib
import subprocess
import sys
import threading
import time

import numpy as np

from warp_meshad._src.app.child_process import stop_child

__all__ = ["DPI", "PlotWorker", "convergence_figure", "convergence_png", "plot_records"]

DPI = 110
_CHILD = "import runpy, sys; sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')"
# one small figure drawn ahead: the fonts, the glyph cache and the mathematical-text parser (log-axis labels) load
_WARM_UP = {"history": [{"step": 0, "energies": [3.0, 2.0, 1.0], "gradient_norms": [1.0, 0.1, 0.01]}],
            "title": "warm-up", "per_step": False}


def _step_colors(count: int):
    """One colour per step (viridis, first step dark) and the colour map's normalization, for ``count`` steps."""
    from matplotlib import cm, colors

    norm = colors.Normalize(vmin=1, vmax=max(count, 2))
    return [cm.viridis(norm(k + 1)) for k in range(count)], norm


def convergence_figure(history: list[dict], title: str, per_step: bool):
    """The figure of ``convergence.png`` (a matplotlib ``Figure``, no pyplot state; fixed margins, no layout engine).

    Args:
        history: the app's step records (:attr:`App.history`): each with ``energies`` and ``gradient_norms`` per
            solver iteration (iteration 0 is the step's start), ``step`` and optionally ``time`` [s].
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
    from matplotlib.ticker import MaxNLocator, NullLocator

    count = len(history)
    legend_per_step = count <= 8
    fig = Figure(figsize=(11, 4.2))
    # fixed margins (room for the step colour bar's label where there is one): a layout engine would measure every
    # label first, half of the drawing's time
    fig.subplots_adjust(left=0.065, right=0.985 if legend_per_step or not per_step else 0.955, bottom=0.125,
                        top=0.83, wspace=0.24)
    ax_e, ax_g = fig.subplots(1, 2)
    fig.suptitle(title)
    if per_step and legend_per_step:
        colors, norm = _step_colors(count)
        offset = 0
        for k, (rec, color) in enumerate(zip(history, colors)):
            e, g = np.asarray(rec["energies"], dtype=np.float64), np.asarray(rec["gradient_norms"], dtype=np.float64)
            label = f"step {rec['step'] + 1}" + (f" (t = {rec['time']:.4g} s)" if rec.get("time") is not None else "")
            above = e[:-1] - e[-1]
            ax_e.semilogy(np.arange(above.size), np.where(above > 0.0, above, np.nan), "o-", color=color, lw=1.2,
                          ms=3, label=label)
            if g.size:
                ax_g.semilogy(offset + np.arange(g.size), np.maximum(g, 1e-300), "o-", color=color, lw=1.2, ms=3)
                if k > 0:
                    ax_g.axvline(offset - 0.5, color="0.55", ls=":", lw=1.0,
                                 label="step boundary" if k == 1 else None)
                offset += g.size
    elif per_step:
        # many steps: each panel's lines as one collection and its points as one scatter (the same picture, drawn in
        # a fraction of the time of two lines per step)
        colors, norm = _step_colors(count)
        _many_steps(ax_e, ax_g, history, colors)
    if per_step:
        ax_e.set(title="energy above the end of its step, per step", xlabel="iteration within the step",
                 ylabel="E - E(end of step)")
        ax_g.set(title="gradient norm, steps one after the other", xlabel="iteration (all steps)",
                 ylabel="gradient norm |g|")
        if legend_per_step:
            ax_e.legend(fontsize="small")
        else:
            from matplotlib import cm

            fig.colorbar(cm.ScalarMappable(norm=norm, cmap="viridis"), ax=[ax_e, ax_g], label="step", pad=0.015,
                         fraction=0.04)
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
        if ax.get_yscale() == "log":  # no minor ticks: over many decades they are most of the drawing's time
            ax.yaxis.set_minor_locator(NullLocator())
    return fig


def _many_steps(ax_e, ax_g, history: list[dict], colors) -> None:
    """The per-step curves of :func:`convergence_figure` for many steps: E - E(end of step) per step on ``ax_e``, the
    gradient norms one step after the other on ``ax_g`` with the steps' boundaries, in the steps' ``colors``."""
    from matplotlib.collections import LineCollection

    e_lines, e_points, e_colors = [], [], []
    g_lines, g_line_colors, g_colors, bounds = [], [], [], []
    offset = 0
    for k, (rec, color) in enumerate(zip(history, colors)):
        e, g = np.asarray(rec["energies"], dtype=np.float64), np.asarray(rec["gradient_norms"], dtype=np.float64)
        above = e[:-1] - e[-1]
        it = np.arange(above.size, dtype=np.float64)
        e_lines.append(np.column_stack([it, np.where(above > 0.0, above, np.nan)]))
        keep = above > 0.0
        e_points.append(np.column_stack([it[keep], above[keep]]))
        e_colors += [color] * int(keep.sum())
        if g.size:
            if k > 0:
                bounds.append(offset - 0.5)
            xs = offset + np.arange(g.size, dtype=np.float64)
            g_lines.append(np.column_stack([xs, np.maximum(g, 1e-300)]))
            g_line_colors.append(color)
            g_colors += [color] * g.size
            offset += g.size
    panels = ((ax_e, e_lines, list(colors), e_points, e_colors), (ax_g, g_lines, g_line_colors, g_lines, g_colors))
    for ax, lines, line_colors, points, pcolors in panels:
        ax.set_yscale("log")
        ax.add_collection(LineCollection(lines, colors=line_colors, linewidths=1.2))
        if points:
            pts = np.concatenate(points)
            ax.scatter(pts[:, 0], pts[:, 1], s=9, c=pcolors, zorder=3)
        ax.autoscale_view()
    if bounds:
        ax_g.vlines(bounds, 0.0, 1.0, transform=ax_g.get_xaxis_transform(), colors="0.55", linestyles=":",
                    linewidths=1.0, label="step boundary")


def convergence_png(history: list[dict], title: str, per_step: bool) -> bytes:
    """:func:`convergence_figure` drawn by Agg, as PNG bytes (``DPI`` dots per inch)."""
    buffer = io.BytesIO()
    convergence_figure(history, title, per_step).savefig(buffer, format="png", dpi=DPI)
    return buffer.getvalue()


def plot_records(history) -> list[dict]:
    """What :func:`convergence_figure` reads of each step record, as JSON types: ``step``, ``energies``,
    ``gradient_norms`` and ``time`` (None when the record has none)."""
    out = []
    for rec in history:
        t = rec.get("time")
        out.append({"step": int(rec["step"]), "energies": [float(v) for v in rec["energies"]],
                    "gradient_norms": [float(v) for v in rec["gradient_norms"]],
                    "time": None if t is None else float(t)})
    return out


class PlotWorker:
    """A child process that draws ``convergence.png`` for a run (see the module docstring). Use it as a context
    manager around the run; leaving the block stops the child if it still runs.

    Args:
        timeout_s: how long :meth:`result` waits for the child's figure, from :meth:`submit`.
    """

    def __init__(self, timeout_s: float = 120.0):
        self.timeout_s = timeout_s
        self.proc: subprocess.Popen | None = None
        self.started_at: float | None = None
        self._thread: threading.Thread | None = None
        self._outcome: dict = {}

    @classmethod
    def available(cls) -> bool:
        """Whether matplotlib is installed (found without importing it)."""
        import importlib.util

        return importlib.util.find_spec("matplotlib") is not None

    def start(self) -> PlotWorker:
        """Start the child (it imports matplotlib and draws its warm-up figure at once). An ``OSError`` starting it
        leaves the worker without a child: :meth:`result` then says so."""
        env = dict(os.environ, MPLBACKEND="Agg")
        cmd = [sys.executable, "-c", _CHILD, str(pathlib.Path(__file__).resolve())]
        try:
            self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                         env=env)
            self.started_at = time.perf_counter()
        except OSError as exc:
            self._outcome = {"error": f"the plot's child process could not start ({exc})"}
        return self

    def submit(self, history, title: str, per_step: bool) -> None:
        """Send the run's step records; the child draws while this process goes on (a thread feeds it and reads the
        PNG back)."""
        if self.proc is None or self._thread is not None:
            return
        job = json.dumps({"history": plot_records(history), "title": title, "per_step": bool(per_step)}).encode()

        def talk():
            try:
                out, err = self.proc.communicate(job)
                self._outcome = {"png": out, "stderr": err.decode("utf-8", "replace"), "rc": self.proc.returncode}
            except Exception as exc:  # the child went away (a broken pipe): the run draws the figure itself
                self._outcome = {"error": f"{type(exc).__name__}: {exc}"}

        self._thread = threading.Thread(target=talk, name="plot-worker", daemon=True)
        self._thread.start()

    def result(self) -> tuple[bytes | None, str]:
        """The PNG's bytes and ``""``, or ``(None, why)`` when the child gave none (it failed, or took longer than
        :attr:`timeout_s`: it is then stopped)."""
        if self._thread is None:
            return None, self._outcome.get("error", "no figure was asked of the plot's child process")
        self._thread.join(self.timeout_s)
        if self._thread.is_alive():
            self.close()
            return None, f"the plot's child process took more than {self.timeout_s:.0f} s"
        o = self._outcome
        if "error" in o:
            return None, o["error"]
        png = o.get("png") or b""
        if o.get("rc") != 0 or not png.startswith(b"\x89PNG"):
            lines = [ln for ln in o.get("stderr", "").strip().splitlines() if ln.strip()]
            return None, (f"the plot's child process failed (exit status {o.get('rc')}): "
                          f"{lines[-1] if lines else 'no message'}")
        return png, ""

    def close(self) -> None:
        """Stop the child if it still runs and wait for it (it then writes nothing more)."""
        stop_child(self.proc)

    def __enter__(self) -> PlotWorker:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _readable(stream) -> bool:
    """Whether ``stream`` has data (or its end) waiting now; False where that cannot be asked."""
    try:
        import select

        return bool(select.select([stream], [], [], 0.0)[0])
    except (OSError, ValueError, ImportError):
        return False


def _serve() -> int:
    """The child's side of :class:`PlotWorker`: warm up, read one job from stdin, write its PNG to stdout."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C reaches the whole group: the run decides, then stops us
    import matplotlib.figure  # noqa: F401

    if not _readable(sys.stdin):  # the run still works: warm up while it does
        convergence_png(**_WARM_UP)
    data = sys.stdin.buffer.read()
    if not data.strip():  # the run ended without asking (an error, an interrupt)
        return 0
    job = json.loads(data)
    png = convergence_png(job["history"], job["title"], job["per_step"])
    sys.stdout.buffer.write(png)
    sys.stdout.buffer.flush()
    return 0


if __name__ == "__main__":
    sys.exit(_serve())
