"""The solvers' grouped options, and the one place that refuses options which cannot work together.

- :class:`LineSearch`: Armijo backtracking (``shrink``, ``tries``, ``c``), every solver's ``line_search=``.
- :class:`Projection`: projected Newton's per-element PSD projection (``mode``, ``eps``), the Newton solvers'
  ``projection=`` (None: the exact Hessian).
- :class:`DeviceLoop`: how a device loop queues and replays its iterations, the ``device_loop=`` of Newton, L-BFGS
  and gradient descent.
- :func:`check_compatible`: every refused combination of options, each refusal naming both sides. The solvers'
  constructors call it with their settings, ``solve`` again with its ``callback``.
- :func:`check_line_search`, :func:`check_projection`, :func:`device_loop_options`: a solver's ``line_search=``,
  ``projection=`` and ``device_loop=`` arguments checked (and the last one turned into options).

Each option object checks its own values when it is built; what one option means for another is decided only here.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Callable

from warp_meshad._src.solve.line_search import check_armijo_settings

__all__ = ["PROJECTION_MODES", "DeviceLoop", "LineSearch", "Projection", "check_compatible", "check_line_search",
           "check_projection", "device_loop_options"]

PROJECTION_MODES = ("clamp", "abs")


def _is_real(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _is_int(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


@dataclass(frozen=True)
class LineSearch:
    """Armijo backtracking: trial steps ``alpha0, shrink alpha0, shrink^2 alpha0, ...`` until
    ``f(x + alpha d) <= f(x) + c alpha (g . d)`` holds (a trial energy of +inf or NaN is rejected). The defaults are
    TinyAD's.

    Attributes:
        shrink: factor in (0, 1) applied to the step after a rejected trial.
        tries: energy evaluations a line search may make (>= 1); when none is accepted the solve stops with
            ``"line_search_failed"``.
        c: sufficient-decrease constant in (0, 1).

    Raises:
        TypeError: a value that is not a number (``tries``: not an int).
        ValueError: ``shrink`` or ``c`` outside (0, 1), ``tries`` < 1.
    """

    shrink: float = 0.8
    tries: int = 64
    c: float = 1e-4

    def __post_init__(self):
        for name in ("shrink", "c"):
            value = getattr(self, name)
            if not _is_real(value):
                raise TypeError(f"LineSearch({name}=...): expected a float in (0, 1), got {value!r}")
            object.__setattr__(self, name, float(value))
        if not _is_int(self.tries):
            raise TypeError(f"LineSearch(tries=...): expected an int >= 1, got {self.tries!r}")
        object.__setattr__(self, "tries", int(self.tries))
        check_armijo_settings(self.shrink, self.c, self.tries,
                              names=("LineSearch(shrink=...)", "LineSearch(c=...)", "LineSearch(tries=...)"))


@dataclass(frozen=True)
class Projection:
    """Projected Newton's per-element projection of the Hessian to positive (semi)definite before assembly
    (:meth:`~warp_meshad.Problem.eval_with_hessian_proj`).

    Attributes:
        mode: ``"clamp"``: eigenvalues below ``eps`` are replaced by ``eps`` (TinyAD's projection); ``"abs"``:
            eigenvalues are replaced by their absolute values, then clamped at ``eps``.
        eps: the smallest eigenvalue an element Hessian keeps (a finite number >= 0).

    Raises:
        ValueError: an unknown ``mode``, or an ``eps`` that is negative, not finite or not a number.
    """

    mode: str = "clamp"
    eps: float = 1e-9

    def __post_init__(self):
        if self.mode not in PROJECTION_MODES:
            raise ValueError(f"Projection(mode=...): expected one of {PROJECTION_MODES}, got {self.mode!r}")
        if not (_is_real(self.eps) and math.isfinite(self.eps) and self.eps >= 0.0):
            raise ValueError(f"Projection(eps=...): expected a finite number >= 0, got {self.eps!r}")
        object.__setattr__(self, "eps", float(self.eps))


@dataclass(frozen=True)
class DeviceLoop:
    """Options of the device loops (``NewtonSolver(device_loop=DeviceLoop(...))``, and L-BFGS's and gradient
    descent's; ``device_loop=True`` means the defaults).

    Attributes:
        trials: Armijo trials queued per slot (>= 1): each costs one energy evaluation whether or not an earlier one
            was accepted; a line search needing more continues in the next slot. Not used by a captured slot that
            runs its line search as a conditional loop (``conditional``).
        poll: read the stop flag once per slot (True), or queue ``max_iterations`` slots with no read (False: the
            caller asks for a fixed iteration count; the work queued after a stop is wasted but changes nothing).
        capture: replay the slots as CUDA graphs (CUDA devices only).
        capture_solve: with ``capture``, capture the linear solve in the slot's graph where the back-end allows it
            (True), or always queue it between two graphs (False).
        conditional: with ``capture``, the captured line search is a while node of the graph (``wp.capture_while``,
            CUDA driver and toolkit 12.4+; else ``trials`` per slot): it runs trials until one is accepted or the
            solver's ``line_search.tries`` are spent, so no energy is evaluated after the accepted trial and no
            line search goes on in the next slot.

    Raises:
        ValueError: ``trials`` not an int >= 1.
        TypeError: a flag that is not a bool.
    """

    trials: int = 8
    poll: bool = True
    capture: bool = False
    capture_solve: bool = True
    conditional: bool = True

    def __post_init__(self):
        if not _is_int(self.trials) or self.trials < 1:
            raise ValueError(f"DeviceLoop(trials=...): expected an int >= 1, got {self.trials!r}")
        for name in ("poll", "capture", "capture_solve", "conditional"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"DeviceLoop({name}=...): expected a bool, got {getattr(self, name)!r}")


def check_line_search(line_search, what: str) -> LineSearch:
    """``line_search`` if it is a :class:`LineSearch`; TypeError naming ``what`` (the caller's argument) otherwise."""
    if not isinstance(line_search, LineSearch):
        raise TypeError(f"{what}: expected a LineSearch, got {type(line_search).__name__}")
    return line_search


def check_projection(projection, what: str) -> Projection | None:
    """``projection`` if it is a :class:`Projection` or None; TypeError naming ``what`` otherwise."""
    if projection is not None and not isinstance(projection, Projection):
        hint = " (Projection(mode=...) holds the mode)" if isinstance(projection, str) else ""
        raise TypeError(f"{what}: expected a Projection or None, got {projection!r}{hint}")
    return projection


def device_loop_options(device_loop) -> DeviceLoop | None:
    """A solver's ``device_loop=`` argument as options: None for the host loop (False or None), the defaults for
    True, a :class:`DeviceLoop` as given.

    Raises:
        TypeError: anything else.
    """
    if device_loop is False or device_loop is None:
        return None
    if device_loop is True:
        return DeviceLoop()
    if not isinstance(device_loop, DeviceLoop):
        raise TypeError(f"device_loop: expected a bool or a DeviceLoop, got {type(device_loop).__name__}")
    return device_loop


def check_compatible(
    solver: str,
    *,
    device=None,
    device_loop: DeviceLoop | None = None,
    hooks=None,
    step_bound_fn: Callable | None = None,
    keep_start_factors: bool = False,
    linear_solver=None,
    linear_solver_options: dict | None = None,
    callback: Callable | None = None,
) -> None:
    """Refuse the combinations of a solver's options that cannot work together; every refusal names both options.

    Refused:

    - a device loop (``device_loop`` not None) with ``hooks.stop``, ``hooks.line_search_energy`` or
      ``step_bound_fn``: host code between the steps the device queues;
    - ``DeviceLoop(capture=True)`` with ``hooks.before_derivatives`` (host code cannot be replayed in a CUDA graph),
      or on a ``device`` that is not CUDA;
    - ``DeviceLoop(poll=False)`` with ``keep_start_factors=True`` (whether a solve starts at the factored point is
      read on the host before its first slot) or with a ``callback`` (no host read per iteration to call it from);
    - a :class:`~warp_meshad.LinearSolver` instance as ``linear_solver`` with ``linear_solver_options`` (options
      build a back-end from its name; an instance is already built).

    Args:
        solver: how the message names the solver (its class name).
        device: the problem's device (a ``wp.context.Device``), or None where not known.
        device_loop: the options of the device loop, or None for the host loop.
        hooks: the solver's :class:`~warp_meshad.NewtonHooks`, or None.
        step_bound_fn, keep_start_factors, linear_solver, linear_solver_options: the solver's arguments.
        callback: ``solve``'s callback (None at construction).

    Raises:
        ValueError: one message listing every refused pair.
    """
    found: list[str] = []

    def refuse(first: str, second: str, why: str) -> None:
        found.append(f"{first} with {second}: {why} (expected one of the two, got both)")

    if device_loop is not None:
        for name in ("stop", "line_search_energy"):
            if hooks is not None and getattr(hooks, name) is not None:
                refuse("device_loop", f"hooks.{name}", f"hooks.{name} is host code inside the iteration, which the "
                       "device loop queues without the host, and the host loop (device_loop=False) runs it")
        if step_bound_fn is not None:
            refuse("device_loop", "step_bound_fn", "step_bound_fn is host code inside the iteration, which the device "
                   "loop queues without the host, and the host loop (device_loop=False) runs it")
        if device_loop.capture:
            if hooks is not None and hooks.before_derivatives is not None:
                refuse("DeviceLoop(capture=True)", "hooks.before_derivatives",
                       "host code cannot be replayed in a CUDA graph, and DeviceLoop(capture=False) runs it")
            if device is not None and not device.is_cuda:
                refuse("DeviceLoop(capture=True)", f"a problem on {device}", "CUDA graphs need a CUDA device")
        if not device_loop.poll:
            if keep_start_factors:
                refuse("DeviceLoop(poll=False)", "keep_start_factors=True", "whether a solve starts at the factored "
                       "point is read on the host before its first slot, and poll=False reads nothing before the end")
            if callback is not None:
                refuse("DeviceLoop(poll=False)", "callback", "the callback runs on the host after every iteration, "
                       "and poll=False reads nothing before the end")
    if linear_solver_options and linear_solver is not None and not isinstance(linear_solver, str):
        refuse(f"linear_solver={type(linear_solver).__name__}(...)", f"linear_solver_options={linear_solver_options!r}",
               "options build a back-end from its name, and an instance is already built")
    if found:
        raise ValueError(f"{solver}: incompatible options: " + "; ".join(found))  # no ';' inside a refusal
