"""Face residuals of curl-reduced 4-direction fields: closeness to a reference field and a barrier on the cross angle.

A face's variable is the vec4 x_f = (Re alpha, Im alpha, Re beta, Im beta) of its two field vectors in the face's
local frame (see :mod:`.polycurl`).

    closeness:  r_f = sqrt(w_f) (x_f - x_f^ref)                                             (vec4)

    barrier:    s_f = Im(beta conj(alpha)) = alpha_x beta_y - alpha_y beta_x   (|alpha| |beta| sin of their angle)
                r_f = sqrt(w_b) (1 / g(s_f / s^) - 1)    if 0 < s_f < s^,   with g(u) = u^3 - 3 u^2 + 3 u,
                      0                                  if s_f >= s^,
                      +inf                               if s_f <= 0 (beta not counter-clockwise of alpha).

The reference x^ref is the field of the previous iteration (a proximal term that keeps Gauss-Newton steps small),
or a prescribed field on constrained faces (with a large weight: soft constraints).

Parameters (:class:`PolyVectorFaceData`, float64):
    reference: x^ref per face, shape [face_count], wp.vec4d [dimensionless, as the field].
    closeness_weight (w_f): per face, shape [face_count], float64 (TinyAD: 1e-3, 100 on constrained faces).
    barrier_weight (w_b): dimensionless (TinyAD: 0.1).
    barrier_start (s^): where the barrier starts, > 0 (TinyAD: 0.9; unit orthogonal vectors have s = 1).

Source: TinyAD-Examples ``apps/polycurl_reduction.cc`` (P. Schmidt et al. 2022), after the closeness and convexity
terms of O. Diamanti et al., "Integrable PolyVector Fields", ACM TOG 34(4), 2015. g is the cubic of Schüller et
al., "Locally Injective Mappings" (SGP 2013): g(0) = 0, g(1) = 1, g'(1) = g''(1) = 0, so the barrier is C2 at s^.

Invariants: closeness is zero exactly at the reference; the barrier residual is >= 0, zero for s_f >= s^, -> +inf
as s_f -> 0+ and +inf for s_f <= 0 (a line search rejects the step), invariant under rotating both vectors.
"""

from typing import Any

import warp as wp

__all__ = ["PolyVectorFaceData", "polyvector_barrier", "polyvector_closeness"]


@wp.struct
class PolyVectorFaceData:
    """reference: x^ref per face, wp.vec4d; closeness_weight: w_f per face, float64; barrier_weight, barrier_start:
    float64."""

    reference: wp.array(dtype=wp.vec4d)
    closeness_weight: wp.array(dtype=wp.float64)
    barrier_weight: wp.float64
    barrier_start: wp.float64


@wp.func
def polyvector_closeness(f: int, x: Any, data: PolyVectorFaceData):
    """sqrt(w_f) (x_f - x_f^ref) (vec4)."""
    return wp.sqrt(data.closeness_weight[f]) * (x - data.reference[f])


@wp.func
def polyvector_barrier(f: int, x: Any, data: PolyVectorFaceData):
    """sqrt(w_b) (1 / g(s / s^) - 1) for 0 < s < s^, 0 beyond, +inf for s <= 0; s = Im(beta conj(alpha))."""
    s = x.x * x.w - x.y * x.z
    if s <= 0.0:
        return wp.float64(wp.inf)
    if s >= data.barrier_start:
        return 0.0
    u = s / data.barrier_start
    g = u * u * u - 3.0 * u * u + 3.0 * u
    return wp.sqrt(data.barrier_weight) * (1.0 / g - 1.0)
