"""Triangle-triangle and segment-triangle intersection tests (closed sets, float64 orientation predicates).

Two closed triangles T1, T2 intersect iff

* not all vertices of one lie strictly on one side of the other's plane, and
* non-coplanar case: some edge of T1 meets T2 or some edge of T2 meets T1 (the intersection of two
  non-coplanar triangles is a segment of the planes' common line whose endpoints lie on edges);
* coplanar case: in the 2D projection that drops the normal's largest axis, some edge of T1 meets
  T2 or a vertex of T2 lies in T1.

A segment (a, b) meets a non-coplanar triangle (p, q, r) iff a, b are not strictly on one side of
its plane and the line ab passes through the triangle: the three volumes orient(a, b, p, q),
orient(a, b, q, r), orient(a, b, r, p) have one sign (zeros allowed: touching counts). This is the
predicate form of the interval test of Moeller ("A Fast Triangle-Triangle Intersection Test",
JGT 1997) and of Guigue and Devillers ("Fast and Robust Triangle-Triangle Overlap Test Using
Orientation Predicates", JGT 2003): only signs of 3x3 determinants of coordinate differences decide.

Precision: determinants in float64 (not adaptive-exact); decisions are exact for coordinates on a
grid whose determinants fit 53 bits (e.g. small integers), which is how the boundary cases are
tested. Degenerate (zero-area) triangles are not supported.

``triangles_intersect`` / ``segment_triangle_intersect`` are ``@wp.func`` for Warp kernels (wp.vec3d);
``triangles_intersect_np`` is the same test vectorized in NumPy over arrays of triangle pairs.
"""

import numpy as np
import warp as wp

__all__ = ["segment_triangle_intersect", "triangles_intersect", "triangles_intersect_np"]


@wp.func
def _orient3d(a: wp.vec3d, b: wp.vec3d, c: wp.vec3d, d: wp.vec3d):
    """(b - a) . ((c - a) x (d - a)), six times the signed volume of the tetrahedron abcd."""
    return wp.dot(b - a, wp.cross(c - a, d - a))


@wp.func
def _orient2d(a: wp.vec2d, b: wp.vec2d, c: wp.vec2d):
    return (b[0] - a[0]) * (c[1] - a[1]) - (b[1] - a[1]) * (c[0] - a[0])


@wp.func
def _project(x: wp.vec3d, axis: int):
    """Drop coordinate ``axis``."""
    if axis == 0:
        return wp.vec2d(x[1], x[2])
    if axis == 1:
        return wp.vec2d(x[2], x[0])
    return wp.vec2d(x[0], x[1])


@wp.func
def _dominant_axis(n: wp.vec3d):
    ax = wp.abs(n[0])
    ay = wp.abs(n[1])
    az = wp.abs(n[2])
    if ax >= ay and ax >= az:
        return 0
    if ay >= az:
        return 1
    return 2


@wp.func
def _on_segment_2d(a: wp.vec2d, b: wp.vec2d, p: wp.vec2d):
    """p (collinear with a, b) lies in the closed segment ab."""
    return (
        wp.min(a[0], b[0]) <= p[0]
        and p[0] <= wp.max(a[0], b[0])
        and wp.min(a[1], b[1]) <= p[1]
        and p[1] <= wp.max(a[1], b[1])
    )


@wp.func
def _segments_intersect_2d(a: wp.vec2d, b: wp.vec2d, c: wp.vec2d, d: wp.vec2d):
    zero = wp.float64(0.0)
    d1 = _orient2d(c, d, a)
    d2 = _orient2d(c, d, b)
    d3 = _orient2d(a, b, c)
    d4 = _orient2d(a, b, d)
    cd_crosses = (d1 > zero and d2 < zero) or (d1 < zero and d2 > zero)
    ab_crosses = (d3 > zero and d4 < zero) or (d3 < zero and d4 > zero)
    if cd_crosses and ab_crosses:
        return True
    if d1 == zero and _on_segment_2d(c, d, a):
        return True
    if d2 == zero and _on_segment_2d(c, d, b):
        return True
    if d3 == zero and _on_segment_2d(a, b, c):
        return True
    if d4 == zero and _on_segment_2d(a, b, d):
        return True
    return False


@wp.func
def _point_in_triangle_2d(p: wp.vec2d, a: wp.vec2d, b: wp.vec2d, c: wp.vec2d):
    zero = wp.float64(0.0)
    o1 = _orient2d(a, b, p)
    o2 = _orient2d(b, c, p)
    o3 = _orient2d(c, a, p)
    return (o1 >= zero and o2 >= zero and o3 >= zero) or (o1 <= zero and o2 <= zero and o3 <= zero)


@wp.func
def _segment_triangle_2d(a: wp.vec2d, b: wp.vec2d, p: wp.vec2d, q: wp.vec2d, r: wp.vec2d):
    if _point_in_triangle_2d(a, p, q, r) or _point_in_triangle_2d(b, p, q, r):
        return True
    return (
        _segments_intersect_2d(a, b, p, q)
        or _segments_intersect_2d(a, b, q, r)
        or _segments_intersect_2d(a, b, r, p)
    )


