"""Compressible Neo-Hookean membrane energy of one triangle of a thin shell.

    F = [x_1 - x_0, x_2 - x_0] D_m^-1            (3 x 2 deformation gradient),
    C = F^T F (2 x 2),   I_1 = tr C,   J = sqrt(det C)   (area ratio),
    psi(F) = mu / 2 (I_1 - 2) - mu log J + lambda / 2 (log J)^2,
    E_f = t A_f psi(F)       if det C > 0,    +inf otherwise (degenerate triangle).

Parameters (SI units):
    x_0, x_1, x_2: positions of the face's corners [m] (vec3, float64 problems).
    rest_inverse (D_m^-1): inverse of the rest frame of each face, ``mesh.face_rest_frame_inverses()``
        [1/m], shape [face_count], mat22d; D_m holds the rest edges x_1 - x_0, x_2 - x_0 in a 2D
        orthonormal frame of the rest face.
    area (A_f): rest area of each face, ``mesh.face_areas()`` [m^2], shape [face_count], float64.
    mu, lam (mu, lambda): Lame parameters [Pa]; from Young's modulus Y and Poisson's ratio nu,
        mu = Y / (2 (1 + nu)), lambda = Y nu / ((1 + nu)(1 - 2 nu)) (plane-strain values, as usual
        in graphics; the plane-stress lambda is 2 mu lambda / (lambda + 2 mu)).
    thickness (t): shell thickness [m]. E_f is in [J].

Source: the compressible Neo-Hookean model (Bonet & Wood, "Nonlinear Continuum Mechanics for Finite
Element Analysis", 2008, Eq. 6.28) restricted to the 2D metric of a membrane, as in the shell
examples of IPC/C-IPC (Li et al. 2020, 2021) and of the locality-aware AD paper's shell scene
(Mahmoud et al., SIGGRAPH 2026).

Invariants: E_f >= 0 for lambda >= 0 (psi is minimal, 0, exactly when C = I); E_f = 0 with zero
gradient at the rest shape and at any rigid motion of it (F = R D_m D_m^-1 with R^T R = I);
invariant under rotations and translations of the corners and under reflections (a membrane has
no orientation: a flipped triangle is not detected, only a degenerate one); E_f -> +inf as the face
degenerates (J -> 0), so a line search rejects collapsing steps. The Hessian is indefinite under
compression: use ``eval_with_hessian_proj`` in Newton.

Two forms: :func:`neo_hookean_membrane` over the face's corners (``Problem.add_term``, 9 duals) and
:func:`neo_hookean_membrane_F` over F's two columns (``Problem.add_deformation_term(mesh.faces, ...,
rest_inverse=D_m^-1)`` on vec3 variables, 6 duals); same data, same results to round-off.
"""

from typing import Any

import warp as wp

from warp_meshad.kernels import ad

__all__ = ["NeoHookeanMembraneData", "neo_hookean_membrane", "neo_hookean_membrane_F"]


@wp.struct
class NeoHookeanMembraneData:
    """D_m^-1 per face (mat22d, [1/m]), rest area per face (float64, [m^2]), mu, lam [Pa], thickness [m]."""

    rest_inverse: wp.array(dtype=wp.mat22d)
    area: wp.array(dtype=wp.float64)
    mu: wp.float64
    lam: wp.float64
    thickness: wp.float64


@wp.func
def neo_hookean_membrane(f: int, x0: Any, x1: Any, x2: Any, data: NeoHookeanMembraneData):
    """t A_f (mu / 2 (tr C - 2) - mu log J + lam / 2 log^2 J), C = F^T F, J = sqrt(det C)."""
    dinv = data.rest_inverse[f]
    e1 = x1 - x0
    e2 = x2 - x0
    f1 = e1 * dinv[0, 0] + e2 * dinv[1, 0]  # columns of F = [e1, e2] D_m^-1
    f2 = e1 * dinv[0, 1] + e2 * dinv[1, 1]
    c11 = ad.dot(f1, f1)
    c12 = ad.dot(f1, f2)
    c22 = ad.dot(f2, f2)
    det_c = c11 * c22 - c12 * c12
    if det_c <= 0.0:
        return wp.float64(wp.inf)
    log_j = 0.5 * ad.log(det_c)
    psi = 0.5 * data.mu * (c11 + c22 - 2.0) - data.mu * log_j + 0.5 * data.lam * log_j * log_j
    return data.thickness * data.area[f] * psi


@wp.func
def neo_hookean_membrane_F(f: int, f1: Any, f2: Any, data: NeoHookeanMembraneData):
    """t A_f (mu / 2 (tr C - 2) - mu log J + lam / 2 log^2 J) of F = [f1, f2] (3 x 2, its columns), C = F^T F."""
    c11 = ad.dot(f1, f1)
    c12 = ad.dot(f1, f2)
    c22 = ad.dot(f2, f2)
    det_c = c11 * c22 - c12 * c12
    if det_c <= 0.0:
        return wp.float64(wp.inf)
    log_j = 0.5 * ad.log(det_c)
    psi = 0.5 * data.mu * (c11 + c22 - 2.0) - data.mu * log_j + 0.5 * data.lam * log_j * log_j
    return data.thickness * data.area[f] * psi
