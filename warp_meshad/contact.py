"""Contact between surfaces: broad-phase pair search, continuous collision detection step bounds, and checks.

:func:`find_contact_pairs` (or a :class:`ContactSearch` kept across calls) finds the point-triangle and edge-edge
pairs closer than a distance (:class:`ContactPairs`: the ``elements`` of contact terms); :func:`max_step` and
:func:`plane_max_step` bound a step so that no pair, or no vertex and plane, collides (CCD);
:func:`edge_edge_mollifier_thresholds` gives the edge-edge barrier's mollifier thresholds; and
:func:`intersecting_face_pairs` checks a mesh for intersecting faces.
"""

from warp_meshad._src.contact.search import (
    ContactPairs,
    ContactSearch,
    edge_edge_mollifier_thresholds,
    find_contact_pairs,
    intersecting_face_pairs,
    max_step,
    plane_max_step,
)

__all__ = [
    "ContactPairs",
    "ContactSearch",
    "edge_edge_mollifier_thresholds",
    "find_contact_pairs",
    "intersecting_face_pairs",
    "max_step",
    "plane_max_step",
]
