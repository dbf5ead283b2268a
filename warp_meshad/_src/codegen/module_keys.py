"""Keys of generated term modules, computed from warp_meshad's own inputs, and what Warp's hash was for each.

Warp names a module's cached binary by a hash of its content, which it computes on the first launch in every
process by resolving the references of every function the module reaches (for a float64 Hessian module: ~180
adjoints of the dual library, 0.2-0.5 s of Python per module), after the dual library itself was imported (its
~460 ``@wp.func`` parsed and registered: ~0.3 s per dual module). A term module is a function of inputs warp_meshad
knows before any of that: the code generators' source files, the term's shape, mode and variant, the energy's
source and what its names refer to, the data struct, Warp's version and the module's resolved options.
:func:`term_key` digests those; :func:`lookup` / :func:`store` keep, per key, Warp's module and kernel hashes (and
the names and return type the generated code had), in ``<kernel_cache_dir>/warp_meshad_keys/`` beside the binaries
(emptying Warp's cache empties these too).

The key over-approximates Warp's hash inputs: every name the energy (and each user function it calls) reads is
resolved and described by value; a name whose value cannot be described stably (an arbitrary Python object) gives
no key, and the term takes Warp's normal path. So equal keys imply equal Warp hashes, and a changed energy, helper,
constant, generator or option gives a new key (a miss: Warp's normal path, then the new record).
"""

from __future__ import annotations

import ast
import builtins
import hashlib
import inspect
import json
import os
import pathlib
import textwrap
import types

import warp as wp

from warp_meshad._src.codegen.warp_compat import constant_text, is_struct_type, type_code

__all__ = ["energy_digest", "generator_digest", "lookup", "store", "term_key", "type_digest"]

FORMAT = "1"  # bump when the record's content or meaning changes
_generator: str | None = None
_MISSING = object()


def generator_digest() -> str:
    """Digest of the code generators' source files (warp_meshad's codegen package and the dual-library generator):
    a change to any of them may change the generated text Warp hashes."""
    global _generator
    if _generator is None:
        from warp_meshad.kernels import _dualgen

        h = hashlib.sha256(FORMAT.encode())
        files = sorted(pathlib.Path(__file__).parent.glob("*.py")) + [pathlib.Path(_dualgen.__file__)]
        for f in files:
            h.update(f.name.encode())
            h.update(f.read_bytes())
        _generator = h.hexdigest()
    return _generator


def _describe(value, seen: set, h) -> bool:
    """Fold a stable description of a value an energy's name refers to into ``h``; False when there is none."""
    if value is None or isinstance(value, (bool, int, float, complex, str, bytes)):
        h.update(f"{type(value).__name__}:{value!r};".encode())
        return True
    if isinstance(value, types.ModuleType):
        h.update(f"module:{value.__name__};".encode())
        return True
    if isinstance(value, wp.Function):
        return _function(value, seen, h)
    if isinstance(value, type) or is_struct_type(value):
        return _type(value, h)
    text = constant_text(value)
    if text is not None:
        h.update(f"value:{text};".encode())
        return True
    owner = getattr(value, "__module__", None) or ""
    if callable(value) and (owner in ("builtins", "warp") or owner.startswith("warp.")):
        h.update(f"py:{owner}.{getattr(value, '__qualname__', '')};".encode())  # pinned by Python's / Warp's version
        return True
    return False


def _type(t, h) -> bool:
    """Fold a type by its Warp type code (a ``@wp.struct`` also by Warp's hash of its fields)."""
    try:
        code = type_code(t)
    except Exception:
        return False
    h.update(f"type:{code};".encode())
    if is_struct_type(t):
        h.update(t.hash)
    return True


def _function(fn: wp.Function, seen: set, h) -> bool:
    """Fold a Warp function: a builtin or library function by name, a user function by source and names."""
    if fn in seen:
        h.update(f"seen:{fn.key};".encode())
        return True
    seen.add(fn)
    if fn.func is None or fn.is_builtin():
        h.update(f"builtin-func:{fn.key};".encode())
        return True
    mod = getattr(fn.func, "__module__", "") or ""
    if mod == "warp" or mod.startswith("warp."):
        h.update(f"warp-func:{mod}.{fn.key};".encode())  # Warp's own functions: pinned by Warp's version
        return True
    # the overloads the user declared; not the concrete ones Warp instantiates from a generic one as code calls it
    # with new types (their source is the template's, and how many exist depends on what this process built)
    overloads = [fn]
    for o in (*getattr(fn, "user_overloads", {}).values(), *getattr(fn, "user_templates", {}).values()):
        if o not in overloads and getattr(o, "generic_parent", None) is None:
            overloads.append(o)
    for o in overloads:
        if o.func is None or not _python_function(o.func, seen, h):
            return False
    return True


_SOURCES: dict = {}  # code object -> (source, the names it reads in walk order) or None: see _read_names


