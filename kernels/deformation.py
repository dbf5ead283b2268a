"""The deformation gradient of a linear tetrahedron, for the tet energies (float64 problems).

    F = D_s D_m^-1,    D_s = [x_1 - x_0, x_2 - x_0, x_3 - x_0]      (current edge vectors as columns),

with D_m the rest matrix of the tet (``TetMesh.rest_matrices``) and D_m^-1 its inverse
(``TetMesh.rest_matrix_inverses``, [1/m]); F is dimensionless, F = I at the rest shape and F = R under a rigid motion.

:func:`tet_deformation_columns` runs unchanged on plain ``wp.vec3d`` and on the dual vectors of a
:class:`warp_meshad.Problem` energy (call it from an energy; the toolkit rewrites it with the energy). It takes the
already-read ``D_m^-1`` of the tet, not the energy's data struct, so that a parameter field read in the energy
(``data.rest_inverse[t]``) can be seeded there.
"""

from typing import Any

import warp as wp

__all__ = ["tet_deformation_columns"]


@wp.func
def tet_deformation_columns(x0: Any, x1: Any, x2: Any, x3: Any, dinv: Any):
    """The three columns f1, f2, f3 of F = [x1 - x0, x2 - x0, x3 - x0] dinv (dinv = D_m^-1, 3 x 3)."""
    e1 = x1 - x0
    e2 = x2 - x0
    e3 = x3 - x0
    f1 = e1 * dinv[0, 0] + e2 * dinv[1, 0] + e3 * dinv[2, 0]
    f2 = e1 * dinv[0, 1] + e2 * dinv[1, 1] + e3 * dinv[2, 1]
    f3 = e1 * dinv[0, 2] + e2 * dinv[1, 2] + e3 * dinv[2, 2]
    return f1, f2, f3
