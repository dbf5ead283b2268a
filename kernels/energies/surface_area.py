"""Area of one triangle of a surface in 3D.

    E_f(x_0, x_1, x_2) = 1/2 |(x_1 - x_0) x (x_2 - x_0)|

Summed over the faces this is the surface area; its gradient is the mean curvature normal
(times the vertex area), so gradient descent on it is mean-curvature flow and its minimizers with
fixed boundary are minimal surfaces (Pinkall & Polthier, "Computing Discrete Minimal Surfaces and
Their Conjugates", Experimental Mathematics 2(1), 1993).

Parameters:
    x_0, x_1, x_2: positions of the face's corners (variable_dim = 3) [length]; E_f in [length^2].

Invariants: E_f >= 0; invariant under rigid motions and under cyclic or reversed corner order;
scales by s^2 under a scaling by s. The derivatives are undefined for a degenerate (zero-area)
face, and the Hessian is indefinite in general: use ``eval_with_hessian_proj`` in Newton.
"""

from typing import Any

import warp as wp

from warp_meshad.kernels import ad

__all__ = ["surface_area"]


@wp.func
def surface_area(f: int, x0: Any, x1: Any, x2: Any):
    """1/2 |(x1 - x0) x (x2 - x0)|."""
    return 0.5 * ad.length(ad.cross(x1 - x0, x2 - x0))  # the literal takes the problem's dtype
