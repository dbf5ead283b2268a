"""Every use of Warp's private API in warp_meshad, behind one function each.

Warp keeps its implementation in ``warp._src``; warp_meshad needs a few things only found there (generating a
module's code without compiling it, a function's return type, registering a function built from source text,
watching module loads, the format of a codegen error). Each function below names the Warp 1.19 facts it relies
on; a Warp upgrade is checked here and nowhere else (``tests/test_codegen_contract.py`` fails if another module
of warp_meshad, kernels, apps or benchmarks touches ``warp._src`` or ``Module._run_codegen``).
"""

from __future__ import annotations

import re
from typing import Callable

import warp as wp

__all__ = [
    "binary_hash",
    "codegen_error_frames",
    "complete_before_rehash",
    "constant_text",
    "function_return_types",
    "generate_module_code",
    "install_module_hooks",
    "is_struct_instance",
    "is_struct_type",
    "loaded_binary",
    "matrix_pattern_version",
    "module_hash_record",
    "module_hashed",
    "module_options_text",
    "register_function",
    "seed_module_hash",
    "set_matrix_pattern_version",
    "struct_fields",
    "struct_type",
    "type_code",
]


def is_struct_instance(obj) -> bool:
    """Whether ``obj`` is an instance of a ``@wp.struct``.

    Warp 1.19: instances of every struct class derive from ``warp._src.codegen.StructInstance`` (not exported).
    """
    return isinstance(obj, wp._src.codegen.StructInstance)


def struct_type(instance):
    """The ``@wp.struct`` type (``warp.codegen.Struct``) of a struct instance, as kernels take it as an argument type.

    Warp 1.19: an instance keeps it in the private attribute ``_cls``.
    """
    return instance._cls


def struct_fields(stype) -> list[tuple[str, object]]:
    """The ``(name, type)`` of every field of a ``@wp.struct`` type, in declaration order.

    Warp 1.19: a ``warp.codegen.Struct`` keeps its fields in ``vars`` (name -> ``Var``, whose ``type`` is the field's).
    """
    return [(name, var.type) for name, var in stype.vars.items()]


def generate_module_code(module) -> None:
    """Generate (not compile) the code of every kernel and function of a Warp module: code-generation errors
    (undefined names, no matching overload, ...) surface here, in milliseconds, without a C++ compiler.

    Warp 1.19: ``warp._src.context.ModuleBuilder(module, options)`` builds every function's ``Adjoint`` (the
    typed code) in its constructor; ``Module.load`` does the same before compiling.
    """
    wp._src.context.ModuleBuilder(module, module.options)


def function_return_types(fn) -> list | None:
    """The types a Warp function returns, once its module's code was generated (:func:`generate_module_code`).

    Args:
        fn: a concrete ``wp.Function`` (not a generic one).

    Returns:
        One type per returned value (references stripped), or None when it returns nothing.

    Warp 1.19: ``fn.adj.return_var`` holds the returned ``Var`` objects after code generation, their ``.type``
    possibly a reference type stripped by ``warp._src.codegen.strip_reference``.
    """
    ret = getattr(fn.adj, "return_var", None)
    if not ret:
        return None
    return [wp._src.codegen.strip_reference(v.type) for v in ret]


def register_function(pyfn, key: str, module, source: str):
    """Register a Python function built from source text as a Warp function of ``module``.

    Args:
        pyfn: the Python function (its ``__module__`` set to ``module.name``).
        key: the function's name in the module.
        module: the ``wp.Module`` it belongs to.
        source: its source text; Warp parses this text (not the file the code object names), so the line numbers
            in Warp's errors count from its first line (see :func:`codegen_error_frames`).

    Returns:
        The Warp function (or overload set) the module now holds under ``key``.

    Warp 1.19: ``wp.Function(func, key, namespace, module, value_func, source)`` registers itself in
    ``module.functions`` (not a documented constructor: ``@wp.func`` is the public path, which reads the source
    from the file).
    """
    wp.Function(func=pyfn, key=key, namespace="", module=module, value_func=None, source=source)
    return module.functions[key]


_FRAME = re.compile(r'Error while parsing function "([^"]+)" at (.*?):(\d+):\n[^\n]*\n;')


