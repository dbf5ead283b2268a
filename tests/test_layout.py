"""The layout's promises: apps and examples use only public modules, benchmarks and tools/ only listed private names,
importing warp_meshad stays light, no module import cycle exists (every module imports first in a fresh process, in
sorted and in reversed order), no private member of a solver class is used outside its module, and every built-in
energy is imported from its package, never through its file."""

import ast
import json
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]

# the private names benchmarks and tools/ may import: tuning knobs and internals they measure (module -> names)
BENCHMARK_PRIVATE = {
    # tools/gpu/aot_cuda: the unrolled-projection choice as on CUDA; first_call: times the code-gen steps it wraps
    "warp_meshad._src.codegen": {"kernel_cache", "energy_rewrite", "kernel_source", "warp_compat"},
    "warp_meshad._src.problem": {"tiled", "assembly", "terms"},  # kernel_resources: tile sizes; first_call: wraps
    "warp_meshad._src.codegen.kernel_cache": {"TileVariant", "term_kernel"},  # kernel_resources: registers per kernel
    "warp_meshad._src.codegen.warp_compat": {"install_module_hooks"},  # tools/gpu/aot_cuda: each module for sm_XX
    "warp_meshad._src.problem.reduce": {"ordered_total", "partial_count"},  # the deterministic reduction
    # newton_step: the Dirichlet rows and the step scaling around the driver's timed iteration
    "warp_meshad._src.solve.constraints": {"apply_dirichlet", "fixed_mask_from_indices"},
    "warp_meshad._src.solve.vector_ops": {"scale_into"},
    # batch_param, cudss_calls: time the direct back-ends' analysis, factorization and solve inside the solver loops
    "warp_meshad._src.solve": {"linear"},
    # first_order_loop: the size up to which the two-loop recursion runs in one block (both forms timed)
    "warp_meshad._src.solve.first_order_loop": {"FirstOrderLoopRunner"},
    # the command line's plumbing: first_step, manifold_lbfgs, shell_terms, shells_pile take --set as the CLI does;
    # batch_param starts Ray apart to time it
    "warp_meshad._src.app.loader": {"parse_set"},
    "warp_meshad._src.app.batch": {"start_ray"},
}
HEAVY = ("polyscope", "yaml", "cupy", "torch", "nvmath", "pydantic", "tqdm", "matplotlib", "ray")


