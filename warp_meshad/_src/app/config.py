"""The typed app configs: :class:`AppConfig` and its groups, validated by pydantic, and :class:`ConfigError`.

An app's config class derives from :class:`AppConfig` (a pydantic v2 model): the class is the schema. Values are
checked strictly (an int is not a bool, a string is not a number; an int is accepted as a float and a YAML list as a
tuple) and unknown keys are refused. :func:`apply_overrides` applies a nested mapping (from YAML or ``--set``) to a
config and turns pydantic's errors into a :class:`ConfigError` naming the file (or flag), the dotted key, the expected
type and the value that came, with a did-you-mean for a misspelt key.
"""

from __future__ import annotations

import difflib
import pathlib
import re
import reprlib
import types
import typing
from typing import ClassVar, Literal, Optional, Union

import warp as wp
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from warp_meshad._src.solve.linear import LINEAR_SOLVER_NAMES
from warp_meshad._src.solve.options import DeviceLoop

__all__ = ["AppConfig", "ConfigError", "ConfigModel", "GridConfig", "apply_overrides", "check_config",
           "finish_config", "key_origin", "shown"]

SHOWN_CHARS = 200  # at most this many characters of one value in a message
MESSAGE_CHARS = 2000  # and of a whole ConfigError message

_REPR = reprlib.Repr()
_REPR.maxstring = _REPR.maxother = _REPR.maxlong = SHOWN_CHARS
_REPR.maxlist = _REPR.maxtuple = _REPR.maxdict = _REPR.maxset = _REPR.maxfrozenset = _REPR.maxdeque = 20
_REPR.maxlevel = 4


def shown(value, limit: int = SHOWN_CHARS) -> str:
    """``repr(value)`` for a message, at most ``limit`` characters (a long one ends in ``...``), built without the
    whole repr of a large or deeply nested value (``reprlib``: 20 items per container, 4 levels)."""
    text = _REPR.repr(value)
    return text if len(text) <= limit else text[: max(limit - 3, 1)] + "..."


_LONG_RUN = re.compile(r"\S{%d,}" % (SHOWN_CHARS + 1))
_LONG_LIST = re.compile(r"\[[^\[\]]{%d,}\]" % (SHOWN_CHARS + 1))


def _bounded(text: str) -> str:
    """A message with every run of more than SHOWN_CHARS characters without spaces, and every flat list in square
    brackets longer than that, cut in the middle; at most MESSAGE_CHARS in all (a safety net for values an app
    formats into its own messages)."""
    if len(text) <= SHOWN_CHARS:
        return text
    half = SHOWN_CHARS // 2 - 10

    def cut(m):
        t = m.group(0)
        return f"{t[:half]} ...[{len(t) - 2 * half} characters]... {t[-half:]}"

    text = _LONG_RUN.sub(cut, text)
    text = _LONG_LIST.sub(cut, text)
    return text if len(text) <= MESSAGE_CHARS else text[: MESSAGE_CHARS - 3] + "..."


class ConfigError(ValueError):
    """A bad app config: the message names the file (or flag) and the key. A value quoted in it shows at most about
    :data:`SHOWN_CHARS` characters, the whole message at most :data:`MESSAGE_CHARS`."""

    def __init__(self, where: str, key: str | None, message: str):
        self.where = _bounded(str(where))
        self.key = key
        self.detail = _bounded(message)
        prefix = f"{self.where}: key '{key}'" if key else self.where
        super().__init__(_bounded(f"{prefix}: {self.detail}"))

    def __reduce__(self):  # rebuilt from its parts in another process (a prefetching build, a Ray worker)
        return type(self), (self.where, self.key, self.detail)


