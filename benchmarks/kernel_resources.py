"""Registers, spills and instruction counts of generated kernels, from ptxas and cuobjdump (no GPU needed).

    python -m benchmarks.kernel_resources                 # every set; needs ptxas (CUDA toolkit) on PATH
    python -m benchmarks.kernel_resources --sets tet      # the tet kernels alone (stable Neo-Hookean, float64)

Warp's NVRTC writes PTX for sm_90 (``wp.compile_aot_module(..., arch=90, use_ptx=True)``); ``ptxas -v`` reports
each kernel's registers, stack frame and spills. A newer NVRTC than the local ptxas writes a newer ``.version``
line, which is lowered to what ptxas accepts. Where ``cuobjdump`` and ``nvdisasm`` are found (on PATH, or from the
``nvidia-cuda-cuobjdump`` and ``nvidia-cuda-nvdisasm`` wheels), the SASS of each kernel is counted too: instructions,
FP64 operations (DFMA, DMUL, DADD), local-memory accesses (LDL, STL), global atomics (ATOM/RED) and shared-memory
atomics (ATOMS). Every float atomic of Warp's ``atomic_add`` on an array compiles to three paths (global, shared,
generic), so the FP64 and atomic counts include the untaken ones: compare kernels with the same scatter.

Sets: ``springs`` (the mass-spring Hessian kernels, float32, atomic / tiled / projected), ``shells`` (the shells
scene's element kernels, float64), ``tet`` (stable Neo-Hookean on tets, float64: the F term's ``hessian`` and
analytic ``hessian_proj`` kernels, atomic and tiled as ``assembly="auto"`` may pick them on a GPU, the 12-variable
corner term's ``hessian`` kernel, and the hand-written kernel of ``benchmarks/tet_hand.py``).

Writes ``results/kernel_resources.json`` (every set) or ``results/kernel_resources_<sets>.json`` (or under
``$BENCH_OUT``). The figures are static (this ptxas, not the driver's JIT on the GPU), a guide to occupancy: at 256
threads per block an H100/H200 SM holds 65536 registers, so more than 64 registers per thread allows at most 3 blocks.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import importlib.util
import json
import os
import pathlib
import re
import shutil
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


def _tet_kernels():
    """The tet kernels (float64, stable Neo-Hookean): the F term's, the corner term's and the hand-written one."""
    import dataclasses

    import warp_meshad as wm
    from warp_meshad._src.codegen.kernel_cache import TileVariant, term_kernel
    from warp_meshad._src.problem import tiled as tiled
    from warp_meshad.kernels.energies import (
        StableNeoHookeanData,
        stable_neo_hookean,
        stable_neo_hookean_F,
        stable_neo_hookean_F_hessian_proj,
    )

    from benchmarks import tet_hand

    mesh = wm.TetMesh.box(3, 3, 3)
    data = StableNeoHookeanData()
    data.rest_inverse = wp.array(mesh.rest_matrix_inverses(), dtype=wp.mat33d, device="cpu")
    data.volume = wp.array(mesh.volumes(), dtype=wp.float64, device="cpu")
    data.mu, data.lam = wp.float64(1.0e4), wp.float64(4.0e4)
    out = {}
    for label, proj in (("F (k=9)", None), ("F (k=9) analytic", stable_neo_hookean_F_hessian_proj), ("corners (k=12)", None)):
        p = wm.Problem(mesh.vertex_count, 3, dtype=wp.float64, device="cpu")
        if label.startswith("corners"):
            p.add_term(mesh.tets, stable_neo_hookean, data)
        else:
            p.add_deformation_term(mesh.tets, stable_neo_hookean_F, rest_inverse=data.rest_inverse, data=data,
                                   projection=proj)  # fmt: skip
        t = p.terms[0]
        facts = dataclasses.replace(p.kernel_facts, cuda=True)  # the variants a GPU gets
        cfg = p.tile_config
        mode = "hessian" if proj is None else "hessian_proj"
        mb = tiled.min_blocks(t.spec.k, p.dtype, projected=proj is not None, config=cfg)
        tile = TileVariant(tiled.tile_capacity(p.block_type, cfg), 0, False, cfg.store, (cfg.block_dim, mb) if mb else None)
        out[f"tet snh {label}, {mode}, atomic"] = term_kernel(t, mode, facts)
        if not label.startswith("corners"):
            out[f"tet snh {label}, {mode}, tiled"] = term_kernel(t, mode, facts, tile)
    out["tet snh hand-written (tet_hand._snh_hand)"] = tet_hand._snh_hand
    return out


SETS = {"springs": _kernels, "shells": _shell_kernels, "tet": _tet_kernels}


def _sass_tools() -> tuple[str, dict] | None:
    """(cuobjdump, environment with nvdisasm on PATH), or None where either is missing."""
    folders = [os.path.dirname(t) for t in (shutil.which("cuobjdump"), shutil.which("nvdisasm")) if t]
    spec = importlib.util.find_spec("nvidia")
    for root in (spec.submodule_search_locations or []) if spec else []:
        folders += [str(b) for b in pathlib.Path(root).glob("*/bin")]
    tools = {}
    for name in ("cuobjdump", "nvdisasm"):
        found = [os.path.join(f, name) for f in folders if os.path.isfile(os.path.join(f, name))]
        if not found:
            return None
        tools[name] = found[0]
    env = dict(os.environ, PATH=os.path.dirname(tools["nvdisasm"]) + os.pathsep + os.environ.get("PATH", ""))
    return tools["cuobjdump"], env


def _sass_counts(cubin: pathlib.Path, function: str, tools) -> dict:
    """Instruction counts of one kernel's SASS (see the module docstring)."""
    cuobjdump, env = tools
    sass = subprocess.run([cuobjdump, "-sass", "-fun", function, str(cubin)], capture_output=True, text=True, env=env,
                          check=True).stdout  # fmt: skip
    ops = collections.Counter()
    for line in sass.splitlines():
        m = re.match(r"\s+/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_]+)", line)
        if m:
            ops[m.group(1)] += 1
    return dict(sass_instructions=sum(ops.values()), fp64_ops=ops["DFMA"] + ops["DMUL"] + ops["DADD"],
                dfma=ops["DFMA"], dmul=ops["DMUL"], dadd=ops["DADD"], local_memory_ops=ops["LDL"] + ops["STL"],
                global_atomics=ops["ATOM"] + ops["RED"] + ops["ATOMG"] + ops["REDG"], shared_atomics=ops["ATOMS"])  # fmt: skip


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sets", nargs="+", default=list(SETS), choices=list(SETS), help="kernel sets (default: all)")
    args = ap.parse_args(argv)
    wp.config.log_level = wp.LOG_WARNING
    tools = _sass_tools()
    if tools is None:
        print("cuobjdump / nvdisasm not found: registers and spills only (pip install nvidia-cuda-cuobjdump "
              "nvidia-cuda-nvdisasm for instruction counts)")  # fmt: skip
    kernels = {}
    for name in args.sets:
        kernels.update(SETS[name]())
    records = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, kernel in kernels.items():
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
            # the report of this kernel's forward entry (a module may hold others)
            entries = re.split(r"Compiling entry function ", res.stderr)
            info = next((e for e in entries if kernel.key in e and "_cuda_kernel_forward" in e), res.stderr)
            function = re.match(r"'([^']+)'", info).group(1) if info is not res.stderr else None
            regs = int(re.search(r"Used (\d+) registers", info).group(1))
            spill = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", info)
            barriers = re.search(r"used (\d+) barriers", info)
            rec = dict(kernel=name, registers=regs, stack_bytes=int(spill.group(1)), spill_store_bytes=int(spill.group(2)),
                       spill_load_bytes=int(spill.group(3)), barriers=int(barriers.group(1)) if barriers else 0, arch="sm_90",
                       blocks_of_256_per_sm_by_registers=65536 // (((regs + 7) // 8) * 8 * 256),
                       ptxas=subprocess.run(["ptxas", "--version"], capture_output=True, text=True).stdout.split("\n")[-2],
                       date=datetime.date.today().isoformat())
            if tools is not None and function:
                rec.update(_sass_counts(d / "k.cubin", function, tools))
            records.append(rec)
            line = (f"{name:56s} {regs:4d} registers, {rec['spill_store_bytes']:4d} B spilled, {rec['barriers']} barriers, "
                    f"{rec['blocks_of_256_per_sm_by_registers']} blocks of 256 per SM")
            if "sass_instructions" in rec:
                line += (f"; SASS {rec['sass_instructions']}, FP64 {rec['fp64_ops']}, local {rec['local_memory_ops']}, "
                         f"atomics {rec['global_atomics']} global {rec['shared_atomics']} shared")
            print(line, flush=True)
    stem = "kernel_resources" if list(args.sets) == list(SETS) else "kernel_resources_" + "_".join(args.sets)
    path = out_dir() / f"{stem}.json"
    path.write_text(json.dumps(records, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
