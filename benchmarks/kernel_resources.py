"""Registers, spills and barriers of the mass-spring Hessian kernels, from ptxas (no GPU needed).

    python -m benchmarks.kernel_resources            # needs ptxas (CUDA toolkit) on PATH

Warp's NVRTC writes PTX for sm_90 (``wp.compile_aot_module(..., arch=90, use_ptx=True)``); ``ptxas -v`` reports
each kernel's registers, stack frame and spills. A newer NVRTC than the local ptxas writes a newer ``.version``
line, which is lowered to what ptxas accepts. Writes ``results/kernel_resources.json`` (or ``$BENCH_OUT``).
The figures are static (this ptxas, not the driver's JIT on the GPU), a guide to occupancy: at 256 threads per
block an H100/H200 SM holds 65536 registers, so more than 64 registers per thread allows at most 3 blocks.
"""

from __future__ import annotations

import datetime
import json
import os
import pathlib
import re
import subprocess
import tempfile

import numpy as np
import warp as wp

from benchmarks.common import out_dir


def _kernels():
    import warp_meshad as wm
    from warp_meshad._src.codegen.kernel_cache import TileVariant, term_kernel
    from warp_meshad._src.problem import tiled as tiled
    from warp_meshad.kernels.energies import MassSpringData, mass_spring

    mesh = wm.TriMesh.grid(8, 8)
    rest = wp.array(mesh.edge_lengths().astype(np.float32), dtype=wp.float32, device="cpu")
    data = MassSpringData(wp.float32, rest=rest, stiffness=10.0)
    out = {}
    for det in (False, True):
        p = wm.Problem(mesh.vertex_count, 3, dtype=wp.float32, device="cpu", deterministic=det, assembly="tiled")
        p.add_term(mesh.edges, mass_spring, data)
        t = p.terms[0]
        cfg = p.tile_config
        facts = p.kernel_facts

        def tile(cap, row_cap=0, rounds=False, projected=False):  # the tiled variant under the problem's knobs
            mb = tiled.min_blocks(t.spec.k, p.dtype, projected=projected, config=cfg)
            return TileVariant(cap, row_cap, rounds, cfg.store, (cfg.block_dim, mb) if mb else None)

        cap = tiled.tile_capacity(p.block_type, cfg)
        if det:
            plan = p.tile_plan  # the deterministic plan's block and row capacities
            out["hessian, deterministic tiled"] = term_kernel(t, "hessian", facts, tile(plan.cap, plan.row_cap, True))
        else:
            out["hessian, atomic"] = term_kernel(t, "hessian", facts)
            out["hessian, tiled"] = term_kernel(t, "hessian", facts, tile(cap))
            out["hessian_proj, atomic"] = term_kernel(t, "hessian_proj", facts)
            out["hessian_proj, tiled"] = term_kernel(t, "hessian_proj", facts, tile(cap, projected=True))
    return out


def _shell_kernels():
    """The element kernels of the shells scene (float64: membrane k = 9, bending k = 12, IPC barriers k = 12)."""
    from warp_meshad._src.codegen.kernel_cache import term_kernel
    from warp_meshad.app import app_class, load_config

    config = load_config("shells/spot_drop", test=True, flags={"--device": {"device": "cpu"}})
    app = app_class(config.app, config.source)(config)
    p = app.problem
    out = {}
    for unrolled in (True, False):  # True is what a GPU picks for k <= 12
        p.unrolled_projection = unrolled
        for t in p.terms:
            how = "unrolled" if unrolled and t.spec.k <= 12 else "loop"
            out[f"shells {t.label} (k={t.spec.k}), hessian_proj, {how} Jacobi"] = term_kernel(t, "hessian_proj", p.kernel_facts)
    for t in p.terms:
        out[f"shells {t.label} (k={t.spec.k}), hessian"] = term_kernel(t, "hessian", p.kernel_facts)
    return out


def main():
    wp.config.quiet = True
    records = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, kernel in {**_kernels(), **_shell_kernels()}.items():
            d = pathlib.Path(tmp) / re.sub(r"\W", "_", name)
            d.mkdir()
            (ptx,) = [f for f in wp.compile_aot_module(kernel.module, arch=90, module_dir=str(d), use_ptx=True)
                      if str(f).endswith(".ptx")]
            text = pathlib.Path(ptx).read_bytes().replace(b"\0", b"").decode()
            text = re.sub(r"^\.version \d+\.\d+", ".version 9.0", text, flags=re.M)
            clean = d / "k.ptx"
            clean.write_text(text)
            res = subprocess.run(["ptxas", "-v", "-arch=sm_90", str(clean), "-o", str(d / "k.cubin")],
                                 capture_output=True, text=True, check=True)
            info = res.stderr
            regs = int(re.search(r"Used (\d+) registers", info).group(1))
            spill = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", info)
            barriers = int(re.search(r"used (\d+) barriers", info).group(1))
            rec = dict(kernel=name, registers=regs, stack_bytes=int(spill.group(1)), spill_store_bytes=int(spill.group(2)),
                       spill_load_bytes=int(spill.group(3)), barriers=barriers, arch="sm_90",
                       blocks_of_256_per_sm_by_registers=65536 // (((regs + 7) // 8) * 8 * 256),
                       ptxas=subprocess.run(["ptxas", "--version"], capture_output=True, text=True).stdout.split("\n")[-2],
                       date=datetime.date.today().isoformat())
            records.append(rec)
            print(f"{name:48s} {regs:4d} registers, {rec['spill_store_bytes']} B spilled, {barriers} barriers, "
                  f"{rec['blocks_of_256_per_sm_by_registers']} blocks of 256 per SM", flush=True)
    path = out_dir() / "kernel_resources.json"
    path.write_text(json.dumps(records, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
