"""Additive continuous collision detection (ACCD) of point-triangle and edge-edge pairs (float64).

Over a linear step x_i(t) = x_i + t dx_i, t in [0, t_max], ACCD (Li, Kaufman, Jiang, "Codimensional
Incremental Potential Contact", ACM TOG 40(4), SIGGRAPH 2021, Algorithm 1) advances t by steps that
are provably collision free: after removing the pair's mean displacement (distances are
translation invariant), l_p bounds how fast the distance can shrink,

    point-triangle:  l_p = |dp| + max(|da|, |db|, |dc|),
    edge-edge:       l_p = max(|da0|, |da1|) + max(|db0|, |db1|),

so |d(t) - d(t')| <= l_p |t - t'| for the unsquared distance d, and from a configuration at distance
d the step t_l = s (d^2 - xi^2) / ((d + xi) l_p) = s (d - xi) / l_p keeps the distance above
xi + (1 - s)(d - xi) > xi. The iteration stops once the distance has fallen below the gap
(1 - s)(d_0 - xi) (the returned t is then the start of that last, rejected step) or t passes t_max
(no impact before t_max: t_max is returned). s is the conservative rescaling (0.9 as in the paper
and the IPC toolkit).

Guarantees: every returned t is safe, i.e. the distance stays > xi along [0, t]; t > 0 whenever the
pair starts farther apart than xi and moves (the first step is always taken), so a pair already
separated and moving apart never blocks a step; t = t_max when nothing moves. ``max_iterations``
caps the loop (grazing motions take many small steps): t is then the (still safe) progress so far.

Units: positions and displacements [m]; xi (``min_distance``) [m]; t dimensionless (a fraction of
the step).
"""

import warp as wp

from .distance import edge_edge_distance_sq, point_triangle_distance_sq

__all__ = ["edge_edge_ccd", "point_triangle_ccd"]


@wp.func
def _accd_advance(d_sq: wp.float64, min_distance: wp.float64, rescaling: wp.float64, lp: wp.float64):
    """The ACCD step s (d^2 - xi^2) / ((d + xi) l_p)."""
    return rescaling * (d_sq - min_distance * min_distance) / ((wp.sqrt(d_sq) + min_distance) * lp)


@wp.func
def point_triangle_ccd(
    p: wp.vec3d,
    a: wp.vec3d,
    b: wp.vec3d,
    c: wp.vec3d,
    dp: wp.vec3d,
    da: wp.vec3d,
    db: wp.vec3d,
    dc: wp.vec3d,
    min_distance: wp.float64,
    t_max: wp.float64,
    rescaling: wp.float64,
    max_iterations: int,
):
    """Safe time of impact in [0, t_max] of point p and triangle (a, b, c) moving by dp, da, db, dc.

    Returns 0 when the pair starts at distance <= min_distance, t_max when no impact happens before
    t_max, else the ACCD time of impact (the distance stays > min_distance on [0, t]).
    """
    zero = wp.float64(0.0)
    mean = (dp + da + db + dc) * wp.float64(0.25)
    up = dp - mean
    ua = da - mean
    ub = db - mean
    uc = dc - mean
    lp = wp.length(up) + wp.max(wp.length(ua), wp.max(wp.length(ub), wp.length(uc)))
    d_sq = point_triangle_distance_sq(p, a, b, c)
    xi_sq = min_distance * min_distance
    if d_sq <= xi_sq:
        return zero
    if lp <= zero:
        return t_max
    gap = (wp.float64(1.0) - rescaling) * (d_sq - xi_sq) / (wp.sqrt(d_sq) + min_distance)
    t = zero
    for _it in range(max_iterations):
        tl = _accd_advance(d_sq, min_distance, rescaling, lp)
        tn = t + tl
        d_sq = point_triangle_distance_sq(p + up * tn, a + ua * tn, b + ub * tn, c + uc * tn)
        if t > zero and (d_sq - xi_sq) / (wp.sqrt(d_sq) + min_distance) < gap:
            return t
        t = tn
        if t > t_max:
            return t_max
    return wp.min(t, t_max)


@wp.func
def edge_edge_ccd(
    a0: wp.vec3d,
    a1: wp.vec3d,
    b0: wp.vec3d,
    b1: wp.vec3d,
    da0: wp.vec3d,
    da1: wp.vec3d,
    db0: wp.vec3d,
    db1: wp.vec3d,
    min_distance: wp.float64,
    t_max: wp.float64,
    rescaling: wp.float64,
    max_iterations: int,
):
    """Safe time of impact in [0, t_max] of edges (a0, a1) and (b0, b1) moving by da0, da1, db0, db1.

    Same contract as :func:`point_triangle_ccd`.
    """
    zero = wp.float64(0.0)
    mean = (da0 + da1 + db0 + db1) * wp.float64(0.25)
    ua0 = da0 - mean
    ua1 = da1 - mean
    ub0 = db0 - mean
    ub1 = db1 - mean
    lp = wp.max(wp.length(ua0), wp.length(ua1)) + wp.max(wp.length(ub0), wp.length(ub1))
    d_sq = edge_edge_distance_sq(a0, a1, b0, b1)
    xi_sq = min_distance * min_distance
    if d_sq <= xi_sq:
        return zero
    if lp <= zero:
        return t_max
    gap = (wp.float64(1.0) - rescaling) * (d_sq - xi_sq) / (wp.sqrt(d_sq) + min_distance)
    t = zero
    for _it in range(max_iterations):
        tl = _accd_advance(d_sq, min_distance, rescaling, lp)
        tn = t + tl
        d_sq = edge_edge_distance_sq(a0 + ua0 * tn, a1 + ua1 * tn, b0 + ub0 * tn, b1 + ub1 * tn)
        if t > zero and (d_sq - xi_sq) / (wp.sqrt(d_sq) + min_distance) < gap:
            return t
        t = tn
        if t > t_max:
            return t_max
    return wp.min(t, t_max)
