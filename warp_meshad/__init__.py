"""warp_meshad: second-order automatic differentiation of mesh energies on the GPU, on NVIDIA Warp.

A user writes one local energy term as a ``@wp.func`` over one element's variables; a
:class:`Problem` evaluates it over every element with forward-mode dual numbers and assembles the
energy, gradient, sparse Hessian (or Jacobian, or a matrix-free Hessian-vector product) into
storage preallocated from the mesh topology.

The device library (dual numbers, ``ad`` math, built-in energies) is :mod:`warp_meshad.kernels`.
"""

from ._src.convert import to_cupy, to_scipy
from ._src.mesh import MeshError, TriMesh
from ._src.linear import LinearSolveInfo, make_linear_solver
from ._src.problem import Problem
from ._src.solvers import (
    GaussNewtonSolver,
    GradientDescentSolver,
    LBFGSSolver,
    NewtonCGSolver,
    NewtonSolver,
    SolveResult,
)
from ._src.tutte import tutte_embedding

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
    "TriMesh",
    "make_linear_solver",
    "to_cupy",
    "to_scipy",
    "tutte_embedding",
]
