"""The Polyscope viewer of the apps, and headless screenshots.

- :func:`show`: the interactive viewer (``warp-meshad run CONFIG --viewer``): the mesh with the app's quantities, a
  Play / Pause button, a Step button, and the step, iteration count, energy and gradient norm, live.
- :func:`screenshot`: ``screenshot.png`` rendered by Polyscope through EGL without a screen. It runs in a child
  process (this file run by path with ``SCENE.npz OUT.png``: numpy, Polyscope and matplotlib only, no Warp) so that a
  broken GL driver cannot take the run down with it, and reports why it was skipped where EGL or Polyscope is missing.
  :class:`ScreenshotWorker` starts that child ahead (``--serve``: it imports and starts EGL while the run works, then
  renders the scene it is given on stdin).

Both show the same scene: the mesh coloured by the app's first scalar quantity (named with its units; every vector
quantity drawn too), and for an app with texture coordinates (:meth:`App.uv_coordinates`) the uv map as a checker on
the surface, with two flat copies of the uv layout beside it (a checker, and the first quantity's colours). The
colours come with a colour bar: Polyscope's own in the viewer, and in the screenshot a matplotlib one (same colour map
and range, labelled with the quantity's name) composed beside the render (:func:`add_colorbar`), since Polyscope
draws its colour bar only in its interface. The screenshot of an app with texture coordinates is three panels of
:data:`PANEL_SIZE` pixels side by side, each render showing one of the three meshes seen from the front (+z) and
framed on it alone (:func:`front_camera`), under the titles :data:`UV_PANEL_TITLES` (:func:`panels_figure`).

Polyscope is optional (in the ``apps`` and ``viewer`` extras: ``pip install 'warp-meshad[apps]'``), imported only here
and only when used. Headless rendering also needs EGL (Mesa's ``libegl1 libegl-mesa0`` on Debian/Ubuntu); where it is
missing, the screenshot is skipped with that reason.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import subprocess
import sys
import tempfile
import time

import numpy as np

from warp_meshad._src.app.child_process import stop_child
from warp_meshad._src.app.native_output import captured_fds

__all__ = ["PANEL_MARGIN", "PANEL_SIZE", "UV_PANEL_TITLES", "ColorBar", "ScreenshotWorker", "ViewerController",
           "ViewerError", "add_colorbar", "check_display", "colorbar_figure", "figure_pixels", "first_colorbar",
           "front_camera", "panels_figure", "screenshot", "show", "title_row_height"]

MESH_NAME = "mesh"
UV_CHECKER_NAME = "uv layout (checker)"  # the flat copies of the uv layout beside the surface
UV_COLORS_NAME = "uv layout (colours)"
_UV_QUANTITY = "uv checker"
_UV_CHECKERS = 24  # checker squares across the uv layout's longer side
_CMAP = "viridis"
_VECTOR_RADIUS = 0.0008  # relative to the scene's length scale (Polyscope's default is 0.0025)
_NO_EGL = 3  # exit status of the rendering child when Polyscope cannot initialize EGL
_CHILD = "import runpy, sys; sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')"
_EGL_HINT = ("install Mesa's EGL (Debian/Ubuntu: apt-get install libegl1 libegl-mesa0), or set screenshot: false "
             "(--set screenshot=false)")
_VECTOR_KINDS = {"vertex_vectors": "vertices", "face_vectors": "faces"}
# the screenshot of an app with uv coordinates: three panels of PANEL_SIZE pixels (width, height), these titles
UV_PANEL_TITLES = ("surface (uv checker)", UV_CHECKER_NAME, UV_COLORS_NAME)
PANEL_SIZE = (600, 600)
PANEL_MARGIN = 1.08  # a panel's view over its mesh's extent


class ViewerError(RuntimeError):
    """The viewer window cannot open (no display, no OpenGL)."""


def import_polyscope():
    """``(polyscope, polyscope.imgui)``; ImportError naming the extra when missing."""
    try:
        import polyscope as ps
        import polyscope.imgui as psim
    except ImportError:
        raise ImportError("the viewer needs polyscope: pip install 'warp-meshad[apps]' (or 'warp-meshad[viewer]', or "
                          "pip install polyscope)") from None
    return ps, psim


@dataclasses.dataclass(frozen=True)
class ColorBar:
    """What the colours of a scalar quantity mean: its name (with units), the colour map and the range mapped to it."""

    label: str
    vmin: float
    vmax: float
    cmap: str = _CMAP


def scalar_range(values) -> tuple[float, float]:
    """``(min, max)`` of the finite values (a flipped uv triangle has infinite distortion), widened where they are
    all equal so that the range is never empty; ``(0, 1)`` when none is finite."""
    v = np.asarray(values, dtype=np.float64)
    v = v[np.isfinite(v)]
    if v.size == 0:
        return 0.0, 1.0
    lo, hi = float(v.min()), float(v.max())
    if hi <= lo:
        pad = 0.5 * max(abs(lo), 1.0)
        lo, hi = lo - pad, hi + pad
    return lo, hi


def first_colorbar(quantities: dict) -> ColorBar | None:
    """The colour bar of the quantity a scene shows first (its first scalar quantity); None if it has none."""
    for name, (kind, values) in quantities.items():
        if kind in ("vertices", "faces"):
            return ColorBar(name, *scalar_range(values))
    return None


def _flat_layout(vertices: np.ndarray, uv: np.ndarray, slot: int) -> np.ndarray:
    """The uv layout as a z = const mesh of the surface's height, placed ``slot`` places to the right of the surface."""
    lo, hi = vertices.min(axis=0), vertices.max(axis=0)
    size = max(hi[1] - lo[1], 0.5 * (hi[0] - lo[0]), 1e-12)
    span = max(float(np.ptp(uv, axis=0).max()), 1e-300)
    flat = (uv - uv.min(axis=0)) * (size / span)
    gap = 0.15 * size
    x0 = hi[0] + gap + slot * (size + gap)
    return np.column_stack([x0 + flat[:, 0], lo[1] + flat[:, 1], np.full(len(uv), 0.5 * (lo[2] + hi[2]))])


