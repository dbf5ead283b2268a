"""Inertia and gravity of one vertex in a backward Euler time step, written as a minimization.

    E_i(x_i) = m_i / (2 h^2) * |x_i - x~_i|^2  -  m_i * g . x_i,     x~_i = x_i^n + h v_i^n

Summed over the vertices and added to the elastic energy W(x) (e.g. :func:`mass_spring` on the
edges), the minimizer of E(x) + W(x) is the backward (implicit) Euler step
x^{n+1} = x^n + h v^{n+1}, M (v^{n+1} - v^n) / h = M g - grad W(x^{n+1}); then v^{n+1} = (x^{n+1} - x^n) / h.

Parameters (SI units):
    x_i: position of vertex i [m] (vec3).
    mass (m_i): lumped vertex mass [kg], shape [vertex_count].
    target (x~_i): predicted position x_i^n + h v_i^n [m], shape [vertex_count], vec3.
    gravity (g): acceleration of gravity [m/s^2], vec3 (e.g. (0, -9.81, 0)).
    inv_h2 (1 / h^2): inverse squared time step [1/s^2]. E_i is in [J].

Source: the variational form of implicit Euler (Martin et al., "Example-based Elastic Materials",
SIGGRAPH 2011; Gast et al., "Optimization Integrator for Large Time Steps", TVCG 2015), as used by
the mass-spring app of RXMesh and by IPC (Li et al., SIGGRAPH 2020).

Invariants: quadratic with constant Hessian m_i / h^2 * I (positive definite for m_i > 0, so the
whole step energy is strongly convex up to the springs); with g = 0 the minimum E_i = 0 is at
x_i = x~_i; with gravity the minimizer is x~_i + h^2 g.

One definition for float32 and float64 problems: the data is made for the problem's scalar type,
``InertiaGravityData(wp.float32, ...)`` (see :mod:`warp_meshad.kernels.dtype_struct`).
"""

from typing import Any

import warp as wp

from warp_meshad.kernels import ad
from warp_meshad.kernels.dtype_struct import dtype_struct

__all__ = ["InertiaGravityData", "inertia_gravity"]


@dtype_struct
class InertiaGravityData:
    """mass [kg] and target x~ [m] per vertex, gravity [m/s^2], inv_h2 = 1/h^2 [1/s^2] (the problem's scalar type)."""

    mass: wp.array(dtype=wp.Float)
    target: wp.array(dtype=wp.types.vector(3, wp.Float))
    gravity: wp.types.vector(3, wp.Float)
    inv_h2: wp.Float


@wp.func
def inertia_gravity(i: int, x: Any, data: Any):
    """m_i / (2 h^2) |x - x~_i|^2 - m_i g . x."""
    m = data.mass[i]
    return 0.5 * m * data.inv_h2 * ad.length_sq(x - data.target[i]) - m * ad.dot(data.gravity, x)