class ConfigModel(BaseModel):
    """Base of every config and nested group of keys (such as ``grid:``): strict types, no unknown keys.

    A list is accepted where the field is a tuple (YAML has no tuples) and a tuple where it is a list.
    """

    model_config = ConfigDict(strict=True, extra="forbid")

    # fields that YAML and --set cannot set (filled in by the loader)
    internal_fields: ClassVar[frozenset[str]] = frozenset()

    @field_validator("*", mode="before")
    @classmethod
    def _sequence_kind(cls, value, info):
        tp = cls.model_fields[info.field_name].annotation
        if typing.get_origin(tp) in (typing.Union, types.UnionType):  # Optional[tuple[...]]
            tp = next((a for a in typing.get_args(tp) if a is not type(None)), tp)
        origin = typing.get_origin(tp)
        if origin is tuple and isinstance(value, list):
            return tuple(value)
        if origin is list and isinstance(value, tuple):
            return list(value)
        return value


class GridConfig(ConfigModel):
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


class AppConfig(ConfigModel):
    """Fields every app has. Apps derive their own config class and may narrow a field's type (e.g. the solver names).

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
        device_loop: the solver's loop, for the apps whose solver has no host-side hooks (param, elastic, smoothing,
            manifold_opt): ``false`` (the host loop), ``true`` (decisions on the device, one small read per
            iteration: ``device_loop=True`` of the solver), ``"capture"`` (the same replayed as CUDA graphs; CUDA
            only, the host loop on the CPU; the first-order solvers' whole solve is one graph with its stop decided
            on the device), ``"auto"`` (the default: ``"capture"`` on a CUDA device for those apps, else the host
            loop).
        deterministic: assemble without float atomics (``Problem(deterministic=True)``: every element writes its
            contributions to its own slots, summed in a fixed order), so that a run repeats bitwise where the
            linear solver does: on the CPU it does. On a GPU cuDSS's solves still vary at round-off (on param's
            singular Hessians along the null space), so two runs reach the same minimum by different iterates;
            cuDSS's deterministic mode, which would repeat them, is not asked for (on the H200 it made a later
            plan in the same process fail with an illegal memory access: benchmarks/README.md, section
            ``cudss_deterministic.py``). Not
            for apps with contact (interaction terms).
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
        origins: how the command line set each key it gave, by dotted key (``{"mesh": "--set mesh=a.obj",
            "device": "--device cpu"}``; set by the loader); errors about a key name it (:meth:`origin`).
    """

    app: str = ""
    mesh: str = "grid"
    grid: GridConfig = Field(default_factory=GridConfig)
    dtype: Literal["float64", "float32"] = "float64"
    device: Optional[str] = None
    solver: str = "newton"
    linear_solver: Literal[LINEAR_SOLVER_NAMES] = "auto"
    device_loop: Union[bool, Literal["capture", "auto"]] = "auto"
    deterministic: bool = False
    steps: int = 10
    iterations: int = 20
    tolerance: float = 1e-8
    output: Optional[str] = None
    mesh_format: Literal["obj", "ply"] = "obj"
    viewer: bool = False
    screenshot: bool = True
    test: dict = Field(default_factory=dict)
    scene: str = ""
    source: Optional[str] = None
    test_run: bool = False
    origins: dict[str, str] = Field(default_factory=dict)

    internal_fields: ClassVar[frozenset[str]] = frozenset({"scene", "source", "test_run", "origins"})
    # names of built-in mesh generators (no file) and the mesh file extensions an app reads; apps may widen them
    mesh_generators: ClassVar[tuple[str, ...]] = ("grid",)
    mesh_suffixes: ClassVar[tuple[str, ...]] = (".obj", ".off", ".ply")
    # the apps whose Newton solver takes ``device_loop`` (no host-side hooks) set it
    device_loop_supported: ClassVar[bool] = False
    # the apps whose problems have interaction terms (no deterministic assembly yet) clear it
    deterministic_supported: ClassVar[bool] = True

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
        if self.device_loop not in (False, "auto") and not self.device_loop_supported:
            errors.append(("device_loop", f"expected false (the {self.app or 'app'} app's solver runs host-side steps "
                                          f"between device steps), got {self.device_loop!r}"))
        if self.deterministic and not self.deterministic_supported:
            errors.append(("deterministic", f"expected false (the {self.app or 'app'} app's contact terms have no "
                                            "deterministic assembly), got true"))
        if self.device is not None and not re.fullmatch(r"cpu|cuda(:\d+)?", self.device):
            errors.append(("device", f"expected 'cpu', 'cuda' or 'cuda:N', got {shown(self.device)}"))
        return errors

    def device_loop_option(self, device, poll: bool = True) -> bool | DeviceLoop:
        """The solver's ``device_loop=...`` for ``device_loop`` on ``device`` (``"capture"`` needs CUDA: the host
        loop elsewhere; ``"auto"``: ``"capture"`` for an app that supports a device loop, else the host loop).

        Args:
            poll: with ``"capture"``, read the stop flag once per iteration (True, Newton's loops), or let the device
                decide the stop with no read before the end (False: the first-order loops, the whole solve one CUDA
                graph).
        """
        loop = self.device_loop
        if loop == "auto":
            loop = "capture" if self.device_loop_supported else False
        if loop == "capture":
            return DeviceLoop(capture=True, poll=poll) if wp.get_device(device).is_cuda else False
        return loop is True

    def origin(self, key: str) -> str:
        """Where the value of ``key`` (dotted: ``"grid.nx"``) came from, for messages: the command-line flag that set
        it or its group (``"--set grid.nx=8"``, ``"--device cuda:7"``), else the config file, else
        ``"<ConfigClass>(...)"`` for a config built in Python."""
        return key_origin(self.origins, key) or self.source or f"{type(self).__name__}(...)"

    def mesh_path(self) -> pathlib.Path | None:
        """The mesh file (absolute once loaded from a file), or None for a built-in generator."""
        if self.mesh in self.mesh_generators:
            return None
        p = pathlib.Path(self.mesh).expanduser()
        if not p.is_absolute() and self.source:
            p = pathlib.Path(self.source).resolve().parent / p
        return p


