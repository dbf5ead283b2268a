"""Squared distances between the primitives of a triangle mesh, for contact (float64).

    point-triangle:  d(p, T)  = min over y in triangle (a, b, c) of |p - y|^2
    edge-edge:       d(A, B)  = min over y in segment (a0, a1), z in segment (b0, b1) of |y - z|^2

Each distance is evaluated in two steps, as in IPC (Li et al., "Incremental Potential Contact",
SIGGRAPH 2020) and its toolkit: a *distance type* (which feature pair is closest: vertex, edge
interior or face interior) is classified on the plain values, then one smooth closed formula is
evaluated for that type:

    point-point  |p - q|^2
    point-line   |(u - p) x (v - p)|^2 / |v - u|^2                       (closest point inside the edge)
    point-plane  ((p - a) . n)^2 / |n|^2,      n = (b - a) x (c - a)      (closest point inside the face)
    line-line    ((b0 - a0) . n)^2 / |n|^2,    n = (a1 - a0) x (b1 - b0)  (closest points inside both edges)

so ``point_triangle_distance_sq`` and ``edge_edge_distance_sq`` are piecewise smooth, continuous with
a continuous gradient across the type boundaries, and run unchanged on plain ``wp.vec3d`` and on the
dual vectors of a :class:`warp_meshad.Problem` energy (call them from an energy; the toolkit rewrites
them with the energy). The types are plain ``int`` results of the ``*_distance_type`` functions.

Point-triangle types (Voronoi regions of the triangle, Ericson, "Real-Time Collision Detection" 5.1.5):
    0, 1, 2: closest to vertex a, b, c;  3, 4, 5: interior of edge ab, bc, ca;  6: face interior.
    A (numerically) degenerate triangle never gives 6: its closest edge feature is used instead.

Edge-edge types (Sunday / Eberly closest points of two segments, as in the IPC toolkit):
    0: interiors of both edges (line-line);
    1, 2: endpoint a0, a1 against the interior of edge b;  3, 4: endpoint b0, b1 against edge a;
    5, 6, 7, 8: endpoint pairs (a0, b0), (a0, b1), (a1, b0), (a1, b1).
    Nearly parallel edges (|(a1 - a0) x (b1 - b0)|^2 <= 1e-20 |a1 - a0|^2 |b1 - b0|^2) never give 0:
    the line-line formula is singular there; the closest endpoint-vs-edge feature is used instead.

The edge-edge mollifier of IPC (Li et al. 2020, Sec. 4.3) smooths the barrier where the edge-edge
distance is not smooth (parallel edges):

    c(x) = |(a1 - a0) x (b1 - b0)|^2,     eps_x = 1e-3 |a1_rest - a0_rest|^2 |b1_rest - b0_rest|^2,
    m(c) = -c^2 / eps_x^2 + 2 c / eps_x   if c < eps_x,   1 otherwise   (C1 at c = eps_x, m(0) = 0).

Units: positions in [m]; squared distances in [m^2]; the mollifier is dimensionless.
All literals are float64: the functions serve float64 problems and plain float64 kernels.
"""

from typing import Any

import warp as wp

from warp_meshad.kernels import ad

__all__ = [
    "edge_edge_cross_sq",
    "edge_edge_distance_sq",
    "edge_edge_distance_type",
    "edge_edge_mollifier",
    "edge_edge_mollifier_threshold",
    "line_line_distance_sq",
    "point_edge_distance_sq",
    "point_edge_distance_type",
    "point_line_distance_sq",
    "point_plane_distance_sq",
    "point_point_distance_sq",
    "point_triangle_distance_sq",
    "point_triangle_distance_type",
]


# ------------------------------------------------------------------------------------ closed formulas


@wp.func
def point_point_distance_sq(p: Any, q: Any):
    """|p - q|^2."""
    return ad.length_sq(p - q)


@wp.func
def point_line_distance_sq(p: Any, u: Any, v: Any):
    """Squared distance of p to the infinite line through u, v: |(u - p) x (v - p)|^2 / |v - u|^2."""
    return ad.length_sq(ad.cross(u - p, v - p)) / ad.length_sq(v - u)


@wp.func
def point_plane_distance_sq(p: Any, a: Any, b: Any, c: Any):
    """Squared distance of p to the plane through a, b, c: ((p - a) . n)^2 / |n|^2, n = (b - a) x (c - a)."""
    n = ad.cross(b - a, c - a)
    s = ad.dot(p - a, n)
    return s * s / ad.length_sq(n)


@wp.func
def line_line_distance_sq(a0: Any, a1: Any, b0: Any, b1: Any):
    """Squared distance of the lines (a0, a1), (b0, b1): ((b0 - a0) . n)^2 / |n|^2, n = (a1 - a0) x (b1 - b0)."""
    n = ad.cross(a1 - a0, b1 - b0)
    s = ad.dot(b0 - a0, n)
    return s * s / ad.length_sq(n)


