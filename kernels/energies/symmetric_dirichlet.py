"""Symmetric Dirichlet distortion energy of one triangle of a 2D parameterization.

    J_f = D_s D_m^-1,   D_s = [u_1 - u_0, u_2 - u_0],
    E_f(u_0, u_1, u_2) = A_f (|J_f|_F^2 + |J_f^-1|_F^2)    if det J_f > 0,   +inf otherwise.

For 2 x 2 matrices |J^-1|_F^2 = |J|_F^2 / det(J)^2, which is what is evaluated (no inverse).

Parameters:
    u_0, u_1, u_2: uv coordinates of the face's corners (variable_dim = 2) [uv units].
    rest_inverse (D_m^-1): inverse of the face's rest frame, ``mesh.face_rest_frame_inverses()``
        [1 / length]; D_m has the rest edge vectors x_1 - x_0, x_2 - x_0 in a 2D frame of the face.
    area (A_f): rest area of the face, ``mesh.face_areas()`` [length^2]; E_f is in [length^2]
        (divide by the total area, e.g. through the term weight, for a unitless energy).

Source: J. Smith and S. Schaefer, "Bijective Parameterization with Free Boundaries", ACM TOG 34(4)
(SIGGRAPH 2015); also TinyAD's parameterization example (Schmidt et al. 2022).

Invariants: E_f >= 4 A_f, with equality exactly when J_f is a rotation (the face is mapped
isometrically); invariant under rotations and translations of the uv plane; E_f -> +inf as the
triangle degenerates (det J_f -> 0+), and E_f = +inf for a flipped or degenerate triangle, which a
line search treats as a rejected step. Start from a flip-free map (e.g. a Tutte embedding).

One definition for float32 and float64 problems: the data is made for the problem's scalar type,
``SymmetricDirichletData(wp.float32, rest_inverse=..., area=...)`` (see :mod:`warp_meshad.kernels.dtype_struct`).

Two forms: :func:`symmetric_dirichlet` over the face's uv corners (``Problem.add_term``, 6 duals) and
:func:`symmetric_dirichlet_F` over J_f (``Problem.add_deformation_term(mesh.faces, ..., rest_inverse=D_m^-1)`` on vec2
variables, 4 duals); same data, same results to round-off.
"""

from typing import Any

import warp as wp

from warp_meshad.kernels import ad
from warp_meshad.kernels.dtype_struct import dtype_struct

__all__ = ["SymmetricDirichletData", "symmetric_dirichlet", "symmetric_dirichlet_F"]


@dtype_struct
class SymmetricDirichletData:
    """rest_inverse: D_m^-1 per face, shape [face_count], 2x2 matrices; area: A_f per face, shape [face_count] (both
    of the problem's scalar type: wp.mat22f / float32 or wp.mat22d / float64)."""

    rest_inverse: wp.array(dtype=wp.types.matrix((2, 2), wp.Float))
    area: wp.array(dtype=wp.Float)


@wp.func
def symmetric_dirichlet(f: int, u0: Any, u1: Any, u2: Any, data: Any):
    """A_f (|J|_F^2 + |J^-1|_F^2) with J = [u1 - u0, u2 - u0] D_m^-1; +inf when det J <= 0."""
    jac = ad.mat22_cols(u1 - u0, u2 - u0) * data.rest_inverse[f]
    det = ad.det(jac)
    fro = ad.frobenius_sq(jac)
    energy = data.area[f] * (fro + fro / (det * det))
    return ad.where(det > 0.0, energy, type(data.area[f])(wp.inf))


@wp.func
def symmetric_dirichlet_F(f: int, F: Any, data: Any):
    """A_f (|J|_F^2 + |J^-1|_F^2) of the 2 x 2 Jacobian J = F (data.rest_inverse is not read); +inf when det J <= 0."""
    det = ad.det(F)
    fro = ad.frobenius_sq(F)
    energy = data.area[f] * (fro + fro / (det * det))
    return ad.where(det > 0.0, energy, type(data.area[f])(wp.inf))