def _add_uv_checker(mesh, uv: np.ndarray, enabled: bool | None) -> None:
    """The uv map as a checker texture on ``mesh`` (uv scaled to [0, 1] on its longer side)."""
    span = max(float(np.ptp(uv, axis=0).max()), 1e-300)
    mesh.add_parameterization_quantity(_UV_QUANTITY, (uv - uv.min(axis=0)) / span, defined_on="vertices",
                                       viz_style="checker", checker_size=1.0 / _UV_CHECKERS, enabled=enabled)


def _register_scene(ps, vertices, faces, quantities: dict, spheres, uv=None, colorbars: bool = False) -> list:
    """Register the mesh, its quantities, the uv layouts (when ``uv`` is given) and the spheres.

    Returns:
        The surface meshes: the mesh, then the two flat uv layouts when ``uv`` is given.
    """
    mesh = ps.register_surface_mesh(MESH_NAME, vertices, faces, smooth_shade=True, edge_width=0.0)
    structures = [mesh]
    if uv is None:
        _update_quantities(mesh, quantities, first=True, colorbars=colorbars)
    else:
        uv = np.asarray(uv, dtype=np.float64)
        _update_quantities(mesh, quantities, first=True, colorbars=colorbars, enable=False)
        _add_uv_checker(mesh, uv, enabled=True)
        flat = {name: q for name, q in quantities.items() if q[0] in ("vertices", "faces")}
        for slot, name in enumerate((UV_CHECKER_NAME, UV_COLORS_NAME)):
            layout = ps.register_surface_mesh(name, _flat_layout(vertices, uv, slot), faces, edge_width=0.0,
                                              material="flat")  # unlit: the colours are the colour bar's
            _update_quantities(layout, flat, first=True, colorbars=colorbars, enable=slot == 1)
            _add_uv_checker(layout, uv, enabled=slot == 0)
            structures.append(layout)
    for i, (center, radius) in enumerate(spheres):
        cloud = ps.register_point_cloud(f"sphere {i}", np.asarray(center, dtype=np.float64).reshape(1, 3))
        cloud.set_radius(float(radius), relative=False)
        cloud.set_color((0.75, 0.75, 0.78))
    return structures