def _private_imports(path: pathlib.Path) -> list[tuple[str, str]]:
    """``(module, name)`` of every import of a ``_src`` module in ``path`` (name ``""`` for ``import module``)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and "_src" in node.module.split("."):
            out += [(node.module, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and any(a.name == "_src" for a in node.names):
            out.append((f"{node.module}._src", ""))
        elif isinstance(node, ast.Import):
            out += [(a.name, "") for a in node.names if "_src" in a.name.split(".")]
    return out


def test_private_import_finder_sees_every_form(tmp_path):
    p = tmp_path / "m.py"
    p.write_text("import warp_meshad._src.app.base\nfrom warp_meshad import _src\nfrom warp_meshad._src.app import x\n"
                 "def f():\n    from warp_meshad._src.solve.linear import y\nfrom warp_meshad.app import App\n")
    assert _private_imports(p) == [("warp_meshad._src.app.base", ""), ("warp_meshad._src", ""),
                                   ("warp_meshad._src.app", "x"), ("warp_meshad._src.solve.linear", "y")]


@pytest.mark.parametrize("folder", ["apps", "examples"])
def test_apps_and_examples_import_only_public_modules(folder):
    found = {str(p.relative_to(ROOT)): _private_imports(p) for p in sorted((ROOT / folder).glob("*.py"))}
    assert found, f"no Python files in {folder}/"
    assert {k: v for k, v in found.items() if v} == {}


def test_benchmarks_import_only_listed_private_names():
    bad = []
    for p in [*sorted((ROOT / "benchmarks").glob("*.py")), *sorted((ROOT / "tools").rglob("*.py"))]:
        for module, name in _private_imports(p):
            if name not in BENCHMARK_PRIVATE.get(module, ()):
                bad.append(f"{p.relative_to(ROOT)}: {module} {name}".rstrip())
    assert bad == [], "private names outside BENCHMARK_PRIVATE (use a public one, or list it with its reason)"


def _energy_file_imports(path: pathlib.Path) -> list[str]:
    """Each import in ``path`` of a built-in energy through its file (``warp_meshad.kernels.energies.<file>``)."""
    prefix = "warp_meshad.kernels.energies."
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(prefix):
            out.append((node.lineno, f"from {node.module} import ..."))
        elif isinstance(node, ast.Import):
            out += [(node.lineno, f"import {a.name}") for a in node.names if a.name.startswith(prefix)]
    return [f"{line}: {text}" for line, text in sorted(out)]


def test_energies_are_imported_from_their_package_only():
    """One import path per energy: ``from warp_meshad.kernels.energies import name``, never through the file that
    defines it."""
    found = {}
    for folder in ("warp_meshad", "kernels", "apps", "tests", "benchmarks", "examples", "tools", "docs"):
        for p in sorted((ROOT / folder).rglob("*.py")):
            if "__pycache__" not in p.parts and (bad := _energy_file_imports(p)):
                found[str(p.relative_to(ROOT))] = bad
    assert found == {}, "import these names from warp_meshad.kernels.energies"


def test_energy_file_import_finder_sees_both_forms(tmp_path):
    p = tmp_path / "m.py"
    p.write_text("from warp_meshad.kernels.energies import mass_spring\nimport warp_meshad.kernels.energies\n"
                 "def f():\n    from warp_meshad.kernels.energies.arap import arap\n"
                 "import warp_meshad.kernels.energies.dirichlet as d\n")
    assert _energy_file_imports(p) == ["4: from warp_meshad.kernels.energies.arap import ...",
                                       "5: import warp_meshad.kernels.energies.dirichlet"]


def _run(code: str) -> str:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT.parent, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_importing_warp_meshad_is_light():
    loaded = json.loads(_run(f"import json, sys, warp_meshad; print(json.dumps([m for m in {HEAVY!r} "
                                                               "if m in sys.modules]))"))
    assert loaded == []


def _modules() -> list[str]:
    """Every module of the package, from the source tree as pyproject maps it (``kernels/`` is
    ``warp_meshad.kernels``, ``apps/`` ``warp_meshad.apps``, ``configs/`` ``warp_meshad.configs``)."""
    out = []
    for folder, package in (("warp_meshad", "warp_meshad"), ("kernels", "warp_meshad.kernels"),
                            ("apps", "warp_meshad.apps"), ("configs", "warp_meshad.configs")):
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = path.relative_to(ROOT / folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            if parts != ("__main__",) and (path.parent / "__init__.py").is_file():
                out.append(".".join((package,) + parts))
    return sorted(out)


@pytest.mark.parametrize("order", ["sorted", "reversed"])
def test_no_import_cycle(order):
    """Every module imported in one fresh process, in sorted and in reversed order: a cycle fails as a partially
    initialized module when the import starts on its other side."""
    modules = _modules()
    assert {"warp_meshad.app", "warp_meshad.apps.cloth", "warp_meshad.kernels.ad", "warp_meshad.configs",
            "warp_meshad._src.app.runner"} <= set(modules)
    if order == "reversed":
        modules = modules[::-1]
    script = f"import importlib\nfor name in {modules!r}:\n    importlib.import_module(name)\nprint('ok')\n"
    assert _run(script).strip() == "ok"


# the solver classes' modules: their private members are theirs alone
SOLVER_MODULES = ("solvers.py", "device_loop.py", "first_order_loop.py", "batch_solver.py")


def _private_members(path: pathlib.Path) -> set[str]:
    """The ``_name`` methods and ``self._name`` attributes of the classes in ``path``."""
    names = set()
    for cls in (n for n in ast.walk(ast.parse(path.read_text(), str(path))) if isinstance(n, ast.ClassDef)):
        for node in ast.walk(cls):
            if isinstance(node, ast.FunctionDef) and node.name.startswith("_") and not node.name.startswith("__"):
                names.add(node.name)
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self"
                    and node.attr.startswith("_") and not node.attr.startswith("__")):
                names.add(node.attr)
    return names


def _foreign_uses(path: pathlib.Path, names: set[str]) -> list[str]:
    """``line: expr._name`` for each access to one of ``names`` on anything but ``self`` / ``cls`` / ``super()`` / a
    class defined in ``path``."""
    out = []
    tree = ast.parse(path.read_text(), str(path))
    own_classes = {n.name for n in ast.walk(tree) if isinstance(n, ast.ClassDef)}
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Attribute) and node.attr in names):
            continue
        base = node.value
        if isinstance(base, ast.Name) and base.id in ("self", "cls", *own_classes):  # a class of this module
            continue
        if isinstance(base, ast.Call) and isinstance(base.func, ast.Name) and base.func.id == "super":
            continue
        out.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}")
    return out


def test_no_private_solver_member_is_used_across_modules():
    """The loops, apps and benchmarks reach a solver through its public step API (``system``,
    ``solve_direction``, ``pinned_gradient``, ``check_x``, ``first_step``, ``SolveResult.record_*``), never through
    another class's underscore members."""
    solve = ROOT / "warp_meshad" / "_src" / "solve"
    members = {solve / m: _private_members(solve / m) for m in SOLVER_MODULES}
    assert {"_direction", "_hessian", "_buf", "_alloc", "_keep_gradient"} <= members[solve / "solvers.py"]
    files = [p for folder in ("warp_meshad", "apps", "benchmarks") for p in sorted((ROOT / folder).rglob("*.py"))]
    uses = [use for p in files for use in _foreign_uses(p, set().union(*(n for m, n in members.items() if m != p)))]
    assert uses == [], "\n".join(uses)


def _pyproject() -> dict:
    tomllib = pytest.importorskip("tomllib", reason="tomllib is Python 3.11+")
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_every_package_and_config_folder_is_installed():
    """pyproject.toml lists its packages by hand: a new subpackage (a folder of .py files under warp_meshad/,
    kernels/ or apps/) or a new app's configs/<app>/ folder must be there, with its YAML files as package data, or an
    installed copy lacks it."""
    tool = _pyproject()["tool"]["setuptools"]
    listed, data = set(tool["packages"]), tool["package-data"]
    roots = {"warp_meshad": ROOT / "warp_meshad", "warp_meshad.kernels": ROOT / "kernels",
             "warp_meshad.apps": ROOT / "apps", "warp_meshad.configs": ROOT / "configs"}
    assert {name: str(path.relative_to(ROOT)) for name, path in roots.items()} == tool["package-dir"]
    missing = []
    for name, root in roots.items():
        for init in sorted(root.rglob("__init__.py")):
            if "__pycache__" in init.parts:
                continue
            package = ".".join([name, *init.parent.relative_to(root).parts])
            if package not in listed:
                missing.append(package)
    for folder in sorted(p for p in (ROOT / "configs").iterdir() if p.is_dir() and any(p.glob("*.yaml"))):
        package = f"warp_meshad.configs.{folder.name}"
        if package not in listed or "*.yaml" not in data.get(package, ()):
            missing.append(f"{package} (with its *.yaml as package data)")
    assert missing == [], f"pyproject.toml [tool.setuptools] lacks: {missing}"
