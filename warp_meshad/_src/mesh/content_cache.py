"""Results of pure mesh computations kept on disk and keyed by their inputs' content, for the runs of the apps: the
arrays parsed from a mesh file (:meth:`~warp_meshad.TriMesh.from_file`) and a Tutte embedding
(:func:`~warp_meshad.tutte_embedding`). A warm ``warp-meshad run param/armadillo`` then neither parses the OBJ file
nor imports SciPy and factorizes the Laplacian to find its start point.

The cache is used only inside :func:`enabled` (the app runner builds its app there); elsewhere :func:`cached` just
computes. An entry is one ``.npz`` (no pickles) under ``$WARP_MESHAD_CACHE_PATH/content-<FORMAT>/`` (default root
``~/.cache/warp_meshad``), named by a SHA-256 over: its kind, the inputs' bytes (a file's content, a mesh's vertex and
face arrays with their dtypes and shapes), the source of every module of ``warp_meshad/_src/mesh/`` (the code that
computed it), numpy's version and the installed files of SciPy, QDLDL and trimesh (path, size and time of their
``__init__``, found without importing them). So a changed input, a changed reader or a changed library
gives a new entry; nothing is ever invalidated by hand. An entry that cannot be read (damaged, half-written by a
killed process: writes are atomic, so only a damaged disk gives one) is computed again and replaced; a cache folder
that cannot be written costs the write only. Past :data:`LIMIT_VARIABLE` MiB (default 256) the entries used least
recently are deleted after each write. ``WARP_MESHAD_CONTENT_CACHE=0`` turns the cache off.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import pathlib
import tempfile
import threading

import numpy as np

__all__ = ["FORMAT", "LIMIT_VARIABLE", "SWITCH_VARIABLE", "cache_folder", "cached", "enabled", "is_enabled"]

FORMAT = 1
SWITCH_VARIABLE = "WARP_MESHAD_CONTENT_CACHE"
LIMIT_VARIABLE = "WARP_MESHAD_CONTENT_CACHE_MB"
_state = threading.local()


def cache_folder() -> pathlib.Path:
    """``$WARP_MESHAD_CACHE_PATH/content-<FORMAT>`` (default root ``~/.cache/warp_meshad``, as the generated dual
    modules' root)."""
    root = os.environ.get("WARP_MESHAD_CACHE_PATH")
    if not root:
        root = os.path.join(os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "warp_meshad")
    return pathlib.Path(root) / f"content-{FORMAT}"


@contextlib.contextmanager
def enabled():
    """Use the cache in this thread inside the block (unless ``WARP_MESHAD_CONTENT_CACHE`` is ``0``/``off``)."""
    depth = getattr(_state, "depth", 0)
    _state.depth = depth + 1
    try:
        yield
    finally:
        _state.depth = depth


def is_enabled() -> bool:
    """Whether :func:`cached` reads and writes entries here and now."""
    if not getattr(_state, "depth", 0):
        return False
    return os.environ.get(SWITCH_VARIABLE, "1").strip().lower() not in ("0", "off", "false", "no")


@functools.lru_cache(maxsize=1)
def _code_digest() -> str:
    """SHA-256 of the mesh modules' sources and the library versions the cached results depend on."""
    import importlib.util

    h = hashlib.sha256(f"format {FORMAT}\nnumpy {np.__version__}\n".encode())
    for name in ("scipy", "qdldl", "trimesh"):  # found, not imported: an install rewrites the file (its size, time)
        try:
            origin = importlib.util.find_spec(name).origin
            st = os.stat(origin)
            h.update(f"{name} {origin} {st.st_size} {st.st_mtime_ns}\n".encode())
        except Exception:  # not installed: results that need it are not computed either
            h.update(f"{name} -\n".encode())
    for path in sorted(pathlib.Path(__file__).resolve().parent.glob("*.py")):
        h.update(path.name.encode() + b"\0" + path.read_bytes())
    return h.hexdigest()


def _key(kind: str, parts) -> str:
    h = hashlib.sha256(f"{kind}\0{_code_digest()}\0".encode())
    for part in parts:
        if isinstance(part, np.ndarray):
            a = np.ascontiguousarray(part)
            h.update(f"array {a.dtype.str} {a.shape}\0".encode())
            h.update(memoryview(a).cast("B"))
        elif isinstance(part, (bytes, bytearray, memoryview)):
            h.update(b"bytes\0")
            h.update(part)
        else:
            h.update(f"{type(part).__name__} {part!r}\0".encode())
    return h.hexdigest()[:40]


def _limit_bytes() -> int:
    text = os.environ.get(LIMIT_VARIABLE, "").strip()
    try:
        mib = float(text) if text else 256.0
    except ValueError:
        raise ValueError(f"{LIMIT_VARIABLE}: expected a number of MiB, got {text!r}") from None
    return int(max(mib, 0.0) * 1024 * 1024)


def _prune(folder: pathlib.Path, keep: pathlib.Path) -> None:
    """Delete the entries used least recently (oldest modification time: a hit touches its entry) until the folder
    holds at most :data:`LIMIT_VARIABLE` MiB; ``keep`` stays."""
    entries = []
    try:
        with os.scandir(folder) as it:
            for e in it:
                if e.name.endswith(".npz"):
                    try:
                        st = e.stat()
                    except OSError:
                        continue
                    entries.append((st.st_mtime, st.st_size, e.path))
    except OSError:
        return
    total, limit = sum(size for _, size, _ in entries), _limit_bytes()
    for _, size, path in sorted(entries):
        if total <= limit:
            break
        if os.path.abspath(path) == os.path.abspath(keep):
            continue
        with contextlib.suppress(OSError):
            os.remove(path)
            total -= size


def cached(kind: str, parts, compute, names: tuple[str, ...]) -> dict[str, np.ndarray]:
    """``compute()``'s arrays, from the cache when an entry for ``(kind, parts)`` exists (see the module docstring).

    Args:
        kind: what is cached (``"obj-file"``, ``"tutte"``); part of the key and of the file name.
        parts: the inputs: arrays, bytes, or values whose ``repr`` identifies them (an option's value).
        compute: ``() -> {name: np.ndarray}``, the computation; its exceptions pass through and cache nothing.
        names: the names ``compute`` returns; an entry lacking one is computed again.

    Returns:
        ``{name: array}`` (a cached entry's arrays are fresh, writable copies).
    """
    if not is_enabled():
        return compute()
    folder = cache_folder()
    path = folder / f"{kind}-{_key(kind, parts)}.npz"
    try:
        with np.load(path, allow_pickle=False) as z:
            if set(names) <= set(z.files):
                out = {n: np.array(z[n]) for n in names}
                with contextlib.suppress(OSError):
                    os.utime(path)
                return out
    except FileNotFoundError:
        pass
    except Exception:  # damaged: computed again and replaced below
        pass
    out = compute()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.stem}.", suffix=".npz", dir=folder)
        try:
            with os.fdopen(fd, "wb") as f:
                np.savez(f, **{n: np.asarray(out[n]) for n in names})
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        _prune(folder, path)
    except OSError:
        pass  # a read-only or full cache folder costs only this entry
    return out
