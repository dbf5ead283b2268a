"""Watch Warp compile and load its modules: a message as each compile starts, and what it cost.

Warp builds a module (all the kernels of one Python module, or of one ``module="unique"`` kernel) the first time a
kernel of it launches: codegen, then Clang (CPU) or NVRTC (CUDA), then a binary in the kernel cache
(``wp.config.kernel_cache_dir``); later processes load the cached binary in milliseconds. A cold build takes seconds
per module (a float64 Hessian module: ~5 s on a CPU core), and Warp says nothing while it runs unless its log level
is INFO, and then only after each module is done.

:class:`ModuleLoads` is a context manager that, while active, wraps Warp's module load (every load, cached or
compiled, with its time) and its code generation (which Warp 1.19 runs only on a cache miss, before the native
compile: the moment to say "compiling ..."), through :func:`~.warp_compat.install_module_hooks`. The wrappers are
installed once, while at least one monitor is active, and removed after the last one exits; they add one dictionary
look-up to each kernel launch. Where Warp's code generation cannot be watched, the load times are still recorded,
with ``compiled`` left unknown (None).

Modules get readable names from :func:`describe_module` (``Problem`` registers each energy kernel's term and mode);
other modules are named by their kernels' Python module and key.
"""

from __future__ import annotations

import re
import threading
import time
from dataclasses import dataclass

import warp as wp

from warp_meshad._src.codegen.warp_compat import binary_hash, install_module_hooks, loaded_binary
from warp_meshad._src.plural import plural

__all__ = ["ModuleLoad", "ModuleLoads", "describe_module", "kernel_cache_dir", "module_label"]

_LABELS: dict[str, str] = {}  # Warp module name -> what it holds, for messages
_HASH_SUFFIX = re.compile(r"_[0-9a-f]{8,12}(_\d+)?$")

_lock = threading.RLock()
_active: list[ModuleLoads] = []
_hooks: dict = {}  # the restore function of the installed wrappers, and whether codegen is watched
_frames = threading.local()  # per thread: the stack of Module.load calls in progress


def describe_module(name: str, text: str) -> None:
    """Name what a Warp module holds (e.g. ``"term 'spring': hessian_proj"``) in the compile messages.

    Args:
        name: the Warp module's name (``module.name``).
        text: a short description.
    """
    _LABELS[str(name)] = str(text)


def module_label(module) -> str:
    """A readable name of a Warp module: the description registered with :func:`describe_module`, else the Python
    module and key of its kernels (hash suffixes dropped), else its name."""
    name = getattr(module, "name", str(module))
    text = _LABELS.get(name)
    if text is not None:
        return text
    kernels = list(getattr(module, "kernels", {}).values())
    owner = getattr(getattr(kernels[0], "func", None), "__module__", None) if kernels else None
    if owner and owner != name:
        keys = sorted({_short_key(getattr(k, "key", "")) for k in kernels})
        shown = ", ".join(keys[:2]) + (f", ... ({len(keys)} kernels)" if len(keys) > 2 else "")
        return f"{owner}: {shown}"
    return name


def _short_key(key: str) -> str:
    """A kernel key without its hash suffix and the enclosing function of a local kernel
    (``make_bsr_mv_kernel__locals__bsr_mv_kernel_3f0c6c5c`` -> ``bsr_mv_kernel``)."""
    head, sep, tail = _HASH_SUFFIX.sub("", key).rpartition("__locals__")
    return tail if sep else head + tail


def kernel_cache_dir() -> str | None:
    """Warp's kernel cache folder (after ``wp.init()``), or None before."""
    return wp.config.kernel_cache_dir


@dataclass
class ModuleLoad:
    """One module load seen by a monitor.

    Attributes:
        module: the Warp module's name.
        label: what it holds (:func:`module_label`).
        device: the device it was loaded on.
        hash: the binary's content hash, 7 hex digits as in Warp's log (None where Warp gives none): a module built
            twice under one name (its kernels changed in between, e.g. a kernel added to it) has two.
        compiled: True when Warp built it (a kernel-cache miss), False when it loaded the cached binary, None when
            this Warp version does not tell.
        seconds: wall time of the load (codegen + compile + load, or the cached load).
    """

    module: str
    label: str
    device: str
    hash: str | None
    compiled: bool | None
    seconds: float


