"""Reproduce the failure of cuDSS's deterministic mode seen on the H200 (cuDSS 0.8, nvmath-python 1.0).

    python -m benchmarks.make_dataset --out /tmp/patches
    python -m benchmarks.cudss_deterministic --patches /tmp/patches 044 045                # died on the H200
    python -m benchmarks.cudss_deterministic --patches /tmp/patches 044 045 --mode off     # ran
    python -m benchmarks.cudss_deterministic --patches /tmp/patches 045 044 --keep         # ran

Each named patch is parametrized in turn in one process, as ``warp-meshad run param/patches`` does with
``deterministic: true`` on a CUDA device, with every ``CudssSolver`` made in ``deterministic=True`` (``--mode on``,
``CUDSS_CONFIG_DETERMINISTIC_MODE`` set before the plan) or not (``--mode off``). ``--keep`` keeps every app (its
solver and buffers) alive; otherwise each is dropped and collected before the next. Prints one line per patch
(``ok <patch> <energy>``); the failure is an exception from the first host read after the bad launch (Warp CUDA error
700, an illegal memory access), which leaves the CUDA context unusable.

Seen on the H200: ``044 045`` died with the mode on whether patch 44's app was kept or dropped (and with the mode on
the sequence ``044 044 045`` with ``--keep``), with the analysis cache on or off, with nvmath's own execute calls
instead of the direct ones, and with LU from the start; ``044 045`` with ``--keep`` ran once; every order ran with
the mode off, and 45 alone ran (benchmarks/README.md, section ``cudss_deterministic.py``). So ``NewtonSolver`` no
longer asks for the mode (``deterministic: true`` keeps the deterministic assembly only).
"""

from __future__ import annotations

import argparse
import functools
import gc
import pathlib


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("patches", nargs="+", help="patch numbers (044) or mesh paths, in order")
    parser.add_argument("--patches", dest="folder", default="/tmp/patches", help="folder of make_dataset's patches")
    parser.add_argument("--mode", choices=("on", "off"), default="on", help="cuDSS's deterministic mode")
    parser.add_argument("--keep", action="store_true", help="keep every app alive (else drop each before the next)")
    parser.add_argument("--device", default="cuda:0")
    args = parser.parse_args(argv)

    import warp as wp

    wp.config.log_level = wp.LOG_WARNING
    from warp_meshad import app as appmod
    from warp_meshad._src.solve import linear

    init = linear.CudssSolver.__init__

    def with_mode(self, *a, **kw):
        init(self, *a, **kw)
        self.deterministic = args.mode == "on"  # read when the plan is made

    functools.update_wrapper(with_mode, init)  # the options check reads the signature through __wrapped__
    linear.CudssSolver.__init__ = with_mode

    alive = []
    for name in args.patches:
        path = pathlib.Path(name) if name.endswith(".obj") else pathlib.Path(args.folder) / f"patch_{name}.obj"
        config = appmod.load_config("param/patches", overrides={
            "mesh": str(path), "device": args.device, "deterministic": True, "screenshot": False})
        app = appmod.app_class("param")(config)
        app.run()
        wp.synchronize_device(args.device)
        print("ok", name, app.energy, flush=True)
        if args.keep:
            alive.append(app)
        else:
            del app
            gc.collect()
            wp.synchronize_device(args.device)


if __name__ == "__main__":
    main()
