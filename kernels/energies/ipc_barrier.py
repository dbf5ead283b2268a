"""IPC log barriers on point-triangle and edge-edge squared distances (with the edge-edge mollifier).

    b(d) = -kappa (d - d^2_hat)^2 log(d / d^2_hat)    if 0 < d < d^2_hat,
           0                                        if d >= d^2_hat,
           +inf                                     if d <= 0 (contact or crossing),

    E_pt(p, a, b, c)       = b(d_pt(p, a, b, c)),
    E_ee(a0, a1, b0, b1)   = m(c(x)) b(d_ee(a0, a1, b0, b1)),

with d the *squared* distance (the IPC toolkit's convention, which avoids square roots and keeps the
barrier smooth), d_pt the point-triangle and d_ee the edge-edge squared distance of
:mod:`warp_meshad.kernels.contact.distance` (all closest-feature cases), and m the edge-edge
mollifier m(c) = -c^2/eps_x^2 + 2 c/eps_x for c = |(a1 - a0) x (b1 - b0)|^2 < eps_x, 1 otherwise,
eps_x = 1e-3 |a1_rest - a0_rest|^2 |b1_rest - b0_rest|^2 (one value per edge-edge pair).

Parameters:
    p, a, b, c / a0, a1, b0, b1: vertex positions [m] (vec3, float64 problems).
    activation_distance (d_hat): unsigned distance below which the barrier acts [m], > 0; the
        barrier compares d with d_hat^2.
    stiffness (kappa): barrier stiffness [J / m^4] (b is a function of squared lengths); energies
        are in [J].
    mollifier_threshold (eps_x): per edge-edge element, shape [pair_count], float64 [m^4]; compute it
        from the rest positions with ``warp_meshad._src.contact.edge_edge_mollifier_thresholds``.

Elements: point-triangle rows ``[p, a, b, c]`` (a vertex and a face not containing it), edge-edge
rows ``[a0, a1, b0, b1]`` (two edges sharing no vertex), as produced by the candidate search.

Source: M. Li, Z. Ferguson, T. Schneider, T. Langlois, D. Zorin, D. Panozzo, C. Jiang, D. M. Kaufman,
"Incremental Potential Contact: Intersection- and Inversion-free, Large-Deformation Dynamics",
ACM TOG 39(4), SIGGRAPH 2020 (barrier Eq. 6, mollifier Sec. 4.3 / supplement).

Invariants: E >= 0; E = 0 with zero gradient and Hessian at and beyond d_hat (b is C2 at
d = d_hat^2); E -> +inf as the distance -> 0, and E = +inf at distance 0, which a line search treats
as a rejected step (bound the step with continuous collision detection so no step tunnels through);
invariant under rigid motions; the edge-edge energy is 0 for exactly parallel edges and C1 in x
(the mollifier's second derivative jumps at c = eps_x); b is convex in d on (0, d_hat^2), the
energy in x is not: use ``eval_with_hessian_proj`` in Newton.
"""

from typing import Any

import warp as wp

from warp_meshad.kernels import ad
from warp_meshad.kernels.contact.distance import (
    edge_edge_distance_sq,
    edge_edge_mollifier,
    point_triangle_distance_sq,
)

__all__ = [
    "BarrierData",
    "EdgeEdgeBarrierData",
    "edge_edge_barrier",
    "ipc_barrier",
    "point_triangle_barrier",
]


@wp.struct
class BarrierData:
    """activation_distance d_hat [m] and stiffness kappa [J/m^4] (float64)."""

    activation_distance: wp.float64
    stiffness: wp.float64


@wp.struct
class EdgeEdgeBarrierData:
    """d_hat [m], kappa [J/m^4], and the mollifier threshold eps_x per edge-edge element [m^4], shape [pair_count]."""

    activation_distance: wp.float64
    stiffness: wp.float64
    mollifier_threshold: wp.array(dtype=wp.float64)


@wp.func
def ipc_barrier(d: Any, dhat_sq: wp.float64):
    """-(d - dhat_sq)^2 log(d / dhat_sq) for 0 < d < dhat_sq (no range checks; plain or dual d)."""
    gap = d - dhat_sq
    return -(gap * gap) * ad.log(d / dhat_sq)


@wp.func
def point_triangle_barrier(e: int, p: Any, a: Any, b: Any, c: Any, data: BarrierData):
    """kappa b(d_pt(p, triangle abc)); +inf at zero distance, 0 beyond d_hat."""
    d = point_triangle_distance_sq(p, a, b, c)
    dhat_sq = data.activation_distance * data.activation_distance
    if d <= 0.0:
        return wp.float64(wp.inf)
    if d >= dhat_sq:
        return 0.0
    return data.stiffness * ipc_barrier(d, dhat_sq)


@wp.func
def edge_edge_barrier(e: int, a0: Any, a1: Any, b0: Any, b1: Any, data: EdgeEdgeBarrierData):
    """kappa m(c) b(d_ee(edge a0a1, edge b0b1)); +inf at zero distance, 0 beyond d_hat."""
    d = edge_edge_distance_sq(a0, a1, b0, b1)
    dhat_sq = data.activation_distance * data.activation_distance
    if d <= 0.0:
        return wp.float64(wp.inf)
    if d >= dhat_sq:
        return 0.0
    m = edge_edge_mollifier(a0, a1, b0, b1, data.mollifier_threshold[e])
    return data.stiffness * m * ipc_barrier(d, dhat_sq)
