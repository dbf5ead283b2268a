"""cuDSS's analysis cache on disk (``CudssSolver(analysis_cache=...)``): one ``.npz`` per sparsity pattern, matrix
type and analysis options, holding the fill-reducing ordering and the nested-dissection partition tree of a plan.
Here: the option's check and its environment variable (``_check_analysis_cache_option``), handing a cached entry to
an unplanned solver (``_apply_cached_analysis``), writing one after a plan (``_save_analysis``), and the size limit
that deletes the entries used least recently (``_prune_analysis_cache``, ``_analysis_cache_limit_bytes``).

Not here: the key of an entry, which depends on the solver's options (``CudssSolver._analysis_key`` in ``cudss.py``).
The functions take cuDSS's bindings (``nvmath.bindings.cudss``) as an argument and import nothing optional.
"""

from __future__ import annotations

import os

import numpy as np
import warp as wp

from warp_meshad._src.solve.linear.base import _logger

__all__ = ["ANALYSIS_CACHE_FOLDER", "ANALYSIS_CACHE_LIMIT_VARIABLE", "ANALYSIS_CACHE_VARIABLE"]

ANALYSIS_CACHE_VARIABLE = "WARP_MESHAD_CUDSS_ANALYSIS_CACHE"
"""Environment variable: ``CudssSolver``'s analysis cache when the option is not given (a folder, ``auto`` (the
default) or ``0``/``off``)."""
ANALYSIS_CACHE_FOLDER = "warp_meshad_cudss"
"""``CudssSolver(analysis_cache="auto")``: this folder in Warp's kernel cache."""
ANALYSIS_CACHE_LIMIT_VARIABLE = "WARP_MESHAD_CUDSS_ANALYSIS_CACHE_MB"
"""Environment variable: the analysis cache's size limit in MiB (default 1024); past it, the entries used least
recently are deleted after each save."""


def _analysis_cache_limit_bytes() -> int:
    text = os.environ.get(ANALYSIS_CACHE_LIMIT_VARIABLE, "").strip()
    try:
        mib = float(text) if text else 1024.0
    except ValueError:
        raise ValueError(f"{ANALYSIS_CACHE_LIMIT_VARIABLE}: expected a number of MiB, got {text!r}") from None
    if not mib > 0.0:
        raise ValueError(f"{ANALYSIS_CACHE_LIMIT_VARIABLE}: expected a number of MiB > 0, got {text!r}")
    return int(mib * 1024 * 1024)


def _prune_analysis_cache(folder, limit_bytes: int, keep=None) -> list:
    """Delete the ``.npz`` entries of ``folder`` used least recently (oldest modification time: a hit touches its
    entry) until the rest fit in ``limit_bytes``; ``keep`` (the entry just written) stays. Returns the deleted
    paths. Entries that vanish meanwhile (another process pruning) are skipped."""
    entries = []
    try:
        with os.scandir(folder) as it:
            for e in it:
                if e.name.endswith(".npz") and e.is_file():
                    try:
                        st = e.stat()
                    except OSError:
                        continue
                    entries.append((st.st_mtime, st.st_size, e.path))
    except OSError:
        return []
    total = sum(size for _, size, _ in entries)
    deleted = []
    for _, size, path in sorted(entries):
        if total <= limit_bytes:
            break
        if keep is not None and os.path.abspath(path) == os.path.abspath(keep):
            continue
        try:
            os.remove(path)
        except OSError:
            continue
        total -= size
        deleted.append(path)
    return deleted


def _check_analysis_cache_option(analysis_cache):
    """``CudssSolver(analysis_cache=...)``: None (the environment's choice), False, ``"auto"`` or a folder, as a
    ``pathlib.Path`` (or None: off)."""
    import pathlib

    if analysis_cache is None:
        analysis_cache = os.environ.get(ANALYSIS_CACHE_VARIABLE, "").strip() or "auto"
        if analysis_cache in ("0", "off", "false", "no"):
            analysis_cache = False
    if analysis_cache is False:
        return None
    if isinstance(analysis_cache, str) and analysis_cache == "auto":
        root = wp.config.kernel_cache_dir
        if root is None:
            wp.init()  # sets the kernel cache folder
            root = wp.config.kernel_cache_dir
        return pathlib.Path(root) / ANALYSIS_CACHE_FOLDER
    if not isinstance(analysis_cache, (str, pathlib.PurePath)):
        raise ValueError(f"analysis_cache: expected None, False, 'auto' or a folder (str or path), got "
                         f"{type(analysis_cache).__name__}")
    return pathlib.Path(analysis_cache)


def _apply_cached_analysis(cudss, solver, path, n: int) -> bool:
    """Hand a cached ordering and partition tree (``path``, an ``.npz``) to the unplanned ``solver``: True if there
    was one that cuDSS took, False otherwise (no file, unreadable, wrong size: cuDSS analyses as usual)."""
    try:
        with np.load(path) as f:
            perm = np.ascontiguousarray(f["perm"], dtype=np.int32)
            tree = np.ascontiguousarray(f["tree"], dtype=np.uint8)
    except (OSError, KeyError, ValueError):
        return False
    if perm.shape != (n,) or tree.size == 0:
        return False
    try:
        cudss.data_set(solver.handle, solver.data_ptr, cudss.DataParam.USER_PERM, perm.ctypes.data, perm.nbytes)
        cudss.data_set(solver.handle, solver.data_ptr, cudss.DataParam.USER_ND_PARTITION_TREE, tree.ctypes.data,
                       tree.nbytes)
    except Exception as exc:  # an older cuDSS without the tree: plan without the cache (its ordering is not set twice)
        _logger.info("cudss: the cached analysis %s was not taken (%s: %s)", path, type(exc).__name__, exc)
        return False
    try:
        os.utime(path)  # used now: the size limit deletes the entries used least recently first
    except OSError:
        pass
    return True


def _save_analysis(cudss, solver, path, n: int) -> None:
    """Write the planned ``solver``'s ordering and partition tree to ``path`` (atomically); failures are logged."""
    import tempfile

    try:
        out = {}
        for key, param in (("perm", cudss.DataParam.PERM_REORDER_ROW), ("tree", cudss.DataParam.ND_PARTITION_TREE)):
            # cuDSS wants the exact size: ask for it first (a null value with size 0 writes the size needed)
            written = np.zeros(1, dtype=np.uint64)
            cudss.data_get(solver.handle, solver.data_ptr, param, 0, 0, written.ctypes.data)
            buf = np.empty(int(written[0]), dtype=np.uint8)
            cudss.data_get(solver.handle, solver.data_ptr, param, buf.ctypes.data, buf.nbytes, written.ctypes.data)
            out[key] = buf
        perm, tree = out["perm"].view(np.int32), out["tree"]
        if perm.shape != (n,):
            raise ValueError(f"expected an ordering of {n} rows, cuDSS gave {perm.shape[0]}")
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            np.savez(f, perm=perm, tree=tree)
        os.replace(tmp, path)
        _prune_analysis_cache(path.parent, _analysis_cache_limit_bytes(), keep=path)
    except Exception as exc:
        _logger.warning("cudss: could not keep the analysis in %s (%s: %s)", path, type(exc).__name__, exc)
