"""What a new energy compiles before its first projected Hessian, from empty kernel caches (issue 34 item 2).

    python -m benchmarks.compile_time --device cpu                      # the three cases, one process each
    python -m benchmarks.compile_time --device cuda:0                   # the same on a GPU (the lead's H200 run)
    python -m benchmarks.compile_time --device cpu --nvrtc 90           # CPU, plus each module's NVRTC sm_90 compile
    python -m benchmarks.compile_time --device cpu --order gradient     # energy, gradient first; then the Hessian
    python -m benchmarks.compile_time --device cpu --options '{"optimization_level": 1}'   # a compile option
    python -m benchmarks.compile_time --device cuda:0 --runtime-only    # the run-time check below (1M tets, 1000^2)

Each case runs in a fresh process whose ``WARP_CACHE_PATH`` and ``WARP_MESHAD_CACHE_PATH`` are new empty folders (what
a user meets with a new energy: nothing of it compiled, and none of warp_meshad's own kernels either). Cases:

* ``lnh_corner``: the classic log-Neo-Hookean of a tet written over its four corners, ``add_term(mesh.tets, ...)``,
  12 duals, float64: psi = mu / 2 (I_C - 3) - mu log J + lam / 2 (log J)^2 times the rest volume (+inf for J <= 0);
* ``lnh_F``: the same psi as an energy of F, ``add_deformation_term`` (9 duals, no analytic projection);
* ``springs32``: springs on the edges of a grid, float32, ``add_term(mesh.edges, ...)`` (2 vec3 variables, 6 duals).

A process times, after its imports and ``wp.init()``: the ``Problem`` with its term on a small mesh (``TetMesh.box(4, 4,
4)``, ``TriMesh.grid(8, 8)``), then, with ``--order hessian`` (default), the first ``eval_with_hessian_proj`` (a
projected-Newton solve's first call), the first ``eval`` and the first ``eval_with_gradient``; with ``--order
gradient`` the first ``eval`` and ``eval_with_gradient``, then the Hessian. Every Warp module that compiles is
recorded under the call that caused it, with its wall and thread CPU time and the time of Warp's code generation
(Python, part of it). ``to_first_hessian_proj_s`` is the wall time from the Problem's creation to the end of the first
projected Hessian (for ``--order hessian``); ``process_s`` adds the imports, ``wall_s`` Python's start too.

``--nvrtc ARCH`` (CPU runs, no GPU needed) also compiles each module the process builds with Warp's NVRTC for sm_ARCH
(``wp.compile_aot_module``; timed apart and left out of the times above) and makes the kernel choices a CUDA device
makes (the packed PSD projection up to k = 12): ``to_first_hessian_proj_cuda_compile_s`` sums Warp's code generation
and NVRTC over the modules of the setup and the first call, the compile work a GPU run does on its host.
``--options`` sets ``wp.config`` attributes in the child before anything compiles (``optimization_level``,
``use_precompiled_headers``, ``cpu_compiler_flags``, ...).

``--runtime`` / ``--runtime-only`` time, in this process with the default caches, what the projection and dual-library
changes must not slow down: ``benchmarks.tet_hand``'s ``warp_meshad_snh`` and ``warp_meshad_snh_F`` (Hessian) and
``..._proj`` (projected: of the 12 x 12 Hessian in x on the corner path, of the 9 x 9 F Hessian on the F path) on
``TetMesh.box(n, n, n)`` (``--tet-size``, default 56 on a GPU: 998,250 tets; 12 on the CPU) and
``benchmarks.mass_spring``'s ``warp_meshad`` and ``warp_meshad_proj`` (gradient + Hessian, projected) on an n x n grid
(``--spring-size``, default 1000 on a GPU, 300 on the CPU); ``--projection unrolled`` gives every problem the packed
projection up to k = 12 (what a GPU runs) on the CPU too. Writes ``compile_time.json`` to ``$BENCH_OUT`` (records are
appended; a CPU run without it: ``$TMPDIR/bench_cpu``) and prints a table.
"""

import time

_T0 = time.perf_counter()  # before the imports: the child's imports_s counts them

import argparse  # noqa: E402
import datetime
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
from typing import Any

import warp as wp

from warp_meshad.kernels import ad
from warp_meshad.kernels.deformation import tet_deformation_columns

