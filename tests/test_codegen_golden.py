"""The generated sources stay byte for byte what tests/golden/ holds (tests/golden_cases.py says how they are made).

Warp hashes a module from its source text: a changed generated text recompiles every user's kernels. Changing it
on purpose: ``python tests/golden_cases.py --write`` and name the change in the commit.
"""

import difflib
import json

import pytest

import golden_cases as gc


def _manifest():
    return json.loads((gc.GOLDEN / "digests.json").read_text())


def _diff(want: str, got: str, name: str) -> str:
    lines = difflib.unified_diff(want.splitlines(), got.splitlines(), f"golden {name}", f"generated {name}", lineterm="", n=1)
    return "\n".join(list(lines)[:40])


def test_kernel_sources_are_the_golden_ones():
    want = gc.read_kernel_goldens()
    digests = _manifest()["kernels"]
    cases = gc.kernel_cases()
    assert sorted(name for name, *_ in cases) == sorted(want) == sorted(digests)
    for name, shape, mode, variant in cases:
        got = gc.render_kernel(shape, mode, variant)
        assert got == want[name], _diff(want[name], got, name)
        assert gc.digest(got) == digests[name]


def test_dual_modules_are_the_golden_ones():
    digests = _manifest()["duals"]
    assert sorted(gc.dual_name(*c) for c in gc.DUAL_ALL) == sorted(digests)
    for case in gc.DUAL_ALL:
        name = gc.dual_name(*case)
        got = gc.render_dual(*case)
        full = gc.GOLDEN / f"duals_{name}.py.txt"
        if full.exists():
            want = full.read_text()
            assert got == want, _diff(want, got, name)
        assert gc.digest(got) == digests[name], f"dual module {name} differs from its golden digest"


def test_term_kernel_names_are_the_golden_ones():
    # a kernel's name digests its text, the rewritten energy and the energy's module name: the same name means
    # the same Warp module hash, so kernels compiled before the change are still found in the cache
    assert gc.term_kernel_names() == _manifest()["term_kernel_names"]
