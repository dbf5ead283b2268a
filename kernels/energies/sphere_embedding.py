"""Dirichlet energy of a triangle mapped onto the unit sphere, with an injectivity barrier, in tangent coordinates.

Each vertex i carries a 2D tangent vector v_i around its current point p_i on the unit sphere, with an orthonormal
tangent basis (b1_i, b2_i) at p_i; the point it stands for is the retraction

    R_i(v_i) = (p_i + v_i,1 b1_i + v_i,2 b2_i) / |p_i + v_i,1 b1_i + v_i,2 b2_i|      (on the sphere for every v_i).

For a face (a, b, c) with retracted points A, B, C:

    V_f = det[A, B, C] / 6                          (signed volume of the tetrahedron with the origin)
    E_f = -w log(V_f) + |A - B|^2 + |B - C|^2 + |C - A|^2  [+ target term]       if V_f > 0,   +inf otherwise,

with the optional target term sum over the corners of Y^2 (``target = 1``: pull to the equator y = 0) or
(1 - Y)^2 (``target = 2``: pull to the north pole), Y the point's y coordinate, as in TinyAD's example.
After each solve the caller moves p_i to R_i(v_i), rebuilds the bases and restarts from v = 0 (re-centering).

Parameters (:class:`SphereEmbeddingData`, float64):
    faces: the mesh's faces (vertex indices), shape [face_count, 3], int32 (the energy's element index is the face).
    points (p_i): current points on the unit sphere, shape [vertex_count], wp.vec3d.
    tangent1, tangent2 (b1_i, b2_i): orthonormal tangent bases, b1 x b2 = p, shape [vertex_count], wp.vec3d.
    barrier_weight (w): weight of the log barrier (TinyAD: 0.1).
    target: 0 none, 1 equator, 2 north pole.
    The sphere has radius 1, so lengths and volumes are dimensionless.

Source: TinyAD-Examples ``apps/manifold_optimization.cc`` (P. Schmidt et al., "TinyAD: Automatic Differentiation in
Geometry Processing Made Simple", SGP 2022, Sec. 5.4); retraction-based Riemannian optimization (P.-A. Absil, R.
Mahony, R. Sepulchre, "Optimization Algorithms on Matrix Manifolds", 2008).

Invariants: E_f is invariant under rotations of the sphere (target 0) and under a change of tangent basis together
with the matching rotation of v; E_f is +inf exactly when the face's corners are not positively oriented as seen
from outside the sphere (V_f <= 0), so a line search never accepts a flip; at v = 0 the retracted points are p.
"""

from typing import Any

import warp as wp

from warp_meshad.kernels import ad

__all__ = ["SphereEmbeddingData", "sphere_embedding", "sphere_retract"]


@wp.struct
class SphereEmbeddingData:
    """faces [face_count, 3] int32; points, tangent1, tangent2 [vertex_count] wp.vec3d; barrier_weight float64;
    target int (0 none, 1 equator, 2 north pole)."""

    faces: wp.array2d(dtype=wp.int32)
    points: wp.array(dtype=wp.vec3d)
    tangent1: wp.array(dtype=wp.vec3d)
    tangent2: wp.array(dtype=wp.vec3d)
    barrier_weight: wp.float64
    target: int


@wp.func
def sphere_retract(v: Any, p: wp.vec3d, b1: wp.vec3d, b2: wp.vec3d):
    """normalize(p + v_1 b1 + v_2 b2): the point on the unit sphere of tangent coordinates v at p."""
    return ad.normalize(p + v.x * b1 + v.y * b2)


@wp.func
def _target_term(q: Any, target: int):
    """Y^2 (equator), (1 - Y)^2 (north pole) or 0."""
    if target == 1:
        return q.y * q.y
    if target == 2:
        return (1.0 - q.y) * (1.0 - q.y)
    return q.y * 0.0


@wp.func
def sphere_embedding(f: int, va: Any, vb: Any, vc: Any, data: SphereEmbeddingData):
    """-w log(det[A, B, C] / 6) + |A - B|^2 + |B - C|^2 + |C - A|^2 (+ target), +inf if det <= 0."""
    ia = data.faces[f, 0]
    ib = data.faces[f, 1]
    ic = data.faces[f, 2]
    a = sphere_retract(va, data.points[ia], data.tangent1[ia], data.tangent2[ia])
    b = sphere_retract(vb, data.points[ib], data.tangent1[ib], data.tangent2[ib])
    c = sphere_retract(vc, data.points[ic], data.tangent1[ic], data.tangent2[ic])
    volume = ad.dot(a, ad.cross(b, c)) / 6.0
    if volume <= 0.0:
        return wp.float64(wp.inf)
    energy = -data.barrier_weight * ad.log(volume)
    energy = energy + ad.length_sq(a - b) + ad.length_sq(b - c) + ad.length_sq(c - a)
    if data.target != 0:
        energy = energy + _target_term(a, data.target) + _target_term(b, data.target) + _target_term(c, data.target)
    return energy
