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
    "function_return_types",
    "generate_module_code",
    "install_module_hooks",
    "is_struct_instance",
    "loaded_binary",
    "matrix_pattern_version",
    "register_function",
    "set_matrix_pattern_version",
    "struct_type",
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
