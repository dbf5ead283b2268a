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
def test_readme_first_example_runs_from_any_folder(tmp_path, monkeypatch, capsys):
    text = (ROOT / "README.md").read_text()
    code = text.split("## A first example", 1)[1].split("```python", 1)[1].split("```", 1)[0]
    script = tmp_path / "first_example.py"
    script.write_text(code)
    monkeypatch.chdir(tmp_path)  # not the repository: the example reads no file
    spec = importlib.util.spec_from_file_location("first_example", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    # what it prints: the springs' energy at the grid (against numpy) and the Hessian's shape
    mesh = module.mesh
    assert (mesh.vertex_count, mesh.face_count) == (121, 200)  # as its comment says
    f, shape = capsys.readouterr().out.strip().split(" ", 1)
    lengths = np.linalg.norm(mesh.vertices[mesh.edges[:, 0]] - mesh.vertices[mesh.edges[:, 1]], axis=1)
    np.testing.assert_allclose(float(f), np.sum(0.5 * (lengths - 0.1) ** 2), rtol=1e-9)
    assert shape == f"({3 * mesh.vertex_count}, {3 * mesh.vertex_count})"
