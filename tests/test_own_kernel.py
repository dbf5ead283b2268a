"""The device library used from one's own ``@wp.kernel``: the warp_meshad.kernels docstring's example,
examples/own_kernel.py, and the docstrings of ``ad.duals`` and the generated ``seed``."""

import importlib.util
import pathlib
import textwrap

import numpy as np
import pytest
import warp as wp

import warp_meshad.kernels
from warp_meshad.kernels import ad

ROOT = pathlib.Path(__file__).resolve().parents[1]


def run_file(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.cpu  # the example names device="cpu"
def test_kernels_docstring_example_runs(tmp_path, capsys):
    doc = warp_meshad.kernels.__doc__
    block = doc.split("differences)::\n", 1)[1]
    code = textwrap.dedent(block.split('\n"""', 1)[0])
    assert "D.seed(" in code and "wp.launch(" in code
    script = tmp_path / "docstring_example.py"  # Warp reads kernel source from a file (no exec)
    script.write_text(code)
    run_file(script, "docstring_example")
    printed = capsys.readouterr().out.strip().splitlines()[-1].split("#")[0]
    g = np.array(printed.strip(" []").split(), dtype=float)
    # E = (|a - b| - rest)^2 / 2: dE/da = (|a - b| - rest) (a - b) / |a - b|, dE/db = -dE/da
    a, b, rest = np.zeros(3), np.array([2.0, 0.0, 0.0]), 1.0
    ga = (np.linalg.norm(a - b) - rest) * (a - b) / np.linalg.norm(a - b)
    np.testing.assert_allclose(g, np.concatenate([ga, -ga]), rtol=1e-12)


@pytest.mark.cpu
def test_own_kernel_example_matches_closed_form_and_central_differences(capsys):
    module = run_file(ROOT / "examples" / "own_kernel.py", "own_kernel")
    g, H, fd_g, fd_H = module.main("cpu")
    assert "central difference" in capsys.readouterr().out
    np.testing.assert_allclose(g, fd_g, rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(H, fd_H, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(H, H.T, atol=1e-12)
    # the gradient of sum_t (A_t - A0_t)^2 in closed form: dA/dx_i = n x e_i / 2, e_i the edge opposite corner i
    mesh = module.wm.TriMesh.grid(4, 3)
    x = mesh.vertices + 0.1 * np.random.default_rng(0).standard_normal(mesh.vertices.shape)
    expected = np.zeros_like(x)
    for t, (i, j, k) in enumerate(mesh.faces.tolist()):
        N = np.cross(x[j] - x[i], x[k] - x[i])
        area, n = 0.5 * np.linalg.norm(N), N / np.linalg.norm(N)
        w = 2.0 * (area - mesh.face_areas()[t])
        for corner, (p, q) in ((i, (j, k)), (j, (k, i)), (k, (i, j))):
            expected[corner] += w * 0.5 * np.cross(n, x[q] - x[p])
    np.testing.assert_allclose(g, expected.ravel(), rtol=1e-10, atol=1e-13)


def test_duals_and_seed_are_documented():
    D = ad.duals(3, wp.float64, hessian=False)
    assert "offset" in D.seed.__doc__ and D.seed.doc == D.seed.__doc__
    for name in ("const", "value", "gradient"):
        assert getattr(D, name).__doc__, name
    H = ad.duals(3, wp.float64)
    assert "K x K" in H.hessian.__doc__
    assert "seed(x, offset)" in ad.duals.__doc__
    with pytest.raises(ValueError, match="1..64"):
        ad.duals(65)
