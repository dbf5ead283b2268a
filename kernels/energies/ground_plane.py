"""IPC log barrier keeping one vertex above a plane (ground or box wall).

    s_i = n . (x_i - o)                    (signed distance to the plane, n a unit normal),
    E_i(x_i) = -kappa (s_i^2 - d_hat^2)^2 log(s_i^2 / d_hat^2)    if 0 < s_i < d_hat,
               0                                                if s_i >= d_hat,
               +inf                                             if s_i <= 0 (on or below the plane).

The barrier acts on the squared distance d = s^2, as the point-triangle and edge-edge barriers of
:mod:`warp_meshad.kernels.energies.ipc_barrier`, so one stiffness kappa serves all contact terms.
Box walls are one term per wall (each with its own plane).

Parameters:
    x_i: position of vertex i [m] (vec3, float64 problems).
    origin (o): a point of the plane [m], vec3d; normal (n): unit normal pointing to the free side, vec3d.
    activation_distance (d_hat): distance below which the barrier acts [m], > 0.
    stiffness (kappa): barrier stiffness [J / m^4]; E_i is in [J].

Source: the barrier of M. Li et al., "Incremental Potential Contact: Intersection- and
Inversion-free, Large-Deformation Dynamics", ACM TOG 39(4), SIGGRAPH 2020, with the point-plane
distance (the IPC toolkit's planar obstacles).

Invariants: E_i >= 0; E_i = 0 with zero gradient and Hessian at and beyond d_hat (C2 there);
E_i -> +inf as s_i -> 0+, E_i = +inf on or below the plane (a rejected line-search step; the exact
step bound for a plane is the time a vertex reaches it); depends on x_i only through s_i, so it is
invariant under motions within the plane; its Hessian kappa b''(s^2) (2 s)^2 n n^T + 2 kappa b'(s^2) n n^T
is PSD (b is convex and decreasing in d on (0, d_hat^2)).
"""

from typing import Any

import warp as wp

from warp_meshad.kernels import ad

__all__ = ["GroundPlaneData", "ground_plane_barrier"]


@wp.struct
class GroundPlaneData:
    """origin [m] and unit normal of the plane (vec3d), activation distance d_hat [m], stiffness kappa [J/m^4]."""

    origin: wp.vec3d
    normal: wp.vec3d
    activation_distance: wp.float64
    stiffness: wp.float64


@wp.func
def ground_plane_barrier(i: int, x: Any, data: GroundPlaneData):
    """-kappa (s^2 - d_hat^2)^2 log(s^2 / d_hat^2) for 0 < s < d_hat, 0 beyond, +inf below; s = n . (x - o)."""
    s = ad.dot(x - data.origin, data.normal)
    if s <= 0.0:
        return wp.float64(wp.inf)
    if s >= data.activation_distance:
        return 0.0
    d = s * s
    dhat_sq = data.activation_distance * data.activation_distance
    gap = d - dhat_sq
    return -data.stiffness * gap * gap * ad.log(d / dhat_sq)