def _update_scene(structures: list, vertices, quantities: dict, uv=None) -> None:
    """New positions, quantities and uv for the structures of :func:`_register_scene`; the shown ones stay shown."""
    mesh = structures[0]
    mesh.update_vertex_positions(vertices)
    _update_quantities(mesh, quantities)
    if uv is not None:
        uv = np.asarray(uv, dtype=np.float64)
        flat = {name: q for name, q in quantities.items() if q[0] in ("vertices", "faces")}
        _add_uv_checker(mesh, uv, enabled=None)
        for slot, layout in enumerate(structures[1:]):
            layout.update_vertex_positions(_flat_layout(vertices, uv, slot))
            _update_quantities(layout, flat)
            _add_uv_checker(layout, uv, enabled=None)


def _update_quantities(mesh, quantities: dict, first: bool = False, colorbars: bool = False, enable: bool = True):
    """Add or replace the quantities, each scalar coloured over its :func:`scalar_range`.

    Args:
        mesh: the Polyscope surface mesh.
        quantities: ``{name: (kind, values)}`` (:meth:`App.quantities`).
        first: the first registration: show the first scalar quantity and every vector quantity (when ``enable``);
            later calls keep the user's choice.
        colorbars: draw Polyscope's on-screen colour bar of a shown scalar quantity (the interactive viewer).
        enable: with ``first``, show quantities at all.
    """
    shown_scalar = False
    for name, (kind, values) in quantities.items():
        values = np.asarray(values, dtype=np.float64)
        if kind in ("vertices", "faces"):
            enabled = (enable and not shown_scalar) if first else None
            shown_scalar = True
            extra = {"onscreen_colorbar_enabled": True} if colorbars else {}
            mesh.add_scalar_quantity(name, values, defined_on=kind, enabled=enabled, cmap=_CMAP,
                                     vminmax=scalar_range(values), **extra)
        elif kind in _VECTOR_KINDS:
            mesh.add_vector_quantity(name, values, defined_on=_VECTOR_KINDS[kind], enabled=enable if first else None,
                                     radius=_VECTOR_RADIUS)  # thin: the colours beneath stay visible
        else:
            raise ValueError(f"quantity {name!r}: unknown kind {kind!r}")


def colorbar_figure(image: np.ndarray, bar: ColorBar, dpi: float = 100.0):
    """A matplotlib ``Figure`` of ``image`` with a vertical colour bar to its right labelled ``bar.label``.

    Args:
        image: the render, shape (height, width, 3 or 4), uint8.
        bar: the colour map, range and label.
        dpi: pixels per inch of the figure (its size in pixels: the image's height, the image's width plus the bar's).

    Returns:
        The figure (no pyplot state): axes 0 the image, axes 1 the colour bar.
    """
    return panels_figure([image], [None], bar, dpi)


