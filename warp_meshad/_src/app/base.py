"""The App base class every app derives from, and the choice of its Warp device.

An app is one class ``App`` in a module of :mod:`warp_meshad.apps` built from its typed config (a subclass of
:class:`~warp_meshad.app.AppConfig`): ``step()``, ``run()``, ``check_final()``, and what the runner and
the viewer read (``positions()``, ``quantities()``, ``history``, ...).
"""

from __future__ import annotations

import math
import pathlib
import time
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from warp_meshad._src.app.config import AppConfig, ConfigError, finish_config
from warp_meshad._src.app.history import DEFAULT_CAPACITY, StepHistory
from warp_meshad._src.mesh.checks import check_nondegenerate
from warp_meshad._src.mesh.trimesh import MeshError, TriMesh
from warp_meshad._src.plural import plural

__all__ = ["App", "BatchStepParts", "resolve_device", "step_problem"]


@dataclass
class BatchStepParts:
    """What one step of an app solves, so that the steps of many apps (one per mesh) run as one batched solve
    (:class:`~warp_meshad.ProblemBatch` + :class:`~warp_meshad.BatchNewtonSolver`, ``warp-meshad batch``).

    Attributes:
        problem: the app's :class:`~warp_meshad.Problem` (its terms must match the other apps' one to one).
        x: the step's start point (wp.array of the problem's variables).
        fixed: indices of the pinned variables, or None.
        solver: the app's :class:`~warp_meshad.NewtonSolver`: the batched solve takes its settings
            (:meth:`~warp_meshad.BatchNewtonSolver.like`), so the app states its solver once.
        solve: keyword arguments of ``solve`` (``max_iterations``, ``tolerance``, ``energy_tolerance``, ...).
    """

    problem: object
    x: object
    fixed: object = None
    solver: object = None
    solve: dict = field(default_factory=dict)


def resolve_device(name: str | None, where: str = "device") -> tuple[str, str]:
    """The Warp device to use and why: ``name`` if given, else the first CUDA device if any, else the CPU.

    Initialises Warp where it is not yet, without Warp's "Could not find or load the NVIDIA CUDA driver" line unless
    ``name`` is a CUDA device (see :func:`~warp_meshad._src.app.warp_init.init_warp`).

    Args:
        name: ``"cpu"``, ``"cuda"``, ``"cuda:N"`` or None.
        where: the file or flag ``name`` came from, named in the error.

    Raises:
        ConfigError: a CUDA device was asked for but none (or not that one) exists.
    """
    import warp as wp

    from warp_meshad._src.app.warp_init import init_warp

    init_warp(name)  # without Warp's CUDA-driver warning unless a CUDA device was asked for
    count = wp.get_cuda_device_count()
    if name is None:
        if count > 0:
            return "cuda:0", "the first CUDA device (default)"
        return "cpu", "no CUDA device found (default)"
    if name.startswith("cuda"):
        index = int(name.split(":")[1]) if ":" in name else 0
        if index >= count:
            raise ConfigError(where, "device", f"{name!r} requested but {plural(count, 'CUDA device')} found; use "
                                               "--device cpu")
        return f"cuda:{index}", "requested"
    return name, "requested"


def _read_mesh(c: AppConfig) -> TriMesh:
    try:
        if c.mesh == "grid":
            g = c.grid
            return TriMesh.grid(g.nx, g.ny, g.width, g.height)
        return TriMesh.from_file(c.mesh_path())
    except MeshError as exc:
        raise ConfigError(c.origin("mesh"), "mesh", str(exc)) from None


