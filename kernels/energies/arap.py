"""As-rigid-as-possible (ARAP) energy of one edge, with the rotations of its two vertex cells held fixed.

    E_e(x'_a, x'_b) = w_e / 2 * ( |(x'_a - x'_b) - R_a (x_a - x_b)|^2 + |(x'_a - x'_b) - R_b (x_a - x_b)|^2 )

Summed over the edges this is Sorkine & Alexa's
E(S') = sum_i sum_{j in N(i)} w_ij / 2 |(x'_i - x'_j) - R_i (x_i - x_j)|^2 (each edge appears once in the cell of
each endpoint). With the rotations fixed it is quadratic in x', with Hessian 2 L (x) I_3 (L the w-weighted graph
Laplacian), so one Newton step is the exact "global step"; the "local step" sets each R_i to V_i U_i^T from the SVD
S_i = U_i Sigma_i V_i^T of the cell covariance S_i = sum_j w_ij (x_i - x_j)(x'_i - x'_j)^T.

Parameters:
    x'_a, x'_b: deformed positions of the edge's two vertices (vec3d variables) [length].
    rest_edge (x_a - x_b): the edge vector in the rest shape, per edge, shape [edge_count], wp.vec3d [length].
    weight (w_e): cotangent weight 1/2 (cot alpha + cot beta) of the edge (one cot on a boundary edge), per edge,
        shape [edge_count], float64, dimensionless; E is in [length^2]. A cotangent weight is negative where the
        two opposite angles sum to more than pi: the global Hessian stays PSD (L is the cotangent Laplacian), but
        E can then fall below 0 and the local step no longer recovers rigid motions; clamp such weights at 0.
    edge_vertex_indices (a, b): the edge's two vertex indices, shape [edge_count, 2], int32 (the same order as the
        term's elements, so rest_edge[e] = x[a] - x[b]).
    rotation (R_i): the best-fit rotation of every vertex cell, shape [vertex_count], wp.mat33d.

Source: O. Sorkine and M. Alexa, "As-Rigid-As-Possible Surface Modeling", Symposium on Geometry Processing 2007,
eqs. (3)-(9); cotangent weights as in Pinkall & Polthier 1993.

Invariants: E = 0 when x' = Q x + t is a rigid motion of the rest shape and every R_i = Q (in particular at the rest
shape with R_i = I); with w_e >= 0, E >= 0 and the local step at a rigid motion returns R_i = Q in every cell whose
weighted edges span at least a plane (its covariance is C_i Q^T with C_i PSD), so E = 0 there after it; invariant
under swapping the edge's ends, and under a rigid motion of x' when every R_i is rotated with it.
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
