"""warp_meshad: second-order automatic differentiation of mesh energies on the GPU, on NVIDIA Warp.

A user writes one local energy term as a ``@wp.func`` over one element's variables; a
:class:`Problem` evaluates it over every element with forward-mode dual numbers and assembles the
energy, gradient, sparse Hessian (or Jacobian, or a matrix-free Hessian-vector product) into
storage preallocated from the mesh topology.

The device library (dual numbers, ``ad`` math, built-in energies) is :mod:`warp_meshad.kernels`.
"""

import os as _os

# Running from a source checkout without installing (PYTHONPATH=<repo>): the device library lives in
# <repo>/kernels and is installed as warp_meshad.kernels; let the same name resolve here.
_root = _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))
if _os.path.isfile(_os.path.join(_root, "pyproject.toml")) and _os.path.isfile(
    _os.path.join(_root, "kernels", "_dualgen.py")
) and not any(_os.path.isfile(_os.path.join(p, "kernels", "_dualgen.py")) for p in __path__):
    __path__.append(_root)

from ._src.interop.convert import to_cupy, to_scipy  # noqa: E402
from ._src.mesh.trimesh import MeshError, TriMesh  # noqa: E402
from ._src.mesh.tetmesh import TetMesh  # noqa: E402
from ._src.solve.linear import LinearSolveInfo, make_linear_solver  # noqa: E402
from ._src.mesh.locality import locality_order  # noqa: E402
from ._src.problem.parameters import implicit_gradient  # noqa: E402
from ._src.problem.problem import Problem  # noqa: E402
from ._src.solve.solvers import (  # noqa: E402
    GaussNewtonSolver,
    GradientDescentSolver,
    LBFGSSolver,
    NewtonCGSolver,
    NewtonSolver,
    SolveResult,
)
from ._src.mesh.tutte import tutte_embedding  # noqa: E402

__version__ = "0.1.0"

__all__ = [
    "GaussNewtonSolver",
    "GradientDescentSolver",
    "LBFGSSolver",
    "LinearSolveInfo",
    "MeshError",
    "NewtonCGSolver",
    "NewtonSolver",
    "Problem",
    "SolveResult",
    "TetMesh",
    "TriMesh",
    "locality_order",
    "implicit_gradient",
    "make_linear_solver",
    "to_cupy",
    "to_scipy",
    "tutte_embedding",
]
