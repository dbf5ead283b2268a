"""Importing warp_meshad costs nothing until a name is used (warp_meshad/__init__.py, PEP 562): no Warp, no
plotting module, no solver or linear back-end module, no optional dependency; each name comes from its module when
first asked for; warp_meshad.app and warp_meshad.kernels.energies do the same, and the app framework imports no
plotting module."""

import importlib
import json
import os
import pathlib
import subprocess
import sys

import pytest

import warp_meshad

ROOT = pathlib.Path(__file__).resolve().parents[1]
PLOTTING = ("matplotlib", "polyscope")
OPTIONAL = ("cupy", "nvmath", "torch", "ray", "pydantic", "yaml", "trimesh", "meshio")

# one fresh process: what is loaded after each stage (json: stage -> module names of interest)
_STAGES = """
import json, sys
def loaded():
    return sorted(m for m in sys.modules if m.split(".")[0] in ("warp", "scipy", "matplotlib", "polyscope", "cupy",
                  "nvmath", "torch", "ray", "pydantic", "yaml", "trimesh", "meshio")
                  or m.startswith(("warp_meshad._src.solve", "warp_meshad._src.app")))
out = {}
import warp_meshad as wm
out["import"] = loaded()
wm.TriMesh, wm.Problem, wm.tutte_embedding
out["mesh and problem"] = loaded()
wm.NewtonSolver
out["solver"] = loaded()
import warp_meshad.app
out["app"] = loaded()
warp_meshad.app.run, warp_meshad.app.load_config
out["runner"] = loaded()
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def stages() -> dict:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([sys.executable, "-c", _STAGES], cwd=ROOT.parent, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _top(names) -> set:
    return {n.split(".")[0] for n in names}


def test_importing_the_package_loads_nothing_heavy(stages):
    assert stages["import"] == []  # not even Warp


def test_meshes_and_problems_load_no_solver_scipy_or_plotting_module(stages):
    loaded = stages["mesh and problem"]
    assert "warp" in _top(loaded)  # the problem is a Warp program
    assert not [m for m in loaded if m.startswith("warp_meshad._src.solve")], loaded
    assert not [m for m in loaded if m.startswith("scipy")], loaded  # Tutte's sparse solve imports SciPy when it runs
    assert not _top(loaded) & set(PLOTTING + OPTIONAL), loaded


def test_a_solver_loads_the_linear_back_ends_but_none_of_their_libraries(stages):
    loaded = stages["solver"]
    assert "warp_meshad._src.solve.solvers" in loaded and "warp_meshad._src.solve.linear.registry" in loaded
    assert "scipy.sparse.linalg" not in loaded  # the SciPy back-ends import it at their first solve
    assert not _top(loaded) & set(PLOTTING + ("cupy", "nvmath", "torch", "ray")), loaded


def test_the_app_framework_loads_its_modules_when_used_and_no_plotting_module(stages):
    assert stages["app"] == stages["solver"]  # importing warp_meshad.app alone adds nothing
    loaded = stages["runner"]
    assert "warp_meshad._src.app.runner" in loaded and "pydantic" in _top(loaded)  # configs are pydantic models
    assert "warp_meshad._src.app.batch" not in loaded  # the batch and Ray's prefetch: only for a batch
    assert "warp_meshad._src.app.plot" in loaded  # the figure's module: numpy only until it draws
    assert not _top(loaded) & set(PLOTTING + ("cupy", "nvmath", "torch", "ray", "yaml")), loaded


def test_every_public_name_comes_from_its_module():
    assert sorted(warp_meshad._HOMES) == sorted(warp_meshad.__all__)
    for name, home in warp_meshad._HOMES.items():
        assert getattr(warp_meshad, name) is getattr(importlib.import_module(home), name), name
    assert set(warp_meshad.__all__) <= set(dir(warp_meshad)) and "app" in dir(warp_meshad)
    assert warp_meshad.app is importlib.import_module("warp_meshad.app")
    with pytest.raises(AttributeError, match="module 'warp_meshad' has no attribute 'Solver'"):
        warp_meshad.Solver  # noqa: B018
    ns = {}
    exec("from warp_meshad import *", ns)
    assert set(warp_meshad.__all__) <= set(ns)


# what the command line alone uses (python -m warp_meshad imports it from its private modules)
CLI_PLUMBING = {"parse_set": "warp_meshad._src.app.loader", "start_ray": "warp_meshad._src.app.batch",
                "DEFAULT_CONFIG": "warp_meshad._src.app.registry", "configs_root": "warp_meshad._src.app.registry",
                "check_output_folder": "warp_meshad._src.app.outputs", "resolve_device": "warp_meshad._src.app.base"}


def test_the_app_module_exports_what_an_app_author_needs_and_no_cli_plumbing():
    app = importlib.import_module("warp_meshad.app")
    assert sorted(app.__all__) == sorted(app._HOMES) == app.__all__  # one sorted list, each name with its home
    assert {"App", "AppConfig", "ConfigError", "load_config", "run", "run_batch", "verify_outputs"} <= set(app.__all__)
    for name, (module, attr) in app._HOMES.items():
        assert getattr(app, name) is getattr(importlib.import_module(module), attr), name
    assert not set(CLI_PLUMBING) & set(app.__all__), sorted(set(CLI_PLUMBING) & set(app.__all__))
    for name, module in CLI_PLUMBING.items():
        assert hasattr(importlib.import_module(module), name), name  # still where the CLI imports it
        with pytest.raises(AttributeError, match=f"has no attribute '{name}'"):
            getattr(app, name)


_ENERGIES = """
import json, sys
def files():
    return sorted(m.rsplit(".", 1)[1] for m in sys.modules if m.startswith("warp_meshad.kernels.energies."))
out = {}
import warp_meshad.kernels.energies as en
out["import"] = files()
from warp_meshad.kernels.energies import MassSpringData
out["MassSpringData"] = files()
import warp_meshad.kernels.energies.symmetric_dirichlet  # the file first, then the name: the energy, not the file
out["attribute after the file"] = type(en.symmetric_dirichlet).__name__
from warp_meshad.kernels.energies import mass_spring
out["mass_spring"] = type(mass_spring).__name__
print(json.dumps(out))
"""


def test_the_energies_package_imports_an_energy_when_it_is_used():
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([sys.executable, "-c", _ENERGIES], cwd=ROOT.parent, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["import"] == [] and out["MassSpringData"] == ["mass_spring"]
    assert out["attribute after the file"] == "Function" and out["mass_spring"] == "Function"
    from warp_meshad.kernels import energies

    for name in energies.__all__:  # every listed name is its file's object
        assert getattr(energies, name) is getattr(importlib.import_module(
            f"warp_meshad.kernels.energies.{energies._HOMES[name]}"), name), name
    assert energies.__all__ == sorted(energies._HOMES)  # one sorted list, each name with its file
    defined = {}  # every public name of every file: each is in the package's list, with its file as home
    for path in sorted((ROOT / "kernels" / "energies").glob("[!_]*.py")):
        for name in importlib.import_module(f"warp_meshad.kernels.energies.{path.stem}").__all__:
            defined[name] = path.stem
    assert defined == energies._HOMES