def _read_names(func):
    """A Python function's source and the names it reads, in the order :func:`_python_function` folds them, each
    once: ``("attr", path, base, chain)`` for an attribute chain on a name, ``("name", id)`` for a bare name. Both are
    functions of the code object alone (the values are resolved on every call), so they are kept per code object:
    a function's source is read and parsed once per process. None when the source is not available."""
    code = func.__code__
    if code in _SOURCES:
        return _SOURCES[code]
    try:
        src = textwrap.dedent(inspect.getsource(func))
        tree = ast.parse(src)
    except (OSError, TypeError, SyntaxError):
        _SOURCES[code] = None
        return None
    names, done = [], set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            chain, base = [], node
            while isinstance(base, ast.Attribute):
                chain.append(base.attr)
                base = base.value
            if not isinstance(base, ast.Name):
                continue
            path = ".".join([base.id, *reversed(chain)])
            if path not in done:
                done.add(path)
                names.append(("attr", path, base.id, tuple(reversed(chain))))
        elif isinstance(node, ast.Name) and node.id not in done:
            done.add(node.id)
            names.append(("name", node.id))
    _SOURCES[code] = (src, tuple(names))
    return _SOURCES[code]


def _python_function(func, seen: set, h) -> bool:
    """Fold a Python function's source and every name it reads (globals, closure cells, attribute chains)."""
    read = _read_names(func)
    if read is None:
        return False
    src, names = read
    h.update(f"func:{func.__module__}.{func.__qualname__}:{len(src)}:".encode())
    h.update(src.encode())
    scope = dict(func.__globals__)
    if func.__closure__:
        for name, cell in zip(func.__code__.co_freevars, func.__closure__):
            try:
                scope[name] = cell.cell_contents
            except ValueError:
                return False
    for entry in names:
        if entry[0] == "attr":
            _, path, base, chain = entry
            value = scope.get(base, _MISSING)
            for attr in chain:
                if value is _MISSING:
                    break
                value = getattr(value, attr, _MISSING)
            if value is _MISSING or isinstance(value, types.ModuleType) and base in scope:
                h.update(f"attr:{path}:{'?' if value is _MISSING else 'module:' + value.__name__};".encode())
                continue
            h.update(f"attr:{path}=".encode())
            if not _describe(value, seen, h):
                return False
        else:
            name = entry[1]
            value = scope.get(name, _MISSING)
            if value is _MISSING:  # a local, an argument or a Python builtin: the source says which
                h.update(f"name:{name}:{'builtin' if hasattr(builtins, name) else 'local'};".encode())
                continue
            h.update(f"name:{name}=".encode())
            if not _describe(value, seen, h):
                return False
    return True


def energy_digest(energy: wp.Function) -> str | None:
    """Digest of an energy's source and of everything its names refer to (user functions it calls, recursively,
    constants by value, types by Warp type code); None when a name refers to something without a stable
    description."""
    h = hashlib.sha256()
    return h.hexdigest() if _function(energy, set(), h) else None


def type_digest(t) -> str | None:
    """A stable text of a type (a data struct: its fields by Warp's struct hash), or None."""
    if t is None:
        return "none"
    h = hashlib.sha256()
    return h.hexdigest() if _type(t, h) else None


def term_key(module, parts: tuple) -> str | None:
    """The key of a generated term module: the generators, Warp's version and the module's resolved options, its
    name, and ``parts`` (the energy's :func:`energy_digest`, the term's shape, mode, variant, kernel facts, data
    struct; each already a stable text or None, which gives no key)."""
    if any(p is None for p in parts):
        return None
    from warp_meshad._src.codegen.warp_compat import module_options_text

    h = hashlib.sha256()
    for p in (generator_digest(), wp.config.version, module.name, module_options_text(module), *parts):
        h.update(str(p).encode())
        h.update(b"\0")
    return h.hexdigest()


def _folder() -> pathlib.Path | None:
    root = wp.config.kernel_cache_dir
    return pathlib.Path(root) / "warp_meshad_keys" if root else None


def lookup(key: str | None) -> dict | None:
    """The record stored for a key, or None."""
    folder = _folder()
    if key is None or folder is None:
        return None
    try:
        with open(folder / f"{key}.json") as f:
            rec = json.load(f)
    except (OSError, ValueError):
        return None
    return rec if rec.get("format") == FORMAT and rec.get("key") == key else None


def store(key: str | None, record: dict) -> None:
    """Keep a record for a key (written atomically; a read-only cache folder is not an error)."""
    folder = _folder()
    if key is None or folder is None:
        return
    try:
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f"{key}.{os.getpid()}.tmp"
        tmp.write_text(json.dumps({"format": FORMAT, "key": key, **record}, sort_keys=True))
        os.replace(tmp, folder / f"{key}.json")
    except OSError:
        pass