def step_problem(rec: dict) -> str | None:
    """What is wrong with one step's record for :meth:`App.check_final`, or None: a solve that stopped on
    ``non_finite_*`` before its first iteration, a non-finite energy, or an energy that rose over the step."""
    reason = str(rec.get("reason", ""))
    if reason.startswith("non_finite") and rec.get("iterations", 0) == 0:
        what = reason.removeprefix("non_finite_")
        return (f"step {rec['step']}: the solve stopped before its first iteration ({reason}: the {what} at the "
                f"start point is NaN or infinite; a degenerate mesh or start point gives that)")
    e = rec["energies"]
    if not e:
        return f"step {rec['step']}: no energy recorded"
    bad = next((k for k, v in enumerate(e) if not math.isfinite(v)), None)
    if bad is not None:
        return f"step {rec['step']}: non-finite energy {e[bad]} at iteration {bad}"
    tol = 1e-10 * max(1.0, abs(e[0]))
    if e[-1] > e[0] + tol:
        return f"step {rec['step']}: energy rose from {e[0]} to {e[-1]}"
    return None


class App:
    """Base class of the apps: a typed config in, ``step()`` / ``run()`` / ``check_final()``, and what the runner and
    the viewer read.

    Subclasses set ``name`` and ``config_class`` and implement :meth:`step` (one time step or solver round: call
    :meth:`record` with its solve result) and :meth:`positions`; they may extend :meth:`check_final`,
    :meth:`quantities`, :meth:`spheres` and :meth:`extra_metrics`.

    Attributes:
        config: the app's config (an :class:`AppConfig` subclass).
        device: the Warp device used (str), and ``device_reason`` why.
        dtype: ``wp.float64`` or ``wp.float32``.
        mesh: the input :class:`~warp_meshad.TriMesh` (topology and rest shape).
        prepared: what :meth:`prepare` gave this app (empty when it built everything itself).
        setup_phases: wall time of the build's phases, ``{name: seconds}`` in order (see :meth:`lap`).
        history: the step records (:class:`~warp_meshad._src.app.history.StepHistory`, a list): one per step,
            ``{"step", "iterations", "energies", "gradient_norms", "time_ms", "reason", "converged",
            "steepest_descent_fallbacks", "fallback_reasons", "linear_solves_capped"}``; a run of more than
            ``history_capacity + 1`` steps keeps the first and the latest ``history_capacity`` of them, and
            ``history.total(key)`` sums a field over every step. Assigning a list replaces it.
        steps_done: number of steps taken.
    """

    name: ClassVar[str] = ""
    config_class: ClassVar[type[AppConfig]] = AppConfig
    continuous_objective: ClassVar[bool] = False  # True: every step continues one minimization (not time steps)
    history_capacity: ClassVar[int] = DEFAULT_CAPACITY  # latest step records kept in memory besides the first

    def __init__(self, config: AppConfig, prepared: dict | None = None):
        self.setup_phases = {}
        self._lap_mark = time.perf_counter()
        import warp as wp

        config = self._checked_config(config)
        self.config = config
        self.lap("config check")
        self.device, self.device_reason = resolve_device(config.device, config.origin("device"))
        self.lap("device")
        self.dtype = wp.float64 if config.dtype == "float64" else wp.float32
        self.history = []
        self.steps_done = 0
        self.prepared = dict(prepared or {})
        self.mesh = self.prepared["mesh"] if "mesh" in self.prepared else self.load_mesh()
        self.lap("mesh read")

    @property
    def history(self) -> StepHistory:
        """The step records (see the class's attributes)."""
        return self._history

    @history.setter
    def history(self, records) -> None:
        self._history = StepHistory(records, capacity=self.history_capacity, check=step_problem)

    @classmethod
    def _checked_config(cls, config: AppConfig) -> AppConfig:
        if not isinstance(config, cls.config_class):
            raise TypeError(f"{cls.__name__}(config): expected a {cls.config_class.__name__}, got "
                            f"{type(config).__name__}")
        if not config.app:
            config = config.model_copy(update={"app": cls.name})
        return finish_config(config)

    @classmethod
    def prepare(cls, config: AppConfig) -> dict:
        """The CPU-only part of building this app for ``config`` (no Warp device work), to run ahead in another
        process (``warp-meshad batch`` builds the next meshes this way while the GPU solves): a picklable dict that
        ``App(config, prepared=...)`` takes instead of doing that work again. The base reads the mesh
        (``{"mesh": TriMesh}``) unless the app reads its own (overrides :meth:`load_mesh`); apps add their start
        points (param: the Tutte embedding).

        Raises:
            ConfigError: as :meth:`load_mesh`.
        """
        return cls._prepare_checked(cls._checked_config(config))

    @classmethod
    def _prepare_checked(cls, config: AppConfig) -> dict:
        """:meth:`prepare` of a checked config (apps extend this one)."""
        if cls.load_mesh is not App.load_mesh:
            return {}
        return {"mesh": _read_mesh(config)}

    # -- building blocks ---------------------------------------------------------------------------------------------

    def lap(self, name: str) -> float:
        """Record the wall time since the previous lap (or the start of the build) as setup phase ``name`` of
        :attr:`setup_phases` (added to it when the name repeats); returns it [s]. The base laps ``config check``,
        ``device``, ``mesh read`` and ``checks`` (:meth:`require_nondegenerate`, whose preceding work is ``other``);
        apps lap their own steps (``start point``, ``problem``, ``solver``) and the runner laps what is left of the
        build as ``other``; ``metrics.json["phases_s"]["setup"]`` shows them."""
        now = time.perf_counter()
        seconds = now - self._lap_mark
        self._lap_mark = now
        self.setup_phases[name] = self.setup_phases.get(name, 0.0) + seconds
        return seconds

    def load_mesh(self):
        """The config's mesh: ``TriMesh.grid`` for ``mesh: grid``, else the file.

        Raises:
            ConfigError: key ``mesh``, with the :class:`~warp_meshad.MeshError` message (an empty, non-manifold or
                unreadable mesh, NaN coordinates, unreferenced vertices, ...).
        """
        return _read_mesh(self.config)

    def require_nondegenerate(self, faces: str | None = None, edges: str | None = None) -> None:
        """Refuse the mesh before the app runs when its energies cannot take it: zero-length edges (with ``edges``:
        why they are needed; checked first, as coincident vertices give both) or zero-area faces (with ``faces``), by
        :func:`~warp_meshad._src.mesh.checks.check_nondegenerate`'s rule.

        Raises:
            ConfigError: key ``mesh``, naming the first offending edges or faces and what was expected.
        """
        self.lap("other")
        m = self.mesh
        try:
            if edges:
                check_nondegenerate(m.source, m.vertices, edges=m.edges, needs=edges)
            if faces:
                check_nondegenerate(m.source, m.vertices, faces=m.faces, needs=faces)
        except MeshError as exc:
            raise ConfigError(self.config.origin("mesh"), "mesh", str(exc)) from None
        self.lap("checks")

    def record(self, result, **extra) -> dict:
        """Append a :class:`~warp_meshad.SolveResult` to :attr:`history` as one step; return the record."""
        rec = {
            "step": self.steps_done,
            "iterations": int(result.iterations),
            "energies": [float(e) for e in result.energies],
            "gradient_norms": [float(g) for g in result.gradient_norms],
            "time_ms": {k: float(v) for k, v in result.time_ms.items()},
            "reason": result.reason,
            "converged": bool(result.converged),
            # failures made visible: iterations that stepped along -g, CG solves stopped at their iteration cap
            "steepest_descent_fallbacks": int(getattr(result, "steepest_descent_fallbacks", 0)),
            "fallback_reasons": dict(getattr(result, "fallback_reasons", {})),
            "linear_solves_capped": int(getattr(result, "linear_solves_capped", 0)),
        }
        rec.update(extra)
        self.history.append(rec)
        self.steps_done += 1
        return rec

    # -- the interface -----------------------------------------------------------------------------------------------

    def step(self) -> dict:
        """Advance by one step (a time step, or one round of solver iterations); returns its history record."""
        raise NotImplementedError

    def run(self, callback=None) -> list[dict]:
        """Take the remaining ``config.steps`` steps; ``callback(app, record)`` after each. Returns :attr:`history`."""
        while self.steps_done < self.config.steps:
            rec = self.step()
            if callback is not None:
                callback(self, rec)
        return self.history

    def batch_step_parts(self) -> BatchStepParts | None:
        """What the next :meth:`step` solves, for a batched step of many apps; None (the default) when this app's
        step is not one Newton solve of a fixed problem (it then runs mesh by mesh)."""
        return None

    def finish_batch_step(self, result, seconds: float, cpu_seconds: float) -> dict:
        """Take this mesh's :class:`~warp_meshad.SolveResult` of a batched step as :meth:`step` takes its own solve's
        (``seconds``, ``cpu_seconds``: this mesh's share of the batch's wall and process CPU time); returns the step's
        history record."""
        raise NotImplementedError(f"{type(self).__name__}: batch_step_parts() is given but finish_batch_step() is not")

    def check_final(self) -> None:
        """Assert the result is sane. The base checks: finite positions, and for every step (:func:`step_problem`)
        finite energies, a solve that did not increase its energy and one that took its first iteration (a solve
        that stops at once on ``non_finite_*`` read NaN or inf at its start point). Apps add their own checks."""
        x = self.positions()
        assert np.all(np.isfinite(x)), f"{self.name}: {int(np.sum(~np.isfinite(x)))} non-finite coordinates"
        problems = [self.history.dropped_problem] + [step_problem(rec) for rec in self.history]
        first = next((p for p in problems if p is not None), None)
        assert first is None, f"{self.name}: {first}"

    def positions(self) -> np.ndarray:
        """Current vertex positions, float64 numpy (vertex_count, 3)."""
        raise NotImplementedError

    def quantities(self) -> dict:
        """Per-element quantities to show: ``{name: (kind, values)}`` with kind ``"vertices"`` or ``"faces"`` (scalars,
        shape (n,)) or ``"vertex_vectors"`` / ``"face_vectors"`` (shape (n, 3)). Each name says what the values are and
        their units (``"speed [m/s]"``, ``[1]`` for a ratio): it labels the colour bar of the screenshot and the
        viewer. The first scalar quantity is the one shown first."""
        return {}

    def uv_coordinates(self) -> np.ndarray | None:
        """Texture coordinates, float64 numpy (vertex_count, 2), shown as a checker on the surface and as a flat layout
        beside it; None (the default): the app has none."""
        return None

    def spheres(self) -> list[tuple[np.ndarray, float]]:
        """Static spheres of the scene (center, radius), drawn by the viewer."""
        return []

    def extra_metrics(self) -> dict:
        """App-specific entries of ``metrics.json``."""
        return {}

    def save_options(self) -> dict:
        """Keyword arguments of :meth:`TriMesh.save` for the final mesh (e.g. ``uv``)."""
        return {}

    @property
    def energy(self) -> float:
        """Energy at the end of the last step (NaN before the first)."""
        return self.history[-1]["energies"][-1] if self.history else float("nan")

    @property
    def gradient_norm(self) -> float:
        """Gradient norm at the end of the last step (NaN before the first)."""
        return self.history[-1]["gradient_norms"][-1] if self.history and self.history[-1]["gradient_norms"] else float(
            "nan")

    def describe(self) -> str:
        """One line: what runs where."""
        c = self.config
        m = self.mesh
        mesh = f"{c.grid.nx}x{c.grid.ny} grid" if c.mesh == "grid" else pathlib.Path(c.mesh).name
        return (f"{self.name}/{c.scene or 'custom'}: {mesh} ({plural(m.vertex_count, 'vertex', 'vertices')}, "
                f"{plural(m.face_count, 'face')}), {c.dtype}, solver {c.solver}, {plural(c.steps, 'step')}, on "
                f"{self.device} ({self.device_reason})")
