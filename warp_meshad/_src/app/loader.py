"""Reading a config: a YAML file (or a name under ``configs/``), its ``test:`` block, ``--set`` pairs and flags.

Overrides apply in this order: the config class's defaults, the YAML file, the file's ``test:`` block (with
``test=True``: the small size the test suite runs), ``--set key=value`` pairs (dotted keys reach nested fields), then
the command-line flags (``--device``, ``--steps``, ``--output``). A mesh path in a file is relative to the file's
folder; one given with ``--set`` is relative to the current folder. pyyaml is imported only here, when used.

YAML aliases are bounded: a document whose aliases (``*name``) would expand it to more than
:data:`MAX_EXPANDED_VALUES` values, or that refers to itself, is refused from its node graph, before any Python value
is built (a 500-byte "billion laughs" file of 8 levels otherwise costs seconds and hundreds of MB).
"""

from __future__ import annotations

import pathlib
import re

from warp_meshad._src.app.config import (
    AppConfig,
    ConfigError,
    apply_overrides,
    check_config,
    finish_config,
    key_origin,
    shown,
)
from warp_meshad._src.app.registry import app_class, available_apps, available_configs, close_scenes, configs_root

__all__ = ["MAX_EXPANDED_VALUES", "load_config", "parse_set"]

MAX_EXPANDED_VALUES = 100_000  # values (scalars, lists, mappings) of a config once its aliases are expanded


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


class _TooLarge(Exception):
    """The document's aliases expand it beyond the bound (or it refers to itself): the message says which."""


def _expanded_size(root, limit: int) -> int:
    """Values in the document under node ``root`` with every alias expanded (a composed node reached through n
    aliases counts n times), computed on the node graph without expanding it; raises :class:`_TooLarge` past
    ``limit`` or for a node that contains itself."""
    def children(node):
        if isinstance(node.value, list):
            for item in node.value:
                yield from (item if isinstance(item, tuple) else (item,))

    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()
    stack = [(root, False)]
    while stack:
        node, closing = stack.pop()
        key = id(node)
        if closing:
            open_nodes.discard(key)
            sizes[key] = min(1 + sum(sizes[id(c)] for c in children(node)), limit + 1)
            continue
        if key in sizes:
            continue
        if key in open_nodes:
            raise _TooLarge("an alias refers to a node that contains it (a recursive document)")
        open_nodes.add(key)
        stack.append((node, True))
        for c in children(node):
            if id(c) in open_nodes:
                raise _TooLarge("an alias refers to a node that contains it (a recursive document)")
            if id(c) not in sizes:
                stack.append((c, False))
    total = sizes[id(root)]
    if total > limit:
        raise _TooLarge(f"its aliases (*name) expand it to more than {limit:,} values")
    return total


def _load_yaml(text: str):
    """``yaml.safe_load`` that also reads ``1e-3`` as a number (YAML 1.1, PyYAML's default, wants ``1.0e-3``) and
    refuses documents whose aliases expand beyond :data:`MAX_EXPANDED_VALUES` values (:class:`_TooLarge`)."""
    global _LOADER
    yaml = _yaml()
    if _LOADER is None:

        class Loader(yaml.SafeLoader):
            pass

        Loader.yaml_implicit_resolvers = {k: list(v) for k, v in yaml.SafeLoader.yaml_implicit_resolvers.items()}
        Loader.add_implicit_resolver("tag:yaml.org,2002:float", re.compile(_FLOAT), list("-+0123456789."))
        _LOADER = Loader
    loader = _LOADER(text)
    try:
        try:
            node = loader.get_single_node()
        except RecursionError:
            raise _TooLarge("it is nested too deeply") from None
        if node is None:
            return None
        _expanded_size(node, MAX_EXPANDED_VALUES)
        return loader.construct_document(node)
    finally:
        loader.dispose()


def _refused(why: str) -> str:
    return f"refused unread: {why}; a config is a small mapping (write its values out, with fewer aliases)"


def _yaml_value(text: str, key: str):
    yaml = _yaml()
    try:
        return _load_yaml(text) if text.strip() else ""
    except yaml.YAMLError as exc:
        raise ConfigError("--set", key, f"cannot parse value {shown(text)}: {exc}") from None
    except _TooLarge as exc:
        raise ConfigError("--set", key, f"value {shown(text)} {_refused(str(exc))}") from None


