"""The app framework: typed configs loaded from YAML, the App base class, the runner and its outputs.

An app is a module ``warp_meshad.apps.<name>`` (folder ``apps/``) holding one class ``App`` (a subclass of
:class:`App`) whose ``config_class`` is a dataclass derived from :class:`AppConfig`. The dataclass is the schema: a
YAML file in ``configs/<app>/<scene>.yaml`` names the app and overrides its fields; an unknown key, a value of the
wrong type or a missing mesh file is a :class:`ConfigError` naming the file and the key.

Overrides apply in this order: dataclass defaults, the YAML file, the file's ``test:`` block (with ``test=True``: the
small size the test suite runs), ``--set key=value`` pairs (dotted keys reach nested fields), then the command-line
flags (``--device``, ``--steps``, ``--output``).

Outputs (:func:`run_app`) go to ``output/<app>_<scene>/`` (``output/<app>_<scene>_test/`` for a ``test=True``
config) unless ``output`` says otherwise: the final mesh (``final.obj`` or ``final.ply``), ``metrics.json``,
``convergence.png`` (matplotlib) and ``screenshot.png`` (Polyscope, headless EGL, where available). The folder is
checked for writing before the app is built; every file is written atomically (temporary file, then ``os.replace``)
with the permissions of an ordinary new file (``0666`` less the umask).

While an app is built and run, the Warp modules it compiles are announced on the log as each compile starts
(:class:`~warp_meshad._src.codegen.module_loads.ModuleLoads`); ``metrics.json`` records the compile and load times and
whether the kernel cache was warm. :func:`warmup_app` builds an app and takes one short step without writing
anything, so that a later run finds every kernel of its first step in Warp's kernel cache.

pyyaml, matplotlib and polyscope are optional and imported only where used.
"""

from __future__ import annotations

import dataclasses
import difflib
import errno
import importlib
import json
import math
import os
import pathlib
import pkgutil
import platform
import re
import sys
import tempfile
import time
import types
import typing
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, Optional

import numpy as np

from warp_meshad._src.solve.linear import LINEAR_SOLVER_NAMES
from warp_meshad._src.mesh.trimesh import MeshError, _atomic_write, new_file_mode
from warp_meshad._src.codegen.module_loads import ModuleLoads

__all__ = [
    "App",
    "AppConfig",
    "ConfigError",
    "GridConfig",
    "RunReport",
    "WarmupReport",
    "app_class",
    "apps_package",
    "available_apps",
    "available_configs",
    "check_output_folder",
    "configs_root",
    "load_config",
    "parse_set",
    "resolve_device",
    "run_app",
    "warmup_app",
]

_ROOT = pathlib.Path(__file__).resolve().parents[2]
DEFAULT_CONFIG = "cloth/hanging"


class ConfigError(ValueError):
    """A bad app config: the message names the file (or flag) and the key."""

    def __init__(self, where: str, key: str | None, message: str):
        self.where = str(where)
        self.key = key
        self.detail = message
        prefix = f"{self.where}: key '{key}'" if key else self.where
        super().__init__(f"{prefix}: {message}")


# ----------------------------------------------------------------------------------------------------------------------
# Config schema
# ----------------------------------------------------------------------------------------------------------------------


def internal(default):
    """A config field that YAML and ``--set`` cannot set (filled in by the loader)."""
    return field(default=default, metadata={"internal": True})


@dataclass
class GridConfig:
    """The built-in mesh generator ``mesh: grid``: a regular triangulated grid (:meth:`TriMesh.grid`).

    Attributes:
        nx: vertices along the first axis (>= 2).
        ny: vertices along the second axis (>= 2).
        width: extent along the first axis [m].
        height: extent along the second axis [m].
    """

    nx: int = 32
    ny: int = 32
    width: float = 1.0
    height: float = 1.0


