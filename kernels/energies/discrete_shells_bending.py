"""Discrete-shells bending energy of one interior edge (its diamond of two triangles).

    e = x_1 - x_0,   n_1 = e x (x_a - x_0),   n_2 = (x_b - x_0) x e      (normals of the two faces),
    theta = atan2((n_1 x n_2) . e / |e|, n_1 . n_2)                      (signed dihedral angle, 0 when flat),
    E_e = k_b * w_e * (theta - theta_rest_e)^2,     w_e = 3 |e_rest|^2 / (A_1,rest + A_2,rest).

w_e is |e| / h_e of the paper with h_e a third of the mean height of the two triangles; theta is
measured with atan2 of the unnormalized sine and cosine (robust near flat and near folded diamonds,
no acos). The element is a row of ``mesh.edge_diamonds``: ``[v0, v1, a, b]`` with faces
(v0, v1, a) and (v1, v0, b).

Parameters:
    x_0, x_1, x_a, x_b: positions of the diamond's vertices [m] (vec3, float64 problems).
    rest_angle (theta_rest_e): rest dihedral angle per diamond [rad], shape [diamond_count], float64.
    weight (w_e): 3 |e_rest|^2 / (A_1 + A_2) per diamond (dimensionless), shape [diamond_count].
    stiffness (k_b): bending stiffness [J]; for a plate of Young's modulus Y, Poisson's ratio nu
        and thickness t, about Y t^3 / (24 (1 - nu^2)) (Tamstorf & Grinspun 2013 discuss the factor).
    Both arrays come from :func:`discrete_shells_rest_state` (NumPy, host).

Source: E. Grinspun, A. N. Hirani, M. Desbrun, P. Schroeder, "Discrete Shells", SCA 2003 (Eq. 3);
the dihedral angle formula as in R. Tamstorf, E. Grinspun, "Discrete bending forces and their
Jacobians", Graphical Models 75(6), 2013.

Invariants: E_e >= 0; E_e = 0 with zero gradient at the rest shape (theta = theta_rest) and under
any rigid motion; invariant under rotations and translations; theta in (-pi, pi]: a diamond folded
through pi jumps (the barrier terms keep shells from folding flat onto themselves); +inf for a
diamond with a degenerate face (sine and cosine both zero). The Hessian is indefinite in general:
use ``eval_with_hessian_proj`` in Newton.
"""

from typing import Any

import numpy as np
import warp as wp

from warp_meshad.kernels import ad

__all__ = ["DiscreteShellsBendingData", "discrete_shells_bending", "discrete_shells_rest_state"]


@wp.struct
class DiscreteShellsBendingData:
    """rest_angle [rad] and weight 3|e|^2/(A_1 + A_2) per diamond (float64), stiffness k_b [J]."""

    rest_angle: wp.array(dtype=wp.float64)
    weight: wp.array(dtype=wp.float64)
    stiffness: wp.float64


@wp.func
def discrete_shells_bending(e: int, x0: Any, x1: Any, xa: Any, xb: Any, data: DiscreteShellsBendingData):
    """k_b w_e (theta - theta_rest)^2 with the signed dihedral angle theta of the diamond."""
    edge = x1 - x0
    n1 = ad.cross(edge, xa - x0)
    n2 = ad.cross(xb - x0, edge)
    sin_part = ad.dot(ad.cross(n1, n2), edge)  # |n1||n2| sin(theta) |e|
    cos_part = ad.dot(n1, n2) * ad.length(edge)  # |n1||n2| cos(theta) |e|
    if ad.value(sin_part) == 0.0 and ad.value(cos_part) == 0.0:
        return wp.float64(wp.inf)
    theta = ad.atan2(sin_part, cos_part)
    diff = theta - data.rest_angle[e]
    return data.stiffness * data.weight[e] * diff * diff


def discrete_shells_rest_state(vertices, diamonds) -> tuple[np.ndarray, np.ndarray]:
    """Rest dihedral angles and weights of :func:`discrete_shells_bending` (NumPy, host).

    Args:
        vertices: rest positions, shape (vertex_count, 3) [m].
        diamonds: rows ``[v0, v1, a, b]``, shape (diamond_count, 4), e.g. ``mesh.edge_diamonds``.

    Returns:
        ``(rest_angle, weight)``: float64 arrays of shape (diamond_count,): theta_rest [rad] (same
        formula as the energy) and w_e = 3 |e|^2 / (A_1 + A_2).
    """
    x = np.asarray(vertices, dtype=np.float64)
    dm = np.asarray(diamonds)
    if x.ndim != 2 or x.shape[1] != 3:
        raise ValueError(f"discrete_shells_rest_state: vertices must have shape (n, 3), got {x.shape}")
    if dm.ndim != 2 or dm.shape[1] != 4:
        raise ValueError(f"discrete_shells_rest_state: diamonds must have shape (m, 4), got {dm.shape}")
    x0, x1, xa, xb = (x[dm[:, i]] for i in range(4))
    edge = x1 - x0
    n1 = np.cross(edge, xa - x0)
    n2 = np.cross(xb - x0, edge)
    elen = np.linalg.norm(edge, axis=1)
    sin_part = np.einsum("ij,ij->i", np.cross(n1, n2), edge)
    cos_part = np.einsum("ij,ij->i", n1, n2) * elen
    angle = np.arctan2(sin_part, cos_part)
    area_sum = 0.5 * (np.linalg.norm(n1, axis=1) + np.linalg.norm(n2, axis=1))
    if np.any(area_sum <= 0):
        bad = int(np.argmax(area_sum <= 0))
        raise ValueError(f"discrete_shells_rest_state: diamond {bad} ({dm[bad].tolist()}) has zero area")
    return angle, 3.0 * elen * elen / area_sum