@wp.func
def segment_triangle_intersect(a: wp.vec3d, b: wp.vec3d, p: wp.vec3d, q: wp.vec3d, r: wp.vec3d):
    """Whether the closed segment (a, b) and the closed triangle (p, q, r) share a point (float64)."""
    zero = wp.float64(0.0)
    sa = _orient3d(p, q, r, a)
    sb = _orient3d(p, q, r, b)
    if (sa > zero and sb > zero) or (sa < zero and sb < zero):
        return False
    if sa == zero and sb == zero:
        axis = _dominant_axis(wp.cross(q - p, r - p))
        return _segment_triangle_2d(
            _project(a, axis), _project(b, axis), _project(p, axis), _project(q, axis), _project(r, axis)
        )
    o1 = _orient3d(a, b, p, q)
    o2 = _orient3d(a, b, q, r)
    o3 = _orient3d(a, b, r, p)
    return (o1 >= zero and o2 >= zero and o3 >= zero) or (o1 <= zero and o2 <= zero and o3 <= zero)


@wp.func
def triangles_intersect(p1: wp.vec3d, q1: wp.vec3d, r1: wp.vec3d, p2: wp.vec3d, q2: wp.vec3d, r2: wp.vec3d):
    """Whether the closed triangles (p1, q1, r1) and (p2, q2, r2) share a point (float64)."""
    zero = wp.float64(0.0)
    s1 = _orient3d(p2, q2, r2, p1)
    s2 = _orient3d(p2, q2, r2, q1)
    s3 = _orient3d(p2, q2, r2, r1)
    if (s1 > zero and s2 > zero and s3 > zero) or (s1 < zero and s2 < zero and s3 < zero):
        return False
    t1 = _orient3d(p1, q1, r1, p2)
    t2 = _orient3d(p1, q1, r1, q2)
    t3 = _orient3d(p1, q1, r1, r2)
    if (t1 > zero and t2 > zero and t3 > zero) or (t1 < zero and t2 < zero and t3 < zero):
        return False
    if s1 == zero and s2 == zero and s3 == zero:
        axis = _dominant_axis(wp.cross(q2 - p2, r2 - p2))
        a = _project(p1, axis)
        b = _project(q1, axis)
        c = _project(r1, axis)
        p = _project(p2, axis)
        q = _project(q2, axis)
        r = _project(r2, axis)
        return (
            _segment_triangle_2d(a, b, p, q, r)
            or _segment_triangle_2d(b, c, p, q, r)
            or _segment_triangle_2d(c, a, p, q, r)
            or _point_in_triangle_2d(p, a, b, c)
        )
    return (
        segment_triangle_intersect(p1, q1, p2, q2, r2)
        or segment_triangle_intersect(q1, r1, p2, q2, r2)
        or segment_triangle_intersect(r1, p1, p2, q2, r2)
        or segment_triangle_intersect(p2, q2, p1, q1, r1)
        or segment_triangle_intersect(q2, r2, p1, q1, r1)
        or segment_triangle_intersect(r2, p2, p1, q1, r1)
    )


# ------------------------------------------------------------------------------------ NumPy version


def _np_orient3d(a, b, c, d):
    return np.einsum("...i,...i->...", b - a, np.cross(c - a, d - a))


def _np_orient2d(a, b, c):
    return (b[..., 0] - a[..., 0]) * (c[..., 1] - a[..., 1]) - (b[..., 1] - a[..., 1]) * (c[..., 0] - a[..., 0])


def _np_project(x, axis):
    """Drop coordinate ``axis`` (per row)."""
    out = np.empty(x.shape[:-1] + (2,))
    cols = np.array([[1, 2], [2, 0], [0, 1]])[axis]  # (m, 2)
    out[..., 0] = np.take_along_axis(x, cols[..., :1], axis=-1)[..., 0]
    out[..., 1] = np.take_along_axis(x, cols[..., 1:], axis=-1)[..., 0]
    return out


def _np_dominant_axis(n):
    a = np.abs(n)
    return np.where((a[:, 0] >= a[:, 1]) & (a[:, 0] >= a[:, 2]), 0, np.where(a[:, 1] >= a[:, 2], 1, 2))


def _np_on_segment_2d(a, b, p):
    return (
        (np.minimum(a[:, 0], b[:, 0]) <= p[:, 0])
        & (p[:, 0] <= np.maximum(a[:, 0], b[:, 0]))
        & (np.minimum(a[:, 1], b[:, 1]) <= p[:, 1])
        & (p[:, 1] <= np.maximum(a[:, 1], b[:, 1]))
    )


