"""The examples run as written."""

import importlib.util
import pathlib

import numpy as np
import pytest

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


@pytest.mark.cpu  # the README's code names device="cpu"
def test_readme_ten_lines_run(tmp_path, monkeypatch, capsys):
    text = (ROOT / "README.md").read_text()
    code = text.split("## Ten lines", 1)[1].split("```python", 1)[1].split("```", 1)[0]
    script = tmp_path / "ten_lines.py"
    script.write_text(code)
    monkeypatch.chdir(ROOT)
    spec = importlib.util.spec_from_file_location("ten_lines", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    # what it prints: the springs' energy at the mesh as loaded (against numpy) and the Hessian's shape
    mesh = module.mesh
    f, shape = capsys.readouterr().out.strip().split(" ", 1)
    lengths = np.linalg.norm(mesh.vertices[mesh.edges[:, 0]] - mesh.vertices[mesh.edges[:, 1]], axis=1)
    np.testing.assert_allclose(float(f), np.sum(0.5 * (lengths - 1.0) ** 2), rtol=1e-9)
    assert shape == f"({3 * mesh.vertex_count}, {3 * mesh.vertex_count})"
