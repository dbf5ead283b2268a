"""Stable Neo-Hookean elastic energy of one tetrahedron.

    F = [x_1 - x_0, x_2 - x_0, x_3 - x_0] D_m^-1            (3 x 3 deformation gradient),
    I_C = |F|_F^2 = tr(F^T F),   J = det F,
    psi(F) = mu / 2 (I_C - 3) - mu (J - 1) + lambda / 2 (J - 1)^2,
    E_t = V_t psi(F).

This is the paper's energy without its log(I_C + 1) term: mu / 2 (I_C - 3) + lambda / 2 (J - alpha)^2 with
alpha = 1 + mu / lambda, expanded and with its constant mu^2 / (2 lambda) dropped, as in Kim & Eberle's course notes.
It is zero with zero stress at rest as it stands (P(I) = mu I - mu I = 0). Matching linear elasticity with Lame
parameters (mu_LE, lambda_LE) at small strain needs the reparametrization

    mu = mu_LE,   lambda = lambda_LE + mu_LE

(the expansion of psi at F = I + H is mu |sym H|^2 + (lambda - mu) / 2 tr(H)^2 + O(H^3));
:func:`stable_neo_hookean_lame` converts Young's modulus and Poisson's ratio. Unlike the classic Neo-Hookean energy
it has no log J: it stays finite and smooth through J <= 0, so inverted and degenerate tets get a restoring force
instead of +inf (a line search never sees an invalid state).

Parameters (SI units):
    x_0 .. x_3: positions of the tet's corners [m] (vec3, float64 problems).
    rest_inverse (D_m^-1): inverse of the rest matrix of each tet, ``mesh.rest_matrix_inverses()`` [1/m],
        shape [tet_count], mat33d; D_m has the rest edge vectors x_1 - x_0, x_2 - x_0, x_3 - x_0 as columns.
    volume (V_t): rest volume of each tet, ``mesh.volumes()`` [m^3], shape [tet_count], float64.
    mu, lam (mu, lambda): the model's Lame parameters [Pa] (after the reparametrization above). E_t is in [J].

Source: B. Smith, F. de Goes and T. Kim, "Stable Neo-Hookean Flesh Simulation", ACM Transactions on Graphics
37(2), 2018 (its energy before the rest-stability log(I_C + 1) term, and its Lame reparametrization);
T. Kim and D. Eberle, "Dynamic Deformables: Implementation and Production Practicalities", SIGGRAPH course notes
(the form above, without the log term).

Invariants: E_t = 0 with zero gradient at the rest shape and at any rigid motion of it (F = R, R a rotation);
invariant under rotations and translations of the corners; at rest the Hessian equals that of linear elasticity
V_t (mu_LE |eps|^2 + lambda_LE / 2 tr(eps)^2) with the reparametrized constants. The Hessian is indefinite away from
rest (compression, inversion): use ``eval_with_hessian_proj`` in Newton.

Two forms: :func:`stable_neo_hookean` over the tet's corners (``Problem.add_term(mesh.tets, ...)``, 12 duals) and
:func:`stable_neo_hookean_F` over F (``Problem.add_deformation_term(mesh.tets, ..., rest_inverse=D_m^-1)``, 9 duals,
dF/dx applied by the toolkit); both take the same data and give the same energy, gradient and Hessian to round-off.

Analytic eigensystem (Smith, de Goes and Kim, "Analytic Eigensystems for Isotropic Distortion Energies", ACM TOG
38(1), 2019; Kim & Eberle's notes, ch. 7): with F = U diag(s) V^T (signed SVD, U and V rotations) and
dpsi/dJ = lam (J - 1) - mu, the Hessian d2psi/dF2 has the twist eigenvalues mu + s_k dpsi/dJ and the flip eigenvalues
mu - s_k dpsi/dJ (k: the singular value outside the mode's pair), and its three scaling eigenvalues are those of

    A = mu I + lam g g^T + dpsi/dJ [[0, s_2, s_1], [s_2, 0, s_0], [s_1, s_0, 0]],    g = (s_1 s_2, s_0 s_2, s_0 s_1).

:func:`stable_neo_hookean_F_hessian_proj` returns the PSD projection of V_t d2psi/dF2 from them
(``add_deformation_term(..., projection=stable_neo_hookean_F_hessian_proj)``): no 9 x 9 Jacobi iteration.
"""

from typing import Any

import warp as wp

from warp_meshad.kernels import ad
from warp_meshad.kernels.deformation import tet_deformation_columns
from warp_meshad.kernels.isotropic import isotropic_hessian_proj