class ModuleLoads:
    """Context manager recording the Warp module loads of a block, and announcing each compile as it starts.

    Args:
        log: ``log(text)`` called from the loading thread as a compile starts (None: silent), e.g.
            ``"compiling Warp module 3: term 'spring': hessian_proj (cpu) ..."``.
        total: the number of modules the block will build, when known: messages then say ``3/12``.

    Attributes:
        loads: one :class:`ModuleLoad` per module load in the block, in completion order.
        compiling: number of compiles announced so far.
    """

    def __init__(self, log=None, total: int | None = None):
        self.log = log
        self.total = total
        self.loads: list[ModuleLoad] = []
        self.compiling = 0
        self.started = None
        self.seconds = 0.0

    # -- results ---------------------------------------------------------------------------------------------------

    @property
    def compiled(self) -> list[ModuleLoad]:
        """The loads that built their module (kernel-cache misses)."""
        return [r for r in self.loads if r.compiled]

    @property
    def compile_s(self) -> float:
        """Seconds spent in loads that compiled (codegen, compile and the load of the new binary)."""
        return sum((r.seconds for r in self.loads if r.compiled), 0.0)

    @property
    def load_s(self) -> float:
        """Seconds spent in loads that did not compile (cached binaries; loads whose kind is unknown): compile time
        excluded, so ``compile_s + load_s`` is the time of all loads."""
        return sum((r.seconds for r in self.loads if not r.compiled), 0.0)

    @property
    def cache_warm(self) -> bool | None:
        """True when every module came from the kernel cache (or was loaded already); None when unknown."""
        if any(r.compiled is None for r in self.loads):
            return None
        return not any(r.compiled for r in self.loads)

    def summary(self) -> dict:
        """The numbers for ``metrics.json``: counts, seconds (``compile_s``: the loads that compiled; ``load_s``: the
        others), the cache folder and each load (its module, what it holds, device, hash)."""
        return {
            "cache_warm": self.cache_warm,
            "modules_loaded": len(self.loads),
            "modules_compiled": len(self.compiled),
            "compile_s": self.compile_s,
            "load_s": self.load_s,
            "kernel_cache": kernel_cache_dir(),
            "modules": [
                {"module": r.module, "what": r.label, "device": r.device, "hash": r.hash, "compiled": r.compiled,
                 "seconds": r.seconds}
                for r in self.loads
            ],
        }

    def describe(self) -> str:
        """One line for the end of a run, e.g. ``"compiled 15 Warp modules in 9.6 s, 2 loaded from the cache in
        0.01 s; later runs load them from the kernel cache (...)"``; a module compiled more than once (on two devices,
        or with its kernels changed in between) is named with its devices and hashes."""
        compiled = self.compiled
        if not compiled:
            return f"all {plural(len(self.loads), 'Warp module')} loaded from the kernel cache in {self.load_s:.2f} s"
        cached = len(self.loads) - len(compiled)
        more = f", {cached} loaded from the cache in {self.load_s:.2f} s" if cached else ""
        builds: dict[str, list[ModuleLoad]] = {}
        for r in compiled:
            builds.setdefault(r.module, []).append(r)
        again = [f"{rs[0].label} {len(rs)} times ({', '.join(f'{r.device} {r.hash}' for r in rs)})"
                 for rs in builds.values() if len(rs) > 1]
        twice = f" ({'; '.join(again)})" if again else ""
        return (f"compiled {plural(len(compiled), 'Warp module')} in {self.compile_s:.1f} s{twice}{more}; later runs "
                f"load them from the kernel cache ({kernel_cache_dir()})")

    # -- context manager -------------------------------------------------------------------------------------------

    def __enter__(self) -> ModuleLoads:
        self.started = time.perf_counter()
        with _lock:
            if not _active:
                _install()
            _active.append(self)
        return self

    def __exit__(self, *exc) -> None:
        with _lock:
            if self in _active:
                _active.remove(self)
            if not _active:
                _uninstall()
        self.seconds = time.perf_counter() - self.started

    # -- events ----------------------------------------------------------------------------------------------------

    def _compile_started(self, module, device) -> None:
        with _lock:
            self.compiling += 1
            count = f"{self.compiling}/{self.total}" if self.total else str(self.compiling)
        if self.log is not None:
            where = f" ({device})" if device is not None else ""
            self.log(f"compiling Warp module {count}: {module_label(module)}{where} ...")

    def _loaded(self, record: ModuleLoad) -> None:
        with _lock:
            self.loads.append(record)


# ----------------------------------------------------------------------------------------------------------------------
# The wrappers on wp.Module
# ----------------------------------------------------------------------------------------------------------------------


def _stack() -> list:
    s = getattr(_frames, "stack", None)
    if s is None:
        s = _frames.stack = []
    return s


def _install() -> None:
    def wrap_load(load):
        def watched_load(module, device=None, block_dim=None, *args, **kwargs):
            dev = wp.get_device(device)
            before = loaded_binary(module, dev, block_dim)
            stack = _stack()
            frame = {"compiled": False if _hooks["codegen"] else None, "device": str(dev)}
            stack.append(frame)
            t0 = time.perf_counter()
            try:
                result = load(module, dev, block_dim, *args, **kwargs)
            finally:
                stack.pop()
            if result is not None and result is not before:  # not a launch's fast path: Warp built or read the binary
                record = ModuleLoad(module.name, module_label(module), str(dev), binary_hash(result),
                                    frame["compiled"], time.perf_counter() - t0)
                for monitor in list(_active):
                    monitor._loaded(record)
            return result

        return watched_load

    def wrap_codegen(codegen):
        def watched_codegen(module, *args, **kwargs):
            stack = _stack()
            device = None
            if stack:
                stack[-1]["compiled"] = True
                device = stack[-1]["device"]
            for monitor in list(_active):
                monitor._compile_started(module, device)
            return codegen(module, *args, **kwargs)

        return watched_codegen

    _hooks["restore"], _hooks["codegen"] = install_module_hooks(wrap_load, wrap_codegen)


def _uninstall() -> None:
    restore = _hooks.pop("restore", None)
    if restore is not None:
        restore()