@dataclass
class AppConfig:
    """Fields every app has. Apps derive their own dataclass and may narrow a field's type (e.g. the solver names).

    Attributes:
        app: the app's name (module ``warp_meshad.apps.<app>``).
        mesh: a mesh file (OBJ/OFF/PLY; a relative path resolves against the config file's folder, or against the
            current folder when given with ``--set``) or ``"grid"``.
        grid: the grid generator's size, used when ``mesh: grid``.
        dtype: floating point type of the variables, ``"float64"`` or ``"float32"``.
        device: Warp device (``"cpu"``, ``"cuda"``, ``"cuda:1"``); None: the first CUDA device if any, else the CPU.
        solver: the nonlinear solver (each app lists its choices).
        linear_solver: linear back-end of Newton-type solvers (``"auto"``, ``"qdldl"``, ``"scipy"``, ``"cg"``,
            ``"cupy"``, ``"cudss"``; see :func:`~warp_meshad.make_linear_solver`).
        steps: number of ``step()`` calls of a run (time steps, or solver rounds).
        iterations: solver iteration cap per step.
        tolerance: solver tolerance (Newton decrement for Newton-type solvers, else gradient norm).
        output: output folder; None: ``output/<app>_<scene>`` under the current folder (``output/<app>_<scene>_test``
            for a test-size run).
        mesh_format: file format of the final mesh, ``"obj"`` or ``"ply"``.
        viewer: open the interactive Polyscope viewer.
        screenshot: render ``screenshot.png`` headless (Polyscope + EGL) where available.
        test: overrides applied by ``--test`` (a small size that runs in seconds on a CPU); same keys as the config.
        scene: the config file's name without extension (set by the loader).
        source: the config file's path (set by the loader).
        test_run: the ``test:`` block was asked for (``load_config(..., test=True)``, set by the loader).
    """

    app: str = ""
    mesh: str = "grid"
    grid: GridConfig = field(default_factory=GridConfig)
    dtype: Literal["float64", "float32"] = "float64"
    device: Optional[str] = None
    solver: str = "newton"
    linear_solver: Literal[LINEAR_SOLVER_NAMES] = "auto"
    steps: int = 10
    iterations: int = 20
    tolerance: float = 1e-8
    output: Optional[str] = None
    mesh_format: Literal["obj", "ply"] = "obj"
    viewer: bool = False
    screenshot: bool = True
    test: dict = field(default_factory=dict)
    scene: str = internal("")
    source: Optional[str] = internal(None)
    test_run: bool = internal(False)

    # names of built-in mesh generators (no file) and the mesh file extensions an app reads; apps may widen them
    mesh_generators: ClassVar[tuple[str, ...]] = ("grid",)
    mesh_suffixes: ClassVar[tuple[str, ...]] = (".obj", ".off", ".ply")

    def validate(self) -> list[tuple[str, str]]:
        """Checks across fields and of values; returns (key, message) pairs (empty when valid).

        Subclasses extend it (call ``super().validate()``).
        """
        errors = []
        if self.steps < 0:
            errors.append(("steps", f"expected an int >= 0, got {self.steps}"))
        if self.iterations < 0:
            errors.append(("iterations", f"expected an int >= 0, got {self.iterations}"))
        if not self.tolerance >= 0.0:
            errors.append(("tolerance", f"expected a number >= 0, got {self.tolerance}"))
        if self.mesh == "grid":
            for k in ("nx", "ny"):
                if getattr(self.grid, k) < 2:
                    errors.append((f"grid.{k}", f"expected an int >= 2, got {getattr(self.grid, k)}"))
            for k in ("width", "height"):
                if not getattr(self.grid, k) > 0.0:
                    errors.append((f"grid.{k}", f"expected a number > 0, got {getattr(self.grid, k)}"))
        if self.device is not None and not re.fullmatch(r"cpu|cuda(:\d+)?", self.device):
            errors.append(("device", f"expected 'cpu', 'cuda' or 'cuda:N', got {self.device!r}"))
        return errors

    def mesh_path(self) -> pathlib.Path | None:
        """The mesh file (absolute once loaded from a file), or None for a built-in generator."""
        if self.mesh in self.mesh_generators:
            return None
        p = pathlib.Path(self.mesh).expanduser()
        if not p.is_absolute() and self.source:
            p = pathlib.Path(self.source).resolve().parent / p
        return p


def _type_name(tp) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return " or ".join(_type_name(a) for a in args) + " or null"
    if origin in (list, tuple):
        args = typing.get_args(tp)
        if origin is tuple and args and args[-1] is not Ellipsis:
            return f"a list of {len(args)} {_type_name(args[0])}s"
        return f"a list of {_type_name(args[0])}s" if args else "a list"
    if dataclasses.is_dataclass(tp):
        return f"a mapping with keys {', '.join(_public_fields(tp))}"
    return {bool: "true/false", int: "an int", float: "a number", str: "a string", dict: "a mapping"}.get(tp, str(tp))


def _public_fields(cls) -> list[str]:
    return [f.name for f in dataclasses.fields(cls) if not f.metadata.get("internal")]


def _hints(cls) -> dict:
    return typing.get_type_hints(cls)


def _convert(value, tp, where: str, key: str, current=None):
    """``value`` (from YAML) checked against the annotation ``tp``; nested dataclasses merge into ``current``."""

    def bad():
        shown = repr(value) if len(repr(value)) < 60 else repr(value)[:57] + "..."
        return ConfigError(where, key, f"expected {_type_name(tp)}, got {type(value).__name__} {shown}")

    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if value is None and len(args) < len(typing.get_args(tp)):
            return None
        if len(args) == 1:
            return _convert(value, args[0], where, key, current)
        raise bad()
    if origin is Literal:
        if value in typing.get_args(tp) and type(value) is type(typing.get_args(tp)[0]):
            return value
        raise bad()
    if origin in (list, tuple):
        args = typing.get_args(tp)
        if not isinstance(value, (list, tuple)):
            raise bad()
        if origin is tuple and args and args[-1] is not Ellipsis:
            if len(value) != len(args):
                raise bad()
            return tuple(_convert(v, a, where, f"{key}[{i}]") for i, (v, a) in enumerate(zip(value, args)))
        item = args[0] if args else Any
        out = [_convert(v, item, where, f"{key}[{i}]") for i, v in enumerate(value)]
        return tuple(out) if origin is tuple else out
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise bad()
        base = current if current is not None else tp()
        return _apply(base, value, where, prefix=f"{key}.")
    if tp is Any:
        return value
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise bad()
    if tp is int:
        if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
            return int(value)
        raise bad()
    if tp is float:
        if isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool):
            return float(value)
        raise bad()
    if tp is str:
        if isinstance(value, str):
            return value
        raise bad()
    if tp is dict:
        if isinstance(value, dict):
            return dict(value)
        raise bad()
    raise ConfigError(where, key, f"unsupported field type {tp!r} in the config schema")


