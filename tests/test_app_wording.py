"""The apps' modules state behaviour: no work-log words ("session N", campaigns) in their text."""

import pathlib
import re

import pytest

APPS = pathlib.Path(__file__).resolve().parents[1] / "apps"


@pytest.mark.parametrize("path", sorted(APPS.glob("*.py")), ids=lambda p: p.name)
def test_no_session_in_app_modules(path):
    hits = [f"{path.name}:{i}: {line.strip()}" for i, line in enumerate(path.read_text().splitlines(), 1)
            if re.search(r"\bsessions?\b", line, re.IGNORECASE)]
    assert not hits, "cite a benchmark table by its name instead:\n" + "\n".join(hits)
