"""The applications: one module per app, each with one class ``App`` built from a typed config.

Run them from YAML scenes in ``configs/<app>/``::

    warp-meshad list
    warp-meshad run configs/cloth/hanging.yaml            # or: python -m warp_meshad run cloth/hanging

or from Python::

    from warp_meshad.apps.cloth import App, ClothConfig
    app = App(ClothConfig(steps=5))
    app.run()
    app.check_final()

See :mod:`warp_meshad._src.app.framework` for the config rules, the runner and its outputs.
"""