def panels_figure(images: list, titles: list, bar: ColorBar | None = None, dpi: float = 100.0):
    """A matplotlib ``Figure`` of renders side by side, each under its title, with ``bar``'s colour bar at the right.

    Args:
        images: the renders, each shape (height, width, 3 or 4), uint8, of one height.
        titles: one per image (None: no title); where every one is None there is no title row.
        bar: the colour map, range and label of the coloured panels, or None (no colour bar).
        dpi: pixels per inch of the figure. Its size in pixels: the images' height (plus a title row of
            :func:`title_row_height` where there are titles), the sum of their widths plus the bar's.

    Returns:
        The figure (no pyplot state): one axes per image, in order, then the colour bar's.

    Raises:
        ValueError: ``images`` and ``titles`` differ in length, or the images in height.
    """
    from matplotlib import cm, colors
    from matplotlib.figure import Figure

    if len(images) != len(titles) or not images:
        raise ValueError(f"panels_figure: expected one title per image, got {len(images)} images and "
                         f"{len(titles)} titles")
    heights = {im.shape[0] for im in images}
    if len(heights) != 1:
        raise ValueError(f"panels_figure: expected images of one height, got heights {sorted(heights)}")
    height = heights.pop()
    widths = [im.shape[1] for im in images]
    top = title_row_height(height) if any(t is not None for t in titles) else 0
    extra = max(int(0.2 * height), 120) if bar is not None else 0  # the bar, its ticks and its label
    total, total_h = sum(widths) + extra, height + top
    fig = Figure(figsize=(total / dpi, total_h / dpi), dpi=dpi)
    fig.patch.set_facecolor("white")
    font = max(8.0, 11.0 * height / 720.0)
    x = 0
    for image, width, title in zip(images, widths, titles):
        ax = fig.add_axes((x / total, 0.0, width / total, height / total_h))
        ax.imshow(image, interpolation="nearest")
        ax.set_axis_off()
        if title is not None:
            ax.set_title(title, fontsize=1.25 * font, pad=0.3 * top)
        x += width
    if bar is not None:
        cax = fig.add_axes(((x + 0.12 * extra) / total, 0.12 * height / total_h, 0.14 * extra / total,
                            0.76 * height / total_h))
        cb = fig.colorbar(cm.ScalarMappable(norm=colors.Normalize(bar.vmin, bar.vmax), cmap=bar.cmap), cax=cax)
        cb.formatter.set_useOffset(False)  # tick labels are the values (1.0002, not 0.0002 and "+1" above)
        cb.update_ticks()
        cb.set_label(bar.label, fontsize=font)
        cb.ax.tick_params(labelsize=0.9 * font)
    return fig


def title_row_height(height: int) -> int:
    """Pixels above renders of ``height`` pixels that hold their titles in :func:`panels_figure`."""
    return max(int(0.07 * height), 30)


