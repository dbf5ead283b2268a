"""The vertex side shared by TriMesh and TetMesh: vertex count, positions, the per-vertex stencil and bounds."""

from __future__ import annotations

import functools

import numpy as np

from warp_meshad._src.mesh.checks import MeshError, readonly

__all__ = ["VertexMesh"]


class VertexMesh:
    """The vertex side of `TriMesh` and `TetMesh`: counts, positions and bounds (``source`` and ``_vertices`` are set
    by the subclass)."""

    source: str
    _vertices: np.ndarray

    @property
    def vertex_count(self) -> int:
        """Number of vertices n."""
        return self._vertices.shape[0]

    @property
    def vertices(self) -> np.ndarray:
        """Vertex positions, float64, shape (vertex_count, 3), C-contiguous, read-only."""
        return self._vertices

    @functools.cached_property
    def vertex_indices(self) -> np.ndarray:
        """Per-vertex stencil (V): ``arange(vertex_count)``, int32, shape (vertex_count, 1)."""
        return readonly(np.arange(self.vertex_count, dtype=np.int32).reshape(-1, 1))

    def _positions(self, x) -> np.ndarray:
        if x is None:
            return self._vertices
        if hasattr(x, "numpy") and not isinstance(x, np.ndarray):  # e.g. a wp.array of vec3d
            x = x.numpy()
        x = np.asarray(x, dtype=np.float64)
        if x.shape != (self.vertex_count, 3):
            raise MeshError(f"{self.source}: positions have shape {x.shape}; expected ({self.vertex_count}, 3)")
        return x

    def bounding_box(self, x=None) -> tuple[np.ndarray, np.ndarray]:
        """Axis-aligned bounds ``(min, max)``, each float64 of shape (3,).

        Args:
            x: positions, shape (vertex_count, 3); defaults to `vertices`.
        """
        x = self._positions(x)
        return x.min(axis=0), x.max(axis=0)