CASES = ("lnh_corner", "lnh_F", "springs32")
ORDERS = {"hessian": ("hessian_proj", "energy", "gradient"), "gradient": ("energy", "gradient", "hessian_proj")}
NAME = "compile_time"


# ----------------------------------------------------------------------------------------------------------------------
# the child: one case in one process
# ----------------------------------------------------------------------------------------------------------------------


@wp.struct
class LNHData:
    rest_inverse: wp.array(dtype=wp.mat33d)
    volume: wp.array(dtype=wp.float64)
    mu: wp.float64
    lam: wp.float64


@wp.struct
class SpringData:
    rest: wp.array(dtype=wp.float32)
    k: wp.float32


@wp.func
def log_neo_hookean(t: int, x0: Any, x1: Any, x2: Any, x3: Any, data: LNHData):
    """V (mu / 2 (I_C - 3) - mu log J + lam / 2 (log J)^2), F from the corners; +inf for J <= 0."""
    f1, f2, f3 = tet_deformation_columns(x0, x1, x2, x3, data.rest_inverse[t])
    ic = ad.dot(f1, f1) + ad.dot(f2, f2) + ad.dot(f3, f3)
    j = ad.dot(f1, ad.cross(f2, f3))
    if j <= 0.0:
        return wp.float64(wp.inf)
    lj = ad.log(j)
    return data.volume[t] * (0.5 * data.mu * (ic - 3.0) - data.mu * lj + 0.5 * data.lam * lj * lj)


@wp.func
def log_neo_hookean_F(t: int, F: Any, data: LNHData):
    """The same psi of the 3 x 3 deformation gradient F."""
    j = ad.det(F)
    if j <= 0.0:
        return wp.float64(wp.inf)
    lj = ad.log(j)
    return data.volume[t] * (0.5 * data.mu * (ad.frobenius_sq(F) - 3.0) - data.mu * lj + 0.5 * data.lam * lj * lj)


@wp.func
def spring32(e: int, xa: Any, xb: Any, data: SpringData):
    """k / 2 (|xa - xb| - rest)^2."""
    d = ad.length(xa - xb) - data.rest[e]
    return 0.5 * data.k * d * d


def _build(case: str, device: str):
    """The case's Problem (with its term) and a point x: a tet box stretched 10% with noise, or a grid with noise."""
    import numpy as np
    import warp as wp

    import warp_meshad as wm

    rng = np.random.default_rng(0)
    if case in ("lnh_corner", "lnh_F"):
        mesh = wm.TetMesh.box(4, 4, 4)
        dinv = mesh.rest_matrix_inverses()
        data = LNHData()
        data.rest_inverse = wp.array(dinv, dtype=wp.mat33d, device=device)
        data.volume = wp.array(mesh.volumes(), dtype=wp.float64, device=device)
        data.mu, data.lam = wp.float64(1.0e4), wp.float64(4.0e4)
        p = wm.Problem(mesh.vertex_count, 3, dtype=wp.float64, device=device)
        if case == "lnh_corner":
            p.add_term(mesh.tets, log_neo_hookean, data)
        else:
            p.add_deformation_term(mesh.tets, log_neo_hookean_F, dinv, data)
        x = mesh.vertices * np.array([1.1, 1.0, 1.0]) + 0.02 * rng.normal(size=mesh.vertices.shape)
        return p, wp.array(x, dtype=wp.vec3d, device=device)
    mesh = wm.TriMesh.grid(8, 8)
    data = SpringData()
    data.rest = wp.array(0.9 * mesh.edge_lengths(), dtype=wp.float32, device=device)
    data.k = wp.float32(2.0)
    p = wm.Problem(mesh.vertex_count, 3, dtype=wp.float32, device=device)
    p.add_term(mesh.edges, spring32, data)
    x = mesh.vertices + 0.01 * rng.normal(size=mesh.vertices.shape)
    return p, wp.array(x, dtype=wp.vec3f, device=device)


