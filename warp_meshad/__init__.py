"""warp_meshad: second-order automatic differentiation of mesh energies on the GPU, on NVIDIA Warp.

A user writes one local energy term as a ``@wp.func`` over one element's variables; a
:class:`Problem` evaluates it over every element with forward-mode dual numbers and assembles the
energy, gradient, sparse Hessian (or Jacobian, or a matrix-free Hessian-vector product) into
storage preallocated from the mesh topology.

The device library (dual numbers, ``ad`` math, built-in energies) is :mod:`warp_meshad.kernels`; the app framework
:mod:`warp_meshad.app`, contact :mod:`warp_meshad.contact`, time stepping :mod:`warp_meshad.dynamics`, the apps
:mod:`warp_meshad.apps` and their YAML scenes :mod:`warp_meshad.configs`.

Importing the package imports none of them, nor Warp: each name of ``__all__`` comes from its module when it is
first used (``wm.Problem`` imports the problem's modules, ``wm.NewtonSolver`` the solvers').
"""

import importlib as _importlib

__version__ = "0.1.0"

# each public name and the private module that defines it: imported on first use (PEP 562), so that importing the
# package costs nothing of Warp, the solvers or the linear back-ends until a name is asked for
_HOMES = {
    "BatchNewtonSolver": "warp_meshad._src.solve.batch_solver",
    "BatchSolveResult": "warp_meshad._src.solve.batch_solver",
    "DeviceLoop": "warp_meshad._src.solve.options",
    "EnergyError": "warp_meshad._src.codegen.energy_errors",
    "GaussNewtonSolver": "warp_meshad._src.solve.solvers",
    "GradientDescentSolver": "warp_meshad._src.solve.solvers",
    "LBFGSSolver": "warp_meshad._src.solve.solvers",
    "LineSearch": "warp_meshad._src.solve.options",
    "LinearSolveError": "warp_meshad._src.solve.linear",
    "LinearSolveInfo": "warp_meshad._src.solve.linear",
    "LinearSolver": "warp_meshad._src.solve.linear",
    "MeshError": "warp_meshad._src.mesh.trimesh",
    "NewtonCGSolver": "warp_meshad._src.solve.solvers",
    "NewtonHooks": "warp_meshad._src.solve.solvers",
    "NewtonSolver": "warp_meshad._src.solve.solvers",
    "OneRings": "warp_meshad._src.mesh.one_rings",
    "Problem": "warp_meshad._src.problem.problem",
    "ProblemBatch": "warp_meshad._src.problem.batch",
    "Projection": "warp_meshad._src.solve.options",
    "RemeshResult": "warp_meshad._src.mesh.remesh",
    "SolveResult": "warp_meshad._src.solve.solvers",
    "TetMesh": "warp_meshad._src.mesh.tetmesh",
    "TileConfig": "warp_meshad._src.problem.tiled",
    "TriMesh": "warp_meshad._src.mesh.trimesh",
    "locality_order": "warp_meshad._src.mesh.locality",
    "implicit_gradient": "warp_meshad._src.solve.implicit",
    "make_linear_solver": "warp_meshad._src.solve.linear",
    "remesh_isotropic": "warp_meshad._src.mesh.remesh",
    "to_cupy": "warp_meshad._src.interop.convert",
    "to_scipy": "warp_meshad._src.interop.convert",
    "tutte_embedding": "warp_meshad._src.mesh.tutte",
}
# the public submodules, reachable as attributes too (``wm.app`` after ``import warp_meshad as wm``)
_SUBMODULES = ("app", "apps", "configs", "contact", "dynamics", "kernels", "torch")

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
    "OneRings",
    "Problem",
    "ProblemBatch",
    "Projection",
    "RemeshResult",
    "SolveResult",
    "TetMesh",
    "TileConfig",
    "TriMesh",
    "locality_order",
    "implicit_gradient",
    "make_linear_solver",
    "remesh_isotropic",
    "to_cupy",
    "to_scipy",
    "tutte_embedding",
]


def __getattr__(name: str):
    home = _HOMES.get(name)
    if home is not None:
        value = getattr(_importlib.import_module(home), name)
    elif name in _SUBMODULES:
        value = _importlib.import_module(f"{__name__}.{name}")
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value  # later look-ups find it without this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__) | set(_SUBMODULES))
