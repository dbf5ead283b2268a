"""Spatially coherent numbering of mesh variables (a Morton / Z-order space-filling curve).

Numbering vertices along a space-filling curve makes runs of consecutive indices compact in space:
the patches of consecutive Hessian rows used by the tiled assembly then share few elements with
each other, and the threads of a warp touch nearby memory.
"""

from __future__ import annotations

import numpy as np

__all__ = ["locality_order"]


def _spread_bits(v: np.ndarray) -> np.ndarray:
    """Insert two zero bits between each of the lower 21 bits of ``v`` (uint64)."""
    v = v & np.uint64(0x1FFFFF)
    v = (v | (v << np.uint64(32))) & np.uint64(0x1F00000000FFFF)
    v = (v | (v << np.uint64(16))) & np.uint64(0x1F0000FF0000FF)
    v = (v | (v << np.uint64(8))) & np.uint64(0x100F00F00F00F00F)
    v = (v | (v << np.uint64(4))) & np.uint64(0x10C30C30C30C30C3)
    v = (v | (v << np.uint64(2))) & np.uint64(0x1249249249249249)
    return v


def locality_order(points) -> np.ndarray:
    """Order of points along a 3D Morton (Z-order) curve.

    Args:
        points: (n, 2) or (n, 3) real coordinates (vertex positions, face centroids, ...).

    Returns:
        int64 array (n,): ``order[k]`` is the index of the k-th point along the curve, so
        ``points[order]`` is the reordered set (see :meth:`warp_meshad.TriMesh.reordered`).

    Raises:
        ValueError: ``points`` is not (n, 2) or (n, 3) or holds NaN/inf.
    """
    p = np.asarray(points, dtype=np.float64)
    if p.ndim != 2 or p.shape[1] not in (2, 3):
        raise ValueError(f"locality_order(points=...) must have shape (n, 2) or (n, 3), got {p.shape}")
    if not np.all(np.isfinite(p)):
        bad = np.flatnonzero(~np.all(np.isfinite(p), axis=1))
        raise ValueError(f"locality_order(points=...) has non-finite coordinates at rows {bad[:5].tolist()}")
    if p.shape[0] == 0:
        return np.zeros(0, dtype=np.int64)
    if p.shape[1] == 2:
        p = np.concatenate([p, np.zeros((p.shape[0], 1))], axis=1)
    lo, hi = p.min(axis=0), p.max(axis=0)
    scale = (2**21 - 1) / max(float(np.max(hi - lo)), 1e-300)
    q = np.floor((p - lo) * scale).astype(np.uint64)
    code = _spread_bits(q[:, 0]) | (_spread_bits(q[:, 1]) << np.uint64(1)) | (_spread_bits(q[:, 2]) << np.uint64(2))
    return np.argsort(code, kind="stable").astype(np.int64)
