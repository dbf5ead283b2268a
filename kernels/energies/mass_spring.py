"""Mass-spring energy of one edge.

    E_e(x_a, x_b) = k / 2 * (|x_a - x_b| - r_e)^2

Parameters (consistent units, e.g. SI):
    x_a, x_b: positions of the edge's two vertices [m]; any variable_dim (vec2/vec3/vec4).
    rest (r_e): rest length of edge e [m], usually ``mesh.edge_lengths()``.
    stiffness (k): spring constant [N/m]; the energy is in [J].

Source: the classic mass-spring model as in RXMesh's MassSpring app
(``apps/MassSpring``, Mahmoud et al., "Locality-Aware Automatic Differentiation on the GPU for
Mesh-Based Computations", SIGGRAPH 2026).

Invariants: E >= 0; E = 0 when every edge has its rest length (in particular at the rest
shape); invariant under rigid motions (rotations, translations) and under swapping x_a, x_b.
The Hessian is indefinite for compressed springs (|x_a - x_b| < r_e): use
``eval_with_hessian_proj`` in Newton. Undefined derivative at |x_a - x_b| = 0.

One definition for float32 and float64 problems: the data is made for the problem's scalar type,
``MassSpringData(wp.float32, rest=..., stiffness=...)`` (see :mod:`warp_meshad.kernels.dtype_struct`).
"""

from typing import Any

import warp as wp

from warp_meshad.kernels import ad
from warp_meshad.kernels.dtype_struct import dtype_struct

__all__ = ["MassSpringData", "mass_spring"]


@dtype_struct
class MassSpringData:
    """rest: rest length per edge [m], shape [edge_count]; stiffness: k [N/m] (both of the problem's scalar type)."""

    rest: wp.array(dtype=wp.Float)
    stiffness: wp.Float


@wp.func
def mass_spring(e: int, xa: Any, xb: Any, data: Any):
    """k / 2 (|xa - xb| - rest[e])^2."""
    stretch = ad.length(xa - xb) - data.rest[e]
    return 0.5 * data.stiffness * stretch * stretch
