"""The registration table of the linear back-ends (``solve/linear/registry.py``) is the one list of them: the names
``make_linear_solver`` accepts, its message for an unknown one, each back-end's ``name`` and what the probe builds all
come from it, so that a new back-end is a new file and one entry."""

import inspect

import pytest
import warp as wp

from warp_meshad._src.solve.linear import LINEAR_SOLVER_NAMES, LinearSolver, make_linear_solver, registry


def test_the_names_are_auto_and_the_table():
    assert LINEAR_SOLVER_NAMES == ("auto", *registry._BACKENDS)
    for name, cls in registry._BACKENDS.items():
        assert issubclass(cls, LinearSolver), f"{name}: {cls!r} is not a LinearSolver"
        assert cls.name == name, f"{cls.__name__} is registered as {name!r} but says name={cls.name!r}"


def test_an_unknown_name_is_refused_with_every_registered_one():
    with pytest.raises(ValueError, match="unknown linear solver 'umfpack'") as caught:
        make_linear_solver("umfpack")
    missing = [name for name in LINEAR_SOLVER_NAMES if repr(name) not in str(caught.value)]
    assert missing == []


def test_every_registered_back_end_can_be_built_without_options():
    # what the probe of "auto" does: cls() with no arguments
    required = {name: [p.name for p in inspect.signature(cls.__init__).parameters.values()
                       if p.name != "self" and p.default is inspect.Parameter.empty
                       and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
                for name, cls in registry._BACKENDS.items()}
    assert {name: params for name, params in required.items() if params} == {}


@pytest.mark.parametrize("name", ["scipy", "qdldl", "cg"])
def test_the_probe_solves_with_a_registered_host_back_end(device, name, monkeypatch):
    monkeypatch.setattr(registry, "_probe_cache", {})
    assert registry._probe(name, wp.get_device(device), wp.float64) == (True, "")
    assert list(registry._probe_cache) == [(name, str(wp.get_device(device)), "float64")]

