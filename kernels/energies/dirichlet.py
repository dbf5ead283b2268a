"""Dirichlet (membrane smoothing) energy of one edge, uniform or per-edge weighted.

    E_e(x_a, x_b) = w_e / 2 * |x_a - x_b|^2

Summed over the edges, E = 1/2 x^T L x per coordinate with L the graph Laplacian weighted by w
(uniform weights: the umbrella operator; cotangent weights: the discrete Dirichlet energy of the
surface, Pinkall & Polthier 1993). Its minimizers with fixed boundary are (weighted) harmonic maps
(Tutte 1963; Floater 1997).

Parameters:
    x_a, x_b: the edge's two variables (vec2, vec3 or vec4) [length].
    weight (w_e): per-edge weight, shape [edge_count], float64; dimensionless for uniform or
        cotangent weights, so E is in [length^2]. ``dirichlet`` uses w_e = 1 (scale it with the
        term weight).

Invariants: E >= 0; E = 0 exactly when x_a = x_b; invariant under translations and rotations of
all variables; quadratic, so the Hessian is constant (w_e [[I, -I], [-I, I]]) and PSD for w_e >= 0.
"""

from typing import Any

import warp as wp

from warp_meshad.kernels import ad

__all__ = ["DirichletData", "dirichlet", "weighted_dirichlet"]


@wp.struct
class DirichletData:
    """weight: w_e per edge, shape [edge_count], float64."""

    weight: wp.array(dtype=wp.float64)


@wp.func
def dirichlet(e: int, xa: Any, xb: Any):
    """1/2 |xa - xb|^2 (uniform weight; scale with the term weight)."""
    return wp.float64(0.5) * ad.length_sq(xa - xb)


@wp.func
def weighted_dirichlet(e: int, xa: Any, xb: Any, data: DirichletData):
    """w_e / 2 |xa - xb|^2."""
    return wp.float64(0.5) * data.weight[e] * ad.length_sq(xa - xb)
