"""The Polyscope viewer of the apps, and headless screenshots.

- :func:`show`: the interactive viewer (``warp-meshad run CONFIG --viewer``): the mesh with the app's quantities, a
  Play / Pause button, a Step button, and the step, iteration count, energy and gradient norm, live.
- :func:`screenshot`: ``screenshot.png`` rendered by Polyscope through EGL without a screen. It runs in a child
  process (``python -m warp_meshad._src.app.viewer SCENE.npz OUT.png``) so that a broken GL driver cannot take the run
  down with it, and reports why it was skipped where EGL or Polyscope is missing.

Polyscope is optional (in the ``apps`` and ``viewer`` extras: ``pip install 'warp-meshad[apps]'``), imported only here
and only when used. Headless rendering also needs EGL (Mesa's ``libegl1 libegl-mesa0`` on Debian/Ubuntu); where it is
missing, the screenshot is skipped with that reason.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import tempfile

import numpy as np

__all__ = ["ViewerController", "ViewerError", "screenshot", "show"]

MESH_NAME = "mesh"
_NO_EGL = 3  # exit status of the rendering child when Polyscope cannot initialize EGL
_EGL_HINT = ("install Mesa's EGL (Debian/Ubuntu: apt-get install libegl1 libegl-mesa0), or set screenshot: false "
             "(--set screenshot=false)")
_VECTOR_KINDS = {"vertex_vectors": "vertices", "face_vectors": "faces"}


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


def _register_scene(ps, vertices, faces, quantities: dict, spheres):
    """Register the mesh, its quantities (the first one shown) and the spheres; returns the surface mesh."""
    mesh = ps.register_surface_mesh(MESH_NAME, vertices, faces, smooth_shade=True, edge_width=0.0)
    _update_quantities(mesh, quantities, first=True)
    for i, (center, radius) in enumerate(spheres):
        cloud = ps.register_point_cloud(f"sphere {i}", np.asarray(center, dtype=np.float64).reshape(1, 3))
        cloud.set_radius(float(radius), relative=False)
        cloud.set_color((0.75, 0.75, 0.78))
    return mesh


def _update_quantities(mesh, quantities: dict, first: bool = False):
    """Add or replace the quantities; the first registration shows the first one, later ones keep the user's choice."""
    for i, (name, (kind, values)) in enumerate(quantities.items()):
        enabled = (i == 0) if first else None
        values = np.asarray(values, dtype=np.float64)
        if kind in ("vertices", "faces"):
            mesh.add_scalar_quantity(name, values, defined_on=kind, enabled=enabled, cmap="viridis")
        elif kind in _VECTOR_KINDS:
            mesh.add_vector_quantity(name, values, defined_on=_VECTOR_KINDS[kind], enabled=enabled)
        else:
            raise ValueError(f"quantity {name!r}: unknown kind {kind!r}")


class ViewerController:
    """Play / pause / single-step logic of the viewer, independent of the window.

    Args:
        app: an :class:`~warp_meshad.app.App`.
        ps: the polyscope module (initialized), or None to drive the app without drawing.
        log: ``log(text)`` for messages.
    """

    def __init__(self, app, ps=None, log=None):
        self.app = app
        self.ps = ps
        self.log = log or (lambda text: None)
        self.playing = False
        self.frames = 0
        self.mesh = None
        if ps is not None:
            self.mesh = _register_scene(ps, app.positions(), app.mesh.faces, app.quantities(), app.spheres())

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
        self.log(f"step {self.app.steps_done}: {rec['iterations']} iterations, energy {self.app.energy:.9g}")
        self.refresh()

    def refresh(self) -> None:
        if self.mesh is not None:
            self.mesh.update_vertex_positions(self.app.positions())
            _update_quantities(self.mesh, self.app.quantities())

    def status_lines(self) -> list[str]:
        app = self.app
        iters = sum(r["iterations"] for r in app.history)
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


def show(app, log=None, backend: str | None = None, frames: int | None = None) -> ViewerController:
    """Open the interactive viewer on ``app`` until the window closes.

    Args:
        app: the app (not yet run, or partly run).
        log: ``log(text)`` for messages.
        backend: Polyscope backend (None: its default; ``"openGL_mock"`` for tests).
        frames: run this many frames then return (None: until the window closes).
    """
    ps, _ = import_polyscope()
    ps.set_use_prefs_file(False)  # no .polyscope.ini in the current folder
    try:
        if backend is None:
            ps.init()
        else:
            ps.init(backend)
    except RuntimeError as exc:
        raise ViewerError(f"cannot open the viewer window (no display or OpenGL here?): {exc}; run without --viewer "
                          "(or with --headless) to get the outputs and a headless screenshot") from None
    ps.remove_all_structures()
    controller = ViewerController(app, ps, log)
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


def screenshot(app, path, timeout_s: float = 120.0) -> tuple[bool, str]:
    """Render the app's current state to ``path`` (PNG) headless, in a child process.

    Returns:
        ``(True, "")`` when written, else ``(False, why)`` (no polyscope, no EGL, a driver failure, ...).
    """
    try:
        import polyscope  # noqa: F401
    except ImportError:
        return False, "polyscope is not installed (pip install 'warp-meshad[apps]' or pip install polyscope)"
    path = pathlib.Path(path)
    fd, scene = tempfile.mkstemp(prefix=".scene.", suffix=".npz", dir=path.parent)
    os.close(fd)
    try:
        quantities = app.quantities()
        arrays = {"vertices": app.positions(), "faces": app.mesh.faces}
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
        cmd = [sys.executable, "-m", "warp_meshad._src.app.viewer", scene, str(tmp)]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return False, f"rendering took more than {timeout_s:.0f} s"
        if proc.returncode != 0 or not tmp.is_file():
            lines = [ln.strip() for ln in (proc.stderr + proc.stdout).strip().splitlines() if ln.strip()]
            if tmp.exists():
                tmp.unlink()
            if proc.returncode == _NO_EGL:
                return False, f"headless rendering unavailable: {lines[-1] if lines else 'no EGL'}; {_EGL_HINT}"
            return False, (f"headless rendering failed (Polyscope + EGL, exit status {proc.returncode}): "
                           f"{lines[-1] if lines else 'no message'}")
        os.replace(tmp, path)
        return True, ""
    finally:
        if os.path.exists(scene):
            os.unlink(scene)


def _render_scene_file(scene_path: str, png_path: str) -> None:
    """Child-process side of :func:`screenshot`."""
    ps, _ = import_polyscope()
    data = np.load(scene_path)
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
    quantities = {
        str(n): (str(k), data[f"q{i}"]) for i, (n, k) in enumerate(zip(data["quantity_names"], data["quantity_kinds"]))
    }
    spheres = [(c, r) for c, r in zip(data["sphere_centers"], data["sphere_radii"])]
    _register_scene(ps, data["vertices"], data["faces"], quantities, spheres)
    ps.reset_camera_to_home_view()
    ps.screenshot(png_path, transparent_bg=False)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: python -m warp_meshad._src.app.viewer SCENE.npz OUT.png")
    _render_scene_file(sys.argv[1], sys.argv[2])
