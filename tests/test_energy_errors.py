"""An energy that does not compile is reported at the user's file and line, with the offending name, in a few lines
without the rewrite's internal names (warp_meshad/_src/codegen/energy_errors.py); WARP_MESHAD_DEBUG_CODEGEN=1 chains
Warp's own error. CPU only: add_term's probe generates code without compiling it."""

import inspect
from typing import Any

import numpy as np
import pytest
import warp as wp

import warp_meshad as wm
from warp_meshad._src.codegen.energy_errors import DEBUG_VARIABLE, EnergyError
from warp_meshad.kernels import ad


@wp.func
def _undefined_name(e: int, xa: Any, xb: Any):
    l = ad.length(xa - xb)
    return wp.float64(0.5) * l * stiffnes  # noqa: F821


@wp.func
def _type_mismatch(e: int, xa: Any, xb: Any):
    l = ad.length(xa - xb)
    return l + xa


@wp.func
def _wrong_call(e: int, xa: Any, xb: Any):
    l = ad.length(xa, xb)
    return l * l


@wp.func
def _helper_with_error(a: Any):
    return a * undefined_in_helper  # noqa: F821


@wp.func
def _calls_a_bad_helper(e: int, xa: Any, xb: Any):
    return _helper_with_error(ad.length(xa - xb))


def _line_of(fn, text: str) -> int:
    """The line of this file where ``fn``'s source holds ``text``."""
    lines, first = inspect.getsourcelines(fn.func)
    return first + next(i for i, line in enumerate(lines) if text in line)


def _add(energy):
    p = wm.Problem(3, 3, wp.float64, device="cpu")
    p.add_term(elements=np.array([[0, 1], [1, 2]]), energy=energy)


@pytest.mark.parametrize(
    "energy, offending, reason",
    [
        (_undefined_name, "* stiffnes", "name 'stiffnes' is not defined"),
        (_type_mismatch, "return l + xa", "unsupported operand types for +: float64, vec3d"),
        (_wrong_call, "ad.length(xa, xb)", "no overload of 'length' takes arguments of types (vec3d, vec3d)"),
    ],
)
def test_error_names_the_users_file_line_and_name(energy, offending, reason, monkeypatch):
    monkeypatch.delenv(DEBUG_VARIABLE, raising=False)
    with pytest.raises(EnergyError) as info:
        _add(energy)
    msg = str(info.value)
    where = f"{__file__}:{_line_of(energy, offending)}, in {energy.func.__name__}: {reason}"
    assert where in msg, msg
    assert offending in msg.splitlines()[2]  # the offending line itself, as written
    assert msg.startswith(f"add_term(energy={energy.func.__name__}): the energy does not compile")
    assert "_wm_" not in msg and "Error while parsing" not in msg
    assert len(msg.splitlines()) <= 10
    assert info.value.__cause__ is None and info.value.__suppress_context__
    assert isinstance(info.value, ValueError)  # as before: add_term's errors about the energy are ValueErrors


def test_error_in_a_helper_names_the_helpers_line():
    with pytest.raises(EnergyError) as info:
        _add(_calls_a_bad_helper)
    msg = str(info.value)
    line = _line_of(_helper_with_error, "undefined_in_helper")
    assert f"{__file__}:{line}, in _helper_with_error: name 'undefined_in_helper' is not defined" in msg, msg


def test_debug_variable_keeps_warps_error(monkeypatch):
    monkeypatch.setenv(DEBUG_VARIABLE, "1")
    with pytest.raises(EnergyError) as info:
        _add(_undefined_name)
    assert info.value.__cause__ is not None
    assert "Referencing undefined symbol: stiffnes" in str(info.value.__cause__)


@wp.func
def _cast_of_a_dual(e: int, xa: Any, xb: Any):
    l = ad.length(xa - xb)
    m = wp.float64(l)
    return m * m


def test_error_at_a_kernels_first_launch_names_the_users_line():
    # plain values pass add_term's probe; the gradient kernel's duals do not convert to float64
    p = wm.Problem(3, 3, wp.float64, device="cpu")
    p.add_term(elements=np.array([[0, 1], [1, 2]]), energy=_cast_of_a_dual)
    x = wp.zeros(3, dtype=wp.vec3d, device="cpu")
    with pytest.raises(EnergyError) as info:
        p.eval_with_gradient(x)
    msg = str(info.value)
    line = _line_of(_cast_of_a_dual, "wp.float64(l)")
    assert msg.startswith("term '_cast_of_a_dual': the energy does not compile for the gradient kernel")
    assert f"{__file__}:{line}, in _cast_of_a_dual: no overload of 'float64' takes arguments of types " \
           "(float64 (dual))" in msg, msg
    assert "_wm_" not in msg and "_generated" not in msg and len(msg.splitlines()) <= 10


@pytest.mark.parametrize("call", ["add_term", "eval_with_gradient"])
def test_traceback_shows_the_users_call_then_the_message(call, monkeypatch):
    # the whole report (traceback + message) fits in about 10 lines: the user's call, the public entry point, the message
    import traceback

    monkeypatch.delenv(DEBUG_VARIABLE, raising=False)
    p = wm.Problem(3, 3, wp.float64, device="cpu")
    with pytest.raises(EnergyError) as info:
        if call == "add_term":
            p.add_term(elements=np.array([[0, 1], [1, 2]]), energy=_undefined_name)
        else:
            p.add_term(elements=np.array([[0, 1], [1, 2]]), energy=_cast_of_a_dual)
            p.eval_with_gradient(wp.zeros(3, dtype=wp.vec3d, device="cpu"))
    frames = traceback.extract_tb(info.value.__traceback__)
    assert frames[1].filename.endswith("energy_errors.py") and len(frames) == 2, frames
    assert wm.EnergyError is EnergyError and "warp_meshad.EnergyError" in "".join(
        traceback.format_exception_only(info.type, info.value))