def codegen_error_frames(exc: BaseException) -> tuple[list[tuple[str, str, int]], str] | None:
    """The functions a Warp code-generation error went through, outermost first, and its reason.

    Returns:
        ``([(function key, file, line), ...], reason)``, or None when ``exc`` is not a code-generation error.
        ``line`` is the statement's 0-based line within the function's source, plus the line Warp took the
        function to start at (0 for a function registered from source text, see :func:`register_function`).

    Warp 1.19: ``Adjoint.build`` re-raises an error of the function body as the same exception type with the one
    argument ``'Error while parsing function "<key>" at <file>:<line>:\\n<source line>\\n;<inner args>'``; a call
    to another Warp function nests the callee's message as the inner argument.
    """
    text = exc.args[0] if exc.args and isinstance(exc.args[0], str) else None
    if text is None:
        return None
    frames, pos = [], 0
    while (m := _FRAME.match(text, pos)) is not None:
        frames.append((m.group(1), m.group(2), int(m.group(3))))
        pos = m.end()
    if not frames:
        return None
    return frames, text[pos:]


def install_module_hooks(wrap_load: Callable, wrap_codegen: Callable | None = None) -> tuple[Callable[[], None], bool]:
    """Wrap Warp's module loading: ``wp.Module.load`` becomes ``wrap_load(original)`` and, where this Warp has
    it, the code generation of a cache miss becomes ``wrap_codegen(original)``.

    Args:
        wrap_load: ``original -> replacement`` for ``wp.Module.load(module, device, block_dim=None, ...)``, which
            every launch calls (returning the loaded binary, cached or just built).
        wrap_codegen: ``original -> replacement`` for ``wp.Module._run_codegen(module, ...)``, or None to leave it.

    Returns:
        ``(restore, codegen_hooked)``: ``restore()`` puts the originals back; ``codegen_hooked`` tells whether the
        code-generation hook is installed (Warp calls ``_run_codegen`` only when it builds a module: a kernel
        cache miss, before the native compile).

    Warp 1.19: ``Module.load`` is looked up on the class at each launch; ``Module._run_codegen`` is private.
    """
    load = wp.Module.load
    wp.Module.load = wrap_load(load)
    codegen = getattr(wp.Module, "_run_codegen", None) if wrap_codegen is not None else None
    if codegen is not None:
        wp.Module._run_codegen = wrap_codegen(codegen)

    def restore() -> None:
        wp.Module.load = load
        if codegen is not None:
            wp.Module._run_codegen = codegen

    return restore, codegen is not None


def loaded_binary(module, device, block_dim: int | None):
    """The binary of ``module`` already loaded on ``device`` for ``block_dim`` (None: the module's default), or None.

    Warp 1.19: ``Module.execs`` maps ``(device.context, block_dim)`` to the loaded ``ModuleExec``.
    """
    dev = wp.get_device(device)
    return module.execs.get((dev.context, block_dim if block_dim is not None else module.options["block_dim"]))


def binary_hash(binary) -> str | None:
    """The content hash of a loaded module binary (from :func:`loaded_binary` or ``Module.load``) as Warp's log
    shows it (7 hex digits), or None where the binary has none.

    Warp 1.19: ``ModuleExec.module_hash`` (bytes).
    """
    h = getattr(binary, "module_hash", None)
    return h.hex()[:7] if h else None


def set_matrix_pattern_version(A, version: int) -> None:
    """Mark the sparsity pattern of a ``warp.sparse.BsrMatrix`` as changed in place (linear solvers that keep a
    symbolic analysis per pattern compare this number).

    Warp 1.19: ``BsrMatrix`` has no field for it; an attribute is set through ``BsrMatrix.__setattr__`` as Warp's
    own sparse code sets its private fields.
    """
    from warp.sparse import BsrMatrix

    BsrMatrix.__setattr__(A, "pattern_version", int(version))


def matrix_pattern_version(A) -> int | None:
    """The number set by :func:`set_matrix_pattern_version` (None where never set)."""
    return getattr(A, "pattern_version", None)


def module_hash_record(module) -> dict | None:
    """Warp's content hashes of a module that Warp hashed (loaded) in this process, one per block size it was hashed
    for, in the form :func:`seed_module_hash` takes back; None where there are none or the module does not fit that
    path (generic kernels, ``wp.static`` expressions, a deterministic mode, several live kernels of one key).

    Warp 1.19: ``Module.load(device, block_dim)`` fills ``Module.hashers[block_dim]`` (a ``ModuleHasher``: ``hash``,
    ``kernel_hashes`` {kernel: digest}) and ``Module.resolved_options[block_dim]``; CPU launches load with
    ``block_dim=1``, CUDA launches with the module's or the launch's block size. Hashing a kernel also sets
    ``kernel.grid_stride`` and, through ``Adjoint.get_references``, ``adj.kernel_dim`` and
    ``adj.tid_extent_limit_candidate``, which launches read.
    """
    live = list(module._get_live_kernels())
    if not live or any(k.is_generic for k in live) or len({k.key for k in live}) != len(live):
        return None
    if module.has_unresolved_static_expressions or not module.hashers:
        return None
    out = {}
    for block_dim, hasher in module.hashers.items():
        options = module.resolved_options.get(block_dim)
        if options is None or options.get("deterministic") or set(hasher.kernel_hashes.keys()) != set(live):
            return None
        kernels = {}
        for k in live:
            kernels[k.key] = {"hash": hasher.kernel_hashes[k].hex(), "grid_stride": bool(k.grid_stride),
                              "kernel_dim": int(k.adj.kernel_dim),
                              "tid_extent_limit_candidate": int(k.adj.tid_extent_limit_candidate)}  # fmt: skip
        out[str(block_dim)] = {"module_hash": hasher.get_hash().hex(), "kernels": kernels}
    return {"block_dims": out}


