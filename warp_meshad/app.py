"""The app framework: typed configs read from YAML, the :class:`App` base class, the registry of apps, and the
runner that writes a run's outputs.

An app is one module of :mod:`warp_meshad.apps` holding a class ``App`` (derived from :class:`App`) whose
``config_class`` derives from :class:`AppConfig` (a pydantic model: the class is the schema). A YAML file in
``configs/<app>/`` names the app and overrides config fields; an unknown key, a value of the wrong type or a missing
mesh file is a :class:`ConfigError` naming the file and the key::

    from warp_meshad import app

    config = app.load_config("cloth/hanging", test=True)
    report = app.run(config)            # build, run, check_final, write metrics.json and the final mesh
    app.warmup(config)                  # or: compile the kernels of a run ahead of time, writing nothing
    app.run_batch(config, "assets/datasets/param_patches_small", "output/patches")  # every mesh of a dataset
    app.step_batched(apps)              # the steps of many apps of one scene as batched solves (ProblemBatch)

A run writes its outputs as one unit (``manifest.json`` last: :func:`verify_outputs` checks a folder against it),
holds its output folder's lock (a second writer gets :class:`FolderBusy`), ends on SIGINT / SIGTERM with
:class:`Interrupted` (what was finished and how to resume) and on a failed write with :class:`OutputWriteError`; an
app's :class:`StepHistory` stays bounded over long runs.

This module holds what an app author uses: the base classes and configs, the runner and the batch, the registry,
the outputs and the errors. The command line's own plumbing (``--set`` parsing, the default scene, starting Ray apart)
stays in its private modules, where ``python -m warp_meshad`` imports it.

Importing this module imports nothing else: each name comes from its module when first used (``load_config``
imports pydantic and pyyaml, ``run`` the runner and tqdm; matplotlib and polyscope only when a plot or a screenshot is
drawn in this process; ray only when a batch runs on it).
"""

import importlib as _importlib

# each name: (the private module that defines it, its name there), imported on first use (PEP 562)
_HOMES = {
    "App": ("warp_meshad._src.app.base", "App"),
    "BatchStepParts": ("warp_meshad._src.app.base", "BatchStepParts"),
    "BatchReport": ("warp_meshad._src.app.batch", "BatchReport"),
    "SUMMARY_COLUMNS": ("warp_meshad._src.app.batch", "SUMMARY_COLUMNS"),
    "find_meshes": ("warp_meshad._src.app.batch", "find_meshes"),
    "run_batch": ("warp_meshad._src.app.batch", "run_batch"),
    "AppConfig": ("warp_meshad._src.app.config", "AppConfig"),
    "ConfigError": ("warp_meshad._src.app.config", "ConfigError"),
    "ConfigModel": ("warp_meshad._src.app.config", "ConfigModel"),
    "GridConfig": ("warp_meshad._src.app.config", "GridConfig"),
    "FolderBusy": ("warp_meshad._src.app.folder_lock", "FolderBusy"),
    "StepHistory": ("warp_meshad._src.app.history", "StepHistory"),
    "Interrupted": ("warp_meshad._src.app.interrupts", "Interrupted"),
    "load_config": ("warp_meshad._src.app.loader", "load_config"),
    "OutputWriteError": ("warp_meshad._src.app.output_set", "OutputWriteError"),
    "verify_outputs": ("warp_meshad._src.app.output_set", "verify_outputs"),
    "output_folder": ("warp_meshad._src.app.outputs", "output_folder"),
    "Prefetch": ("warp_meshad._src.app.prefetch", "Prefetch"),
    "app_class": ("warp_meshad._src.app.registry", "app_class"),
    "available_apps": ("warp_meshad._src.app.registry", "available_apps"),
    "available_configs": ("warp_meshad._src.app.registry", "available_configs"),
    "RunReport": ("warp_meshad._src.app.runner", "RunReport"),
    "WarmupReport": ("warp_meshad._src.app.runner", "WarmupReport"),
    "run": ("warp_meshad._src.app.runner", "run_app"),
    "step_batched": ("warp_meshad._src.app.runner", "step_apps_batched"),
    "warmup": ("warp_meshad._src.app.runner", "warmup_app"),
    "ViewerError": ("warp_meshad._src.app.viewer", "ViewerError"),
}

__all__ = [
    "App",
    "AppConfig",
    "BatchReport",
    "BatchStepParts",
    "ConfigError",
    "ConfigModel",
    "FolderBusy",
    "GridConfig",
    "Interrupted",
    "OutputWriteError",
    "Prefetch",
    "RunReport",
    "SUMMARY_COLUMNS",
    "StepHistory",
    "ViewerError",
    "WarmupReport",
    "app_class",
    "available_apps",
    "available_configs",
    "find_meshes",
    "load_config",
    "output_folder",
    "run",
    "run_batch",
    "step_batched",
    "verify_outputs",
    "warmup",
]


def __getattr__(name: str):
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(_importlib.import_module(home[0]), home[1])
    globals()[name] = value  # later look-ups find it without this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