def _resolve_config_path(path) -> pathlib.Path:
    p = pathlib.Path(path).expanduser()
    if p.is_file():
        return p
    for candidate in (configs_root() / p, configs_root() / f"{p}.yaml", p.with_suffix(".yaml")):
        if candidate.is_file():
            return candidate
    raise ConfigError(str(p), None, f"config file not found{_did_you_mean(str(path))} (give a path, or a name like "
                                    "'cloth/hanging'; 'warp-meshad list' shows them)")


def _did_you_mean(name: str) -> str:
    """``"; did you mean 'a' or 'b'?"`` naming the closest shipped configs, else the scenes of the app ``name``
    starts with, else ``""``."""
    close = close_scenes(name)
    if close:
        quoted = [f"'{c}'" for c in close]
        listed = quoted[0] if len(quoted) == 1 else ", ".join(quoted[:-1]) + " or " + quoted[-1]
        return f"; did you mean {listed}?"
    app = name.replace("\\", "/").split("/", 1)[0]
    files = available_configs().get(app)
    if files and "/" in name:
        return f"; app '{app}' has the scenes {', '.join(f.stem for f in files)}"
    return ""


def load_config(path, overrides: dict | None = None, test: bool = False, flags: dict | None = None) -> AppConfig:
    """Read a YAML config into its app's typed config.

    Args:
        path: a YAML file, or a name under ``configs/`` like ``"cloth/hanging"``.
        overrides: nested mapping applied after the file (``--set``; see :func:`parse_set`).
        test: apply the file's ``test:`` block (the small size the test suite runs).
        flags: ``{flag name: {key: value}}`` applied last, each reported under its flag's name on error
            (e.g. ``{"--steps": {"steps": 2}}``).

    Returns:
        The app's config (its :class:`AppConfig` subclass) with ``scene``, ``source`` and ``origins`` (the flag that
        set each key given by ``overrides`` or ``flags``) set and ``mesh`` resolved to an absolute path.

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
    except _TooLarge as exc:
        raise ConfigError(where, None, _refused(str(exc))) from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(where, None, f"expected a mapping of keys to values, got {type(data).__name__}")
    if "app" not in data:
        raise ConfigError(where, "app", f"missing: name the app (one of {', '.join(available_apps())})")
    name = data["app"]
    if not isinstance(name, str):
        raise ConfigError(where, "app", f"expected a string, got {type(name).__name__} {shown(name)}")
    cls = app_class(name, where)
    config = cls.config_class(app=name, scene=p.stem, source=str(p.resolve()))
    config = apply_overrides(config, dict(data), where)
    check_config(config, where)
    if config.test:
        bad = {"app", "test"} & set(config.test)
        if bad:
            raise ConfigError(where, f"test.{sorted(bad)[0]}", "cannot be overridden in the test block")
        checked = apply_overrides(config, config.test, where, prefix="test.")
        check_config(checked, where, prefix="test.")
        if test:
            config = checked
    if test:
        config = config.model_copy(update={"test_run": True})
    for label, mapping in [("--set", overrides or {})] + list((flags or {}).items()):
        if mapping:
            if "app" in mapping:
                raise ConfigError(label, "app", "the app is fixed by the config file")
            given = _command_line(label, mapping)
            try:
                config = apply_overrides(config, mapping, label)
            except ConfigError as exc:  # name the --set pair or flag that gave the key
                raise ConfigError(key_origin(given, exc.key or "") or label, exc.key, exc.detail) from None
            config = config.model_copy(update={"origins": {**config.origins, **given}})
            check_config(config)
            if "mesh" in mapping and config.mesh not in config.mesh_generators:
                # a path on the command line: relative to the current folder
                config = config.model_copy(update={"mesh": str(pathlib.Path(config.mesh).expanduser().absolute())})
    return finish_config(config)


def _command_line(label: str, mapping: dict, prefix: str = "") -> dict[str, str]:
    """How the command line gave each leaf key of ``mapping``, by dotted key: ``--set grid.nx=8`` for ``--set``,
    ``--device cuda:7`` for a flag (values other than strings written back as YAML)."""
    out = {}
    for k, v in mapping.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(_command_line(label, v, f"{key}."))
        else:
            text = v if isinstance(v, str) else _yaml().safe_dump(v, default_flow_style=True, width=1e9).removesuffix(
                "\n...\n").strip()
            out[key] = f"--set {key}={text}" if label == "--set" else f"{label} {text}"
    return out
