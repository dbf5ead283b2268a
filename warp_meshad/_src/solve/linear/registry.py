"""Back-ends by name: the registration table ``_BACKENDS`` (a name -> its class), :data:`LINEAR_SOLVER_NAMES` and
:func:`make_linear_solver`, the probe of a back-end on a device (``_probe``) and the choice of ``"auto"``
(``_pick_auto``).

Adding a back-end is a new file with its :class:`LinearSolver` subclass and one entry in ``_BACKENDS``: the names
accepted, the error messages, the options ``"auto"`` accepts and the probe all read the table. The probe builds the
class with no arguments (every constructor option has a default) and solves a 2x2 system with it. ``"auto"`` picks
among ``"cudss"``, ``"cupy"`` and ``"cg"`` on a GPU, ``"qdldl"`` and ``"scipy"`` on the CPU (``_pick_auto``).

Not here: the back-ends (one file each) and their interface (``base.py``).
"""

from __future__ import annotations

import inspect
import warnings

import numpy as np
import warp as wp
import warp.sparse as wps

from warp_meshad._src.solve.linear.base import LinearSolver, _logger, _type_name
from warp_meshad._src.solve.linear.cg import CGSolver
from warp_meshad._src.solve.linear.cudss import CudssSolver
from warp_meshad._src.solve.linear.qdldl import QdldlSolver
from warp_meshad._src.solve.linear.scipy import ScipySolver
from warp_meshad._src.solve.linear.spsolve import CupySolver

__all__ = ["LINEAR_SOLVER_NAMES", "make_linear_solver"]

_BACKENDS = {"scipy": ScipySolver, "qdldl": QdldlSolver, "cg": CGSolver, "cupy": CupySolver, "cudss": CudssSolver}
"""The registration table: a back-end's name (its ``name`` attribute) -> its class."""

LINEAR_SOLVER_NAMES = ("auto", *_BACKENDS)
"""Names accepted by :func:`make_linear_solver`: ``"auto"`` and the names of the table."""

_probe_cache: dict[tuple[str, str, str], tuple[bool, str]] = {}
_logged_auto: set[tuple[str, str]] = set()
_warned_auto: set[tuple[str, str]] = set()


def _probe(name: str, device, dtype=wp.float64) -> tuple[bool, str]:
    """Whether back-end ``name`` imports and solves a 2x2 SPD system of ``dtype`` on ``device``, and if not, why.

    Cached per back-end, device and dtype. Returns ``(True, "")`` or ``(False, reason)``.
    """
    key = (name, str(device), _type_name(dtype))
    if key not in _probe_cache:
        try:
            solver = _BACKENDS[name]()
            rows = wp.array([0, 0, 1, 1], dtype=int, device=device)
            cols = wp.array([0, 1, 0, 1], dtype=int, device=device)
            vals = wp.array([4.0, 1.0, 1.0, 3.0], dtype=dtype, device=device)
            A = wps.bsr_from_triplets(2, 2, rows, cols, vals)
            b = wp.array([1.0, 2.0], dtype=dtype, device=device)
            x = wp.zeros(2, dtype=dtype, device=device)
            solver.solve(A, b, x)
            atol = 1e-8 if dtype == wp.float64 else 1e-5
            got = x.numpy()
            if np.allclose(got, [1.0 / 11.0, 7.0 / 11.0], atol=atol):
                result = (True, "")
            else:
                result = (False, f"its {_type_name(dtype)} test solve returned {got.tolist()}, not [1/11, 7/11]")
        except ImportError as exc:
            result = (False, f"not importable: {exc}")
        except Exception as exc:  # any other failure also means "does not work here"
            result = (False, f"its {_type_name(dtype)} test solve failed: {type(exc).__name__}: {exc}")
        if not result[0]:
            _logger.debug("linear back-end %r unusable on %s: %s", name, device, result[1])
        _probe_cache[key] = result
    return _probe_cache[key]


def _filter_options(cls, options: dict) -> dict:
    accepted = set(inspect.signature(cls.__init__).parameters) - {"self"}
    return {k: v for k, v in options.items() if k in accepted}