def _np_segments_intersect_2d(a, b, c, d):
    d1, d2 = _np_orient2d(c, d, a), _np_orient2d(c, d, b)
    d3, d4 = _np_orient2d(a, b, c), _np_orient2d(a, b, d)
    proper = (((d1 > 0) & (d2 < 0)) | ((d1 < 0) & (d2 > 0))) & (((d3 > 0) & (d4 < 0)) | ((d3 < 0) & (d4 > 0)))
    return (
        proper
        | ((d1 == 0) & _np_on_segment_2d(c, d, a))
        | ((d2 == 0) & _np_on_segment_2d(c, d, b))
        | ((d3 == 0) & _np_on_segment_2d(a, b, c))
        | ((d4 == 0) & _np_on_segment_2d(a, b, d))
    )


def _np_point_in_triangle_2d(p, a, b, c):
    o1, o2, o3 = _np_orient2d(a, b, p), _np_orient2d(b, c, p), _np_orient2d(c, a, p)
    return ((o1 >= 0) & (o2 >= 0) & (o3 >= 0)) | ((o1 <= 0) & (o2 <= 0) & (o3 <= 0))


def _np_segment_triangle_2d(a, b, p, q, r):
    return (
        _np_point_in_triangle_2d(a, p, q, r)
        | _np_point_in_triangle_2d(b, p, q, r)
        | _np_segments_intersect_2d(a, b, p, q)
        | _np_segments_intersect_2d(a, b, q, r)
        | _np_segments_intersect_2d(a, b, r, p)
    )


def _np_segment_triangle(a, b, p, q, r):
    sa, sb = _np_orient3d(p, q, r, a), _np_orient3d(p, q, r, b)
    apart = ((sa > 0) & (sb > 0)) | ((sa < 0) & (sb < 0))
    coplanar = (sa == 0) & (sb == 0)
    o1, o2, o3 = _np_orient3d(a, b, p, q), _np_orient3d(a, b, q, r), _np_orient3d(a, b, r, p)
    pierce = ((o1 >= 0) & (o2 >= 0) & (o3 >= 0)) | ((o1 <= 0) & (o2 <= 0) & (o3 <= 0))
    out = ~apart & ~coplanar & pierce
    if coplanar.any():
        i = np.flatnonzero(coplanar)
        axis = _np_dominant_axis(np.cross(q[i] - p[i], r[i] - p[i]))
        pr = [_np_project(v[i], axis) for v in (a, b, p, q, r)]
        out[i] = _np_segment_triangle_2d(*pr)
    return out


def triangles_intersect_np(t1, t2) -> np.ndarray:
    """Whether closed triangles t1[i] and t2[i] share a point, for every i (NumPy, float64).

    Args:
        t1, t2: triangle corners, shape (m, 3, 3) (or (3, 3) for one pair): [pair, corner, xyz].

    Returns:
        bool array, shape (m,) (a bool for one pair).
    """
    t1 = np.asarray(t1, dtype=np.float64)
    t2 = np.asarray(t2, dtype=np.float64)
    if t1.shape != t2.shape or t1.shape[-2:] != (3, 3) or t1.ndim not in (2, 3):
        raise ValueError(
            f"triangles_intersect_np: t1 and t2 must both have shape (m, 3, 3); got {t1.shape} and {t2.shape}"
        )
    single = t1.ndim == 2
    t1 = t1.reshape(-1, 3, 3)
    t2 = t2.reshape(-1, 3, 3)
    p1, q1, r1 = t1[:, 0], t1[:, 1], t1[:, 2]
    p2, q2, r2 = t2[:, 0], t2[:, 1], t2[:, 2]
    s = np.stack([_np_orient3d(p2, q2, r2, v) for v in (p1, q1, r1)], axis=1)
    t = np.stack([_np_orient3d(p1, q1, r1, v) for v in (p2, q2, r2)], axis=1)
    apart = (s > 0).all(1) | (s < 0).all(1) | (t > 0).all(1) | (t < 0).all(1)
    coplanar = ~apart & (s == 0).all(1)
    general = ~apart & ~coplanar
    out = np.zeros(t1.shape[0], dtype=bool)
    if general.any():
        i = np.flatnonzero(general)
        P1, Q1, R1, P2, Q2, R2 = (v[i] for v in (p1, q1, r1, p2, q2, r2))
        hit = np.zeros(i.size, dtype=bool)
        for a, b in ((P1, Q1), (Q1, R1), (R1, P1)):
            hit |= _np_segment_triangle(a, b, P2, Q2, R2)
        for a, b in ((P2, Q2), (Q2, R2), (R2, P2)):
            hit |= _np_segment_triangle(a, b, P1, Q1, R1)
        out[i] = hit
    if coplanar.any():
        i = np.flatnonzero(coplanar)
        axis = _np_dominant_axis(np.cross(q2[i] - p2[i], r2[i] - p2[i]))
        a, b, c, p, q, r = (_np_project(v[i], axis) for v in (p1, q1, r1, p2, q2, r2))
        out[i] = (
            _np_segment_triangle_2d(a, b, p, q, r)
            | _np_segment_triangle_2d(b, c, p, q, r)
            | _np_segment_triangle_2d(c, a, p, q, r)
            | _np_point_in_triangle_2d(p, a, b, c)
        )
    return bool(out[0]) if single else out
