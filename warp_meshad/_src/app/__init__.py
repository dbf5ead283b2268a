"""The app framework behind :mod:`warp_meshad.app`, one concept per module:

- ``config``: :class:`AppConfig` (pydantic), its groups, :class:`ConfigError`, applying overrides with messages that
  name the file and the key;
- ``loader``: reading a config from YAML, its ``test:`` block, ``--set`` pairs and flags;
- ``base``: the :class:`App` base class every app derives from, and the choice of device;
- ``warp_init``: Warp's initialisation, without its CUDA-driver warning where no CUDA device was asked for;
- ``registry``: the apps :mod:`warp_meshad.apps` declares and the configs :mod:`warp_meshad.configs` ships;
- ``history``: :class:`StepHistory`, an app's step records in bounded memory;
- ``runner``: :func:`run_app` and :func:`warmup_app`;
- ``outputs``: ``metrics.json``, ``convergence.png``, the final mesh, the output folder;
- ``output_set``: a run's outputs written as one unit (temporary names, renamed together, ``manifest.json`` last),
  checking a folder against its manifest, :class:`OutputWriteError`;
- ``folder_lock``: one writer per output folder (:class:`FolderLock`, :class:`FolderBusy`);
- ``interrupts``: SIGINT / SIGTERM as :class:`Interrupted` (what was finished, how to resume);
- ``progress``: the progress bar (tqdm) and the messages on stderr;
- ``viewer``: the Polyscope viewer and headless screenshots;
- ``native_output``: what Warp's and Polyscope's native code print, held back for the caller to filter.

The layers import downwards only (config < history < base < registry < loader; interrupts < output_set;
config < folder_lock; outputs < runner < batch); the apps import the public facade, and the registry imports an app
only when asked for its class.
"""
