"""Closed-form PSD projection of the Hessian of an isotropic energy of a 3 x 3 deformation gradient (float64).

An isotropic psi(F) depends on F only through its signed singular values: F = U diag(s) V^T with U, V rotations
(``wp.svd3``: det U = det V = 1, |s_0| >= |s_1| >= |s_2|, and s_2 < 0 when det F < 0). The 9 x 9 Hessian d2psi/dF2
then has eigenvectors known from U and V alone (Smith, de Goes and Kim 2019), written as 3 x 3 matrices Q with
vec(Q)[3 i + j] = Q[i, j] (row-major: the order of F's entries among a deformation term's duals):

    twist_k = (u_i v_j^T - u_j v_i^T) / sqrt 2,    flip_k = (u_i v_j^T + u_j v_i^T) / sqrt 2,
        (i, j) = (1, 2), (0, 2), (0, 1) for k = 0, 1, 2 (k: the singular value outside the pair);
    scaling_m = U diag(w_m) V^T,    w_m the eigenvectors of the 3 x 3 Hessian A = d2psi/ds2 of psi in s.

Their eigenvalues come from the energy in closed form: for psi(I_C, J) (I_C = |F|^2, J = det F) the twist and flip
eigenvalues are 2 dpsi/dI_C + s_k dpsi/dJ and 2 dpsi/dI_C - s_k dpsi/dJ, and A's eigenvalues the scaling ones.
:func:`isotropic_hessian_proj` replaces each eigenvalue lambda by max(lambda, eps) (max(|lambda|, eps) when
``absolute != 0``, the toolkit's two projection modes) and sums lambda vec(Q) vec(Q)^T: the PSD projection of the
Hessian, equal to an eigen-decomposition of the 9 x 9 matrix to round-off, with no iteration (one 3 x 3 SVD, one 3 x 3
symmetric eigen-decomposition, nine rank-one updates). The signed SVD makes the formulas hold for inverted F too.

Source: B. Smith, F. de Goes and T. Kim, "Analytic Eigensystems for Isotropic Distortion Energies", ACM Transactions on
Graphics 38(1), 2019; T. Kim and D. Eberle, "Dynamic Deformables: Implementation and Production Practicalities",
SIGGRAPH course notes, chapter 7.
"""

import warp as wp

__all__ = ["isotropic_hessian_proj", "mat99d", "vec9d"]

mat99d = wp.types.matrix(shape=(9, 9), dtype=wp.float64)
vec9d = wp.types.vector(length=9, dtype=wp.float64)


@wp.func
def _vec9(m: wp.mat33d):
    """vec(m), row-major."""
    return vec9d(m[0, 0], m[0, 1], m[0, 2], m[1, 0], m[1, 1], m[1, 2], m[2, 0], m[2, 1], m[2, 2])


@wp.func
def _clamped(lam: wp.float64, eps: wp.float64, absolute: int):
    """max(lam, eps), or max(|lam|, eps) when absolute != 0."""
    if absolute != 0:
        lam = wp.abs(lam)
    return wp.max(lam, eps)


@wp.func
def _pair(ui: wp.vec3d, uj: wp.vec3d, vi: wp.vec3d, vj: wp.vec3d, twist: wp.float64, flip: wp.float64,
          eps: wp.float64, absolute: int):  # fmt: skip
    """The twist and flip modes of the pair (i, j), each times its projected eigenvalue."""
    a = wp.outer(ui, vj)
    b = wp.outer(uj, vi)
    r = wp.float64(0.7071067811865476)
    qt = _vec9(r * (a - b))
    qf = _vec9(r * (a + b))
    return _clamped(twist, eps, absolute) * wp.outer(qt, qt) + _clamped(flip, eps, absolute) * wp.outer(qf, qf)


@wp.func
def isotropic_hessian_proj(
    u: wp.mat33d,
    v: wp.mat33d,
    twist: wp.vec3d,
    flip: wp.vec3d,
    scaling: wp.mat33d,
    eps: wp.float64,
    absolute: int,
):
    """The PSD projection (9 x 9, ``mat99d``) of an isotropic energy's Hessian in F's entries, row-major.

    Args:
        u, v: the rotations of F's signed SVD (``wp.svd3``).
        twist, flip: the eigenvalues of the twist and flip modes; entry k for the pair of singular values other
            than s_k.
        scaling: the symmetric 3 x 3 Hessian of psi in the signed singular values.
        eps, absolute: eigenvalues below eps become eps; with absolute != 0, |lambda| first.
    """
    u0 = wp.vec3d(u[0, 0], u[1, 0], u[2, 0])
    u1 = wp.vec3d(u[0, 1], u[1, 1], u[2, 1])
    u2 = wp.vec3d(u[0, 2], u[1, 2], u[2, 2])
    v0 = wp.vec3d(v[0, 0], v[1, 0], v[2, 0])
    v1 = wp.vec3d(v[0, 1], v[1, 1], v[2, 1])
    v2 = wp.vec3d(v[0, 2], v[1, 2], v[2, 2])
    h = _pair(u1, u2, v1, v2, twist[0], flip[0], eps, absolute)
    h += _pair(u0, u2, v0, v2, twist[1], flip[1], eps, absolute)
    h += _pair(u0, u1, v0, v1, twist[2], flip[2], eps, absolute)
    w = wp.mat33d()
    lam = wp.vec3d()
    wp.eig3(scaling, w, lam)  # columns of w: eigenvectors
    for m in range(3):
        q = _vec9(w[0, m] * wp.outer(u0, v0) + w[1, m] * wp.outer(u1, v1) + w[2, m] * wp.outer(u2, v2))
        h += _clamped(lam[m], eps, absolute) * wp.outer(q, q)
    return h
