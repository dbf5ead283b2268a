"""Contact geometry on the device: squared distances, continuous collision detection, intersection tests.

- :mod:`.distance`: point-triangle and edge-edge squared distances (all closest-feature cases) and
  the edge-edge mollifier, as ``@wp.func`` that run on plain ``wp.vec3d`` and inside energies
  (dual numbers).
- :mod:`.ccd`: additive continuous collision detection (Li et al. 2021) of point-triangle and
  edge-edge pairs over a linear step: a safe time of impact in [0, t_max].
- :mod:`.intersection`: triangle-triangle intersection test (float64 orientation predicates) for
  Warp kernels, and a vectorized NumPy version for host checks.

The contact energies built on these live in :mod:`warp_meshad.kernels.energies` (``ipc_barrier``,
``ground_plane``); host-side candidate search and step bounds in ``warp_meshad._src.contact.search``.
"""

from .ccd import edge_edge_ccd, point_triangle_ccd
from .distance import (
    edge_edge_cross_sq,
    edge_edge_distance_sq,
    edge_edge_distance_type,
    edge_edge_mollifier,
    edge_edge_mollifier_threshold,
    line_line_distance_sq,
    point_edge_distance_sq,
    point_edge_distance_type,
    point_line_distance_sq,
    point_plane_distance_sq,
    point_point_distance_sq,
    point_triangle_distance_sq,
    point_triangle_distance_type,
)
from .intersection import segment_triangle_intersect, triangles_intersect, triangles_intersect_np

__all__ = [
    "edge_edge_ccd",
    "edge_edge_cross_sq",
    "edge_edge_distance_sq",
    "edge_edge_distance_type",
    "edge_edge_mollifier",
    "edge_edge_mollifier_threshold",
    "line_line_distance_sq",
    "point_edge_distance_sq",
    "point_edge_distance_type",
    "point_line_distance_sq",
    "point_plane_distance_sq",
    "point_point_distance_sq",
    "point_triangle_ccd",
    "point_triangle_distance_sq",
    "point_triangle_distance_type",
    "segment_triangle_intersect",
    "triangles_intersect",
    "triangles_intersect_np",
]