# ------------------------------------------------------------------------------------ classification


@wp.func
def point_edge_distance_type(p: wp.vec3d, u: wp.vec3d, v: wp.vec3d):
    """Closest feature of segment (u, v) to p: 0 endpoint u, 1 endpoint v, 2 interior (plain values)."""
    e = v - u
    t = wp.dot(p - u, e)
    ee = wp.dot(e, e)
    if t <= wp.float64(0.0) or ee <= wp.float64(0.0):
        return 0
    if t >= ee:
        return 1
    return 2


@wp.func
def _point_segment_sq(p: wp.vec3d, u: wp.vec3d, v: wp.vec3d):
    """Plain squared distance of p to the closed segment (u, v)."""
    e = v - u
    ee = wp.dot(e, e)
    t = wp.float64(0.0)
    if ee > wp.float64(0.0):
        t = wp.clamp(wp.dot(p - u, e) / ee, wp.float64(0.0), wp.float64(1.0))
    return wp.length_sq(p - (u + e * t))


@wp.func
def _edge_code(p: wp.vec3d, u: wp.vec3d, v: wp.vec3d, vertex_u: int, vertex_v: int, interior: int):
    """Type code of p against segment (u, v): ``interior`` or the code of the closest endpoint."""
    t = point_edge_distance_type(p, u, v)
    if t == 0:
        return vertex_u
    if t == 1:
        return vertex_v
    return interior


@wp.func
def point_triangle_distance_type(p: wp.vec3d, a: wp.vec3d, b: wp.vec3d, c: wp.vec3d):
    """Region of triangle (a, b, c) closest to p (plain values): 0-2 vertex a/b/c, 3-5 edge ab/bc/ca, 6 face."""
    zero = wp.float64(0.0)
    ab = b - a
    ac = c - a
    ap = p - a
    d1 = wp.dot(ab, ap)
    d2 = wp.dot(ac, ap)
    if d1 <= zero and d2 <= zero:
        return 0
    bp = p - b
    d3 = wp.dot(ab, bp)
    d4 = wp.dot(ac, bp)
    if d3 >= zero and d4 <= d3:
        return 1
    cp = p - c
    d5 = wp.dot(ab, cp)
    d6 = wp.dot(ac, cp)
    if d6 >= zero and d5 <= d6:
        return 2
    vc = d1 * d4 - d3 * d2
    if vc <= zero and d1 >= zero and d3 <= zero:
        return 3
    va = d3 * d6 - d5 * d4
    if va <= zero and d4 - d3 >= zero and d5 - d6 >= zero:
        return 4
    vb = d5 * d2 - d1 * d6
    if vb <= zero and d2 >= zero and d6 <= zero:
        return 5
    nn = wp.length_sq(wp.cross(ab, ac))
    if nn > wp.float64(1.0e-20) * wp.dot(ab, ab) * wp.dot(ac, ac):
        return 6
    # degenerate (needle or point) triangle: the closest of its three edges
    dab = _point_segment_sq(p, a, b)
    dbc = _point_segment_sq(p, b, c)
    dca = _point_segment_sq(p, c, a)
    if dab <= dbc and dab <= dca:
        return _edge_code(p, a, b, 0, 1, 3)
    if dbc <= dca:
        return _edge_code(p, b, c, 1, 2, 4)
    return _edge_code(p, c, a, 2, 0, 5)


@wp.func
def _edge_edge_parallel_type(a0: wp.vec3d, a1: wp.vec3d, b0: wp.vec3d, b1: wp.vec3d):
    """Type of (nearly) parallel edges: the closest endpoint-vs-segment feature (never 0)."""
    d_a0 = _point_segment_sq(a0, b0, b1)
    d_a1 = _point_segment_sq(a1, b0, b1)
    d_b0 = _point_segment_sq(b0, a0, a1)
    d_b1 = _point_segment_sq(b1, a0, a1)
    if d_a0 <= d_a1 and d_a0 <= d_b0 and d_a0 <= d_b1:
        return _edge_code(a0, b0, b1, 5, 6, 1)
    if d_a1 <= d_b0 and d_a1 <= d_b1:
        return _edge_code(a1, b0, b1, 7, 8, 2)
    if d_b0 <= d_b1:
        return _edge_code(b0, a0, a1, 5, 7, 3)
    return _edge_code(b1, a0, a1, 6, 8, 4)