def key_origin(origins: dict[str, str], key: str) -> str | None:
    """The entry of ``origins`` (by dotted key) for ``key`` or its nearest group: ``"grid.nx"`` and ``"gravity[1]"``
    find ``"grid"`` and ``"gravity"``; None when neither is there."""
    parts = re.sub(r"\[\d+\]", "", key).split(".")
    for n in range(len(parts), 0, -1):
        found = origins.get(".".join(parts[:n]))
        if found is not None:
            return found
    return None


def _public_fields(cls: type[ConfigModel]) -> list[str]:
    return [k for k in cls.model_fields if k not in cls.internal_fields]


def _is_model(tp) -> bool:
    return isinstance(tp, type) and issubclass(tp, ConfigModel)


def _type_name(tp) -> str:
    """``tp`` in words, for messages: ``"an int"``, ``"one of 'a', 'b'"``, ``"a list of 3 numbers"``."""
    origin = typing.get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return " or ".join(_type_name(a) for a in args) + " or null"
    if origin in (list, tuple):
        args = typing.get_args(tp)
        item = re.sub(r"^an? ", "", _type_name(args[0])) + "s" if args else ""
        if origin is tuple and args and args[-1] is not Ellipsis:
            return f"a list of {len(args)} {item}"
        return f"a list of {item}" if args else "a list"
    if _is_model(tp):
        return f"a mapping with keys {', '.join(_public_fields(tp))}"
    return {bool: "true/false", int: "an int", float: "a number", str: "a string", dict: "a mapping"}.get(tp, str(tp))


def _item_type(tp, index: int):
    args = [a for a in typing.get_args(tp) if a is not Ellipsis]
    if typing.get_origin(tp) is tuple and len(args) > 1:
        return args[min(index, len(args) - 1)]
    return args[0] if args else typing.Any


def _unknown_key(model, cls: type[ConfigModel], key, prefix: str, where: str) -> ConfigError:
    names = _public_fields(cls)
    close = difflib.get_close_matches(str(key), names, n=1)
    hint = f" (did you mean '{prefix}{close[0]}'?)" if close else ""
    app = getattr(model, "app", "") or ""
    owner = f"app '{app}'" if app else cls.__name__
    return ConfigError(where, f"{prefix}{key}", f"unknown key for {owner}{hint}; valid keys: {', '.join(names)}")


