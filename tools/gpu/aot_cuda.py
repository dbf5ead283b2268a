"""Compile, on a machine without a GPU, the CUDA kernels a command will need on the lent H200.

    WARP_CACHE_PATH=/tmp/aot python -m tools.gpu.aot_cuda benchmarks.shells_pile --device cpu --steps 1 \\
        --set layout=[2,1,1] gap=1e-4 linear_solver=cg
    WARP_CACHE_PATH=/tmp/aot python -m tools.gpu.aot_cuda pytest -q tests/test_duals.py

Runs the given Python module (``pytest`` included) in this process on the CPU. Every Warp module it loads is also
compiled with Warp's NVRTC for ``--arch`` (default 90, as CUBIN: the H200's driver, CUDA 13.0, is older than the
NVRTC of warp-lang 1.19, so Warp loads CUBIN there) into ``$WARP_CACHE_PATH``. Packed into
``.gpu/warpcache.tar.xz`` (``--pack``), ``tools/gpu/remote.sh`` unpacks it as the GPU host's kernel cache, and kernels
whose source and options match load there without compiling (NVRTC compiles of the float64 shells kernels took
about 150 s of device time). Kernel choices that depend on the device are made as on CUDA (the unrolled PSD
projection up to k = 12). A module the GPU run builds differently (another block size, for instance: tiled kernels
run one lane per block on the CPU) just compiles there as before.
"""

from __future__ import annotations

import os
import runpy
import sys
import tarfile
import time


def _hook(arch: int):
    import warp as wp

    from warp_meshad._src.codegen.warp_compat import install_module_hooks

    done = set()

    def wrap_load(original):
        def load(self, device, block_dim=None, *args, **kwargs):
            exe = original(self, device, block_dim, *args, **kwargs)
            if exe is not None and wp.get_device(device).is_cpu:
                key = (self.name, self.get_module_hash(None))
                if key not in done:
                    done.add(key)
                    t = time.perf_counter()
                    try:
                        wp.compile_aot_module(self, arch=arch, use_ptx=False)
                    except Exception as exc:  # a module that only builds on the CPU: the GPU run compiles it
                        print(f"[aot_cuda] {self.name}: not compiled for sm_{arch}: {exc}", file=sys.stderr)
                    else:
                        print(f"[aot_cuda] {self.name}: sm_{arch} in {time.perf_counter() - t:.1f} s", file=sys.stderr)
            return exe

        return load

    install_module_hooks(wrap_load)  # for the whole run: never restored

    from warp_meshad._src.codegen import kernel_cache

    default = kernel_cache.unrolled_default
    kernel_cache.unrolled_default = lambda k, cuda: default(k, cuda=True)  # the projection choice as on CUDA


def pack(cache: str, out: str):
    """Tar the CUDA artifacts of the cache (cubin, meta; no CPU objects) as ``out`` (xz)."""
    with tarfile.open(out, "w:xz") as tar:
        for root, _, files in os.walk(cache):
            for f in files:
                if f.endswith((".cubin", ".meta")):
                    path = os.path.join(root, f)
                    tar.add(path, arcname=os.path.join("warpcache", os.path.relpath(path, cache)))
    print(f"[aot_cuda] wrote {out} ({os.path.getsize(out) / 1e6:.1f} MB)")


def main():
    args = sys.argv[1:]
    if args[:1] == ["--pack"]:
        pack(os.environ["WARP_CACHE_PATH"], args[1] if len(args) > 1 else ".gpu/warpcache.tar.xz")
        return
    arch = 90
    if args[:1] == ["--arch"]:
        arch, args = int(args[1]), args[2:]
    if not args:
        raise SystemExit(__doc__)
    _hook(arch)
    sys.argv = args
    if args[0] == "pytest":
        import pytest

        raise SystemExit(pytest.main(args[1:]))
    runpy.run_module(args[0], run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