@wp.func
def edge_edge_distance_type(a0: wp.vec3d, a1: wp.vec3d, b0: wp.vec3d, b1: wp.vec3d):
    """Closest feature pair of segments (a0, a1), (b0, b1) (plain values); codes in the module docstring."""
    zero = wp.float64(0.0)
    u = a1 - a0
    v = b1 - b0
    w = a0 - b0
    a = wp.dot(u, u)
    b = wp.dot(u, v)
    c = wp.dot(v, v)
    d = wp.dot(u, w)
    e = wp.dot(v, w)
    den = a * c - b * b
    if wp.length_sq(wp.cross(u, v)) <= wp.float64(1.0e-20) * a * c or a <= zero or c <= zero:
        return _edge_edge_parallel_type(a0, a1, b0, b1)
    # s = sn / den on edge a, t = tn / td on edge b
    ty = 0
    sn = b * e - c * d
    tn = zero
    td = den
    if sn <= zero:
        tn = e
        td = c
        ty = 1
    elif sn >= den:
        tn = e + b
        td = c
        ty = 2
    else:
        tn = a * e - b * d
    if tn <= zero:
        # t = 0: b0 against edge a
        if -d <= zero:
            return 5
        if -d >= a:
            return 7
        return 3
    if tn >= td:
        # t = 1: b1 against edge a
        if b - d <= zero:
            return 6
        if b - d >= a:
            return 8
        return 4
    return ty


# ------------------------------------------------------------------------------------ distances


@wp.func
def point_edge_distance_sq(p: Any, u: Any, v: Any):
    """Squared distance of p to the closed segment (u, v) (plain or dual)."""
    t = point_edge_distance_type(ad.value(p), ad.value(u), ad.value(v))
    if t == 2:
        return point_line_distance_sq(p, u, v)
    q = ad.where(t == 1, v, u)
    return ad.length_sq(p - q)


@wp.func
def point_triangle_distance_sq(p: Any, a: Any, b: Any, c: Any):
    """Squared distance of p to the closed triangle (a, b, c) (plain or dual)."""
    t = point_triangle_distance_type(ad.value(p), ad.value(a), ad.value(b), ad.value(c))
    if t == 6:
        return point_plane_distance_sq(p, a, b, c)
    if t >= 3:
        u = ad.where(t == 3, a, ad.where(t == 4, b, c))
        v = ad.where(t == 3, b, ad.where(t == 4, c, a))
        return point_line_distance_sq(p, u, v)
    q = ad.where(t == 0, a, ad.where(t == 1, b, c))
    return ad.length_sq(p - q)


@wp.func
def edge_edge_distance_sq(a0: Any, a1: Any, b0: Any, b1: Any):
    """Squared distance of the closed segments (a0, a1) and (b0, b1) (plain or dual)."""
    t = edge_edge_distance_type(ad.value(a0), ad.value(a1), ad.value(b0), ad.value(b1))
    if t == 0:
        return line_line_distance_sq(a0, a1, b0, b1)
    if t <= 4:
        # an endpoint against the other edge's line
        p = ad.where(t == 1, a0, ad.where(t == 2, a1, ad.where(t == 3, b0, b1)))
        u = ad.where(t <= 2, b0, a0)
        v = ad.where(t <= 2, b1, a1)
        return point_line_distance_sq(p, u, v)
    p = ad.where(t <= 6, a0, a1)
    q = ad.where(t == 5 or t == 7, b0, b1)
    return ad.length_sq(p - q)


# ------------------------------------------------------------------------------------ mollifier


@wp.func
def edge_edge_cross_sq(a0: Any, a1: Any, b0: Any, b1: Any):
    """c = |(a1 - a0) x (b1 - b0)|^2 [m^4], zero for parallel edges (plain or dual)."""
    return ad.length_sq(ad.cross(a1 - a0, b1 - b0))


@wp.func
def edge_edge_mollifier_threshold(a0: wp.vec3d, a1: wp.vec3d, b0: wp.vec3d, b1: wp.vec3d):
    """eps_x = 1e-3 |a1 - a0|^2 |b1 - b0|^2 [m^4], from rest positions (plain values)."""
    return wp.float64(1.0e-3) * wp.length_sq(a1 - a0) * wp.length_sq(b1 - b0)


@wp.func
def edge_edge_mollifier(a0: Any, a1: Any, b0: Any, b1: Any, eps_x: wp.float64):
    """m = -c^2 / eps_x^2 + 2 c / eps_x for c < eps_x, else 1; c = |(a1 - a0) x (b1 - b0)|^2 (plain or dual)."""
    c = edge_edge_cross_sq(a0, a1, b0, b1)
    if c < eps_x:
        r = c / eps_x
        return (wp.float64(2.0) - r) * r
    return c * wp.float64(0.0) + wp.float64(1.0)  # 1, of c's type (a constant dual in dual mode)