class _Loads:
    """Every Warp module load while active: its name, seconds, whether it compiled (Warp ran its code generation: a
    cache miss), the seconds of that code generation, and with ``nvrtc_arch`` the seconds of compiling the module
    for that CUDA architecture too (``wp.compile_aot_module``: Warp's NVRTC, no GPU needed; CPU loads only)."""

    def __init__(self, nvrtc_arch: int | None = None):
        self.loads: list[dict] = []
        self.nvrtc_arch = nvrtc_arch
        self._codegen: list[float] = []

    def __enter__(self):
        from warp_meshad._src.codegen.warp_compat import install_module_hooks

        def wrap_load(load):
            def timed(module, device=None, block_dim=None, *args, **kwargs):
                n_codegen = len(self._codegen)
                t0, c0 = time.perf_counter(), time.thread_time()
                exe = load(module, device, block_dim, *args, **kwargs)
                dt, dc = time.perf_counter() - t0, time.thread_time() - c0
                compiled = len(self._codegen) > n_codegen
                if compiled:
                    rec = {"module": module.name, "s": round(dt, 3), "cpu_s": round(dc, 3),
                           "codegen_s": round(sum(self._codegen[n_codegen:]), 3)}  # fmt: skip
                    if self.nvrtc_arch is not None and wp.get_device(device).is_cpu:
                        t1, c1 = time.perf_counter(), time.thread_time()
                        wp.compile_aot_module(module, arch=self.nvrtc_arch, use_ptx=False)
                        rec[f"nvrtc_sm{self.nvrtc_arch}_s"] = round(time.perf_counter() - t1, 3)
                        rec[f"nvrtc_sm{self.nvrtc_arch}_cpu_s"] = round(time.thread_time() - c1, 3)
                    self.loads.append(rec)
                return exe

            return timed

        def wrap_codegen(codegen):
            def timed(module, *args, **kwargs):
                t0 = time.perf_counter()
                try:
                    return codegen(module, *args, **kwargs)
                finally:
                    self._codegen.append(time.perf_counter() - t0)

            return timed

        self._restore, hooked = install_module_hooks(wrap_load, wrap_codegen)
        if not hooked:
            raise RuntimeError("this Warp version does not let its code generation be watched")
        return self

    def __exit__(self, *exc):
        self._restore()


def child(case: str, device: str, order: str, projection: str, nvrtc_arch: int | None, options: dict) -> dict:
    """Run one case (this process's caches are the parent's empty folders); returns its record."""
    t_start = _T0
    import warp_meshad as wm  # noqa: F401 (timed in imports_s)

    wp.config.log_level = wp.LOG_WARNING
    for name, value in options.items():  # compile options under test (wp.config: every module of the process)
        setattr(wp.config, name, value)
    wp.init()
    if nvrtc_arch is not None:  # the kernels a CUDA device gets (the projection variant depends on it)
        from warp_meshad._src.codegen import kernel_cache

        default, split = kernel_cache.unrolled_default, kernel_cache.split_default
        kernel_cache.unrolled_default = lambda k, cuda: default(k, cuda=True)
        kernel_cache.split_default = lambda k, cuda: split(k, cuda=True)
    t_imported = time.perf_counter()
    phases = []
    nvrtc_key = f"nvrtc_sm{nvrtc_arch}_s"
    with _Loads(nvrtc_arch) as loads:

        def phase(name, fn):
            n0, t0 = len(loads.loads), time.perf_counter()
            out = fn()
            wp.synchronize_device(device)
            dt = time.perf_counter() - t0
            mods = loads.loads[n0:]
            ph = {"phase": name, "s": round(dt, 3), "compile_s": round(sum(m["s"] for m in mods), 3),
                  "modules_compiled": len(mods), "modules": mods}  # fmt: skip
            if nvrtc_arch is not None:
                ph[nvrtc_key] = round(sum(m[nvrtc_key] for m in mods), 3)
                ph["s_without_nvrtc"] = round(dt - ph[nvrtc_key], 3)
            phases.append(ph)
            return out

        def setup():
            p, x = _build(case, device)
            if projection != "auto":
                p.unrolled_projection = projection == "unrolled"
            return p, x

        problem, x = phase("setup", setup)
        calls = {"hessian_proj": lambda: problem.eval_with_hessian_proj(x), "energy": lambda: problem.eval(x),
                 "gradient": lambda: problem.eval_with_gradient(x)}  # fmt: skip
        values = {}
        for name in ORDERS[order]:
            values[name] = phase(name, calls[name])
    t_end = time.perf_counter()
    f, _g, H = values["hessian_proj"]
    first = ORDERS[order][0]
    upto = 0.0
    for ph in phases:
        upto += ph["s"] - ph.get(nvrtc_key, 0.0)
        ph["since_setup_s"] = round(upto, 3)
    by = {ph["phase"]: ph for ph in phases}
    rec = {
        "benchmark": NAME,
        "case": case,
        "device": device,
        "order": order,
        "projection": projection,
        "options": options,
        "process_s": round(t_end - t_start, 3),
        "imports_s": round(t_imported - t_start, 3),
        f"to_first_{first}_s": by[first]["since_setup_s"],
        "to_all_s": round(upto, 3),
        "modules_compiled": sum(ph["modules_compiled"] for ph in phases),
        "compile_s": round(sum(ph["compile_s"] for ph in phases), 3),
        "energy": float(f),
        "hessian_nnz_blocks": int(H.nnz),
        "phases": phases,
        "date": datetime.date.today().isoformat(),
    }
    if nvrtc_arch is not None:
        rec[nvrtc_key] = round(sum(ph[nvrtc_key] for ph in phases), 3)
        upto_first = [m for ph in phases[:2] for m in ph["modules"]]  # setup + first call
        rec[f"to_first_{first}_{nvrtc_key}"] = round(sum(m[nvrtc_key] for m in upto_first), 3)
        rec[f"to_first_{first}_cuda_compile_s"] = round(sum(m[nvrtc_key] + m["codegen_s"] for m in upto_first), 3)
    return rec


