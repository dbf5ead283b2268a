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

Importing this module imports pydantic and tqdm; pyyaml, matplotlib and polyscope only when used; ray only when a
batch runs on it.
"""

from warp_meshad._src.app.base import App, BatchStepParts, resolve_device
from warp_meshad._src.app.batch import SUMMARY_COLUMNS, BatchReport, find_meshes, run_batch, start_ray
from warp_meshad._src.app.config import AppConfig, ConfigError, ConfigModel, GridConfig
from warp_meshad._src.app.folder_lock import FolderBusy
from warp_meshad._src.app.history import StepHistory
from warp_meshad._src.app.interrupts import Interrupted
from warp_meshad._src.app.loader import load_config, parse_set
from warp_meshad._src.app.output_set import OutputWriteError, verify_outputs
from warp_meshad._src.app.outputs import check_output_folder, output_folder
from warp_meshad._src.app.prefetch import Prefetch
from warp_meshad._src.app.registry import DEFAULT_CONFIG, app_class, available_apps, available_configs, configs_root
from warp_meshad._src.app.runner import RunReport, WarmupReport
from warp_meshad._src.app.runner import run_app as run
from warp_meshad._src.app.runner import step_apps_batched as step_batched
from warp_meshad._src.app.runner import warmup_app as warmup
from warp_meshad._src.app.viewer import ViewerError

__all__ = [
    "DEFAULT_CONFIG",
    "SUMMARY_COLUMNS",
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
    "StepHistory",
    "ViewerError",
    "WarmupReport",
    "app_class",
    "available_apps",
    "available_configs",
    "check_output_folder",
    "configs_root",
    "find_meshes",
    "load_config",
    "output_folder",
    "parse_set",
    "resolve_device",
    "run",
    "run_batch",
    "start_ray",
    "step_batched",
    "verify_outputs",
    "warmup",
]
