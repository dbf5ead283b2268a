"""Smooth log barrier keeping one vertex outside a sphere (IPC-style contact with a static sphere).

    d_i = |x_i - c| - r,
    E_i(x_i) = -kappa (d_i - d^)^2 log(d_i / d^)    if 0 < d_i < d^,
               0                                    if d_i >= d^,
               +inf                                 if d_i <= 0 (inside the sphere).

Parameters:
    x_i: position of vertex i [m] (vec3).
    center (c): sphere center [m], vec3; radius (r) [m].
    activation_distance (d^): distance below which the barrier is active [m], > 0.
    stiffness (kappa): barrier stiffness [J / m^2]; E_i is in [J].

Source: the barrier of Incremental Potential Contact (M. Li et al., "Incremental Potential Contact:
Intersection- and Inversion-free, Large-Deformation Dynamics", ACM TOG 39(4), SIGGRAPH 2020), with the
unsigned distance to a sphere.

Invariants: E_i >= 0; E_i = 0 with zero gradient and Hessian at and beyond d^ (the barrier is C2 at
d = d^); E_i -> +inf as d_i -> 0+, and E_i = +inf inside the sphere, which a line search treats as a
rejected step (pair it with a step bound, i.e. continuous collision detection, so a large step cannot
tunnel through the sphere); convex in d on (0, d^); invariant under rotations about c.

One definition for float32 and float64 problems: the data is made for the problem's scalar type,
``SphereBarrierData(wp.float32, ...)`` (see :mod:`warp_meshad.kernels.dtype_struct`).
"""

from typing import Any

import warp as wp

from warp_meshad.kernels import ad
from warp_meshad.kernels.dtype_struct import dtype_struct

__all__ = ["SphereBarrierData", "sphere_barrier"]


@dtype_struct
class SphereBarrierData:
    """center [m], radius [m], activation_distance d^ [m], stiffness kappa [J/m^2] (the problem's scalar type)."""

    center: wp.types.vector(3, wp.Float)
    radius: wp.Float
    activation_distance: wp.Float
    stiffness: wp.Float


@wp.func
def sphere_barrier(i: int, x: Any, data: Any):
    """-kappa (d - d^)^2 log(d / d^) for 0 < d < d^, 0 beyond, +inf inside; d = |x - c| - r."""
    d = ad.length(x - data.center) - data.radius
    if d <= 0.0:
        return type(data.radius)(wp.inf)
    if d >= data.activation_distance:
        return 0.0
    gap = d - data.activation_distance
    return -data.stiffness * gap * gap * ad.log(d / data.activation_distance)
