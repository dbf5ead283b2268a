"""The documents cannot rot: every ``examples/*.py`` runs at its small size, and every runnable ```python block of
README.md and docs/**/*.md runs, on the CPU.

The rule for code blocks (also stated in CONTRIBUTING.md):

- A fenced block opened with exactly ```python runs. A file's blocks run in order in one namespace (a later block
  may use what an earlier one defined), from the repository's root folder.
- A block whose fence comes right after a line ``<!-- skip -->`` (a comment markdown does not show) is shown, not
  run: a fragment, or code that needs a GPU or a long time. A block that only includes a file (``--8<-- "path"``,
  pymdownx.snippets) is not run either: the files it includes are the examples, run below.
- A ```text block right after a line ``<!-- expected-output -->`` is what the blocks before it (since the previous
  such block) print, compared exactly.

An example is a module of ``examples/`` with ``main(device=None, **size)``, checking its own result (asserts), and,
where its default size is more than a test needs, ``TEST_SIZE``: the keyword arguments of a small run. The test calls
``main("cpu", **TEST_SIZE)``.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import pathlib
import re
import sys
import types

import pytest

pytestmark = pytest.mark.cpu

ROOT = pathlib.Path(__file__).resolve().parents[1]
EXAMPLES = sorted((ROOT / "examples").glob("*.py"))
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]

_FENCE = re.compile(r"^(?P<indent>[ \t]*)```(?P<info>[^`\n]*)$")


def code_blocks(text: str) -> list[dict]:
    """The fenced blocks of a markdown text, in order: ``{"line", "info", "code", "marker"}`` with the code dedented
    by its fence's indentation and ``marker`` the HTML comment on the last non-blank line before the fence (or "")."""
    lines = text.splitlines()
    blocks, i = [], 0
    while i < len(lines):
        opened = _FENCE.match(lines[i])
        if not opened:
            i += 1
            continue
        indent, info = opened.group("indent"), opened.group("info").strip()
        before = next((ln.strip() for ln in reversed(lines[:i]) if ln.strip()), "")
        marker = before if before.startswith("<!--") and before.endswith("-->") else ""
        start, body, i = i + 1, [], i + 1
        while i < len(lines) and lines[i].strip() != "```":
            body.append(lines[i][len(indent):] if lines[i].startswith(indent) else lines[i].lstrip())
            i += 1
        blocks.append({"line": start, "info": info, "code": "\n".join(body) + "\n", "marker": marker})
        i += 1
    return blocks


def _include_only(code: str) -> bool:
    return all(ln.startswith("--8<--") for ln in code.splitlines() if ln.strip())


def runnable(blocks: list[dict]) -> list[dict]:
    """The blocks the rule runs (```python, not after ``<!-- skip -->``, not an include) and the expected outputs, in
    order."""
    return [b for b in blocks
            if (b["info"] == "python" and b["marker"] != "<!-- skip -->" and not _include_only(b["code"]))
            or (b["info"] == "text" and b["marker"] == "<!-- expected-output -->")]


def test_the_rule_picks_python_blocks_skips_marked_ones_and_reads_expected_output():
    text = "\n".join([
        "# t", "", "```python", "a = 1", "```", "", "- item:", "", "  ```python", "  b = a + 1", "  ```", "",
        "<!-- skip -->", "```python", "not run", "```", "", "```py", "not run either", "```", "",
        "```python", '--8<-- "examples/x.py"', "```", "",
        "<!-- expected-output -->", "```text", "2", "```", "", "```text", "not compared", "```",
    ])
    picked = runnable(code_blocks(text))
    assert [(b["info"], b["code"]) for b in picked] == [("python", "a = 1\n"), ("python", "b = a + 1\n"),
                                                         ("text", "2\n")]


def _run_document(path: pathlib.Path, tmp_path: pathlib.Path, monkeypatch) -> int:
    """Runs the runnable blocks of ``path`` (see the module docstring); returns how many ran."""
    blocks = runnable(code_blocks(path.read_text()))
    name = "docs_block_" + re.sub(r"\W", "_", path.relative_to(ROOT).with_suffix("").as_posix())
    module = types.ModuleType(name)
    monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.chdir(ROOT)
    printed, ran = io.StringIO(), 0
    for k, block in enumerate(blocks):
        where = f"{path.relative_to(ROOT)} block at line {block['line']}"
        if block["info"] == "text":
            assert printed.getvalue() == block["code"], f"{where}: the blocks before it print something else"
            printed = io.StringIO()
            continue
        source = tmp_path / f"{name}_{k}.py"  # a real file: Warp reads a function's source with inspect
        source.write_text(block["code"])
        module.__file__ = str(source)
        with contextlib.redirect_stdout(printed):
            try:
                exec(compile(block["code"], str(source), "exec", dont_inherit=True), module.__dict__)
            except Exception as exc:
                raise AssertionError(f"{where} failed: {type(exc).__name__}: {exc}") from exc
        ran += 1
    return ran


@pytest.mark.parametrize("path", DOCUMENTS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_document_code_blocks_run(path, tmp_path, monkeypatch):
    _run_document(path, tmp_path, monkeypatch)


def test_readme_first_example_runs_and_shows_what_it_prints():
    blocks = runnable(code_blocks((ROOT / "README.md").read_text()))
    kinds = [b["info"] for b in blocks]
    assert "python" in kinds and "text" in kinds, "README.md: a runnable first example and its expected output"
    assert kinds.index("python") < kinds.index("text")


def _load(path: pathlib.Path):
    spec = importlib.util.spec_from_file_location(f"example_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_there_are_examples():
    assert len(EXAMPLES) >= 3, [p.name for p in EXAMPLES]


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_runs_at_its_small_size(path, capsys):
    module = _load(path)
    size = getattr(module, "TEST_SIZE", {})
    assert callable(getattr(module, "main", None)) and isinstance(size, dict), (
        f"examples/{path.name}: expected main(device=None, **size) and, if any, a TEST_SIZE dict of keyword "
        f"arguments, got main={getattr(module, 'main', None)!r}, TEST_SIZE={size!r}")
    module.main("cpu", **size)
    assert capsys.readouterr().out.strip(), f"examples/{path.name} printed nothing"


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_is_on_a_docs_page(path):
    pages = "".join(p.read_text() for p in (ROOT / "docs").rglob("*.md"))
    assert f'--8<-- "examples/{path.name}"' in pages, f"examples/{path.name} is included in no page of docs/"
