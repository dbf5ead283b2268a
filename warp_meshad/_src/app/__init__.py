"""The app framework behind :mod:`warp_meshad.app`, one concept per module:

- ``config``: :class:`AppConfig` (pydantic), its groups, :class:`ConfigError`, applying overrides with messages that
  name the file and the key;
- ``loader``: reading a config from YAML, its ``test:`` block, ``--set`` pairs and flags;
- ``base``: the :class:`App` base class every app derives from, and the choice of device;
- ``registry``: the apps :mod:`warp_meshad.apps` declares and the configs :mod:`warp_meshad.configs` ships;
- ``runner``: :func:`run_app` and :func:`warmup_app`;
- ``outputs``: ``metrics.json``, ``convergence.png``, the final mesh, the output folder;
- ``progress``: the progress bar (tqdm) and the messages on stderr;
- ``viewer``: the Polyscope viewer and headless screenshots.

The layers import downwards only (config < base < registry < loader, outputs < runner); the apps import the public
facade, and the registry imports an app only when asked for its class.
"""