def run_case(case: str, device: str, order: str, projection: str = "auto", nvrtc_arch: int | None = None,
             options: dict | None = None, keep: pathlib.Path | None = None) -> dict:
    """``case`` in a fresh process with empty caches (temporary folders, removed after; ``keep``: use this folder)."""
    root = pathlib.Path(tempfile.mkdtemp(prefix="wm_compile_")) if keep is None else keep
    env = dict(os.environ, WARP_CACHE_PATH=str(root / "warp"), WARP_MESHAD_CACHE_PATH=str(root / "gen"))
    cmd = [sys.executable, "-m", "benchmarks.compile_time", "--child", case, "--device", device, "--order", order,
           "--projection", projection, "--options", json.dumps(options or {})]
    cmd += ["--nvrtc", str(nvrtc_arch)] if nvrtc_arch is not None else []
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=pathlib.Path(__file__).parent.parent)
    finally:
        if keep is None:
            shutil.rmtree(root, ignore_errors=True)
    wall = time.perf_counter() - t0
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"case {case} failed (rc {proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    rec = json.loads(lines[-1])
    rec["wall_s"] = round(wall, 3)
    return rec


def print_case(rec: dict) -> None:
    first = ORDERS[rec["order"]][0]
    nv = [k for k in rec if k.startswith("nvrtc_sm") and not k.endswith("cpu_s")]
    more = (f"; NVRTC {nv[0][6:-2]}: {rec[nv[0]]:.2f} s, to first {first} {rec[f'to_first_{first}_{nv[0]}']:.2f} s "
            f"(with code generation {rec[f'to_first_{first}_cuda_compile_s']:.2f} s)") if nv else ""
    opts = "".join(f", {k}={v}" for k, v in rec["options"].items())
    print(f"{rec['case']:11s} {rec['device']} (projection {rec['projection']}{opts}): to first {first} "
          f"{rec[f'to_first_{first}_s']:.2f} s, all three calls {rec['to_all_s']:.2f} s "
          f"({rec['modules_compiled']} modules compiled, {rec['compile_s']:.2f} s), process {rec['process_s']:.2f} s "
          f"(imports {rec['imports_s']:.2f} s){more}")
    for ph in rec["phases"]:
        print(f"    {ph['phase']:13s} {ph['s']:7.2f} s  ({ph['modules_compiled']} compiled, {ph['compile_s']:.2f} s)")
        for m in ph["modules"]:
            extra = f", NVRTC {m[nv[0]]:.2f} s (CPU {m[nv[0][:-2] + '_cpu_s']:.2f} s)" if nv else ""
            print(f"        {m['s']:7.2f} s (CPU {m['cpu_s']:.2f} s, codegen {m['codegen_s']:.2f} s{extra})  "
                  f"{m['module']}")