def figure_pixels(fig) -> np.ndarray:
    """A matplotlib figure drawn to RGBA pixels, shape (height, width, 4), uint8."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    return np.asarray(canvas.buffer_rgba()).copy()


def add_colorbar(image: np.ndarray, bar: ColorBar) -> np.ndarray:
    """``image`` with the colour bar of :func:`colorbar_figure` beside it, as pixels.

    Args:
        image: the render, shape (height, width, 3 or 4), uint8.
        bar: the colour map, range and label.

    Returns:
        RGBA pixels, shape (height, width + the bar's width, 4), uint8.
    """
    return figure_pixels(colorbar_figure(image, bar))


class ViewerController:
    """Play / pause / single-step logic of the viewer, independent of the window.

    Args:
        app: an :class:`~warp_meshad.app.App`.
        ps: the polyscope module (initialized), or None to drive the app without drawing.
        log: ``log(text)`` for messages.
        colorbars: draw Polyscope's on-screen colour bar of the shown scalar quantities.

    Attributes:
        mesh: the app's surface mesh in Polyscope (None without ``ps``); ``structures`` it and the uv layouts.
    """

    def __init__(self, app, ps=None, log=None, colorbars: bool = False):
        self.app = app
        self.ps = ps
        self.log = log or (lambda text: None)
        self.playing = False
        self.frames = 0
        self.mesh = None
        self.structures = []
        if ps is not None:
            self.structures = _register_scene(ps, app.positions(), app.mesh.faces, app.quantities(), app.spheres(),
                                              uv=app.uv_coordinates(), colorbars=colorbars)
            self.mesh = self.structures[0]

    @property
    def done(self) -> bool:
        return self.app.steps_done >= self.app.config.steps

    def play(self) -> None:
        if not self.done:
            self.playing = True

    def pause(self) -> None:
        self.playing = False

    def single_step(self) -> None:
        """Take one step (even past ``config.steps``, as a user asking for one more), then refresh."""
        self.playing = False
        self._step()

    def _step(self) -> None:
        rec = self.app.step()
        from warp_meshad._src.plural import plural  # here: the rendering child runs this file without the package

        self.log(f"step {self.app.steps_done}: {plural(rec['iterations'], 'iteration')}, energy {self.app.energy:.9g}")
        self.refresh()

    def refresh(self) -> None:
        if self.structures:
            _update_scene(self.structures, self.app.positions(), self.app.quantities(), self.app.uv_coordinates())

    def status_lines(self) -> list[str]:
        app = self.app
        iters = app.history.total("iterations")
        last = app.history[-1] if app.history else None
        return [
            f"{app.name}/{app.config.scene or 'custom'} on {app.device}",
            f"step {app.steps_done} / {app.config.steps}" + ("  (done)" if self.done else ""),
            f"iterations: {iters}" + (f" (last step {last['iterations']}, {last['reason']})" if last else ""),
            f"energy: {app.energy:.9g}",
            f"gradient norm: {app.gradient_norm:.3e}",
        ]

    def tick(self) -> None:
        """One frame: step when playing; stop at the end of the run."""
        self.frames += 1
        if self.playing:
            if self.done:
                self.playing = False
            else:
                self._step()

    def callback(self) -> None:
        """The Polyscope user callback: the buttons and the status text, then :meth:`tick`."""
        _, psim = import_polyscope()
        if self.playing:
            if psim.Button("Pause"):
                self.pause()
        elif psim.Button("Play"):
            self.play()
        psim.SameLine()
        if psim.Button("Step"):
            self.single_step()
        for line in self.status_lines():
            psim.TextUnformatted(line)
        self.tick()


_NO_VIEWER_HINT = "run without --viewer (or with --headless) to get the outputs and a headless screenshot"


def check_display() -> None:
    """Raise :class:`ViewerError` where no window can open because there is no display to open it on (Linux and the
    BSDs without ``DISPLAY`` or ``WAYLAND_DISPLAY``); elsewhere return (whether OpenGL starts is known only by trying,
    in :func:`show`). Imports nothing, so a run that asked for the viewer can stop before it builds its app."""
    if sys.platform in ("win32", "darwin"):
        return
    if not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")):
        raise ViewerError(f"cannot open the viewer window: no display (neither DISPLAY nor WAYLAND_DISPLAY is set); "
                          f"{_NO_VIEWER_HINT}")


def _init_failure_reason(printed: str) -> str:
    """The first reason Polyscope printed for a failed start, without its ``[polyscope]`` prefixes."""
    for line in printed.splitlines():
        if "GLFW emitted error:" in line:
            return "GLFW: " + line.split("GLFW emitted error:", 1)[1].strip()
    return "no Polyscope backend could start (no display or OpenGL here?)"


def show(app, log=None, backend: str | None = None, frames: int | None = None) -> ViewerController:
    """Open the interactive viewer on ``app`` until the window closes.

    Where the window cannot open, raises :class:`ViewerError` with one sentence saying why (no display, or the reason
    GLFW gave) and what to run instead; Polyscope's own lines about it are not shown, and Polyscope is left able to
    shut down quietly at exit (it is started on its mock backend).

    Args:
        app: the app (not yet run, or partly run).
        log: ``log(text)`` for messages.
        backend: Polyscope backend (None: its default; ``"openGL_mock"`` for tests).
        frames: run this many frames then return (None: until the window closes).

    Raises:
        ViewerError: no display, or no Polyscope backend could start.
        ImportError: Polyscope is not installed (naming the extra).
    """
    if backend is None:
        check_display()
    ps, _ = import_polyscope()
    ps.set_use_prefs_file(False)  # no .polyscope.ini in the current folder
    with captured_fds(1, 2) as printed:
        try:
            ps.init() if backend is None else ps.init(backend)
            failure = None
        except RuntimeError as exc:
            failure = exc
            # polyscope's atexit handler shuts it down and raises when it never started: the mock backend always starts
            ps.init("openGL_mock")
    if failure is not None:
        raise ViewerError(f"cannot open the viewer window: {_init_failure_reason(printed.text)}; {_NO_VIEWER_HINT}"
                          ) from None
    if printed.data:  # a start's own lines (the backend and OpenGL version), as Polyscope prints them
        os.write(1, printed.data)
    ps.remove_all_structures()
    controller = ViewerController(app, ps, log, colorbars=True)
    ps.set_user_callback(controller.callback)
    try:
        if frames is None:
            ps.show()
        else:
            ps.show(forFrames=frames)
    finally:
        ps.clear_user_callback()
    return controller


# ----------------------------------------------------------------------------------------------------------------------
# Headless screenshots
# ----------------------------------------------------------------------------------------------------------------------


def _child_command(*args: str) -> list[str]:
    # this file run by path, not as warp_meshad._src.app.viewer: the child then skips the package's import of Warp and
    # the toolkit (0.9 s on a 2-core CPU); runpy keeps this folder off sys.path
    return [sys.executable, "-c", _CHILD, str(pathlib.Path(__file__).resolve()), *args]


class ScreenshotWorker:
    """The rendering child of :func:`screenshot`, started ahead (the command line's run starts it with the run): while
    the app builds and steps it imports numpy, Polyscope and matplotlib and starts EGL, then waits on its standard
    input for the scene to render (``SCENE.npz<TAB>OUT.png``), so that the screenshot then costs the rendering only.
    A child whose EGL failed has exited with the status :func:`screenshot` reports. As a context manager it stops the
    child when the block ends (a child that was given no scene exits on its own when its input closes)."""

    def __init__(self):
        self.proc: subprocess.Popen | None = None
        self.started_at: float | None = None
        self._taken: subprocess.Popen | None = None

    @classmethod
    def available(cls) -> bool:
        """Whether Polyscope is installed (found without importing it)."""
        import importlib.util

        return importlib.util.find_spec("polyscope") is not None

    def start(self) -> ScreenshotWorker:
        """Start the child; an ``OSError`` leaves the worker without one (:func:`screenshot` then starts its own)."""
        try:
            self.proc = subprocess.Popen(_child_command("--serve"), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=subprocess.PIPE, text=True)
            self.started_at = time.perf_counter()
        except OSError:
            self.proc = None
        return self

    def take(self) -> subprocess.Popen | None:
        """The child, once (None when there is none or it was taken)."""
        proc, self.proc = self.proc, None
        self._taken = proc
        return proc

    def close(self) -> None:
        """Stop the child if it still runs and wait for it."""
        for p in (self.proc, self._taken):
            stop_child(p)

    def __enter__(self) -> ScreenshotWorker:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def screenshot(app, path, timeout_s: float = 120.0, while_rendering=None, worker: ScreenshotWorker | None = None,
               ) -> tuple[bool, str]:
    """Render the app's current state to ``path`` (PNG) headless, in a child process.

    Args:
        app: the app (its :meth:`positions`, :meth:`quantities`, ... are read before the child starts).
        path: the PNG to write.
        timeout_s: the child's time limit, from the moment it is given the scene.
        while_rendering: optional ``() -> None`` (the other outputs) run once in this process while the child
            renders; it runs all the same when there is no child (no polyscope, or the scene could not be read from
            the app). Its exception is raised after the child is stopped.
        worker: a :class:`ScreenshotWorker` started ahead, whose child renders the scene; None (or one without a
            child): a child is started here.

    Returns:
        ``(True, "")`` when written, else ``(False, why)`` (no polyscope, no EGL, a driver failure, ...).
    """
    pending = [] if while_rendering is None else [while_rendering]

    def run_pending():  # at most once, whichever path comes first
        while pending:
            pending.pop()()

    if not ScreenshotWorker.available():
        run_pending()
        return False, "polyscope is not installed (pip install 'warp-meshad[apps]' or pip install polyscope)"
    path = pathlib.Path(path)
    scene = None
    try:
        fd, scene = tempfile.mkstemp(prefix=".scene.", suffix=".npz", dir=path.parent)
        os.close(fd)
        quantities = app.quantities()
        arrays = {"vertices": app.positions(), "faces": app.mesh.faces}
        uv = app.uv_coordinates()
        if uv is not None:
            arrays["uv"] = np.asarray(uv, dtype=np.float64)
        names = []
        for i, (name, (kind, values)) in enumerate(quantities.items()):
            arrays[f"q{i}"] = np.asarray(values, dtype=np.float64)
            names.append((name, kind))
        spheres = app.spheres()
        arrays["sphere_centers"] = np.array([c for c, _ in spheres], dtype=np.float64).reshape(-1, 3)
        arrays["sphere_radii"] = np.array([r for _, r in spheres], dtype=np.float64)
        arrays["quantity_names"] = np.array([n for n, _ in names], dtype=str)
        arrays["quantity_kinds"] = np.array([k for _, k in names], dtype=str)
        np.savez(scene, **arrays)
        tmp = path.with_name(f".{path.name}.tmp.png")
        started = time.perf_counter()
        proc = worker.take() if worker is not None else None
        if proc is not None:
            try:
                proc.stdin.write(f"{scene}\t{tmp}\n")
                proc.stdin.flush()
            except (BrokenPipeError, OSError):  # it has exited (no EGL): its status says why, below
                pass
        else:
            proc = subprocess.Popen(_child_command(scene, str(tmp)), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    text=True)
        try:
            run_pending()
            stdout, stderr = proc.communicate(timeout=max(timeout_s - (time.perf_counter() - started), 0.0))
        except BaseException as exc:  # over time, or while_rendering failed: stop the child, keep nothing of it
            proc.kill()
            proc.communicate()
            if tmp.exists():
                tmp.unlink()
            if isinstance(exc, subprocess.TimeoutExpired):
                return False, f"rendering took more than {timeout_s:.0f} s"
            raise
        if proc.returncode != 0 or not tmp.is_file():
            lines = [ln.strip() for ln in (stderr + stdout).strip().splitlines() if ln.strip()]
            if tmp.exists():
                tmp.unlink()
            if proc.returncode == _NO_EGL:
                return False, f"headless rendering unavailable: {lines[-1] if lines else 'no EGL'}; {_EGL_HINT}"
            return False, (f"headless rendering failed (Polyscope + EGL, exit status {proc.returncode}): "
                           f"{lines[-1] if lines else 'no message'}")
        os.replace(tmp, path)
        return True, ""
    finally:
        if scene is not None and os.path.exists(scene):
            os.unlink(scene)
        run_pending()  # the scene could not be made or the child not started: the other outputs all the same


def _look_from_above(vertices: np.ndarray, spheres) -> None:
    """Point Polyscope's camera at the scene from the front and 30 degrees above (a horizontal sheet, such as the
    cloth at rest, is seen edge-on from the front)."""
    import polyscope as ps

    axes = np.vstack([np.eye(3), -np.eye(3)])
    points = np.vstack([np.asarray(vertices, dtype=np.float64)] +
                       [np.asarray(c, dtype=np.float64) + float(r) * axes for c, r in spheres])
    lo, hi = points.min(axis=0), points.max(axis=0)
    center = 0.5 * (lo + hi)
    distance = 1.3 * max(float(np.linalg.norm(hi - lo)), 1e-9)
    elevation = np.radians(30.0)
    ps.look_at(center + distance * np.array([0.0, np.sin(elevation), np.cos(elevation)]), center)


def front_camera(points: np.ndarray, aspect: float, fov_deg: float, margin: float = PANEL_MARGIN):
    """Where a camera looking along -z (up +y) stands so that ``points`` fill its view: the bounding box's front face
    (z = max) spans ``1 / margin`` of the view's height or width, whichever binds, and every point lies inside.

    Args:
        points: shape (k, 3).
        aspect: the view's width / height.
        fov_deg: the view's vertical field of view, degrees.
        margin: >= 1; the view's extent over the box's.

    Returns:
        ``(camera position, target)``, each float64 of shape (3,).
    """
    lo, hi = points.min(axis=0), points.max(axis=0)
    center = 0.5 * (lo + hi)
    t = np.tan(0.5 * np.radians(fov_deg))
    half_w, half_h = 0.5 * (hi[0] - lo[0]), 0.5 * (hi[1] - lo[1])
    reach = max(half_h / t, half_w / (t * aspect), 1e-12) * margin  # from the front face
    return center + np.array([0.0, 0.0, reach + 0.5 * (hi[2] - lo[2])]), center


def _render_uv_panels(ps, structures: list, panel_points: list, spheres) -> list:
    """One render per uv panel (the surface with its checker, the checker layout, the coloured layout), each with
    only its structure shown and framed by :func:`front_camera`; the surface keeps its shadow and the spheres."""
    ps.set_window_size(*PANEL_SIZE)
    images = []
    for i, points in enumerate(panel_points):
        for j, structure in enumerate(structures):
            structure.set_enabled(i == j)
        for k in range(len(spheres)):
            ps.get_point_cloud(f"sphere {k}").set_enabled(i == 0)
        ps.set_ground_plane_mode("shadow_only" if i == 0 else "none")
        position, target = front_camera(points, PANEL_SIZE[0] / PANEL_SIZE[1], ps.get_vertical_fov_degrees())
        ps.look_at(position, target)
        images.append(ps.screenshot_to_buffer(transparent_bg=False))
    return images


def _start_polyscope():
    """Child-process side: Polyscope initialized on EGL, or this process ends with :data:`_NO_EGL`."""
    ps, _ = import_polyscope()
    ps.set_allow_headless_backends(True)
    ps.set_program_name("warp-meshad")
    ps.set_verbosity(0)
    ps.set_use_prefs_file(False)
    try:
        ps.init("openGL3_egl")
    except RuntimeError as exc:
        print(f"Polyscope could not initialize EGL ({str(exc).replace('[polyscope]', '').strip()})", file=sys.stderr,
              flush=True)
        os._exit(_NO_EGL)  # not sys.exit: Polyscope's exit handler would add a second, misleading error
    ps.set_ground_plane_mode("shadow_only")
    return ps


def _serve() -> None:
    """Child-process side of :class:`ScreenshotWorker`: start, then render the scene named on stdin (none: exit)."""
    ps = _start_polyscope()
    import matplotlib.backends.backend_agg  # noqa: F401 (the colour bar and the PNG, loaded ahead)
    import matplotlib.figure  # noqa: F401
    import matplotlib.image  # noqa: F401

    line = sys.stdin.readline().rstrip("\n")
    if line:
        scene_path, png_path = line.split("\t")
        _render_scene_file(scene_path, png_path, ps)


def _render_scene_file(scene_path: str, png_path: str, ps=None) -> None:
    """Child-process side of :func:`screenshot` (``ps``: Polyscope started already)."""
    if ps is None:
        ps = _start_polyscope()
    data = np.load(scene_path)
    quantities = {
        str(n): (str(k), data[f"q{i}"]) for i, (n, k) in enumerate(zip(data["quantity_names"], data["quantity_kinds"]))
    }
    spheres = [(c, r) for c, r in zip(data["sphere_centers"], data["sphere_radii"])]
    uv = data["uv"] if "uv" in data else None
    structures = _register_scene(ps, data["vertices"], data["faces"], quantities, spheres, uv=uv)
    bar = first_colorbar(quantities)
    if uv is None:
        _look_from_above(data["vertices"], spheres)
        image = ps.screenshot_to_buffer(transparent_bg=False)
        if bar is not None:
            image = add_colorbar(image, bar)
    else:  # three panels side by side, each framed on its own, under its title
        points = [data["vertices"]] + [_flat_layout(data["vertices"], uv, slot) for slot in range(2)]
        images = _render_uv_panels(ps, structures, points, spheres)
        image = figure_pixels(panels_figure(images, list(UV_PANEL_TITLES), bar))
    from matplotlib.image import imsave

    imsave(png_path, image, format="png")


if __name__ == "__main__":
    if sys.argv[1:] == ["--serve"]:
        _serve()
    elif len(sys.argv) == 3:
        _render_scene_file(sys.argv[1], sys.argv[2])
    else:
        sys.exit("usage: python viewer.py SCENE.npz OUT.png | --serve")
