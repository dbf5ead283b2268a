"""As-rigid-as-possible (ARAP) elastic energy of one tetrahedron, with no stored rotations and no differentiated SVD.

    F = [x_1 - x_0, x_2 - x_0, x_3 - x_0] D_m^-1,    F = U diag(s_1, s_2, s_3) V^T   (signed SVD: U, V rotations),
    psi(F) = |F - R(F)|_F^2 = sum_i (s_i - 1)^2 = I_C - 2 I_1 + 3,    R(F) = U V^T (the closest rotation),
    E_t = mu V_t psi(F),

with I_C = |F|_F^2 and I_1 = tr(S) = s_1 + s_2 + s_3 the sum of the signed singular values (S the polar stretch;
for det F < 0 the smallest one is negative). I_1 is computed from the Cauchy-Green invariants I_C,
II_C = |cof F|_F^2 = sum_{i<j} s_i^2 s_j^2 and J = det F = s_1 s_2 s_3: it is the largest root of

    q(a) = (a^2 - I_C)^2 - 8 J a - 4 II_C

(a = s_1 + s_2 + s_3 gives a^2 - I_C = 2 (s_1 s_2 + s_2 s_3 + s_3 s_1) and (a^2 - I_C)^2 / 4 = II_C + 2 J a). Its value
comes from the signed SVD of the plain value of F (``wp.svd3``, accurate to round-off in float64); two Newton steps
on q taken on the dual numbers, with their value parts dropped, then carry the exact gradient and Hessian of the root
(implicit differentiation: each step doubles the order to which the derivatives are right). The root is simple except
where two signed singular values sum to zero: two vanish (a tet collapsed onto a line), or an inverted tet's two
smallest |s_i| are equal. There psi has a kink (its Hessian grows like 1 / (s_i + s_j) next to it, as in Smith et al.
2019); exactly at it (|q'| <= 1e-12 I_C^(3/2)) I_1 is returned without derivatives.

Parameters (SI units):
    x_0 .. x_3: positions of the tet's corners [m] (vec3, float64 problems).
    rest_inverse (D_m^-1): inverse of the rest matrix of each tet, ``mesh.rest_matrix_inverses()`` [1/m],
        shape [tet_count], mat33d.
    volume (V_t): rest volume of each tet, ``mesh.volumes()`` [m^3], shape [tet_count], float64.
    mu: stiffness [Pa] (the shear modulus of the small-strain limit V_t mu |sym(F - I)|^2). E_t is in [J].

Source: the ARAP energy |F - R|_F^2 of B. Smith, F. de Goes and T. Kim, "Analytic Eigensystems for Isotropic
Distortion Energies", ACM TOG 38(1), 2019 (from Sorkine & Alexa 2007 and Chao et al. 2010); I_1 from the Cauchy-Green
invariants as in H. Lin, F. M. Chitalu and T. Komura, "Isotropic ARAP Energy Using Cauchy-Green Invariants", ACM TOG
41(6), 2022.

Invariants: E_t >= 0, = 0 with zero gradient exactly at rigid motions of the rest shape (F a rotation); invariant under
rotations and translations of the corners; finite for every F (inverted tets included: the energy then measures the
distance to the nearest rotation, which is not a barrier). The Hessian is indefinite away from rest: use
``eval_with_hessian_proj`` in Newton.

Two forms: :func:`arap_tet` over the tet's corners (``Problem.add_term``, 12 duals) and :func:`arap_tet_F` over F
(``Problem.add_deformation_term(mesh.tets, ..., rest_inverse=D_m^-1)``, 9 duals); same data, same results to
round-off.
"""

from typing import Any

import warp as wp

from warp_meshad.kernels import ad
from warp_meshad.kernels.deformation import tet_deformation_columns

__all__ = ["ArapTetData", "arap_tet", "arap_tet_F"]


@wp.struct
class ArapTetData:
    """D_m^-1 per tet (mat33d, [1/m]), rest volume per tet (float64, [m^3]), stiffness mu [Pa]."""

    rest_inverse: wp.array(dtype=wp.mat33d)
    volume: wp.array(dtype=wp.float64)
    mu: wp.float64


@wp.func
def _signed_singular_value_sum(f1: Any, f2: Any, f3: Any, ic: Any, ii: Any, j: Any):
    """I_1 = s_1 + s_2 + s_3 of F = [f1, f2, f3] (signed), with the derivatives of the root of
    q(a) = (a^2 - I_C)^2 - 8 J a - 4 II_C."""
    u = wp.mat33d()
    s = wp.vec3d()
    v = wp.mat33d()
    wp.svd3(ad.mat33_cols(ad.value(f1), ad.value(f2), ad.value(f3)), u, s, v)  # signed: U, V rotations
    a = s[0] + s[1] + s[2]
    c = ad.value(ic)
    if wp.abs(4.0 * a * (a * a - c) - 8.0 * ad.value(j)) <= 1.0e-12 * c * wp.sqrt(c):
        return ic * 0.0 + a  # multiple root (see the module docstring): the value, no derivatives
    # two Newton steps on the duals whose value parts are dropped (a is the root to round-off): the first gives the
    # exact gradient of the root, the second its exact Hessian
    p = a * a - ic
    step = (p * p - 8.0 * j * a - 4.0 * ii) / (4.0 * a * p - 8.0 * j)
    r = a - (step - ad.value(step))
    p = r * r - ic
    step = (p * p - 8.0 * j * r - 4.0 * ii) / (4.0 * r * p - 8.0 * j)
    return r - (step - ad.value(step))


@wp.func
def _arap_density(f1: Any, f2: Any, f3: Any):
    """I_C - 2 I_1 + 3 of F = [f1, f2, f3] (its columns): |F - R(F)|^2, R(F) the closest rotation."""
    c1 = ad.cross(f2, f3)  # columns of cof F
    c2 = ad.cross(f3, f1)
    c3 = ad.cross(f1, f2)
    ic = ad.dot(f1, f1) + ad.dot(f2, f2) + ad.dot(f3, f3)
    ii = ad.dot(c1, c1) + ad.dot(c2, c2) + ad.dot(c3, c3)
    j = ad.dot(f1, c1)
    i1 = _signed_singular_value_sum(f1, f2, f3, ic, ii, j)
    return ic - 2.0 * i1 + 3.0


@wp.func
def arap_tet(t: int, x0: Any, x1: Any, x2: Any, x3: Any, data: ArapTetData):
    """mu V_t (I_C - 2 I_1 + 3): I_C = |F|^2, I_1 the sum of the signed singular values of F."""
    dinv = data.rest_inverse[t]
    f1, f2, f3 = tet_deformation_columns(x0, x1, x2, x3, dinv)  # columns of F = D_s D_m^-1
    return data.mu * data.volume[t] * _arap_density(f1, f2, f3)


@wp.func
def arap_tet_F(t: int, F: Any, data: ArapTetData):
    """mu V_t (I_C - 2 I_1 + 3) of the 3 x 3 deformation gradient F (data.rest_inverse is not read)."""
    f1 = ad.vec3(F[0, 0], F[1, 0], F[2, 0])  # columns of F
    f2 = ad.vec3(F[0, 1], F[1, 1], F[2, 1])
    f3 = ad.vec3(F[0, 2], F[1, 2], F[2, 2])
    return data.mu * data.volume[t] * _arap_density(f1, f2, f3)
