"""The examples run as written."""

import importlib.util
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]


def load(name):
    spec = importlib.util.spec_from_file_location(name, ROOT / "examples" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_quickstart_runs(device, capsys):
    f = load("quickstart").main(device)
    assert f > 0
    assert "springs on" in capsys.readouterr().out


def test_readme_ten_lines_run(tmp_path, monkeypatch):
    text = (ROOT / "README.md").read_text()
    code = text.split("## Ten lines", 1)[1].split("```python", 1)[1].split("```", 1)[0]
    script = tmp_path / "ten_lines.py"
    script.write_text(code)
    monkeypatch.chdir(ROOT)
    spec = importlib.util.spec_from_file_location("ten_lines", script)
    spec.loader.exec_module(importlib.util.module_from_spec(spec))