def module_options_text(module) -> str:
    """Warp's resolved options of a module (what its hash folds in), as stable text.

    Warp 1.19: ``Module.resolve_options(warp.config)`` returns the options ``ModuleHasher`` hashes.
    """
    options = module.resolve_options(wp.config)
    return ";".join(f"{k}:{options[k]}" for k in sorted(options))


def seed_module_hash(module, record: dict, device, kernels=()) -> bool:
    """Give a module its Warp hashes without Warp hashing it (no adjoint is resolved), from a
    :func:`module_hash_record` of the same content; Warp's ``Module.load`` then names, finds and loads the cached
    binary as usual.

    Called first with no kernels: tells whether the module is fresh and ``device``'s binary and metadata exist in
    the kernel cache for every recorded block size (the module is left as it was). Called again with the module's
    kernels (created meanwhile, keys as recorded) to set the hashes.

    The caller guarantees the record belongs to this exact content (its key covers every input of Warp's hash):
    a wrong record loads a wrong binary. A launch with a block size not recorded, or a later change to the module
    (``mark_modified``), makes Warp hash the module's real content.

    Warp 1.19: ``Module.get_module_hash(block_dim)`` returns ``hashers[block_dim].get_hash()`` when present and
    ``has_unresolved_static_expressions`` is False; ``Module.load`` then calls ``_compile``, which returns at once
    when ``<kernel_cache_dir>/<identifier>/<output name>`` exists, reads the ``.meta`` file and builds a
    ``ModuleExec`` whose symbol names come from ``hasher.kernel_hashes``; launches read ``kernel.grid_stride``,
    ``adj.kernel_dim`` and ``adj.tid_extent_limit_candidate`` (set while hashing, restored here).
    """
    import os
    import weakref

    ctx = wp._src.context
    entries = {int(bd): e for bd, e in record.get("block_dims", {}).items()}
    if not entries or module.has_unresolved_static_expressions:
        return False
    if not kernels and (module.hashers or module.execs):
        return False
    hashers = {}
    for block_dim, entry in entries.items():
        options = module.resolve_options(wp.config, block_dim=block_dim)
        if options.get("deterministic"):
            return False
        hasher = ctx.ModuleHasher.__new__(ctx.ModuleHasher)
        hasher.kernel_hashes = weakref.WeakKeyDictionary()
        hasher.function_hashes = {}
        hasher.functions_in_progress = set()
        hasher.unique_kernels = {}
        hasher.hash = bytes.fromhex(entry["module_hash"])
        hashers[block_dim] = (hasher, options)
    if not kernels:  # registering a kernel clears the hashes (Module.register_kernel calls mark_modified)
        dev = wp.get_device(device)
        found = True
        for block_dim, (hasher, options) in hashers.items():
            module.hashers[block_dim] = hasher
            module.resolved_options[block_dim] = options
            try:
                folder = os.path.join(wp.config.kernel_cache_dir, module.get_module_identifier(block_dim))
                binary = os.path.join(folder, module._get_compile_output_name(dev, block_dim=block_dim))
                meta = os.path.join(folder, module._get_meta_name(block_dim))
                found = found and os.path.isfile(binary) and os.path.isfile(meta)
            except Exception:
                found = False
        module.mark_modified()
        return found
    live = list(module._get_live_kernels())
    for block_dim, (hasher, options) in hashers.items():
        wanted = entries[block_dim]["kernels"]
        if sorted(k.key for k in live) != sorted(wanted) or len(live) != len(kernels):
            module.mark_modified()
            return False
        for k in live:
            r = wanted[k.key]
            digest = bytes.fromhex(r["hash"])
            k.hash = digest
            k.grid_stride = r["grid_stride"]
            k.adj.kernel_dim = r["kernel_dim"]
            k.adj.tid_extent_limit_candidate = r["tid_extent_limit_candidate"]
            hasher.kernel_hashes[k] = digest
            hasher.unique_kernels[digest] = k
        module.hashers[block_dim] = hasher
        module.resolved_options[block_dim] = options
    return True