def make_linear_solver(name: str = "auto", *, device=None, dtype=None, **options) -> LinearSolver:
    """Create a linear back-end by name.

    Args:
        name: one of :data:`LINEAR_SOLVER_NAMES`: ``"auto"``, ``"scipy"``, ``"qdldl"``, ``"cg"``, ``"cupy"``,
            ``"cudss"``.
        device: device the systems will live on (only used by ``"auto"``); default ``wp.get_device()``.
        dtype: scalar type of the systems, ``wp.float32`` or ``wp.float64`` (default); ``"auto"`` probes the GPU
            back-ends with a system of this type.
        **options: keyword options of the chosen back-end class (:class:`ScipySolver`, :class:`QdldlSolver`,
            :class:`CGSolver`,
            :class:`CupySolver`, :class:`CudssSolver`). With ``"auto"``, each option goes to the picked back-end only if
            that back-end accepts it; an option that no back-end accepts is an error.

    Returns:
        The back-end instance; ``solver.name`` says which one (for ``"auto"``, the one picked, and
        ``solver.cudss_skipped_reason`` why it is not cuDSS; on a CUDA device that reason is also warned once per
        device and reason with ``warnings.warn``).

    Raises:
        ValueError: unknown ``name`` (the message lists the valid ones), or a ``dtype`` other than float32/float64.
        TypeError: an option the back-end does not accept.
        ImportError: an optional package is missing (the message names the pip extra to install).
    """
    if isinstance(name, LinearSolver):
        if options:
            raise TypeError(f"options {sorted(options)} given with a LinearSolver instance")
        return name
    if name not in LINEAR_SOLVER_NAMES:
        raise ValueError(f"unknown linear solver {name!r}; expected one of {LINEAR_SOLVER_NAMES}")
    dtype = wp.float64 if dtype is None else dtype
    if dtype not in (wp.float32, wp.float64):
        raise ValueError(f"dtype: expected wp.float32 or wp.float64, got {_type_name(dtype)}")
    if name != "auto":
        cls = _BACKENDS[name]
        unknown = set(options) - (set(inspect.signature(cls.__init__).parameters) - {"self"})
        if unknown:
            raise TypeError(f"{name!r} linear solver: unknown options {sorted(unknown)}")
        return cls(**options)

    all_accepted = set()
    for cls in _BACKENDS.values():
        all_accepted |= set(inspect.signature(cls.__init__).parameters) - {"self"}
    unknown = set(options) - all_accepted
    if unknown:
        raise TypeError(f"'auto' linear solver: unknown options {sorted(unknown)}")

    picked, skipped = _pick_auto(wp.get_device(device), dtype, options)
    cls = _BACKENDS[picked]
    solver = cls(**_filter_options(cls, options))
    solver.cudss_skipped_reason = skipped
    return solver


def _pick_auto(device, dtype, options: dict) -> tuple[str, str | None]:
    """The back-end ``"auto"`` picks on ``device`` and why it is not cuDSS (None when it is); on a CUDA device that
    reason is warned once per device and reason."""
    if device.is_cuda:
        ok, why = _probe("cudss", device, dtype)
        if ok:
            picked, skipped = "cudss", None
        else:
            picked = "cupy" if _probe("cupy", device, dtype)[0] else "cg"
            skipped = f"cuDSS {why}"
            if (str(device), skipped) not in _warned_auto:
                _warned_auto.add((str(device), skipped))
                warnings.warn(f"linear_solver='auto' on {device}: cuDSS is not used ({skipped}); using {picked!r}",
                              stacklevel=3)
    else:
        # SuperLU's own options (an unsymmetric matrix, an ordering, float32 factors) ask for SuperLU
        superlu = (options.get("symmetric", True) is False or "ordering" in options
                   or options.get("factor_dtype", "float64") != "float64")  # QDLDL factors in float64 only
        picked = "qdldl" if not superlu and _probe("qdldl", device, dtype)[0] else "scipy"
        skipped = f"the device is the CPU ({device}); cuDSS runs on CUDA devices only"
    key = (str(device), picked)
    if key not in _logged_auto:
        _logged_auto.add(key)
        _logger.info("linear solver 'auto' picked %r on %s", picked, device)
    return picked, skipped
