"""warp_meshad: second-order automatic differentiation of mesh energies on the GPU, on NVIDIA Warp.

A user writes one local energy term as a ``@wp.func`` over one element's variables; a
:class:`Problem` evaluates it over every element with forward-mode dual numbers and assembles the
energy, gradient, sparse Hessian (or Jacobian, or a matrix-free Hessian-vector product) into
storage preallocated from the mesh topology.

The device library (dual numbers, ``ad`` math, built-in energies) is :mod:`warp_meshad.kernels`; the app framework
:mod:`warp_meshad.app`, contact :mod:`warp_meshad.contact`, time stepping :mod:`warp_meshad.dynamics`, the apps
:mod:`warp_meshad.apps` and their YAML scenes :mod:`warp_meshad.configs`.
"""

from ._src.codegen.energy_errors import EnergyError
from ._src.interop.convert import to_cupy, to_scipy
from ._src.mesh.trimesh import MeshError, TriMesh
from ._src.mesh.tetmesh import TetMesh
from ._src.solve.linear import LinearSolveError, LinearSolveInfo, LinearSolver, make_linear_solver
from ._src.mesh.locality import locality_order
from ._src.solve.implicit import implicit_gradient
from ._src.problem.problem import Problem
from ._src.problem.batch import ProblemBatch
from ._src.solve.batch_solver import BatchNewtonSolver, BatchSolveResult
from ._src.solve.options import DeviceLoop, LineSearch, Projection
from ._src.problem.tiled import TileConfig
from ._src.solve.solvers import (
    GaussNewtonSolver,
    GradientDescentSolver,
    LBFGSSolver,
    NewtonCGSolver,
    NewtonHooks,
    NewtonSolver,
    SolveResult,
)
from ._src.mesh.tutte import tutte_embedding

__version__ = "0.1.0"

__all__ = [
    "BatchNewtonSolver",
    "BatchSolveResult",
    "DeviceLoop",
    "EnergyError",
    "GaussNewtonSolver",
    "GradientDescentSolver",
    "LBFGSSolver",
    "LineSearch",
    "LinearSolveError",
    "LinearSolveInfo",
    "LinearSolver",
    "MeshError",
    "NewtonCGSolver",
    "NewtonHooks",
    "NewtonSolver",
    "Problem",
    "ProblemBatch",
    "Projection",
    "SolveResult",
    "TetMesh",
    "TileConfig",
    "TriMesh",
    "locality_order",
    "implicit_gradient",
    "make_linear_solver",
    "to_cupy",
    "to_scipy",
    "tutte_embedding",
]