__all__ = [
    "StableNeoHookeanData",
    "stable_neo_hookean",
    "stable_neo_hookean_F",
    "stable_neo_hookean_F_hessian_proj",
    "stable_neo_hookean_lame",
]


@wp.struct
class StableNeoHookeanData:
    """D_m^-1 per tet (mat33d, [1/m]), rest volume per tet (float64, [m^3]), mu, lam [Pa] (reparametrized)."""

    rest_inverse: wp.array(dtype=wp.mat33d)
    volume: wp.array(dtype=wp.float64)
    mu: wp.float64
    lam: wp.float64


@wp.func
def stable_neo_hookean(t: int, x0: Any, x1: Any, x2: Any, x3: Any, data: StableNeoHookeanData):
    """V_t (mu / 2 (I_C - 3) - mu (J - 1) + lam / 2 (J - 1)^2), I_C = |F|^2, J = det F."""
    dinv = data.rest_inverse[t]
    f1, f2, f3 = tet_deformation_columns(x0, x1, x2, x3, dinv)  # columns of F = D_s D_m^-1
    ic = ad.dot(f1, f1) + ad.dot(f2, f2) + ad.dot(f3, f3)
    jm1 = ad.dot(f1, ad.cross(f2, f3)) - 1.0
    psi = 0.5 * data.mu * (ic - 3.0) - data.mu * jm1 + 0.5 * data.lam * jm1 * jm1
    return data.volume[t] * psi


@wp.func
def stable_neo_hookean_F(t: int, F: Any, data: StableNeoHookeanData):
    """V_t (mu / 2 (I_C - 3) - mu (J - 1) + lam / 2 (J - 1)^2) of the 3 x 3 deformation gradient F (data.rest_inverse
    is not read: the toolkit computed F from the term's rest_inverse)."""
    ic = ad.frobenius_sq(F)
    jm1 = ad.det(F) - 1.0
    psi = 0.5 * data.mu * (ic - 3.0) - data.mu * jm1 + 0.5 * data.lam * jm1 * jm1
    return data.volume[t] * psi


@wp.func
def stable_neo_hookean_F_hessian_proj(t: int, F: wp.mat33d, data: StableNeoHookeanData, eps: wp.float64, absolute: int):
    """The PSD projection of the 9 x 9 Hessian of :func:`stable_neo_hookean_F` in F's entries (row-major), from its
    analytic eigensystem (see the module docstring); eigenvalues below eps become eps (|lambda| first where
    absolute != 0)."""
    u = wp.mat33d()
    s = wp.vec3d()
    v = wp.mat33d()
    wp.svd3(F, u, s, v)  # signed: U, V rotations, s[2] < 0 for an inverted F
    vol = data.volume[t]
    mu = data.mu
    dj = data.lam * (s[0] * s[1] * s[2] - wp.float64(1.0)) - mu  # dpsi/dJ
    twist = vol * (wp.vec3d(mu, mu, mu) + dj * s)
    flip = vol * (wp.vec3d(mu, mu, mu) - dj * s)
    g = wp.vec3d(s[1] * s[2], s[0] * s[2], s[0] * s[1])  # dJ/ds
    zero = wp.float64(0.0)
    d2j = wp.mat33d(zero, s[2], s[1], s[2], zero, s[0], s[1], s[0], zero)  # d2J/ds2
    a = vol * (mu * wp.identity(n=3, dtype=wp.float64) + data.lam * wp.outer(g, g) + dj * d2j)
    return isotropic_hessian_proj(u, v, twist, flip, a, eps, absolute)


def stable_neo_hookean_lame(young: float, poisson: float) -> tuple[float, float]:
    """The reparametrized (mu, lam) of :func:`stable_neo_hookean` from Young's modulus [Pa] and Poisson's ratio.

    mu = mu_LE = Y / (2 (1 + nu)), lam = lambda_LE + mu_LE with lambda_LE = Y nu / ((1 + nu)(1 - 2 nu)), so that the
    energy's small-strain limit is linear elasticity with (Y, nu).

    Raises:
        ValueError: Y <= 0 or nu outside (-1, 0.5).
    """
    if not young > 0.0:
        raise ValueError(f"young: expected a Young's modulus > 0 [Pa], got {young}")
    if not -1.0 < poisson < 0.5:
        raise ValueError(f"poisson: expected a Poisson's ratio in (-1, 0.5), got {poisson}")
    mu = young / (2.0 * (1.0 + poisson))
    lam_le = young * poisson / ((1.0 + poisson) * (1.0 - 2.0 * poisson))
    return mu, lam_le + mu
