"""Which apps and configs exist: the app names declared by :mod:`warp_meshad.apps`, their ``App`` classes, and the
YAML configs shipped as :mod:`warp_meshad.configs` (the repository's ``configs/`` folder).

The registry imports an app module only when its class is asked for (:func:`app_class`); the app modules import
:mod:`warp_meshad.app` and never this registry, so there is no import cycle.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.resources
import pathlib

from warp_meshad._src.app.base import App
from warp_meshad._src.app.config import ConfigError

__all__ = ["DEFAULT_CONFIG", "app_class", "available_apps", "available_configs", "close_scenes", "configs_root",
           "scene_names"]

DEFAULT_CONFIG = "cloth/hanging"


def available_apps() -> list[str]:
    """Names of the apps, as :data:`warp_meshad.apps.APP_NAMES` declares them (module ``warp_meshad.apps.<name>``)."""
    from warp_meshad.apps import APP_NAMES

    return sorted(APP_NAMES)


def configs_root() -> pathlib.Path:
    """The folder of the shipped configs: the package :mod:`warp_meshad.configs` (``configs/`` in the repository)."""
    return pathlib.Path(str(importlib.resources.files("warp_meshad.configs")))


def available_configs() -> dict[str, list[pathlib.Path]]:
    """``{app: [config files]}`` under :func:`configs_root`."""
    root = configs_root()
    out = {}
    for folder in sorted(d for d in root.iterdir() if d.is_dir() and not d.name.startswith("_")):
        files = sorted(folder.glob("*.yaml")) + sorted(folder.glob("*.yml"))
        if files:
            out[folder.name] = files
    return out


def scene_names() -> list[str]:
    """The shipped configs' names as the command line takes them (``"<app>/<scene>"``: ``"cloth/hanging"``), sorted."""
    return sorted(f"{app}/{f.stem}" for app, files in available_configs().items() for f in files)


def close_scenes(name: str, n: int = 3) -> list[str]:
    """The shipped config names closest to ``name`` (a misspelt ``"<app>/<scene>"``, a scene under the wrong app, or a
    scene without its app), for a did-you-mean.

    The scene part of ``name`` (after its last ``/``, without a ``.yaml`` / ``.yml`` suffix) is compared with every
    shipped scene (``difflib`` ratio >= 0.6); the closest come first, and among equally close ones those of the app
    ``name`` names.

    Args:
        name: the name that was not found.
        n: at most this many names.

    Returns:
        ``"<app>/<scene>"`` names, closest first; empty when none is close.
    """
    text = str(name).replace("\\", "/").strip("/")
    for suffix in (".yaml", ".yml"):
        if text.endswith(suffix):
            text = text[: -len(suffix)]
    app, _, scene = text.rpartition("/")
    scored = []
    for full in scene_names():
        full_app, full_scene = full.split("/", 1)
        ratio = difflib.SequenceMatcher(None, scene, full_scene).ratio()
        if ratio >= 0.6:
            scored.append((-ratio, full_app != app, full))
    return [full for *_, full in sorted(scored)[:n]]


def app_class(name: str, where: str = "app") -> type[App]:
    """The ``App`` class of app ``name`` (imports ``warp_meshad.apps.<name>``).

    Raises:
        ConfigError: key ``app``: ``name`` is not one of :func:`available_apps` (with a did-you-mean), or its module
            has no ``App`` class derived from :class:`App`.
    """
    names = available_apps()
    if name not in names:
        close = difflib.get_close_matches(name, names, n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        raise ConfigError(where, "app", f"unknown app {name!r}{hint}; available: {', '.join(names) or 'none'}")
    module = importlib.import_module(f"warp_meshad.apps.{name}")
    cls = getattr(module, "App", None)
    if not (isinstance(cls, type) and issubclass(cls, App)):
        raise ConfigError(where, "app", f"module warp_meshad.apps.{name} has no App class derived from App")
    return cls