# ----------------------------------------------------------------------------------------------------------------------
# the run-time check
# ----------------------------------------------------------------------------------------------------------------------


def runtime_check(device: str, tet_size: int, spring_size: int, runs: int, projection: str = "auto") -> list[dict]:
    """Median times of the kernels the projection change touches (see the module docstring), in this process.

    ``projection``: ``"auto"`` (the device's default), ``"unrolled"`` (the packed projection up to k = 12, what a GPU
    runs) or ``"loop"`` (the loop projection), for every problem the benchmarks build.
    """
    from benchmarks import mass_spring, tet_hand
    from warp_meshad._src.codegen import kernel_cache

    wp.config.log_level = wp.LOG_WARNING
    wp.init()
    if projection != "auto":
        kernel_cache.unrolled_default = lambda k, cuda: projection == "unrolled" and k <= 12
    records: list[dict] = []
    tet_hand.run_size(tet_size, device, runs, records, "auto",
                      ("warp_meshad_snh", "warp_meshad_snh_F", "warp_meshad_snh_proj", "warp_meshad_snh_F_proj"))
    mass_spring.run_size(spring_size, device, ["warp_meshad", "warp_meshad_proj"], runs, records)
    keep = ("benchmark", "method", "vertex_count", "dtype", "ms_median", "ms_min", "runs", "device")
    return [{**{k: r.get(k) for k in keep}, "projection": projection} for r in records if "ms_median" in r]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", nargs="+", default=list(CASES), choices=CASES)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--order", default="hessian", choices=sorted(ORDERS))
    ap.add_argument("--projection", default="auto", choices=("auto", "unrolled", "loop"),
                    help="Problem.unrolled_projection: auto (None), unrolled (True) or loop (False)")
    ap.add_argument("--nvrtc", type=int, default=None, metavar="ARCH",
                    help="CPU runs: also compile every module the process builds for sm_ARCH with Warp's NVRTC (timed "
                         "apart, not in the times above) and pick kernels as on CUDA")
    ap.add_argument("--options", default="{}", help='wp.config settings as JSON, e.g. \'{"optimization_level": 2}\' or '
                    '\'{"use_precompiled_headers": false}\' (the child sets them before anything compiles)')
    ap.add_argument("--runtime", action="store_true", help="also time the run-time check (see above)")
    ap.add_argument("--runtime-only", action="store_true", help="only the run-time check")
    ap.add_argument("--tet-size", type=int, default=None, help="TetMesh.box(n, n, n) of the check (cpu 12, GPU 56)")
    ap.add_argument("--spring-size", type=int, default=None, help="spring grid n x n of the check (cpu 300, GPU 1000)")
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--label", default="", help="a tag stored in the records (e.g. before / after)")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        rec = child(args.child, args.device, args.order, args.projection, args.nvrtc, json.loads(args.options))
        print(json.dumps(rec))
        return
    from benchmarks.common import guard_cpu_out, out_dir

    guard_cpu_out(args.device.startswith("cuda"))
    records = []
    if not args.runtime_only:
        for case in args.cases:  # one at a time: compiles are timed on an otherwise idle process
            rec = run_case(case, args.device, args.order, args.projection, args.nvrtc, json.loads(args.options))
            rec["label"] = args.label
            print_case(rec)
            records.append(rec)
    if args.runtime or args.runtime_only:
        cuda = args.device.startswith("cuda")
        tet = args.tet_size or (56 if cuda else 12)
        springs = args.spring_size or (1000 if cuda else 300)
        for r in runtime_check(args.device, tet, springs, args.runs, args.projection):
            r.update(benchmark=f"{NAME}_runtime", source=r["benchmark"], label=args.label)
            records.append(r)
            print(f"runtime {r['source']} {r['method']} ({r['vertex_count']} vertices, projection {args.projection}): "
                  f"median {r['ms_median']:.3f} ms")
    path = out_dir() / f"{NAME}.json"
    old = json.loads(path.read_text()) if path.is_file() else []
    path.write_text(json.dumps(old + records, indent=1))
    print(f"wrote {len(records)} records to {path}")


if __name__ == "__main__":
    main()
