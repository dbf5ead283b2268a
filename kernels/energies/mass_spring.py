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

Two variants with the same formula: ``mass_spring`` (float64 problems, ``MassSpringData``) and
``mass_spring_f32`` (float32 problems, ``MassSpringDataF``). An energy's data argument must have a
concrete struct type (a ``data: Any`` energy is not accepted by ``Problem.add_term``).
"""

from typing import Any

import warp as wp

from warp_meshad.kernels import ad

__all__ = ["MassSpringData", "MassSpringDataF", "mass_spring", "mass_spring_f32"]


@wp.struct
class MassSpringData:
    """rest: rest length per edge [m], shape [edge_count], float64; stiffness: k [N/m]."""

    rest: wp.array(dtype=wp.float64)
    stiffness: wp.float64


@wp.struct
class MassSpringDataF:
    """float32 version of :class:`MassSpringData` (for float32 problems)."""

    rest: wp.array(dtype=wp.float32)
    stiffness: wp.float32


@wp.func
def mass_spring(e: int, xa: Any, xb: Any, data: MassSpringData):
    """k / 2 (|xa - xb| - rest[e])^2 (float64)."""
    stretch = ad.length(xa - xb) - data.rest[e]
    return wp.float64(0.5) * data.stiffness * stretch * stretch


@wp.func
def mass_spring_f32(e: int, xa: Any, xb: Any, data: MassSpringDataF):
    """k / 2 (|xa - xb| - rest[e])^2 (float32)."""
    stretch = ad.length(xa - xb) - data.rest[e]
    return wp.float32(0.5) * data.stiffness * stretch * stretch
