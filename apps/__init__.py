"""The applications: one module per app, each with one class ``App`` built from a typed config.

This package is the registry of apps: :data:`APP_NAMES` lists them, and :func:`warp_meshad.app.app_class` imports
``warp_meshad.apps.<name>`` when one is asked for (a new app is a module here plus its name in :data:`APP_NAMES`).
Run them from YAML scenes in ``configs/<app>/``::

    warp-meshad list
    warp-meshad run configs/cloth/hanging.yaml            # or: python -m warp_meshad run cloth/hanging

or from Python::

    from warp_meshad.apps.cloth import App, ClothConfig
    app = App(ClothConfig(steps=5))
    app.run()
    app.check_final()

See :mod:`warp_meshad.app` for the config rules, the runner and its outputs.
"""

APP_NAMES = ("arap", "cloth", "elastic", "frame_field", "manifold_opt", "param", "shells", "smoothing")

__all__ = ["APP_NAMES"]