def module_hashed(module) -> bool:
    """Whether Warp has loaded ``module`` and holds its hashes now (what :func:`module_hash_record` reads): False
    after a change marked it modified, until its next launch hashes it again.

    Warp 1.19: ``Module.execs`` (loaded binaries) and ``Module.hashers`` (emptied by ``mark_modified``).
    """
    return bool(module.execs) and bool(module.hashers)


class _SeededModule(wp.Module):
    """The class of a module while :func:`complete_before_rehash` has completions pending; never instantiated (a
    module's class is switched to it, and back to ``wp.Module`` once completed).

    Each override runs the pending completions first, and only where Warp is about to read the kernels' content:
    hashing the module for a block size it has no hash of, hashing it anew, generating its code, or building a
    kernel's adjoint for launch metadata. A launch of a module whose hashes are known costs one extra call.
    """

    def _wm_complete(self) -> None:
        completions = self.__dict__.pop("_wm_completions", ())
        self.__class__ = wp.Module
        hashers, options = dict(self.hashers), dict(self.resolved_options)
        for complete in completions:
            complete()
        # completing registers the kernels' functions in the module, which empties its hashes (mark_modified); the
        # content is the one the hashes were computed from (complete_before_rehash's contract), so they still hold
        for block_dim, hasher in hashers.items():
            self.hashers.setdefault(block_dim, hasher)
            self.resolved_options.setdefault(block_dim, options[block_dim])

    def get_module_hash(self, block_dim=None):
        bd = self.options["block_dim"] if block_dim is None else block_dim
        if bd not in self.hashers or self.has_unresolved_static_expressions:
            self._wm_complete()
        return wp.Module.get_module_hash(self, block_dim)

    def hash_module(self):
        self._wm_complete()
        return wp.Module.hash_module(self)

    def _run_codegen(self, *args, **kwargs):
        self._wm_complete()
        return wp.Module._run_codegen(self, *args, **kwargs)

    def _get_kernel_tid_extent_limit(self, *args, **kwargs):
        self._wm_complete()
        return wp.Module._get_kernel_tid_extent_limit(self, *args, **kwargs)


def complete_before_rehash(module, complete: Callable[[], None]) -> None:
    """Run ``complete()`` once, before Warp next reads the content of ``module``'s kernels.

    For a module given its hashes by :func:`seed_module_hash` whose kernels were made without what they call (the
    function is not built: Warp never reads it while the given hashes serve). Should Warp need the real content
    after all (the module marked modified and hashed anew, a launch with a block size not recorded, its code
    generated because the binary is gone, an ahead-of-time compile), ``complete()`` puts the missing functions in
    place first; it must not change the content, so the given hashes stay valid.

    Warp 1.19: hashing goes through ``Module.get_module_hash(block_dim)`` (which builds a ``ModuleHasher`` when
    ``block_dim`` is not in ``Module.hashers``) and ``Module.hash_module``; code generation through
    ``Module._run_codegen``; the launch-extent check through ``Module._get_kernel_tid_extent_limit``. The module's
    class is switched to a subclass overriding those four (plain Python classes, no ``__slots__``).
    """
    pending = module.__dict__.setdefault("_wm_completions", [])
    pending.append(complete)
    if type(module) is wp.Module:
        module.__class__ = _SeededModule


def type_code(t) -> str:
    """Warp's type code of a type (what its module hash folds in for an argument type).

    Warp 1.19: ``warp._src.types.get_type_code``.
    """
    return wp._src.types.get_type_code(t)


def is_struct_type(t) -> bool:
    """Whether ``t`` is a ``@wp.struct`` type (its ``hash`` attribute: Warp's digest of its fields).

    Warp 1.19: struct types are ``warp._src.codegen.Struct`` instances (not exported).
    """
    return isinstance(t, wp._src.codegen.Struct)


def constant_text(value) -> str | None:
    """A Warp value (scalar, vector, matrix, struct instance) as the text of its type and bytes, or None for anything
    else: what Warp's module hash folds in for a constant a function reads.

    Warp 1.19: ``warp._src.types.is_value`` tells Warp values; ``ModuleHasher.get_constant_bytes`` (not using its
    instance) gives their bytes.
    """
    if isinstance(value, (bool, int, float)) or not wp._src.types.is_value(value):
        return None
    try:
        data = wp._src.context.ModuleHasher.get_constant_bytes(None, value)
    except TypeError:
        return None
    return f"{type(value).__module__}.{type(value).__qualname__}:{data.hex()}"