def _apply(obj, mapping: dict, where: str, prefix: str = ""):
    """A copy of dataclass ``obj`` with the fields in ``mapping`` replaced, each checked against its annotation."""
    if not isinstance(mapping, dict):
        raise ConfigError(where, prefix.rstrip(".") or None, f"expected a mapping, got {type(mapping).__name__}")
    cls = type(obj)
    hints = _hints(cls)
    names = _public_fields(cls)
    changes = {}
    for k, v in mapping.items():
        key = f"{prefix}{k}"
        if not isinstance(k, str) or k not in names:
            close = difflib.get_close_matches(str(k), names, n=1)
            hint = f" (did you mean '{prefix}{close[0]}'?)" if close else ""
            app = getattr(obj, "app", "") or ""
            owner = f"app '{app}'" if app else cls.__name__
            raise ConfigError(where, key, f"unknown key for {owner}{hint}; valid keys: {', '.join(names)}")
        changes[k] = _convert(v, hints[k], where, key, current=getattr(obj, k))
    return dataclasses.replace(obj, **changes)


def parse_set(items) -> dict:
    """``["a=1", "grid.nx=8"]`` -> ``{"a": 1, "grid": {"nx": 8}}``; values are parsed as YAML (``[0, -9.8, 0]``)."""
    out: dict = {}
    for item in items or ():
        if "=" not in item:
            raise ConfigError("--set", item, "expected key=value")
        key, text = item.split("=", 1)
        key = key.strip()
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*", key):
            raise ConfigError("--set", key, "expected a key like 'steps' or 'grid.nx'")
        value = _yaml_value(text, key)
        node = out
        parts = key.split(".")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise ConfigError("--set", key, "conflicts with another --set of its parent key")
        node[parts[-1]] = value
    return out


def _yaml():
    try:
        import yaml
    except ImportError:
        raise ImportError(
            "reading app configs needs pyyaml: pip install 'warp-meshad[apps]' (or pip install pyyaml)"
        ) from None
    return yaml


_FLOAT = (  # YAML 1.2 floats, exponent without a dot included
    r"^[-+]?(?:[0-9][0-9_]*\.[0-9_]*(?:[eE][-+]?[0-9]+)?|\.[0-9_]+(?:[eE][-+]?[0-9]+)?|[0-9][0-9_]*[eE][-+]?[0-9]+"
    r"|\.(?:inf|Inf|INF)|[-+]\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"
)
_LOADER = None


def _load_yaml(text: str):
    """``yaml.safe_load`` that also reads ``1e-3`` as a number (YAML 1.1, PyYAML's default, wants ``1.0e-3``)."""
    global _LOADER
    yaml = _yaml()
    if _LOADER is None:

        class Loader(yaml.SafeLoader):
            pass

        Loader.yaml_implicit_resolvers = {k: list(v) for k, v in yaml.SafeLoader.yaml_implicit_resolvers.items()}
        Loader.add_implicit_resolver("tag:yaml.org,2002:float", re.compile(_FLOAT), list("-+0123456789."))
        _LOADER = Loader
    return yaml.load(text, Loader=_LOADER)


def _yaml_value(text: str, key: str):
    yaml = _yaml()
    try:
        return _load_yaml(text) if text.strip() else ""
    except yaml.YAMLError as exc:
        raise ConfigError("--set", key, f"cannot parse value {text!r}: {exc}") from None


def configs_root() -> pathlib.Path:
    """The ``configs/`` folder: the repository's (next to the package), else ``./configs``."""
    root = _ROOT / "configs"
    return root if root.is_dir() else pathlib.Path.cwd() / "configs"


def _resolve_config_path(path) -> pathlib.Path:
    p = pathlib.Path(path).expanduser()
    if p.is_file():
        return p
    for candidate in (configs_root() / p, configs_root() / f"{p}.yaml", p.with_suffix(".yaml")):
        if candidate.is_file():
            return candidate
    raise ConfigError(str(p), None, "config file not found (give a path, or a name like 'cloth/hanging'; "
                                    "'warp-meshad list' shows them)")