def _config_error(exc: ValidationError, config: ConfigModel, where: str, prefix: str) -> ConfigError:
    """The first of pydantic's errors as a :class:`ConfigError` naming the dotted key and the expected type."""
    err = exc.errors()[0]
    model, tp, key = config, type(config), prefix.rstrip(".")
    for part in err["loc"]:
        if _is_model(tp):
            if not isinstance(part, str) or part not in tp.model_fields:  # extra_forbidden
                return _unknown_key(model, tp, part, f"{key}." if key else "", where)
            model = getattr(model, part, None) if isinstance(model, tp) else None
            tp = tp.model_fields[part].annotation
            key = f"{key}.{part}" if key else part
        elif err["type"] == "missing":  # a tuple too short: the whole list is wrong
            break
        else:
            tp = _item_type(tp, int(part))
            key = f"{key}[{part}]"
    value = err["input"]
    return ConfigError(where, key, f"expected {_type_name(tp)}, got {type(value).__name__} {shown(value, 60)}")


def _merged(model: ConfigModel, mapping: dict) -> dict:
    """The fields of ``model`` with ``mapping`` applied; a mapping given for a nested group merges into it."""
    out = dict(model)
    for k, v in mapping.items():
        current = getattr(model, k, None) if isinstance(k, str) else None
        out[k] = _merged(current, v) if isinstance(current, ConfigModel) and isinstance(v, dict) else v
    return out


def apply_overrides(config: ConfigModel, mapping: dict, where: str, prefix: str = "") -> ConfigModel:
    """A copy of ``config`` with the keys of ``mapping`` replaced, each checked against the schema.

    Args:
        config: a config (or nested group) to start from.
        mapping: nested mapping of keys to values (from YAML or ``--set``); nested mappings merge into the groups.
        where: the file or flag the mapping came from, named in errors.
        prefix: dotted prefix of the keys in errors (``"test."`` for the test block).

    Raises:
        ConfigError: ``mapping`` is not a mapping, a key is unknown (or set by the loader only), or a value has the
            wrong type.
    """
    cls = type(config)
    if not isinstance(mapping, dict):
        raise ConfigError(where, prefix.rstrip(".") or None, f"expected a mapping, got {type(mapping).__name__}")
    for k in mapping:
        if not isinstance(k, str) or k in cls.internal_fields:
            raise _unknown_key(config, cls, k, prefix, where)
    try:
        return cls.model_validate(_merged(config, mapping))
    except ValidationError as exc:
        raise _config_error(exc, config, where, prefix) from None


def check_config(config: AppConfig, where: str | None = None, prefix: str = "") -> None:
    """Raise the first of ``config.validate()``'s errors as a :class:`ConfigError`.

    Args:
        config: the config to check.
        where: the file or flag named in the error; None: where the key's value came from (:meth:`AppConfig.origin`).
        prefix: dotted prefix of the keys in errors (``"test."`` for the test block).
    """
    for key, message in config.validate():
        raise ConfigError(where or config.origin(key), prefix + key, message)


def finish_config(config: AppConfig) -> AppConfig:
    """``config`` validated, with its mesh file checked and made absolute; errors name where each key's value came
    from (:meth:`AppConfig.origin`).

    Raises:
        ConfigError: an invalid value, or key ``mesh``: not a generator nor a mesh file of a known kind, or missing.
    """
    check_config(config)
    where = config.origin("mesh")
    mp = config.mesh_path()
    if mp is not None:
        if mp.suffix.lower() not in config.mesh_suffixes:
            kinds = " or ".join(repr(g) for g in config.mesh_generators)
            files = "/".join(config.mesh_suffixes)
            raise ConfigError(where, "mesh", f"expected {kinds} or an {files} file, got {shown(config.mesh)}")
        if not mp.is_file():
            raise ConfigError(where, "mesh", f"mesh file not found: {shown(config.mesh)} (resolved to {mp})")
        config = config.model_copy(update={"mesh": str(mp.resolve())})
    return config
