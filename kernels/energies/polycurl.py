"""Edge residuals of curl-reduced 4-direction fields: smoothness, polycurl and polyquotient across one edge.

A face f carries two tangent vectors alpha_f, beta_f as complex numbers in the face's local frame (t1, t2): the
variable of a face is the vec4 (Re alpha, Im alpha, Re beta, Im beta). The 4-direction field {+-alpha, +-beta} is the
set of roots of the PolyVector z^4 + C_2 z^2 + C_0 with C_0 = alpha^2 beta^2 and C_2 = -(alpha^2 + beta^2). For an
interior edge with unit direction e, e_f and e_g are e in the frames of its faces f and g (complex numbers), and
t_fg = conj(e_f) / conj(e_g) = conj(e_f) e_g transports a vector of f to g (same angle to the edge).

    smoothness (Eq. 17-18):   r_s = sqrt(w_s) (C_0f t_fg^4 - C_0g,  C_2f t_fg^2 - C_2g)   (real and imaginary parts)

    with a_f = Re(alpha_f conj(e_f)), b_f = Re(beta_f conj(e_f)) (and a_g, b_g in g) the components along the edge,
    polycurl (Eq. 11, 19):    r_c = (w_c (a_f^2 b_f^2 - a_g^2 b_g^2),  sqrt(w_c) ((a_f^2 + b_f^2) - (a_g^2 + b_g^2)))
    polyquotient (Eq. 21):    r_q = sqrt(w_q) ((b_f^2 - a_f^2) a_g b_g - (b_g^2 - a_g^2) a_f b_f)

``polyvector_smoothness`` returns r_s (vec4), ``polycurl`` returns (r_c, r_q) (vec3); added with
``add_residual_term(mesh.edge_faces, ..., weight=2.0)`` the problem's energy is the plain sum of squared residuals.

Parameters (:class:`PolyCurlData`, float64):
    edge_f, edge_g: the edge's unit direction (vertex edges[e, 0] -> edges[e, 1]) in the frames of edge_faces[e, 0]
        and edge_faces[e, 1], shape [interior edge count], wp.vec2d [dimensionless].
    smoothness_weight (w_s), curl_weight (w_c), quotient_weight (w_q): dimensionless. The polycurl's first
        coefficient is scaled by w_c, not sqrt(w_c), as in TinyAD's example (which follows the reference
        implementation in libdirectional; TinyAD's defaults w_c = 100, w_q = 10).
    The field variables are dimensionless (unit vectors at the start), so the residuals are too.

Source: O. Diamanti, A. Vaxman, D. Panozzo, O. Sorkine-Hornung, "Integrable PolyVector Fields", ACM TOG 34(4)
(SIGGRAPH 2015), Eq. 11, 17-19, 21 (with the sign typo of Eq. 14/21 fixed as in TinyAD); TinyAD-Examples
``apps/polycurl_reduction.cc`` (P. Schmidt et al. 2022).

Invariants: all residuals vanish for a field that is the parallel transport of one cross across a flat (planar) pair
of faces and is curl free there (a constant field on a plane); all are invariant under swapping alpha and beta and
under alpha -> -alpha or beta -> -beta (they see the unordered cross); r_c and r_q are invariant under reversing e;
swapping f and g leaves |r_s|, |r_c| and |r_q| unchanged. The residuals are polynomials (degree 4) in the
variables, so their derivatives exist everywhere.
"""

from typing import Any

import warp as wp

from warp_meshad.kernels import ad

__all__ = ["PolyCurlData", "polycurl", "polyvector_smoothness"]


@wp.struct
class PolyCurlData:
    """edge_f, edge_g: unit edge direction in the frames of the edge's two faces, shape [edge count], wp.vec2d;
    smoothness_weight, curl_weight, quotient_weight: float64 weights."""

    edge_f: wp.array(dtype=wp.vec2d)
    edge_g: wp.array(dtype=wp.vec2d)
    smoothness_weight: wp.float64
    curl_weight: wp.float64
    quotient_weight: wp.float64


@wp.func
def _cmul(a: Any, b: Any):
    """Complex product of two vec2 (re, im)."""
    return ad.vec2(a.x * b.x - a.y * b.y, a.x * b.y + a.y * b.x)


@wp.func
def _csq(re: Any, im: Any):
    """Complex square of re + i im, as a vec2."""
    return ad.vec2(ad.sq(re) - ad.sq(im), 2.0 * re * im)


@wp.func
def polyvector_smoothness(e: int, xf: Any, xg: Any, data: PolyCurlData):
    """sqrt(w_s) (C_0f t^4 - C_0g, C_2f t^2 - C_2g) with t = conj(e_f) e_g (real and imaginary parts, vec4)."""
    ef = data.edge_f[e]
    eg = data.edge_g[e]
    t = wp.vec2d(ef[0] * eg[0] + ef[1] * eg[1], ef[0] * eg[1] - ef[1] * eg[0])
    t2 = _csq(t[0], t[1])
    t4 = _csq(t2[0], t2[1])
    alpha_f2 = _csq(xf.x, xf.y)  # alpha_f^2
    beta_f2 = _csq(xf.z, xf.w)
    alpha_g2 = _csq(xg.x, xg.y)
    beta_g2 = _csq(xg.z, xg.w)
    # C_0 = alpha^2 beta^2 and C_2 = -(alpha^2 + beta^2) in f (transported to g) and in g
    r0 = _cmul(_cmul(alpha_f2, beta_f2), t4) - _cmul(alpha_g2, beta_g2)
    r2 = (alpha_g2 + beta_g2) - _cmul(alpha_f2 + beta_f2, t2)
    s = wp.sqrt(data.smoothness_weight)
    return ad.vec4(s * r0.x, s * r0.y, s * r2.x, s * r2.y)


@wp.func
def polycurl(e: int, xf: Any, xg: Any, data: PolyCurlData):
    """(w_c (c_0f - c_0g), sqrt(w_c) (c_2f - c_2g), sqrt(w_q) (polyquotient)) of the edge components (vec3)."""
    ef = data.edge_f[e]
    eg = data.edge_g[e]
    af = xf.x * ef[0] + xf.y * ef[1]  # Re(alpha_f conj(e_f))
    bf = xf.z * ef[0] + xf.w * ef[1]
    ag = xg.x * eg[0] + xg.y * eg[1]
    bg = xg.z * eg[0] + xg.w * eg[1]
    af2 = ad.sq(af)
    bf2 = ad.sq(bf)
    ag2 = ad.sq(ag)
    bg2 = ad.sq(bg)
    curl0 = data.curl_weight * (af2 * bf2 - ag2 * bg2)
    curl2 = wp.sqrt(data.curl_weight) * ((ag2 + bg2) - (af2 + bf2))
    quotient = wp.sqrt(data.quotient_weight) * ((bf2 - af2) * (ag * bg) - (bg2 - ag2) * (af * bf))
    return ad.vec3(curl0, curl2, quotient)