def load_config(path, overrides: dict | None = None, test: bool = False, flags: dict | None = None) -> AppConfig:
    """Read a YAML config into its app's typed config.

    Args:
        path: a YAML file, or a name under ``configs/`` like ``"cloth/hanging"``.
        overrides: nested mapping applied after the file (``--set``; see :func:`parse_set`).
        test: apply the file's ``test:`` block (the small size the test suite runs).
        flags: ``{flag name: {key: value}}`` applied last, each reported under its flag's name on error
            (e.g. ``{"--steps": {"steps": 2}}``).

    Returns:
        The app's config dataclass with ``scene`` and ``source`` set and ``mesh`` resolved to an absolute path.

    Raises:
        ConfigError: unreadable YAML, a missing or unknown ``app``, an unknown key, a wrong type, an invalid value or a
            missing mesh file; the message names the file (or flag) and the key.
    """
    p = _resolve_config_path(path)
    where = str(p)
    yaml = _yaml()
    try:
        data = _load_yaml(p.read_text())
    except yaml.YAMLError as exc:
        raise ConfigError(where, None, f"not valid YAML (only plain data is accepted; tags that build objects are "
                                       f"refused): {exc}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(where, None, f"expected a mapping of keys to values, got {type(data).__name__}")
    if "app" not in data:
        raise ConfigError(where, "app", f"missing: name the app (one of {', '.join(available_apps())})")
    name = data["app"]
    if not isinstance(name, str):
        raise ConfigError(where, "app", f"expected a string, got {type(name).__name__} {name!r}")
    cls = app_class(name, where)
    config = cls.config_class(app=name)
    config = dataclasses.replace(config, scene=p.stem, source=str(p.resolve()))
    config = _apply(config, dict(data), where)
    _validate(config, where)
    mesh_where = where
    if config.test:
        bad = {"app", "test"} & set(config.test)
        if bad:
            raise ConfigError(where, f"test.{sorted(bad)[0]}", "cannot be overridden in the test block")
        checked = _apply(config, config.test, where, prefix="test.")
        _validate(checked, where, prefix="test.")
        if test:
            config = checked
    if test:
        config = dataclasses.replace(config, test_run=True)
    for label, mapping in [("--set", overrides or {})] + list((flags or {}).items()):
        if mapping:
            if "app" in mapping:
                raise ConfigError(label, "app", "the app is fixed by the config file")
            config = _apply(config, mapping, label)
            _validate(config, label)
            if "mesh" in mapping:
                mesh_where = label
                if config.mesh not in config.mesh_generators:  # a path on the command line: relative to the cwd
                    config = dataclasses.replace(config, mesh=str(pathlib.Path(config.mesh).expanduser().absolute()))
    return _finish(config, mesh_where)


def _validate(config: AppConfig, where: str, prefix: str = "") -> None:
    for key, message in config.validate():
        raise ConfigError(where, prefix + key, message)


def _finish(config: AppConfig, where: str) -> AppConfig:
    _validate(config, where)
    mp = config.mesh_path()
    if mp is not None:
        if mp.suffix.lower() not in config.mesh_suffixes:
            kinds = " or ".join(repr(g) for g in config.mesh_generators)
            files = "/".join(config.mesh_suffixes)
            raise ConfigError(where, "mesh", f"expected {kinds} or an {files} file, got {config.mesh!r}")
        if not mp.is_file():
            raise ConfigError(where, "mesh", f"mesh file not found: {config.mesh!r} (resolved to {mp})")
        config = dataclasses.replace(config, mesh=str(mp.resolve()))
    return config


# ----------------------------------------------------------------------------------------------------------------------
# App registry
# ----------------------------------------------------------------------------------------------------------------------


def apps_package():
    """The package ``warp_meshad.apps`` (the ``apps/`` folder), or None.

    Installed, pyproject maps ``apps/`` to ``warp_meshad.apps``; in a source tree where that mapping is not installed
    (yet), the folder next to the package is loaded under that name.
    """
    try:
        return importlib.import_module("warp_meshad.apps")
    except ModuleNotFoundError as exc:
        if exc.name != "warp_meshad.apps":
            raise
    init = _ROOT / "apps" / "__init__.py"
    if not init.is_file():
        return None
    from importlib import util as importlib_util

    spec = importlib_util.spec_from_file_location("warp_meshad.apps", init, submodule_search_locations=[str(
        init.parent)])
    module = importlib_util.module_from_spec(spec)
    sys.modules["warp_meshad.apps"] = module
    spec.loader.exec_module(module)
    return module


def available_apps() -> list[str]:
    """Names of the app modules in ``warp_meshad.apps``."""
    pkg = apps_package()
    if pkg is None:
        return []
    return sorted(m.name for m in pkgutil.iter_modules(pkg.__path__) if not m.name.startswith("_"))


def available_configs() -> dict[str, list[pathlib.Path]]:
    """``{app: [config files]}`` under :func:`configs_root`."""
    root = configs_root()
    out = {}
    if root.is_dir():
        for folder in sorted(d for d in root.iterdir() if d.is_dir()):
            files = sorted(folder.glob("*.yaml")) + sorted(folder.glob("*.yml"))
            if files:
                out[folder.name] = files
    return out


def app_class(name: str, where: str = "app") -> type[App]:
    """The ``App`` class of app ``name`` (imports ``warp_meshad.apps.<name>``)."""
    names = available_apps()
    if not re.fullmatch(r"[a-z_][a-z0-9_]*", name) or name not in names:
        close = difflib.get_close_matches(name, names, n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        raise ConfigError(where, "app", f"unknown app {name!r}{hint}; available: {', '.join(names) or 'none'}")
    module = importlib.import_module(f"warp_meshad.apps.{name}")
    cls = getattr(module, "App", None)
    if not (isinstance(cls, type) and issubclass(cls, App)):
        raise ConfigError(where, "app", f"module warp_meshad.apps.{name} has no App class derived from App")
    return cls


def resolve_device(name: str | None, where: str = "device") -> tuple[str, str]:
    """The Warp device to use and why: ``name`` if given, else the first CUDA device if any, else the CPU.

    Raises:
        ConfigError: a CUDA device was asked for but none (or not that one) exists.
    """
    import warp as wp

    count = wp.get_cuda_device_count()
    if name is None:
        if count > 0:
            return "cuda:0", "the first CUDA device (default)"
        return "cpu", "no CUDA device found (default)"
    if name.startswith("cuda"):
        index = int(name.split(":")[1]) if ":" in name else 0
        if index >= count:
            raise ConfigError(where, "device", f"{name!r} requested (config or --device) but {count} CUDA device(s) "
                                               "found; use --device cpu")
        return f"cuda:{index}", "requested"
    return name, "requested"


# ----------------------------------------------------------------------------------------------------------------------
# App base class
# ----------------------------------------------------------------------------------------------------------------------


class App:
    """Base class of the apps: a typed config in, ``step()`` / ``run()`` / ``check_final()``, and what the runner and
    the viewer read.

    Subclasses set ``name`` and ``config_class`` and implement :meth:`step` (one time step or solver round: call
    :meth:`record` with its solve result) and :meth:`positions`; they may extend :meth:`check_final`,
    :meth:`quantities`, :meth:`spheres` and :meth:`extra_metrics`.

    Attributes:
        config: the app's config dataclass.
        device: the Warp device used (str), and ``device_reason`` why.
        dtype: ``wp.float64`` or ``wp.float32``.
        mesh: the input :class:`~warp_meshad.TriMesh` (topology and rest shape).
        history: one record per step: ``{"step", "iterations", "energies", "gradient_norms", "time_ms", "reason",
            "converged", "steepest_descent_fallbacks", "fallback_reasons", "linear_solves_capped"}``.
        steps_done: number of steps taken.
    """

    name: ClassVar[str] = ""
    config_class: ClassVar[type[AppConfig]] = AppConfig
    continuous_objective: ClassVar[bool] = False  # True: every step continues one minimization (not time steps)

    def __init__(self, config: AppConfig):
        import warp as wp

        if not isinstance(config, self.config_class):
            raise TypeError(f"{type(self).__name__}(config): expected a {self.config_class.__name__}, got "
                            f"{type(config).__name__}")
        if not config.app:
            config = dataclasses.replace(config, app=self.name)
        config = _finish(config, config.source or f"{self.config_class.__name__}(...)")
        self.config = config
        self.device, self.device_reason = resolve_device(config.device, config.source or "config")
        self.dtype = wp.float64 if config.dtype == "float64" else wp.float32
        self.history: list[dict] = []
        self.steps_done = 0
        self.mesh = self.load_mesh()

    # -- building blocks ---------------------------------------------------------------------------------------------

    def load_mesh(self):
        """The config's mesh: ``TriMesh.grid`` for ``mesh: grid``, else the file.

        Raises:
            ConfigError: key ``mesh``, with the :class:`~warp_meshad.MeshError` message (an empty, non-manifold or
                unreadable mesh, NaN coordinates, unreferenced vertices, ...).
        """
        from warp_meshad._src.mesh.trimesh import TriMesh

        c = self.config
        try:
            if c.mesh == "grid":
                g = c.grid
                return TriMesh.grid(g.nx, g.ny, g.width, g.height)
            return TriMesh.from_file(c.mesh_path())
        except MeshError as exc:
            raise ConfigError(c.source or f"{self.config_class.__name__}(...)", "mesh", str(exc)) from None

    def record(self, result, **extra) -> dict:
        """Append a :class:`~warp_meshad._src.solve.solvers.SolveResult` to :attr:`history` as one step; return the record."""
        rec = {
            "step": self.steps_done,
            "iterations": int(result.iterations),
            "energies": [float(e) for e in result.energies],
            "gradient_norms": [float(g) for g in result.gradient_norms],
            "time_ms": {k: float(v) for k, v in result.time_ms.items()},
            "reason": result.reason,
            "converged": bool(result.converged),
            # failures made visible: iterations that stepped along -g, CG solves stopped at their iteration cap
            "steepest_descent_fallbacks": int(getattr(result, "steepest_descent_fallbacks", 0)),
            "fallback_reasons": dict(getattr(result, "fallback_reasons", {})),
            "linear_solves_capped": int(getattr(result, "linear_solves_capped", 0)),
        }
        rec.update(extra)
        self.history.append(rec)
        self.steps_done += 1
        return rec

    # -- the interface -----------------------------------------------------------------------------------------------

    def step(self) -> dict:
        """Advance by one step (a time step, or one round of solver iterations); returns its history record."""
        raise NotImplementedError

    def run(self, callback=None) -> list[dict]:
        """Take the remaining ``config.steps`` steps; ``callback(app, record)`` after each. Returns :attr:`history`."""
        while self.steps_done < self.config.steps:
            rec = self.step()
            if callback is not None:
                callback(self, rec)
        return self.history

    def check_final(self) -> None:
        """Assert the result is sane. The base checks: finite positions, finite energies, each step's solve did not
        increase its energy. Apps add their own checks."""
        x = self.positions()
        assert np.all(np.isfinite(x)), f"{self.name}: {int(np.sum(~np.isfinite(x)))} non-finite coordinates"
        for rec in self.history:
            e = rec["energies"]
            assert e and all(math.isfinite(v) for v in e), f"{self.name}: step {rec['step']}: non-finite energy {e}"
            tol = 1e-10 * max(1.0, abs(e[0]))
            assert e[-1] <= e[0] + tol, f"{self.name}: step {rec['step']}: energy rose from {e[0]} to {e[-1]}"

    def positions(self) -> np.ndarray:
        """Current vertex positions, float64 numpy (vertex_count, 3)."""
        raise NotImplementedError

    def quantities(self) -> dict:
        """Per-element quantities to show: ``{name: (kind, values)}`` with kind ``"vertices"`` or ``"faces"`` (scalars,
        shape (n,)) or ``"vertex_vectors"`` / ``"face_vectors"`` (shape (n, 3))."""
        return {}

    def spheres(self) -> list[tuple[np.ndarray, float]]:
        """Static spheres of the scene (center, radius), drawn by the viewer."""
        return []

    def extra_metrics(self) -> dict:
        """App-specific entries of ``metrics.json``."""
        return {}

    def save_options(self) -> dict:
        """Keyword arguments of :meth:`TriMesh.save` for the final mesh (e.g. ``uv``)."""
        return {}

    @property
    def energy(self) -> float:
        """Energy at the end of the last step (NaN before the first)."""
        return self.history[-1]["energies"][-1] if self.history else float("nan")

    @property
    def gradient_norm(self) -> float:
        """Gradient norm at the end of the last step (NaN before the first)."""
        return self.history[-1]["gradient_norms"][-1] if self.history and self.history[-1]["gradient_norms"] else float(
            "nan")

    def describe(self) -> str:
        """One line: what runs where."""
        c = self.config
        m = self.mesh
        mesh = f"{c.grid.nx}x{c.grid.ny} grid" if c.mesh == "grid" else pathlib.Path(c.mesh).name
        steps = f"{c.steps} step{'' if c.steps == 1 else 's'}"
        return (f"{self.name}/{c.scene or 'custom'}: {mesh} ({m.vertex_count} vertices, {m.face_count} faces), "
                f"{c.dtype}, solver {c.solver}, {steps}, on {self.device} ({self.device_reason})")


# ----------------------------------------------------------------------------------------------------------------------
# Progress
# ----------------------------------------------------------------------------------------------------------------------


class Progress:
    """A one-line progress bar on stderr (a line every few seconds when stderr is not a terminal); silent if quiet."""

    def __init__(self, total: int, quiet: bool = False, stream=None, width: int = 24, interval_s: float = 5.0):
        self.total = max(int(total), 1)
        self.quiet = quiet
        self.stream = stream if stream is not None else sys.stderr
        self.width = width
        self.interval_s = interval_s
        self.start = time.perf_counter()
        self._last = -math.inf
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())

    def update(self, done: int, text: str = "") -> None:
        if self.quiet:
            return
        now = time.perf_counter()
        final = done >= self.total
        if not self.tty and (done == 0 or (not final and now - self._last < self.interval_s)):
            return
        self._last = now
        filled = int(self.width * min(done, self.total) / self.total)
        bar = "#" * filled + "." * (self.width - filled)
        line = f"[{bar}] {done}/{self.total} {text} {now - self.start:.1f}s"
        if self.tty:
            self.stream.write("\r" + line + ("\n" if final else ""))
        else:
            self.stream.write(line + "\n")
        self.stream.flush()


# ----------------------------------------------------------------------------------------------------------------------
# Outputs
# ----------------------------------------------------------------------------------------------------------------------


def _json_safe(v):
    if isinstance(v, dict):
        return {str(k): _json_safe(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_json_safe(x) for x in v]
    if isinstance(v, (np.floating, float)):
        return float(v) if math.isfinite(v) else None
    if isinstance(v, np.integer):
        return int(v)
    if isinstance(v, np.ndarray):
        return _json_safe(v.tolist())
    if isinstance(v, pathlib.Path):
        return str(v)
    return v


def versions() -> dict:
    """Versions of the toolkit and its main dependencies."""
    import warp as wp

    from warp_meshad import __version__

    out = {"warp_meshad": __version__, "warp": wp.config.version, "numpy": np.__version__,
           "python": platform.python_version(), "platform": platform.platform()}
    try:
        import scipy

        out["scipy"] = scipy.__version__
    except ImportError:
        pass
    return out


def build_metrics(app: App, times: dict, check: str) -> dict:
    """The content of ``metrics.json`` (non-finite numbers become null)."""
    c = app.config
    energies, gnorms = [], []
    phases: dict[str, float] = {}
    for rec in app.history:
        skip = 1 if app.continuous_objective and energies else 0
        energies.extend(rec["energies"][skip:])
        gnorms.extend(rec["gradient_norms"][skip:])
        for k, v in rec["time_ms"].items():
            phases[k] = phases.get(k, 0.0) + v
    m = app.mesh
    out = {
        "app": app.name,
        "scene": c.scene,
        "config_file": c.source,
        "device": app.device,
        "device_reason": app.device_reason,
        "dtype": c.dtype,
        "versions": versions(),
        "mesh": {"vertex_count": m.vertex_count, "face_count": m.face_count, "edge_count": m.edge_count},
        "steps": app.steps_done,
        "iterations": int(sum(r["iterations"] for r in app.history)),
        "steepest_descent_fallbacks": int(sum(r.get("steepest_descent_fallbacks", 0) for r in app.history)),
        "linear_solves_capped": int(sum(r.get("linear_solves_capped", 0) for r in app.history)),
        "final_energy": app.energy,
        "final_gradient_norm": app.gradient_norm,
        "energy": energies,
        "gradient_norm": gnorms,
        "time_ms": {**{"solver_" + k: v for k, v in phases.items()}, **times},
        "per_step": app.history,
        "check_final": check,
        "config": dataclasses.asdict(c),
    }
    out.update(app.extra_metrics())
    return _json_safe(out)


def write_metrics(path: pathlib.Path, metrics: dict) -> None:
    def w(tmp):
        with open(tmp, "w") as f:
            json.dump(metrics, f, indent=1, allow_nan=False)
            f.write("\n")

    _atomic_write(path, w)


def write_convergence_plot(path: pathlib.Path, app: App) -> bool:
    """``convergence.png``: energy and gradient norm per solver iteration (steps concatenated). False if matplotlib
    is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg", force=True)
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, (ax_e, ax_g) = plt.subplots(1, 2, figsize=(10, 3.8))
    start = 0
    many = len(app.history) > 1
    for rec in app.history:
        e, g = rec["energies"], rec["gradient_norms"]
        color = "C0" if not many else plt.cm.viridis(rec["step"] / max(len(app.history) - 1, 1))
        ax_e.plot(range(start, start + len(e)), e, color=color, lw=1.2)
        if g:
            ax_g.semilogy(range(start, start + len(g)), np.maximum(g, 1e-300), color=color, lw=1.2)
        start += max(len(e) - 1, 1)
    title = f"{app.name}/{app.config.scene or 'custom'} ({app.config.solver}, {app.device})"
    ax_e.set(title=title, xlabel="iteration (all steps)", ylabel="energy")
    ax_g.set(title="gradient norm" + (" (color: step)" if many else ""), xlabel="iteration (all steps)",
             ylabel="|g|")
    ax_e.grid(alpha=0.3)
    ax_g.grid(alpha=0.3)
    fig.tight_layout()

    def w(tmp):
        fig.savefig(tmp, format="png", dpi=110)

    try:
        _atomic_write(path, w)
    finally:
        plt.close(fig)
    return True


def save_mesh(path: pathlib.Path, app: App) -> None:
    """The current positions on the app's mesh, atomically (:meth:`TriMesh.save` writes atomically)."""
    from warp_meshad._src.mesh.trimesh import TriMesh

    TriMesh(app.positions(), app.mesh.faces).save(path, **app.save_options())


@dataclass
class RunReport:
    """What :func:`run_app` did.

    Attributes:
        app: the app after the run.
        output: the output folder.
        files: the files written, by kind (``mesh``, ``metrics``, ``convergence``, ``screenshot``).
        metrics: the content of ``metrics.json``.
        messages: notes (skipped outputs and why).
    """

    app: App
    output: pathlib.Path
    files: dict
    metrics: dict
    messages: list


def output_folder(config: AppConfig) -> pathlib.Path:
    """``config.output``, or ``output/<app>_<scene>`` under the current folder (``output/<app>_<scene>_test`` for a
    test-size run, so that it does not overwrite the full run's outputs)."""
    if config.output:
        return pathlib.Path(config.output).expanduser()
    return pathlib.Path("output") / f"{config.app}_{config.scene or 'custom'}{'_test' if config.test_run else ''}"


def check_output_folder(path, where: str = "output") -> pathlib.Path:
    """Create the output folder if needed and check that a file can be written in it, before any work is done.

    Args:
        path: the output folder.
        where: what set it (a config file, ``"--output"``), named in the error.

    Returns:
        The folder.

    Raises:
        ConfigError: key ``output``: the folder cannot be created (a file stands in its way, no permission) or a
            file cannot be written in it.
    """
    folder = pathlib.Path(path).expanduser()
    try:
        if folder.exists() and not folder.is_dir():
            raise NotADirectoryError(errno.ENOTDIR, "it is a file, not a folder", str(folder))
        folder.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".write-test.", dir=folder)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        reason = exc.strerror or str(exc)
        if exc.filename is not None and str(exc.filename) != str(folder):
            reason += f" ({exc.filename})"
        raise ConfigError(where, "output", f"cannot write the outputs to folder {str(folder)!r}: {reason}; choose "
                                           "another folder (--output DIR)") from None
    return folder


def _stderr_log(quiet: bool):
    """``log(text)`` printing ``warp-meshad: text`` to stderr (unless quiet); on a terminal it first clears the line,
    where the progress bar may stand."""
    def log(text):
        if quiet:
            return
        clear = "\r\x1b[K" if getattr(sys.stderr, "isatty", lambda: False)() else ""
        print(f"{clear}warp-meshad: {text}", file=sys.stderr, flush=True)

    return log


def _step_times(times: list[float]) -> dict:
    """First step and median later step [s] from the step end times (the first entry: the run's start)."""
    steps = np.diff(times)
    return {"first_step_s": float(steps[0]) if steps.size else None,
            "median_step_s": float(np.median(steps[1:])) if steps.size > 1 else None}


def run_app(config: AppConfig, quiet: bool = False, viewer: bool | None = None, check: bool = True,
            log=None) -> RunReport:
    """Build the config's app, run it (headless, or in the viewer), check it, and write its outputs.

    The output folder is checked for writing first. Each Warp module compiled while the app is built and run is
    announced on ``log`` as the compile starts; ``metrics.json["compile"]`` records the compiles and loads
    (:meth:`~warp_meshad._src.codegen.module_loads.ModuleLoads.summary`), ``cache_warm``, and the first and the median later
    step time (``first_step_s``, ``median_step_s``: the first step pays for the compiles of a cold cache).

    Args:
        config: an app config (from :func:`load_config`, or built directly).
        quiet: no progress bar and no messages.
        viewer: open the interactive viewer; None: ``config.viewer``.
        check: run ``check_final`` (its failure is raised after the outputs are written).
        log: ``log(text)`` for messages; default: print to stderr unless quiet.

    Returns:
        :class:`RunReport`.

    Raises:
        ConfigError: a bad config, mesh (key ``mesh``) or output folder (key ``output``).
        AssertionError: ``check_final`` failed (after the outputs are written).
    """
    if log is None:
        log = _stderr_log(quiet)
    out = check_output_folder(output_folder(config), config.source or "config")

    times = {}
    t0 = time.perf_counter()
    import warp as wp

    if wp.config.log_level < wp.LOG_WARNING and quiet:
        wp.config.log_level = wp.LOG_WARNING
    messages = []
    step_ends = []
    with ModuleLoads(log=None if quiet else log) as loads:
        app = app_class(config.app, config.source or "config")(config)
        log(app.describe())
        times["setup"] = (time.perf_counter() - t0) * 1000.0

        t0 = time.perf_counter()
        use_viewer = config.viewer if viewer is None else viewer
        if use_viewer:
            from warp_meshad._src.app import viewer as _viewer

            _viewer.show(app, log=log)
        else:
            progress = Progress(config.steps, quiet=quiet)
            progress.update(0, "")
            step_ends.append(time.perf_counter())

            def after_step(a, rec):
                step_ends.append(time.perf_counter())
                progress.update(a.steps_done, f"E={a.energy:.6g} it={rec['iterations']}")

            app.run(after_step)
        times["run"] = (time.perf_counter() - t0) * 1000.0
    times["compile"] = loads.compile_s * 1000.0
    if loads.compiled:
        log(loads.describe())

    failure = None
    status = "not run"
    if check:
        if app.steps_done < config.steps:
            status = f"skipped: {app.steps_done} of {config.steps} steps taken"
        else:
            try:
                app.check_final()
                status = "passed"
            except AssertionError as exc:
                status = f"failed: {exc}"
                failure = exc

    t0 = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    files = {}
    mesh_path = out / f"final.{config.mesh_format}"
    save_mesh(mesh_path, app)
    files["mesh"] = mesh_path
    plot = out / "convergence.png"
    if write_convergence_plot(plot, app):
        files["convergence"] = plot
    else:
        messages.append("convergence.png skipped: matplotlib is not installed (pip install matplotlib)")
    if config.screenshot:
        from warp_meshad._src.app import viewer as _viewer

        shot = out / "screenshot.png"
        ok, why = _viewer.screenshot(app, shot)
        if ok:
            os.chmod(shot, new_file_mode())
            files["screenshot"] = shot
        else:
            messages.append(f"screenshot.png skipped: {why}")
    times["outputs"] = (time.perf_counter() - t0) * 1000.0
    metrics = build_metrics(app, times, status)
    metrics["compile"] = _json_safe({**loads.summary(), **_step_times(step_ends)})
    write_metrics(out / "metrics.json", metrics)
    files["metrics"] = out / "metrics.json"
    for m in messages:
        log(m)
    log(f"{app.steps_done} steps, {metrics['iterations']} iterations, final energy {app.energy:.9g}, "
        f"check_final {status}; wrote {', '.join(p.name for p in files.values())} to {out}")
    if failure is not None:
        raise failure
    return RunReport(app, out, files, metrics, messages)


@dataclass
class WarmupReport:
    """What :func:`warmup_app` did.

    Attributes:
        app: the app after its warm-up step.
        loads: the module loads seen (:class:`~warp_meshad._src.codegen.module_loads.ModuleLoads`).
        seconds: wall time of the warm-up (build and step).
    """

    app: App
    loads: ModuleLoads
    seconds: float


def warmup_app(config: AppConfig, quiet: bool = False, log=None, iterations: int = 2) -> WarmupReport:
    """Compile (or load from Warp's kernel cache) the kernels of a config's run ahead of time, writing nothing.

    Builds the app at the config's size (its kernels' compile-time sizes, e.g. the GPU tile plans, depend on it; use
    a ``test=True`` config for the small size) and takes one step capped at ``iterations`` solver iterations: the
    kernels Warp builds on first use (each energy term in each evaluation mode the solver uses, the assembly, the
    linear solver, the line search) are then compiled and cached. Kernels that a run first needs later (e.g. contact
    terms before any contact) still compile when they are first used, with a message.

    Args:
        config: an app config (from :func:`load_config`).
        quiet: no messages.
        log: ``log(text)`` for messages; default: print to stderr unless quiet.
        iterations: the solver iteration cap of the warm-up step (>= 1).

    Returns:
        :class:`WarmupReport`.
    """
    if log is None:
        log = _stderr_log(quiet)
    config = dataclasses.replace(config, steps=1, iterations=max(1, min(config.iterations, int(iterations))))
    t0 = time.perf_counter()
    with ModuleLoads(log=None if quiet else log) as loads:
        app = app_class(config.app, config.source or "config")(config)
        log(f"warming up {app.describe()}; one step of at most {config.iterations} solver iteration"
            f"{'' if config.iterations == 1 else 's'}, no outputs")
        app.step()
    seconds = time.perf_counter() - t0
    log(f"{loads.describe()}; warm-up took {seconds:.1f} s")
    return WarmupReport(app, loads, seconds)
