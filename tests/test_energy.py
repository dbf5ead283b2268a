"""The rewriting of user energies (warp_meshad/_src/codegen/energy_rewrite.py): ``==`` and ``!=`` on dual numbers compare values, as
they do in the plain mode, so one energy gives the same energy in every mode and the derivatives of its branch."""

from typing import Any

import numpy as np
import warp as wp

import warp_meshad as wm
from warp_meshad.kernels import ad


@wp.func
def unit_free_spring(e: int, xa: Any, xb: Any):
    """Element 0 and edges of length exactly 1 (the axis-aligned edges of a 3 x 3 grid of size 2 x 2) cost nothing; the
    others (the diagonals, length sqrt(2), for which ``l != l`` is False) cost 0.5 (l - 1)^2."""
    l = ad.length(xa - xb)
    if e == 0 or l == 1.0:
        return 0.0 * l
    if l != l:  # NaN only
        return 1.0e6 + l
    return 0.5 * (l - 1.0) * (l - 1.0)


def test_equality_on_duals_compares_values():
    mesh = wm.TriMesh.grid(3, 3, 2.0, 2.0)
    x = mesh.vertices.copy()
    problem = wm.Problem(variable_count=mesh.vertex_count, variable_dim=3, dtype=wp.float64, device="cpu")
    problem.add_term(elements=mesh.edges, energy=unit_free_spring)
    xd = wp.array(x, dtype=wp.vec3d, device="cpu")
    f, g = problem.eval_with_gradient(xd)

    # reference: the same branches in numpy
    f_ref, g_ref = 0.0, np.zeros_like(x)
    for e, (a, b) in enumerate(mesh.edges):
        d = x[a] - x[b]
        length = np.linalg.norm(d)
        if e == 0 or length == 1.0:
            continue
        f_ref += 0.5 * (length - 1.0) ** 2
        dl = (length - 1.0) * d / length
        g_ref[a] += dl
        g_ref[b] -= dl
    diagonals = sum(1 for a, b in mesh.edges if not np.isclose(np.linalg.norm(x[a] - x[b]), 1.0))
    assert diagonals == 4 and f_ref > 0.0
    np.testing.assert_allclose(f, f_ref, rtol=1e-14)
    np.testing.assert_allclose(problem.eval(xd), f_ref, rtol=1e-14)  # the plain mode's builtin == agrees
    np.testing.assert_allclose(g.numpy(), g_ref, rtol=1e-13, atol=1e-15)
