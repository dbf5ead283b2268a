"""Sparse linear back-ends for Newton-type solvers, behind one interface.

Every back-end solves ``A x = b`` for a square :class:`warp.sparse.BsrMatrix` ``A`` with square blocks
(``block_dim x block_dim``) and block vectors ``b``, ``x`` (``wp.array`` of shape ``[n_block_rows]`` and dtype
``vec{block_dim}{f|d}``, or the scalar dtype for 1x1 blocks). ``x`` is written in place; iterative back-ends use its
input value as the initial guess.

Back-ends (pick one by name with :func:`make_linear_solver`), one file each:

- ``"scipy"`` (``scipy.py``): SuperLU (``scipy.sparse.linalg.splu``) on the host. The scalar CSR pattern is built
  once per sparsity pattern and refilled in place; SciPy exposes no reusable symbolic factorization, so ordering runs
  each call.
- ``"qdldl"`` (``qdldl.py``): sparse LDL^T (QDLDL, AMD ordering) on the host, for symmetric matrices: ordering and
  symbolic factorization once per pattern, a numeric refactorization per call; falls back to SuperLU where LDL^T
  without pivoting fails (an indefinite or singular matrix).
- ``"cg"`` (``cg.py``): Warp's conjugate gradient (``warp.optim.linear.cg``) with a ``"none"``, ``"diag"`` or
  ``"block_jacobi"`` preconditioner, on CPU and GPU. Solver buffers are allocated once per system shape.
- ``"cupy"`` (``spsolve.py``): ``cupyx.scipy.sparse.linalg.spsolve`` on a zero-copy CuPy CSR view of our device
  buffers (GPU only).
- ``"cudss"`` (``cudss.py``): NVIDIA cuDSS through nvmath-python's ``nvmath.sparse.advanced.DirectSolver`` (GPU
  only). Reordering and symbolic factorization (``plan()``) run once per sparsity pattern (optionally taken back from
  an on-disk cache, ``analysis_cache``: ``cudss_analysis_cache.py``); each call refills the CSR values in place and
  runs the numeric factorization and the solve as two direct cuDSS calls on ``b`` and ``x`` (no copies), which the
  device loop can capture in a CUDA graph.
- ``"auto"`` (``registry.py``): cuDSS where it imports and works on a CUDA device, else CuPy, else Warp CG with
  block-Jacobi on a GPU; QDLDL on the CPU where it imports (SciPy when given ``symmetric=False`` or an
  ``ordering``), else SciPy. ``solver.name`` says which was picked (logged once per device with :mod:`logging`) and
  ``solver.cudss_skipped_reason`` why cuDSS was not (on a CUDA device also one ``warnings.warn`` per device and
  reason: cuDSS was probed there and failed).

The sparsity pattern of ``A`` is identified by its ``offsets``/``columns`` array objects, their addresses, the block
count and the shape: a matrix whose pattern is rebuilt *in place* in the same arrays must be announced with
:meth:`LinearSolver.invalidate_pattern` (or by bumping an integer ``pattern_version`` attribute on the matrix).

The direct back-ends (``"cudss"``, ``"qdldl"``, ``"scipy"``) can let one factorization serve several solves
(``reuse_factorization``) and factorize in float32 (``factor_dtype``, ``"cudss"`` and ``"scipy"``), refining in
float64: the semantics are in ``reuse.py``.

Files: ``base.py`` (the interface :class:`LinearSolver`, :class:`LinearSolveInfo`, :class:`LinearSolveError`, the
system checks and residual helpers), ``csr.py`` (BSR -> scalar CSR kernels and buffers), ``reuse.py`` (the
factor-reuse policy), ``gpu_csr.py`` (the CuPy views and thread binding the two GPU back-ends share), one file per
back-end as above, ``cudss_analysis_cache.py`` and ``registry.py`` (the table of back-ends by name,
:data:`LINEAR_SOLVER_NAMES`, :func:`make_linear_solver`, the probe and ``"auto"``). Optional packages (SciPy's
solvers, QDLDL, CuPy, nvmath-python) are imported when a back-end is made or solves, never with this package.
"""

from warp_meshad._src.solve.linear.base import LinearSolveError, LinearSolveInfo, LinearSolver
from warp_meshad._src.solve.linear.cg import CGSolver
from warp_meshad._src.solve.linear.csr import block_row_of
from warp_meshad._src.solve.linear.cudss import CONFIG_VARIABLE, CudssSolver
from warp_meshad._src.solve.linear.cudss_analysis_cache import (ANALYSIS_CACHE_FOLDER, ANALYSIS_CACHE_LIMIT_VARIABLE,
                                                                ANALYSIS_CACHE_VARIABLE)
from warp_meshad._src.solve.linear.qdldl import QdldlSolver
from warp_meshad._src.solve.linear.registry import LINEAR_SOLVER_NAMES, make_linear_solver
from warp_meshad._src.solve.linear.scipy import ScipySolver
from warp_meshad._src.solve.linear.spsolve import CupySolver

__all__ = [
    "ANALYSIS_CACHE_FOLDER",
    "ANALYSIS_CACHE_LIMIT_VARIABLE",
    "ANALYSIS_CACHE_VARIABLE",
    "CONFIG_VARIABLE",
    "LINEAR_SOLVER_NAMES",
    "CGSolver",
    "CudssSolver",
    "CupySolver",
    "LinearSolveError",
    "LinearSolveInfo",
    "LinearSolver",
    "QdldlSolver",
    "ScipySolver",
    "block_row_of",
    "make_linear_solver",
]
