"""The project's text states behaviour: no work-log words (a GPU campaign's number, "the Nth ...") in the apps'
modules, the library, the benchmarks and their results, the docs or the tests; docstrings cite benchmark tables by
name instead."""

import os
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
APPS = ROOT / "apps"
# the word, anywhere in a line (identifiers too, as ``grep -ri`` finds it), written as a pattern so that this file
# passes its own check
WORK_LOG = re.compile(r"ses{2}ion", re.IGNORECASE)
TEXT = {".py", ".md", ".txt", ".json", ".jsonl", ".log", ".yaml", ".yml", ".toml", ".sh", ".cfg", ".ini"}
# build outputs, caches and environments: not the project's text (all git-ignored)
SKIP_DIRS = {"output", "site", "build", "dist", "__pycache__", "node_modules"}


def _hits(path: pathlib.Path) -> list[str]:
    text = path.read_text(errors="replace")
    return [f"{path.relative_to(ROOT)}:{i}: {line.strip()[:160]}" for i, line in enumerate(text.splitlines(), 1)
            if WORK_LOG.search(line)]  # fmt: skip


def _project_text_files():
    for folder, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if not d.startswith(".") and d not in SKIP_DIRS and not d.endswith(".egg-info")
                   and not (pathlib.Path(folder, d) / "pyvenv.cfg").exists()]  # fmt: skip
        for name in files:
            if pathlib.Path(name).suffix in TEXT:
                yield pathlib.Path(folder, name)


@pytest.mark.parametrize("path", sorted(APPS.glob("*.py")), ids=lambda p: p.name)
def test_no_work_log_words_in_app_modules(path):
    hits = _hits(path)
    assert not hits, "cite a benchmark table by its name instead:\n" + "\n".join(hits)


def test_no_work_log_words_in_the_project():
    files = list(_project_text_files())
    assert any(p.name == "README.md" and p.parent == ROOT / "benchmarks" for p in files)  # the walk reaches them
    hits = [h for p in files for h in _hits(p)]
    assert not hits, "state behaviour or cite a benchmark table by its name instead:\n" + "\n".join(hits)
