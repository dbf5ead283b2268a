"""Errors in a user's energy, reported at the user's file and line.

Warp generates the code of an energy from the rewritten source text (:mod:`.energy_rewrite`), so its errors name
lines of that text, its internal names (``_wm_ret``, ``_wm_S``, operator overloads ``add``/``mul``) and the
generated kernel around it, in a long chained traceback. :func:`remember` records, for each rewritten function,
the user's file, function and a map from lines of the rewritten text to the user's lines; :func:`energy_error`
turns a Warp code-generation error that went through such a function into a short :class:`EnergyError`:

    add_term(energy=spring): the energy does not compile for variables of type vec3d:
      /home/me/spring.py:12, in spring: name 'stiffnes' is not defined
        return l * stiffnes

Setting the environment variable ``WARP_MESHAD_DEBUG_CODEGEN=1`` chains Warp's own error (and its traceback)
to it again.
"""

from __future__ import annotations

import functools
import linecache
import os
import re
from dataclasses import dataclass

from warp_meshad._src.codegen.warp_compat import codegen_error_frames

__all__ = ["DEBUG_VARIABLE", "EnergyError", "energy_error", "raise_energy_error", "remember", "reported_at_the_caller"]

DEBUG_VARIABLE = "WARP_MESHAD_DEBUG_CODEGEN"


class EnergyError(ValueError):
    """A user's energy (or residual) that does not compile: the message names the user's file, line and name."""


EnergyError.__module__ = "warp_meshad"  # its public name (exported there): tracebacks print warp_meshad.EnergyError


def reported_at_the_caller(method):
    """Decorator of a public entry point (``Problem.add_term``, ``eval*``, ...): an :class:`EnergyError` raised
    anywhere below it reaches the caller with this entry point as its only toolkit frame, so the traceback shows the
    user's call, then the message (the whole traceback with ``WARP_MESHAD_DEBUG_CODEGEN=1``)."""

    @functools.wraps(method)
    def wrapper(*args, **kwargs):
        try:
            return method(*args, **kwargs)
        except EnergyError as exc:
            if os.environ.get(DEBUG_VARIABLE):
                raise
            raise exc.with_traceback(None) from None

    return wrapper


@dataclass(frozen=True)
class _Origin:
    file: str
    name: str  # the user's function name
    lines: dict  # line of the rewritten text (1-based) -> the user's line
    first: int  # the user's first line of the function (decorators included)


_ORIGINS: dict[str, _Origin] = {}  # Warp function key of a rewritten function -> where the user wrote it

# names the rewrite introduces -> what the user wrote
_OPERATORS = {
    "add": "+", "sub": "-", "mul": "*", "div": "/", "_wm_neg": "unary -", "_wm_lt": "<", "_wm_le": "<=",
    "_wm_gt": ">", "_wm_ge": ">=", "_wm_index": "[]", "_wm_index2": "[, ]",
}  # fmt: skip
_DUAL_TYPE = re.compile(r"\b(?:\w+\.)*(Dual|DVec(\d)_|DMat(\d\d)_)\d+([fd])[GH]\b")  # with its module's path
_UNDEFINED = re.compile(r"Referencing undefined symbol: (\w+)")
_OVERLOAD = re.compile(r"Couldn't find function overload for '(\w+)' that matched inputs with types: \[(.*?)\]")


def remember(key: str, file: str, name: str, first_line: int, line_map: dict) -> None:
    """Record where the rewritten Warp function ``key`` comes from.

    Args:
        key: the Warp function's key (the rewritten function's name).
        file: the user's source file.
        name: the user's function name.
        first_line: the file line of the function's first line (``co_firstlineno``).
        line_map: line of the rewritten source text (1-based) -> line in ``file``, one per statement.
    """
    _ORIGINS[key] = _Origin(file, name, dict(line_map), first_line)


def _readable_type(match: re.Match) -> str:
    s = match.group(4)
    if match.group(2):
        return f"vec{match.group(2)}{s} (dual)"
    if match.group(3):
        return f"mat{match.group(3)}{s} (dual)"
    return ("float32" if s == "f" else "float64") + " (dual)"


def _reason(text: str) -> str:
    """Warp's reason in the words of the user's code."""
    text = text.strip().split("\n", 1)[0]
    m = _UNDEFINED.search(text)
    if m:
        return f"name '{m.group(1)}' is not defined"
    m = _OVERLOAD.search(text)
    if m:
        name, types = m.group(1), _DUAL_TYPE.sub(_readable_type, m.group(2))
        if name in _OPERATORS:
            return f"unsupported operand types for {_OPERATORS[name]}: {types}"
        if name == "_wm_ret":
            return f"cannot return a value of type {types}"
        return f"no overload of '{name}' takes arguments of types ({types})"
    return _DUAL_TYPE.sub(_readable_type, text)


def energy_error(exc: BaseException, context: str) -> EnergyError | None:
    """The short error for a Warp code-generation error raised in a rewritten energy, or None when ``exc`` is not one.

    Args:
        exc: what Warp raised while generating a module's code (at ``add_term``'s probe or a kernel's first launch).
        context: what was being done, e.g. ``"add_term(energy=spring): the energy does not compile ..."``.
    """
    found = codegen_error_frames(exc)
    if found is None:
        return None
    frames, reason = found
    for key, _, line in reversed(frames):  # the innermost function the user wrote
        origin = _ORIGINS.get(key)
        if origin is not None:
            break
    else:
        return None
    user_line = origin.lines.get(line + 1, origin.first)  # Warp counts from 0 in a function built from text
    text = f"{context}:\n  {origin.file}:{user_line}, in {origin.name}: {_reason(reason)}"
    source = linecache.getline(origin.file, user_line).strip()
    if source:
        text += f"\n    {source}"
    if not os.environ.get(DEBUG_VARIABLE):
        text += f"\n({DEBUG_VARIABLE}=1 shows Warp's own error)"
    return EnergyError(text)


def raise_energy_error(exc: BaseException, context: str) -> None:
    """Raise the :class:`EnergyError` of ``exc`` (see :func:`energy_error`) when it is one; return otherwise.

    Warp's error is chained to it only when ``WARP_MESHAD_DEBUG_CODEGEN`` is set.
    """
    err = energy_error(exc, context)
    if err is None:
        return
    if os.environ.get(DEBUG_VARIABLE):
        raise err from exc
    raise err from None
