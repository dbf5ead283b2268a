"""module_keys.energy_digest: the key of an energy folds its source (read and parsed once per function) and the
values its names refer to (resolved on every call), so a changed constant gives a new key within one process."""

from __future__ import annotations

import importlib
import sys
import textwrap

import pytest
import warp as wp

from warp_meshad._src.codegen import module_keys

SOURCE = textwrap.dedent(
    """
    import warp as wp

    SCALE = 2.0

    @wp.func
    def helper(a: float):
        return a * a

    @wp.func
    def energy(e: int, a: float):
        return SCALE * helper(a) + wp.sin(a)
    """
)


@pytest.fixture
def energy_module(tmp_path, monkeypatch):
    (tmp_path / "mk_energy.py").write_text(SOURCE)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("mk_energy", None)
    mod = importlib.import_module("mk_energy")
    yield mod
    sys.modules.pop("mk_energy", None)


def test_digest_repeats_and_follows_the_values_its_names_refer_to(energy_module):
    first = module_keys.energy_digest(energy_module.energy)
    assert first is not None and first == module_keys.energy_digest(energy_module.energy)
    energy_module.SCALE = 3.0  # the source is kept per function; the value is read again
    changed = module_keys.energy_digest(energy_module.energy)
    assert changed not in (None, first)
    energy_module.SCALE = 2.0
    assert module_keys.energy_digest(energy_module.energy) == first


def test_digest_follows_a_called_function_and_refuses_an_undescribable_name(energy_module):
    first = module_keys.energy_digest(energy_module.energy)

    @wp.func
    def other_helper(a: float):
        return a * a * a

    energy_module.helper = other_helper  # the name `helper` now refers to another function
    assert module_keys.energy_digest(energy_module.energy) not in (None, first)
    energy_module.helper = object()  # no stable description: no key (the term takes Warp's own path)
    assert module_keys.energy_digest(energy_module.energy) is None
