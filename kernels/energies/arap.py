"""As-rigid-as-possible (ARAP) energy of one edge, with the rotations of its two vertex cells held fixed.

    E_e(x'_a, x'_b) = w_e / 2 * ( |(x'_a - x'_b) - R_a (x_a - x_b)|^2 + |(x'_a - x'_b) - R_b (x_a - x_b)|^2 )

Summed over the edges this is Sorkine & Alexa's E(S') = sum_i sum_{j in N(i)} w_ij / 2 |(x'_i - x'_j) - R_i (x_i - x_j)|^2
(each edge appears once in the cell of each endpoint). With the rotations fixed it is quadratic in x' (Hessian
2 L (x) I_3 with L the w-weighted graph Laplacian, so one Newton step is the exact "global step"); the "local step"
sets R_i = argmin over rotations, V_i U_i^T from the SVD U_i S_i V_i^T of S_i = sum_j w_ij (x_i - x_j)(x'_i - x'_j)^T.

Parameters:
    x'_a, x'_b: deformed positions of the edge's two vertices (vec3d variables) [length].
    rest_edge (x_a - x_b): the edge vector in the rest shape, per edge, shape [edge_count], wp.vec3d [length].
    weight (w_e): cotangent weight 1/2 (cot alpha + cot beta) of the edge (one cot on a boundary edge), per edge,
        shape [edge_count], float64, dimensionless; E is in [length^2]. Cotangent weights can be negative on
        obtuse meshes (the quadratic is then not convex everywhere); clamp them at 0 for a convex global step.
    edge_vertex_indices (a, b): the edge's two vertex indices, shape [edge_count, 2], int32 (the same order as the
        term's elements, so rest_edge[e] = x[a] - x[b]).
    rotation (R_i): the best-fit rotation of every vertex cell, shape [vertex_count], wp.mat33d.

Source: O. Sorkine and M. Alexa, "As-Rigid-As-Possible Surface Modeling", Symposium on Geometry Processing 2007,
eqs. (3)-(9); cotangent weights as in Pinkall & Polthier 1993.

Invariants: E >= 0; E = 0 when x' = Q x + t is a rigid motion of the rest shape and every R_i = Q (in particular at
the rest shape with R_i = I, and after a local step at any rigid motion); invariant under swapping the edge's ends;
invariant under a rigid motion of x' when every R_i is rotated with it.
"""

from typing import Any

import warp as wp

from warp_meshad.kernels import ad

__all__ = ["ArapData", "arap"]


@wp.struct
class ArapData:
    """rest_edge: x_a - x_b per edge, [edge_count] wp.vec3d; weight: w_e per edge, [edge_count] float64;
    edge_vertex_indices: (a, b) per edge, [edge_count, 2] int32; rotation: R_i per vertex, [vertex_count] wp.mat33d."""

    rest_edge: wp.array(dtype=wp.vec3d)
    weight: wp.array(dtype=wp.float64)
    edge_vertex_indices: wp.array2d(dtype=wp.int32)
    rotation: wp.array(dtype=wp.mat33d)


@wp.func
def arap(e: int, xa: Any, xb: Any, data: ArapData):
    """w_e / 2 (|x'_a - x'_b - R_a r_e|^2 + |x'_a - x'_b - R_b r_e|^2), r_e = x_a - x_b at rest."""
    rest = data.rest_edge[e]
    edge = xa - xb
    ra = edge - data.rotation[data.edge_vertex_indices[e, 0]] * rest
    rb = edge - data.rotation[data.edge_vertex_indices[e, 1]] * rest
    return wp.float64(0.5) * data.weight[e] * (ad.length_sq(ra) + ad.length_sq(rb))
