"""Sparse linear back-ends for Newton-type solvers, behind one interface.

Every back-end solves ``A x = b`` for a square :class:`warp.sparse.BsrMatrix` ``A`` with square blocks
(``block_dim x block_dim``) and block vectors ``b``, ``x`` (``wp.array`` of shape ``[n_block_rows]`` and dtype
``vec{block_dim}{f|d}``, or the scalar dtype for 1x1 blocks). ``x`` is written in place; iterative back-ends use its
input value as the initial guess.

Back-ends (pick one by name with :func:`make_linear_solver`):

- ``"scipy"``: SuperLU (``scipy.sparse.linalg.splu``) on the host. The scalar CSR pattern is built once per sparsity
  pattern and refilled in place; SciPy exposes no reusable symbolic factorization, so ordering runs each call.
- ``"qdldl"``: sparse LDL^T (QDLDL, AMD ordering) on the host, for symmetric matrices: ordering and symbolic
  factorization once per pattern, a numeric refactorization per call; falls back to SuperLU where LDL^T without
  pivoting fails (an indefinite or singular matrix).
- ``"cg"``: Warp's conjugate gradient (``warp.optim.linear.cg``) with a ``"none"``, ``"diag"`` or ``"block_jacobi"``
  preconditioner, on CPU and GPU. Solver buffers are allocated once per system shape.
- ``"cupy"``: ``cupyx.scipy.sparse.linalg.spsolve`` on a zero-copy CuPy CSR view of our device buffers (GPU only).
- ``"cudss"``: NVIDIA cuDSS through nvmath-python's ``nvmath.sparse.advanced.DirectSolver`` (GPU only). Reordering and
  symbolic factorization (``plan()``) run once per sparsity pattern (optionally taken back from an on-disk cache,
  ``analysis_cache``); each call refills the CSR values in place and runs the numeric factorization and the solve
  as two direct cuDSS calls on ``b`` and ``x`` (no copies), which the device loop can capture in a CUDA graph.
- ``"auto"``: cuDSS where it imports and works on a CUDA device, else CuPy, else Warp CG with block-Jacobi on a GPU;
  QDLDL on the CPU where it imports (SciPy when given ``symmetric=False`` or an ``ordering``), else SciPy.
  ``solver.name`` says which was picked (logged once per device with :mod:`logging`) and
  ``solver.cudss_skipped_reason`` why cuDSS was not (on a CUDA device also one ``warnings.warn`` per device and
  reason: cuDSS was probed there and failed).

The sparsity pattern of ``A`` is identified by its ``offsets``/``columns`` array objects, their addresses, the block
count and the shape: a matrix whose pattern is rebuilt *in place* in the same arrays must be announced with
:meth:`LinearSolver.invalidate_pattern` (or by bumping an integer ``pattern_version`` attribute on the matrix).

Factorizations that serve more than one solve (``"cudss"``, ``"qdldl"``, ``"scipy"``; keyword options of their
constructors, default off):

- ``reuse_factorization=k``: one numeric factorization serves at most ``k`` calls of :meth:`LinearSolver.solve` on
  matrices of the same pattern (a Newton run's Hessians). The call that factorizes solves as without the option; the
  next ``k - 1`` calls keep the factors ``M`` of that older matrix and use them to precondition a refinement on the
  current matrix, from ``x0 = M^-1 b``, until ``||b - A x|| <= refine_tol ||b||``: a preconditioned conjugate
  gradient (PCG), which needs a symmetric positive definite matrix (projected Newton's Hessians with Dirichlet rows
  are); where it meets a non-positive curvature it goes on as classic iterative refinement ``x += M^-1 (b - A x)``
  (from the start for ``ScipySolver(symmetric=False)``). A refinement that does not get there within
  ``refine_maxiter`` iterations, or whose rate over its first iterations says it would miss that cap or take longer
  than ``refine_budget`` (default 1) times the numeric factorization that made ``M``, is abandoned and the call
  refactorizes at once ("early refactorization"), restarting the count. So a reused solve never costs much more
  than refactorizing, and a failed refinement costs time, never a wrong answer.
- ``factor_dtype="float32"`` (``"cudss"``, ``"scipy"``): the numeric factorization is of a float32 copy of the
  float64 matrix; each solve takes ``x0`` from the float32 factors and refines it in float64 as above (residual
  ``b - A x`` with the float64 matrix, corrections by the float32 factors) to the same ``refine_tol``. If that fails
  (a matrix too ill-conditioned for float32 factors), the call factorizes the float64 matrix and solves with it
  ("float64 fallback"). Both options combine: reused float32 factors.
- Tolerance: ``refine_tol`` (default 1e-10) is relative to ``||b||``, and never tighter than ten times the relative
  residual the last float64 factorization reached on the pattern (what float64 factors attain on that matrix).
  A refined solve is accepted on its true residual ``||b - A x||`` (one more SpMV).
- :class:`LinearSolveInfo` says what a call did: ``factorized`` (False when it reused older factors),
  ``refinement_iterations`` (refinement iterations after ``x0``; ``iterations`` is ``1 + refinement_iterations``,
  the solves with the factors), ``factor_dtype``; the back-end counts ``factorizations``, ``reused_solves``,
  ``early_refactorizations`` and ``float64_fallbacks``. The options are attributes of the back-end and may be
  changed between solves; :meth:`forget_factors` drops the kept factors.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import logging
import math
import os
import threading
import time
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
import warp as wp
import warp.sparse as wps

from warp_meshad._src.codegen.warp_compat import matrix_pattern_version
from warp_meshad._src.solve.vector_ops import axpy_into, dot, lincomb_into, norm

__all__ = [
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

_logger = logging.getLogger("warp_meshad.linear")

LINEAR_SOLVER_NAMES = ("auto", "scipy", "qdldl", "cg", "cupy", "cudss")
"""Names accepted by :func:`make_linear_solver`."""

_CUDSS_INSTALL = 'pip install "warp-meshad[cudss]"'
_CUPY_INSTALL = 'pip install "warp-meshad[cudss]" (or: pip install cupy-cuda12x)'


class LinearSolveError(RuntimeError):
    """A back-end failed to factorize or solve the system (singular matrix, NaN input, library error)."""


@dataclass
class LinearSolveInfo:
    """What one :meth:`LinearSolver.solve` call did.

    Attributes:
        backend: name of the back-end that ran (``"scipy"``, ``"qdldl"``, ``"cg"``, ``"cupy"``, ``"cudss"``; a
            ``"qdldl"`` call that fell back to SuperLU says ``"scipy"``).
        iterations: iterations of an iterative back-end; 1 for direct back-ends.
        residual_norm: ``||b - A x||_2`` after the solve (CG: its recursively updated residual); NaN when not computed.
        analysis_ms: time of per-pattern work this call (pattern conversion, reordering, symbolic factorization); 0
            when the pattern was reused.
        factor_ms: time of numeric factorization (CG: building the preconditioner).
        solve_ms: time of the solve itself (triangular solves, or the CG iterations).
        converged: False when an iterative back-end stopped at its iteration cap above tolerance.
        factorized: False when a direct back-end reused the factors of an earlier matrix (``reuse_factorization``):
            then ``factor_ms`` is 0 and ``solve_ms`` holds the refinement. True for every other call (iterative
            back-ends: their preconditioner is rebuilt).
        refinement_iterations: PCG iterations on top of the first solve with the factors (reused or float32
            factors; also the iterations of a PCG abandoned before an early refactorization in the same call).
        factor_dtype: ``"float32"`` or ``"float64"``: the precision of the factors this call solved with, where a
            ``reuse_factorization`` / ``factor_dtype`` option is on; None otherwise (the matrix's own precision).
    """

    backend: str
    iterations: int
    residual_norm: float
    analysis_ms: float
    factor_ms: float
    solve_ms: float
    converged: bool = True
    factorized: bool = True
    refinement_iterations: int = 0
    factor_dtype: str | None = None


# ----------------------------------------------------------------------------------------------------------------------
# Private kernels: BSR -> scalar CSR with a closed-form position for every coefficient (no search, no map array).
# Scalar row (r, i) of block row r starts at bs*bs*offsets[r] + i*bs*len(r); block t of the row puts its (i, j)
# coefficient at that start + t*bs + j.
# ----------------------------------------------------------------------------------------------------------------------


@wp.func
def block_row_of(offsets: wp.array(dtype=int), nrow: int, k: int):
    # block row r of the stored block k of a BSR matrix: binary search for offsets[r] <= k < offsets[r + 1]
    # (shared with the Dirichlet kernels of constraints.py, which also run one thread per stored block)
    lo = int(0)
    hi = nrow
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if offsets[mid] <= k:
            lo = mid
        else:
            hi = mid
    return lo


@wp.kernel(enable_backward=False)
def _csr_indptr_from_bsr(offsets: wp.array(dtype=int), bs: int, nrow: int, indptr: wp.array(dtype=int)):
    # one thread per block row: writes the start of its bs scalar rows (and the end for the last row)
    r = wp.tid()
    beg = offsets[r]
    length = offsets[r + 1] - beg
    for i in range(bs):
        indptr[r * bs + i] = bs * bs * beg + i * bs * length
    if r == nrow - 1:
        indptr[nrow * bs] = bs * bs * offsets[nrow]


@wp.kernel(enable_backward=False)
def _csr_indices_from_bsr(
    offsets: wp.array(dtype=int),
    columns: wp.array(dtype=int),
    bs: int,
    nrow: int,
    indices: wp.array(dtype=int),
):
    # one thread per stored block: writes the scalar column index of its bs*bs coefficients
    k = wp.tid()
    if k >= offsets[nrow]:
        return
    r = block_row_of(offsets, nrow, k)
    beg = offsets[r]
    length = offsets[r + 1] - beg
    base = bs * bs * beg + (k - beg) * bs
    c = columns[k]
    for i in range(bs):
        for j in range(bs):
            indices[base + i * bs * length + j] = c * bs + j


@wp.kernel(enable_backward=False)
def _csr_values_from_bsr(
    offsets: wp.array(dtype=int),
    nrow: int,
    block_values: wp.array3d(dtype=Any),
    data: wp.array(dtype=Any),
):
    # one thread per stored block: scatters its bs*bs coefficients into scalar CSR order
    k = wp.tid()
    if k >= offsets[nrow]:
        return
    bs = block_values.shape[1]
    r = block_row_of(offsets, nrow, k)
    beg = offsets[r]
    length = offsets[r + 1] - beg
    base = bs * bs * beg + (k - beg) * bs
    for i in range(bs):
        for j in range(bs):
            data[base + i * bs * length + j] = block_values[k, i, j]


# ----------------------------------------------------------------------------------------------------------------------
# Shared helpers
# ----------------------------------------------------------------------------------------------------------------------


def _block_dim(A: wps.BsrMatrix) -> int:
    return A.block_shape[0]


def _vector_dtype(A: wps.BsrMatrix):
    bs = _block_dim(A)
    if bs == 1:
        return A.scalar_type
    return wp.types.vector(length=bs, dtype=A.scalar_type)


def _type_name(t) -> str:
    try:
        return wp.types.type_repr(t)
    except Exception:
        return getattr(t, "__name__", str(t))


def _check_system(A, b, x) -> None:
    """Validate ``A x = b`` at the public boundary; raise with expected vs got."""
    if not isinstance(A, wps.BsrMatrix):
        raise TypeError(f"A: expected a warp.sparse.BsrMatrix, got {type(A).__name__}")
    rows, cols = A.block_shape
    if rows != cols:
        raise ValueError(f"A: expected square blocks, got block shape {A.block_shape}")
    if A.nrow != A.ncol:
        raise ValueError(f"A: expected a square matrix of blocks, got {A.nrow} x {A.ncol} blocks")
    if getattr(A, "row_counts", None) is not None:
        raise ValueError("A: expected a compact BsrMatrix (row_counts None), got a padded one; call bsr_compress first")
    vec = _vector_dtype(A)
    for name, arr in (("b", b), ("x", x)):
        if not isinstance(arr, wp.array):
            raise TypeError(f"{name}: expected a wp.array, got {type(arr).__name__}")
        if arr.ndim != 1 or arr.shape[0] != A.nrow:
            raise ValueError(f"{name}: expected shape ({A.nrow},), got {arr.shape}")
        if not wp.types.types_equal(arr.dtype, vec):
            raise TypeError(f"{name}: expected dtype {_type_name(vec)}, got {_type_name(arr.dtype)}")
        if arr.device != A.device:
            raise ValueError(f"{name}: expected device {A.device}, got {arr.device}")
        if not arr.is_contiguous:
            raise ValueError(f"{name}: expected a contiguous array")


def _pattern_key(A: wps.BsrMatrix) -> tuple:
    return (
        id(A.offsets),
        id(A.columns),
        A.offsets.ptr,
        A.columns.ptr,
        A.nnz,
        A.nrow,
        A.block_shape,
        A.scalar_type,
        str(A.device),
        matrix_pattern_version(A),
    )


class _CsrBuffers:
    """Scalar CSR copy of a BSR matrix in preallocated Warp buffers on the matrix's device.

    The pattern (``indptr``, ``indices``) is written once per sparsity pattern; :meth:`update_values` refills ``data``
    in place (same address), which is what cuDSS and CuPy views rely on.
    """

    def __init__(self, A: wps.BsrMatrix):
        device = A.device
        self.block_dim = bs = _block_dim(A)
        self.nrow = A.nrow
        self.size = A.nrow * bs
        self.block_nnz = A.nnz_sync() if A.nrow > 0 else 0
        self.nnz = self.block_nnz * bs * bs
        self.indptr = wp.empty(self.size + 1, dtype=wp.int32, device=device)
        self.indices = wp.empty(max(self.nnz, 1), dtype=wp.int32, device=device)
        self.data = wp.zeros(max(self.nnz, 1), dtype=A.scalar_type, device=device)
        if A.nrow > 0:
            wp.launch(_csr_indptr_from_bsr, dim=A.nrow, inputs=[A.offsets, bs, A.nrow, self.indptr], device=device)
        else:
            self.indptr.zero_()
        if self.block_nnz > 0:
            wp.launch(
                _csr_indices_from_bsr,
                dim=self.block_nnz,
                inputs=[A.offsets, A.columns, bs, A.nrow, self.indices],
                device=device,
            )

    def update_values(self, A: wps.BsrMatrix) -> None:
        if self.block_nnz > 0:
            wp.launch(
                _csr_values_from_bsr,
                dim=self.block_nnz,
                inputs=[A.offsets, A.nrow, A.scalar_values, self.data],
                device=A.device,
            )


def _residual_into(A: wps.BsrMatrix, b: wp.array, x: wp.array, work: wp.array) -> wp.array:
    """``work = b - A x`` (``work``: same shape/dtype as b), queued on the device."""
    wp.copy(work, b)
    wps.bsr_mv(A, x, work, alpha=-1.0, beta=1.0)
    return work


def _residual_norm(A: wps.BsrMatrix, b: wp.array, x: wp.array, work: wp.array) -> float:
    """``||b - A x||_2`` using ``work`` (same shape/dtype as b) as scratch."""
    return norm(_residual_into(A, b, x, work))


# ----------------------------------------------------------------------------------------------------------------------
# Interface
# ----------------------------------------------------------------------------------------------------------------------


class LinearSolver:
    """Base class of the linear back-ends.

    Attributes:
        name: back-end name (``"scipy"``, ``"qdldl"``, ``"cg"``, ``"cupy"``, ``"cudss"``).
        cudss_skipped_reason: set by ``make_linear_solver("auto")`` when it picked another back-end than cuDSS: why
            (e.g. ``"the device is the CPU ..."``, or the error of the cuDSS probe on a CUDA device: nvmath-python
            not importable, a failed solve in the system's scalar type). None when cuDSS was picked or the back-end
            was named.
    """

    name: str = "base"
    cudss_skipped_reason: str | None = None
    defers_checks: bool = False
    """Whether :meth:`solve_deferred` leaves the residual check on the device (CuPy, cuDSS); the host back-ends and
    CG check on the host, as in :meth:`solve`."""
    keeps_factors: bool = False
    """Whether :meth:`resolve` solves with the last solve's factors (the direct back-ends: SciPy, QDLDL, cuDSS)
    rather than solving again."""

    def __init__(self, compute_residual: bool = True):
        self.compute_residual = bool(compute_residual)
        self._pattern = None
        self._work = None
        self._deferred = None  # residual_sq of the solve_deferred call under way

    @property
    def direction_rtol(self) -> float:
        """Relative residual ``||b - A x|| / ||b||`` above which the device loop rejects a deferred solve's direction
        (0: any finite residual passes). Only back-ends that can act on a rejection (:meth:`direction_rejected`) set
        one: cuDSS's Cholesky under ``matrix_type="spd_or_general"``."""
        return 0.0

    def direction_rejected(self) -> bool:
        """The device loop rejected the last deferred solve for its residual: change the method if there is another
        one to try (True; cuDSS ``spd_or_general``: LU from now on), else False."""
        return False

    def solve(self, A: wps.BsrMatrix, b: wp.array, x: wp.array) -> LinearSolveInfo:
        """Solve ``A x = b``, writing ``x`` in place.

        Args:
            A: square BSR matrix with square blocks, ``n_block_rows x n_block_rows`` blocks of ``block_dim x
                block_dim``, scalar type float32 or float64.
            b: right-hand side, shape ``[n_block_rows]``, dtype ``vec{block_dim}`` of A's scalar type (the scalar type
                for 1x1 blocks), on A's device.
            x: solution, same shape/dtype/device as ``b``; its input value is the initial guess of iterative back-ends.

        Returns:
            A :class:`LinearSolveInfo` with iterations, residual and timings.

        Raises:
            TypeError, ValueError: mismatched shapes, dtypes or devices (message prints expected vs got).
            LinearSolveError: the back-end failed (e.g. singular matrix).
        """
        raise NotImplementedError

    def invalidate_pattern(self) -> None:
        """Forget the cached sparsity-pattern work (call after rebuilding A's pattern in place)."""
        self._pattern = None

    def resolve(self, A: wps.BsrMatrix, b: wp.array, x: wp.array) -> LinearSolveInfo:
        """Solve ``A x = b`` for another right-hand side with the factorization of the last :meth:`solve` (A's values
        unchanged since): the direct back-ends keep their factors (SciPy, QDLDL, cuDSS); the others solve again.

        Args and returns as :meth:`solve`.
        """
        return self.solve(A, b, x)

    def solve_deferred(self, A: wps.BsrMatrix, b: wp.array, x: wp.array, residual_sq: wp.array) -> LinearSolveInfo:
        """Solve ``A x = b`` as :meth:`solve` does, without waiting for the device where the back-end allows it
        (:attr:`defers_checks`): the residual check is queued as ``residual_sq[0] = ||b - A x||^2`` (not finite when
        the solve failed; untouched with ``compute_residual=False``), the timers do not synchronize (their
        milliseconds are host time to queue the work) and ``LinearSolveInfo.residual_norm`` is NaN. The device loop
        (:mod:`warp_meshad._src.solve.device_loop`) reads ``residual_sq`` with its state. Other back-ends run
        :meth:`solve` and leave ``residual_sq`` alone.

        Args:
            A, b, x: as :meth:`solve`.
            residual_sq: device array of shape [1] and A's scalar type, on A's device.
        """
        return self._deferring(self.solve, A, b, x, residual_sq)

    def resolve_deferred(self, A: wps.BsrMatrix, b: wp.array, x: wp.array,
                         residual_sq: wp.array) -> LinearSolveInfo:
        """:meth:`resolve` (the last factorization, another right-hand side) with :meth:`solve_deferred`'s queued
        residual check, for the device loop's solves with kept factors.

        Args:
            A, b, x, residual_sq: as :meth:`solve_deferred`.
        """
        return self._deferring(self.resolve, A, b, x, residual_sq)

    def _deferring(self, solve, A, b, x, residual_sq) -> LinearSolveInfo:
        """``solve(A, b, x)`` with its residual check queued into ``residual_sq`` where :attr:`defers_checks`."""
        if not self.defers_checks:
            return solve(A, b, x)
        self._deferred = residual_sq
        try:
            return solve(A, b, x)
        finally:
            self._deferred = None

    def _work_like(self, b: wp.array) -> wp.array:
        """A scratch vector shaped as ``b`` (kept between calls)."""
        if self._work is None or self._work.shape != b.shape or self._work.dtype != b.dtype or self._work.device != b.device:
            self._work = wp.empty_like(b)
        return self._work

    def _residual(self, A, b, x) -> float:
        if not self.compute_residual:
            return float("nan")
        self._work_like(b)
        if self._deferred is not None:
            work = _residual_into(A, b, x, self._work)
            wp.utils.array_inner(work, work, out=self._deferred)
            return float("nan")
        return _residual_norm(A, b, x, self._work)

    def _now(self, device) -> float:
        """The host clock, once the device is idle unless a :meth:`solve_deferred` call is under way."""
        if self._deferred is None:
            wp.synchronize_device(device)
        return time.perf_counter()

    def _ms_since(self, t0: float, device) -> float:
        return (self._now(device) - t0) * 1000.0

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"


# ----------------------------------------------------------------------------------------------------------------------
# Factorizations serving several solves: reuse across matrices, float32 factors (module docstring)
# ----------------------------------------------------------------------------------------------------------------------

FACTOR_DTYPES = ("float64", "float32")


def _check_reuse_options(owner: str, reuse_factorization, factor_dtype, refine_tol, refine_maxiter,
                         refine_budget) -> None:
    if isinstance(reuse_factorization, bool) or not isinstance(reuse_factorization, (int, np.integer)) \
            or reuse_factorization < 1:
        raise ValueError(f"{owner}: reuse_factorization: expected an int >= 1 (1: factorize every solve), "
                         f"got {reuse_factorization!r}")
    if factor_dtype not in FACTOR_DTYPES:
        raise ValueError(f"{owner}: factor_dtype: expected one of {FACTOR_DTYPES}, got {factor_dtype!r}")
    if not (isinstance(refine_tol, (int, float)) and 0.0 < refine_tol < 1.0):
        raise ValueError(f"{owner}: refine_tol: expected a relative residual in (0, 1), got {refine_tol!r}")
    if isinstance(refine_maxiter, bool) or not isinstance(refine_maxiter, (int, np.integer)) or refine_maxiter < 1:
        raise ValueError(f"{owner}: refine_maxiter: expected an int >= 1, got {refine_maxiter!r}")
    if refine_budget is not None and not (isinstance(refine_budget, (int, float)) and refine_budget > 0.0):
        raise ValueError(f"{owner}: refine_budget: expected a factor > 0 or None, got {refine_budget!r}")


class _ReusedFactors:
    """Mixin of the direct back-ends: a factorization reused across matrices, float32 factors (see the module
    docstring for the semantics). Off (``reuse_factorization=1``, ``factor_dtype="float64"``), :meth:`solve` and
    :meth:`resolve` are the back-end's own ``_plain_solve`` / ``_plain_resolve``.

    A back-end provides ``_plain_solve(A, b, x)`` (factorize A in its own precision and solve, keeping the factors),
    ``_plain_resolve(A, b, x)``, ``_apply_native(r, z)`` (``z = M^-1 r`` with the factors of the last
    ``_plain_solve``), and where ``factor_dtype="float32"`` is offered ``_factor32(A) -> (analysis_ms, factor_ms)``
    (raises :class:`LinearSolveError` when the float32 factorization fails) and ``_apply32(r, z)``;
    ``_policy_scope(A)`` wraps a call (cuDSS: its device and stream).
    """

    def _init_reuse(self, reuse_factorization: int, factor_dtype: str, refine_tol: float, refine_maxiter: int,
                    refine_budget: float | None):
        _check_reuse_options(type(self).__name__, reuse_factorization, factor_dtype, refine_tol, refine_maxiter,
                             refine_budget)
        self.reuse_factorization = int(reuse_factorization)
        self.factor_dtype = factor_dtype
        self.refine_tol = float(refine_tol)
        self.refine_maxiter = int(refine_maxiter)
        self.refine_budget = None if refine_budget is None else float(refine_budget)
        self.factorizations = 0  # numeric factorizations made by calls with an option on
        self.reused_solves = 0  # calls that solved with the factors of an earlier matrix
        self.early_refactorizations = 0  # calls whose PCG with reused factors failed, so they refactorized
        self.float64_fallbacks = 0  # calls whose float32 refinement failed, so they factorized in float64
        self._refine_work = None
        self.forget_factors()

    def forget_factors(self) -> None:
        """Drop the numeric factors kept for reuse: the next :meth:`solve` factorizes (the sparsity-pattern work,
        e.g. cuDSS's plans, stays). For a matrix known to differ much from the last one (a new time step)."""
        self._reuse_kind = None  # "native" (the matrix's precision) or "float32": the factors kept
        self._reuse_key = None  # the pattern they belong to
        self._uses = 0  # solves they served
        self._factor_ms = 0.0  # time of the numeric factorization that made them
        self._attained = 0.0  # relative residual of the last solve with fresh native factors on that pattern

    @property
    def _policy(self) -> bool:
        return self.reuse_factorization > 1 or self.factor_dtype == "float32"

    def invalidate_pattern(self) -> None:
        super().invalidate_pattern()
        self.forget_factors()

    @contextlib.contextmanager
    def _policy_scope(self, A):
        yield

    def solve(self, A, b, x):
        if not self._policy:
            return self._plain_solve(A, b, x)
        _check_system(A, b, x)
        with self._policy_scope(A):
            return self._policy_solve(A, b, x, reuse=True)

    def resolve(self, A, b, x):
        if not self._policy:
            return self._plain_resolve(A, b, x)
        _check_system(A, b, x)
        with self._policy_scope(A):
            if self._reuse_kind is not None and self._reuse_key == _pattern_key(A):
                info = self._with_kept_factors(A, b, x, norm(b))
                if info is not None:
                    return info
            return self._policy_solve(A, b, x, reuse=False)

    # -- the policy -------------------------------------------------------------------------------------------------

    def _kind_name(self, kind: str, A) -> str:
        return "float32" if kind == "float32" else _type_name(A.scalar_type)

    def _with_kept_factors(self, A, b, x, b_norm: float) -> LinearSolveInfo | None:
        """Solve with the kept factors refined by PCG; None (x overwritten) when the PCG fails or would take longer
        than the numeric factorization that made them."""
        apply = self._apply32 if self._reuse_kind == "float32" else self._apply_native
        t0 = self._now(A.device)
        budget = None if self.refine_budget is None else self.refine_budget * self._factor_ms
        its, ok, residual = self._refine(A, b, x, apply, b_norm, budget_ms=budget)
        self._abandoned = (its, self._ms_since(t0, A.device))
        if not ok:
            return None
        return LinearSolveInfo(self.name, 1 + its, residual, 0.0, 0.0, self._abandoned[1], True, factorized=False,
                               refinement_iterations=its, factor_dtype=self._kind_name(self._reuse_kind, A))

    def _policy_solve(self, A, b, x, reuse: bool) -> LinearSolveInfo:
        device = A.device
        b_norm = norm(b)
        if not math.isfinite(b_norm):
            raise LinearSolveError(f"{self.name}: the right-hand side is not finite")
        extra_its, extra_ms, extra_analysis, extra_factor = 0, 0.0, 0.0, 0.0
        if (reuse and self._reuse_kind is not None and self._reuse_key == _pattern_key(A)
                and self._uses < self.reuse_factorization):
            info = self._with_kept_factors(A, b, x, b_norm)
            if info is not None:
                self._uses += 1
                self.reused_solves += 1
                return info
            self.early_refactorizations += 1
            extra_its, extra_ms = self._abandoned
        self._reuse_kind = None
        info, kind = None, "native"
        if self.factor_dtype == "float32" and A.scalar_type == wp.float64:
            try:
                analysis_ms, factor_ms = self._factor32(A)
            except LinearSolveError as exc:
                why, its, solve_ms = str(exc), 0, 0.0
                analysis_ms = factor_ms = 0.0
            else:
                t0 = self._now(device)
                its, ok, residual = self._refine(A, b, x, self._apply32, b_norm)
                solve_ms = self._ms_since(t0, device)
                why = f"float64 relative residual {residual / max(b_norm, 1e-300):.1e} after {its} refinement iterations"
                if ok:
                    info, kind = LinearSolveInfo(self.name, 1 + its, residual, analysis_ms, factor_ms, solve_ms,
                                                 refinement_iterations=its, factor_dtype="float32"), "float32"
            if info is None:
                self.float64_fallbacks += 1
                if self.float64_fallbacks == 1:
                    _logger.warning("%s: float32 factors did not reach refine_tol (%s); this call and later failing "
                                    "ones factorize in float64", self.name, why)
                extra_its, extra_ms = extra_its + its, extra_ms + solve_ms
                extra_analysis, extra_factor = analysis_ms, factor_ms
        if info is None:
            info = self._plain_solve(A, b, x)
            info.factor_dtype = self._kind_name("native", A)
            if b_norm > 0.0 and math.isfinite(info.residual_norm):
                self._attained = info.residual_norm / b_norm
        info.analysis_ms += extra_analysis
        info.factor_ms += extra_factor
        info.solve_ms += extra_ms
        info.refinement_iterations += extra_its
        info.iterations += extra_its
        self._reuse_kind, self._reuse_key, self._uses = kind, _pattern_key(A), 1
        self._factor_ms = info.factor_ms - extra_factor
        self.factorizations += 1
        return info

    def _refine(self, A, b, x, apply, b_norm: float, budget_ms: float | None = None) -> tuple[int, bool, float]:
        """``x = M^-1 b``, then PCG on ``A x = b`` preconditioned by ``M^-1`` (``apply(r, z)``) until
        ``||b - A x|| <= tol ||b||``, at most ``refine_maxiter`` iterations. Where the PCG meets a non-positive
        curvature (A or M^-1 not positive definite), it goes on as classic iterative refinement ``x += M^-1 (b - A
        x)`` (from the start for a back-end told the matrix is not symmetric). From the second iteration on, the rate
        so far predicts the iterations still needed: the refinement gives up early when they exceed the cap, or when
        their time would exceed ``budget_ms`` (reused factors: the time of the factorization that made them, so a
        reused solve never costs much more than refactorizing). Returns (iterations, converged, ||b - A x||)."""
        target = max(self.refine_tol, 10.0 * self._attained) * b_norm
        work = self._refine_work
        if work is None or work[0].shape != b.shape or work[0].dtype != b.dtype or work[0].device != b.device:
            work = self._refine_work = [wp.empty_like(b) for _ in range(4)]
        r, z, p, q = work
        if b_norm == 0.0:
            x.zero_()
            return 0, True, 0.0
        t_start = time.perf_counter()
        apply(b, x)
        rn = norm(_residual_into(A, b, x, r))
        if not math.isfinite(rn) or rn <= target:
            return 0, math.isfinite(rn), rn
        r0 = best = rn
        cg = getattr(self, "symmetric", True)
        if cg:
            apply(r, z)
            rz = dot(r, z)
            wp.copy(p, z)
        maxiter = self.refine_maxiter
        for k in range(1, maxiter + 1):
            if cg:
                ok = math.isfinite(rz) and rz > 0.0
                if ok:
                    wps.bsr_mv(A, p, q, alpha=1.0, beta=0.0)
                    pq = dot(p, q)
                    ok = math.isfinite(pq) and pq > 0.0
                if ok:
                    alpha = rz / pq
                    axpy_into(x, x, alpha, p)
                    axpy_into(r, r, -alpha, q)
                    rn = norm(r)
                else:
                    cg = False  # not positive definite: classic iterative refinement from here (r = b - A x)
            if not cg:
                apply(r, z)
                axpy_into(x, x, 1.0, z)
                rn = norm(_residual_into(A, b, x, r))
            if not math.isfinite(rn):
                return k, False, rn
            if rn <= target:
                if cg:  # the recursive residual says so: check the true one
                    rn = _residual_norm(A, b, x, q)
                return k, rn <= target, rn
            best = min(best, rn)
            if k >= 2 and k < maxiter:
                # iterations to the target at the mean rate so far (never, without progress)
                need = k * math.log(target / best) / math.log(best / r0) if best < r0 else math.inf
                per_iteration_ms = (time.perf_counter() - t_start) * 1000.0 / (k + 1)  # x0's solve counts as one
                if k + need > maxiter or (budget_ms and per_iteration_ms * (k + 1 + need) > budget_ms):
                    return k, False, rn
            if cg:
                apply(r, z)
                rz_new = dot(r, z)
                lincomb_into(p, 1.0, z, rz_new / rz, p)
                rz = rz_new
        return maxiter, False, rn


# ----------------------------------------------------------------------------------------------------------------------
# SciPy (CPU)
# ----------------------------------------------------------------------------------------------------------------------


class ScipySolver(_ReusedFactors, LinearSolver):
    """SuperLU on the host through SciPy.

    Args:
        symmetric: the matrix is symmetric (Newton Hessians are): its CSR arrays are then read directly as CSC (no
            transpose copy) and SuperLU runs in symmetric mode with a small diagonal pivot threshold.
        ordering: SuperLU column ordering (``permc_spec``): ``"MMD_AT_PLUS_A"`` (default, for symmetric patterns),
            ``"COLAMD"``, ``"MMD_ATA"``, ``"NATURAL"``.
        compute_residual: compute ``||b - A x||`` after each solve (one SpMV).
        reuse_factorization: one factorization serves at most this many solves (1: factorize every solve); between
            factorizations, PCG on the current matrix preconditioned by the kept factors (module docstring).
        factor_dtype: ``"float64"`` or ``"float32"``: SuperLU of a float32 copy of a float64 matrix, refined in
            float64 (module docstring; emulates cuDSS's float32 factors on the CPU).
        refine_tol: relative residual the refined solves reach (reused or float32 factors).
        refine_maxiter: iteration cap of a refined solve, past which it refactorizes (reuse) or falls back to
            float64 factors.
        refine_budget: a solve with reused factors gives up (and refactorizes) once its predicted time exceeds this
            factor times the time of the numeric factorization that made the factors; None: the cap only.
        (With ``symmetric=False`` the refinement is classic iterative refinement, not PCG.)
    """

    keeps_factors = True

    name = "scipy"
    _ORDERINGS = ("MMD_AT_PLUS_A", "COLAMD", "MMD_ATA", "NATURAL")

    def __init__(
        self,
        symmetric: bool = True,
        ordering: str = "MMD_AT_PLUS_A",
        compute_residual: bool = True,
        reuse_factorization: int = 1,
        factor_dtype: str = "float64",
        refine_tol: float = 1e-10,
        refine_maxiter: int = 20,
        refine_budget: float | None = 1.0,
    ):
        super().__init__(compute_residual)
        if ordering not in self._ORDERINGS:
            raise ValueError(f"ordering: expected one of {self._ORDERINGS}, got {ordering!r}")
        self.symmetric = bool(symmetric)
        self.ordering = ordering
        self._csr = None
        self._lu = None  # the last factorization (resolve) and the pattern it belongs to
        self._lu_of = None
        self._lu32 = None  # float32 factors (factor_dtype="float32")
        self._init_reuse(reuse_factorization, factor_dtype, refine_tol, refine_maxiter, refine_budget)

    def _plain_solve(self, A, b, x):
        _check_system(A, b, x)
        t0 = self._now(A.device)
        self._host_pattern(A)
        return self._factor_solve(A, b, x, self._ms_since(t0, A.device))

    def _host_pattern(self, A) -> bool:
        """Build the scalar CSR buffers and their host copies for a new sparsity pattern; True if it was new."""
        key = _pattern_key(A)
        if self._pattern == key:
            return False
        self._csr = _CsrBuffers(A)
        self._host_indptr = self._csr.indptr.numpy()
        self._host_indices = self._csr.indices.numpy()[: self._csr.nnz]
        self._pattern = _pattern_key(A)  # after nnz_sync() made A.nnz exact
        return True

    def _host_values(self, A) -> np.ndarray:
        """A's scalar CSR values on the host (zero-copy view on the CPU, a host copy on the GPU)."""
        csr = self._csr
        csr.update_values(A)
        data = csr.data.numpy()[: csr.nnz]
        if not np.all(np.isfinite(data)):
            raise LinearSolveError(f"{self.name}: the matrix has non-finite entries")
        return data

    def _write_solution(self, A, x, sol) -> None:
        if x.device.is_cpu:
            x.numpy().reshape(-1)[:] = sol
        else:
            bs = self._csr.block_dim
            sol = sol.astype(wp.dtype_to_numpy(getattr(x.dtype, "_wp_scalar_type_", x.dtype)), copy=False)
            x.assign(sol.reshape((x.shape[0],) if bs == 1 else (x.shape[0], bs)))

    # -- reuse and float32 factors (_ReusedFactors) ----------------------------------------------------------------

    def _apply_native(self, r, z) -> None:
        self._write_solution(None, z, self._lu.solve(r.numpy().reshape(-1)))

    def _factor32(self, A) -> tuple[float, float]:
        import scipy.sparse as sps
        import scipy.sparse.linalg as spla

        t0 = self._now(A.device)
        self._host_pattern(A)
        analysis_ms = self._ms_since(t0, A.device)
        t0 = time.perf_counter()
        n = self._csr.size
        self._lu32 = None
        data = self._host_values(A).astype(np.float32)
        if self.symmetric:  # as _factor_solve does
            mat = sps.csc_matrix((data, self._host_indices, self._host_indptr), shape=(n, n))
            options, pivot = {"SymmetricMode": True}, 0.01
        else:
            mat = sps.csr_matrix((data, self._host_indices, self._host_indptr), shape=(n, n)).tocsc()
            options, pivot = {}, 1.0
        try:
            self._lu32 = spla.splu(mat, permc_spec=self.ordering, diag_pivot_thresh=pivot, options=options)
        except RuntimeError as exc:
            raise LinearSolveError(f"{self.name}: float32 factorization failed: {exc}") from exc
        return analysis_ms, (time.perf_counter() - t0) * 1000.0

    def _apply32(self, r, z) -> None:
        self._write_solution(None, z, self._lu32.solve(r.numpy().reshape(-1).astype(np.float32)))

    def _factor_solve(self, A, b, x, analysis_ms: float) -> LinearSolveInfo:
        import scipy.sparse as sps
        import scipy.sparse.linalg as spla

        device = A.device
        t0 = time.perf_counter()
        data = self._host_values(A)
        n = self._csr.size
        if self.symmetric:
            mat = sps.csc_matrix((data, self._host_indices, self._host_indptr), shape=(n, n))
            options = {"SymmetricMode": True}
            pivot = 0.01
        else:
            mat = sps.csr_matrix((data, self._host_indices, self._host_indptr), shape=(n, n)).tocsc()
            options = {}
            pivot = 1.0
        self._lu = self._lu_of = None
        try:
            lu = spla.splu(mat, permc_spec=self.ordering, diag_pivot_thresh=pivot, options=options)
        except RuntimeError as exc:  # "Factor is exactly singular"
            raise LinearSolveError(f"scipy: factorization failed: {exc}") from exc
        self._lu, self._lu_of = lu, _pattern_key(A)
        factor_ms = (time.perf_counter() - t0) * 1000.0

        t0 = time.perf_counter()
        rhs = b.numpy().reshape(-1).astype(data.dtype, copy=False)
        self._write_solution(A, x, lu.solve(rhs))
        solve_ms = self._ms_since(t0, device)
        return LinearSolveInfo("scipy", 1, self._residual(A, b, x), analysis_ms, factor_ms, solve_ms)

    def _plain_resolve(self, A, b, x):
        _check_system(A, b, x)
        if self._lu is None or self._lu_of != _pattern_key(A):
            return self.solve(A, b, x)
        t0 = time.perf_counter()
        rhs = b.numpy().reshape(-1).astype(wp.dtype_to_numpy(A.scalar_type), copy=False)
        self._write_solution(A, x, self._lu.solve(rhs))
        return LinearSolveInfo("scipy", 1, self._residual(A, b, x), 0.0, 0.0, self._ms_since(t0, A.device))


# ----------------------------------------------------------------------------------------------------------------------
# QDLDL (CPU): sparse LDL^T with a reusable ordering and symbolic factorization
# ----------------------------------------------------------------------------------------------------------------------


class QdldlSolver(ScipySolver):
    """Sparse LDL^T (QDLDL, AMD ordering) on the host, for symmetric matrices.

    The ordering and the symbolic factorization run once per sparsity pattern; later calls refactor the numbers only
    (``qdldl.Solver.update``), which SuperLU cannot do. LDL^T without pivoting needs a quasi-definite matrix: the
    positive definite Hessians of projected Newton are. Where the factorization fails (a zero pivot: an indefinite
    or singular matrix), that call falls back to SuperLU (:class:`ScipySolver`, symmetric mode) and its
    :class:`LinearSolveInfo` says ``backend="scipy"``; the next call tries LDL^T again.

    Args:
        compute_residual: compute ``||b - A x||`` after each solve (one SpMV); a solve whose residual exceeds
            ``residual_tolerance * ||b||`` (growth in an indefinite matrix) is redone with SuperLU. Without it, only a
            failed factorization or a non-finite solution falls back.
        residual_tolerance: relative residual above which the LDL^T solution is not trusted.
        reuse_factorization, refine_tol, refine_maxiter, refine_budget: as :class:`ScipySolver` (QDLDL factors in
            float64 only).

    Attributes:
        fallbacks: calls that fell back to SuperLU so far.

    Raises:
        ImportError: ``qdldl`` is not installed (``pip install qdldl``).
    """

    name = "qdldl"

    def __init__(
        self,
        compute_residual: bool = True,
        residual_tolerance: float = 1e-6,
        reuse_factorization: int = 1,
        refine_tol: float = 1e-10,
        refine_maxiter: int = 20,
        refine_budget: float | None = 1.0,
    ):
        super().__init__(symmetric=True, compute_residual=compute_residual, reuse_factorization=reuse_factorization,
                         refine_tol=refine_tol, refine_maxiter=refine_maxiter, refine_budget=refine_budget)
        self._qdldl = _import_qdldl()
        self.residual_tolerance = float(residual_tolerance)
        self.fallbacks = 0
        self._ldl = None
        self._ldl_of = None  # the pattern the factors in _ldl belong to, while they are the last call's

    def invalidate_pattern(self) -> None:
        super().invalidate_pattern()
        self._ldl = None

    def _host_pattern(self, A) -> bool:
        if not super()._host_pattern(A):
            return False
        # read as CSC, the symmetric CSR is the same matrix: its entries with column <= row are the CSC's upper
        # triangle, which QDLDL takes as it is
        indptr, indices, n = self._host_indptr, self._host_indices, self._csr.size
        rows = np.repeat(np.arange(n, dtype=np.int32), np.diff(indptr))
        self._upper = np.flatnonzero(indices <= rows)
        counts = np.bincount(rows[self._upper], minlength=n)
        self._upper_indptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
        self._upper_indices = indices[self._upper]
        self._ldl = None
        return True

    def _factor_solve(self, A, b, x, analysis_ms: float) -> LinearSolveInfo:
        import scipy.sparse as sps

        device = A.device
        t0 = time.perf_counter()
        data = self._host_values(A)
        n = self._csr.size
        upper = sps.csc_matrix((data[self._upper].astype(np.float64, copy=False), self._upper_indices,
                                self._upper_indptr), shape=(n, n))  # fmt: skip
        try:
            if self._ldl is None:
                self._ldl = self._qdldl.Solver(upper, upper=True)  # ordering, symbolic and numeric factorization
            else:
                self._ldl.update(upper, upper=True)  # numeric factorization only
        except (RuntimeError, ValueError) as exc:  # "not quasi-definite" (zero pivot) and the like
            return self._fall_back(A, b, x, analysis_ms, str(exc))
        factor_ms = (time.perf_counter() - t0) * 1000.0
        t0 = time.perf_counter()
        rhs = b.numpy().reshape(-1).astype(np.float64, copy=False)
        sol = self._ldl.solve(rhs)
        if not np.all(np.isfinite(sol)):
            return self._fall_back(A, b, x, analysis_ms, "non-finite solution")
        self._write_solution(A, x, sol.astype(data.dtype, copy=False))
        solve_ms = self._ms_since(t0, device)
        residual = self._residual(A, b, x)
        # without pivoting, an indefinite matrix can factor with growth: a bad residual means "use SuperLU"
        b_norm = max(float(np.linalg.norm(rhs)), np.finfo(np.float64).tiny)
        if residual > self.residual_tolerance * b_norm:
            return self._fall_back(A, b, x, analysis_ms, f"relative residual {residual / b_norm:.1e}")
        self._lu = self._lu_of = None
        self._ldl_of = _pattern_key(A)
        return LinearSolveInfo(self.name, 1, residual, analysis_ms, factor_ms, solve_ms)

    def _apply_native(self, r, z) -> None:
        if self._ldl_of is None:  # the last factorization fell back to SuperLU
            return super()._apply_native(r, z)
        rhs = r.numpy().reshape(-1)
        self._write_solution(None, z, self._ldl.solve(rhs.astype(np.float64, copy=False)).astype(rhs.dtype, copy=False))

    def _plain_resolve(self, A, b, x):
        _check_system(A, b, x)
        if self._ldl is None or self._ldl_of != _pattern_key(A):
            return super()._plain_resolve(A, b, x)  # the last call fell back to SuperLU (its factors), or none yet
        t0 = time.perf_counter()
        sol = self._ldl.solve(b.numpy().reshape(-1).astype(np.float64, copy=False))
        self._write_solution(A, x, sol.astype(wp.dtype_to_numpy(A.scalar_type), copy=False))
        return LinearSolveInfo(self.name, 1, self._residual(A, b, x), 0.0, 0.0, self._ms_since(t0, A.device))

    def _fall_back(self, A, b, x, analysis_ms, why: str) -> LinearSolveInfo:
        self._ldl = None
        self._ldl_of = None
        self.fallbacks += 1
        if self.fallbacks == 1:
            _logger.warning("qdldl: LDL^T failed (%s); this call and later failing ones use SuperLU", why)
        return super()._factor_solve(A, b, x, analysis_ms)


# ----------------------------------------------------------------------------------------------------------------------
# Warp CG / PCG (CPU and GPU)
# ----------------------------------------------------------------------------------------------------------------------


class CGSolver(LinearSolver):
    """Preconditioned conjugate gradient from ``warp.optim.linear`` (symmetric positive-definite systems).

    Args:
        preconditioner: ``"none"``, ``"diag"`` (Jacobi) or ``"block_jacobi"`` (inverse of each diagonal block; Jacobi
            for 1x1 blocks).
        tol: relative tolerance on the residual, ``||r|| <= max(tol * ||b||, atol)``.
        atol: absolute tolerance on the residual.
        maxiter: iteration cap; None means the number of scalar unknowns.
        check_every: convergence check period (iterations) of Warp's CG.
        use_cuda_graph: capture iterations in a CUDA graph on GPU.
        compute_residual: unused (CG reports its own residual); accepted for interface symmetry.
    """

    name = "cg"
    PRECONDITIONERS = {"none": "id", "diag": "diag", "block_jacobi": "block_jacobi_direct"}

    def __init__(
        self,
        preconditioner: str = "block_jacobi",
        tol: float = 1e-8,
        atol: float = 0.0,
        maxiter: int | None = None,
        check_every: int = 10,
        use_cuda_graph: bool = True,
        compute_residual: bool = True,
    ):
        super().__init__(compute_residual)
        if preconditioner not in self.PRECONDITIONERS:
            raise ValueError(f"preconditioner: expected one of {tuple(self.PRECONDITIONERS)}, got {preconditioner!r}")
        if not tol >= 0.0 or not atol >= 0.0:
            raise ValueError(f"tol, atol: expected >= 0, got tol={tol}, atol={atol}")
        if maxiter is not None and int(maxiter) < 1:
            raise ValueError(f"maxiter: expected a positive int or None, got {maxiter}")
        if int(check_every) < 1:
            raise ValueError(f"check_every: expected >= 1, got {check_every}")
        self.preconditioner = preconditioner
        self.tol = float(tol)
        self.atol = float(atol)
        self.maxiter = None if maxiter is None else int(maxiter)
        self.check_every = int(check_every)
        self.use_cuda_graph = bool(use_cuda_graph)
        self._state = None

    def solve(self, A, b, x):
        from warp.optim import linear as wpl

        _check_system(A, b, x)
        device = A.device
        t0 = self._now(device)
        key = (b.shape, b.dtype, str(device), A.nrow)
        if self._state is None or self._pattern != key:
            self._state = wpl.cg(
                A,
                b,
                x,
                tol=self.tol,
                atol=self.atol,
                maxiter=self.maxiter or 0,
                check_every=self.check_every,
                use_cuda_graph=self.use_cuda_graph,
                run=False,
            )
            self._pattern = key
        analysis_ms = self._ms_since(t0, device)

        t0 = time.perf_counter()
        ptype = self.PRECONDITIONERS[self.preconditioner]
        M = None if ptype == "id" else wpl.preconditioner(A, ptype)
        factor_ms = self._ms_since(t0, device)

        t0 = time.perf_counter()
        iterations, residual, abs_tol = self._state(A=A, b=b, x=x, M=M)
        solve_ms = self._ms_since(t0, device)
        iterations, residual, abs_tol = int(iterations), float(residual), float(abs_tol)
        if not math.isfinite(residual):
            raise LinearSolveError(f"cg: residual became {residual} (indefinite or non-finite matrix?)")
        converged = residual <= abs_tol * (1.0 + 1e-12)
        return LinearSolveInfo(self.name, iterations, residual, analysis_ms, factor_ms, solve_ms, converged)

    def invalidate_pattern(self) -> None:
        self._pattern = None
        self._state = None


# ----------------------------------------------------------------------------------------------------------------------
# GPU back-ends: CuPy and cuDSS (nvmath-python)
# ----------------------------------------------------------------------------------------------------------------------


def _import_qdldl():
    try:
        import qdldl
    except ImportError as exc:
        raise ImportError(f"the 'qdldl' linear solver needs the qdldl package: pip install qdldl ({exc})") from exc
    return qdldl


def _import_cupy():
    try:
        import cupy
        import cupyx.scipy.sparse
        import cupyx.scipy.sparse.linalg  # noqa: F401
    except ImportError as exc:
        raise ImportError(f"the 'cupy' linear back-end needs CuPy: {_CUPY_INSTALL}") from exc
    return cupy


def _check_cudss_config_option(config) -> dict:
    """``CudssSolver(config=...)``: None (the environment's :data:`CONFIG_VARIABLE`, else none) or a dict of names to
    ints; the names are checked against cuDSS later."""
    if config is None:
        text = os.environ.get(CONFIG_VARIABLE, "").strip()
        if not text:
            return {}
        try:
            config = json.loads(text)
        except ValueError as exc:
            raise ValueError(f"{CONFIG_VARIABLE}: expected a JSON object of cuDSS configuration names to ints, got "
                             f"{text!r} ({exc})") from None
        where = CONFIG_VARIABLE
    else:
        where = "config"
    if not isinstance(config, dict):
        raise ValueError(f"{where}: expected None or a dict {{name: int}}, got {type(config).__name__}")
    out = {}
    for name, value in config.items():
        if not isinstance(name, str):
            raise ValueError(f"{where}: expected str keys (cuDSS configuration names), got {name!r}")
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise ValueError(f"{where}[{name!r}]: expected an int, got {value!r}")
        out[name.lower()] = int(value)
    return out


def _check_permutation_option(permutation) -> np.ndarray | None:
    """``CudssSolver(permutation=...)``: None or a permutation (1-D ints, each of 0..n-1 once), as contiguous int32."""
    if permutation is None:
        return None
    arr = np.asarray(permutation)
    if arr.ndim != 1 or arr.dtype.kind not in "iu":
        raise ValueError(f"permutation: expected None or a 1-D int array, got dtype {arr.dtype} and shape {arr.shape}")
    if not np.array_equal(np.sort(arr), np.arange(arr.shape[0])):
        raise ValueError(f"permutation: expected each of 0..{arr.shape[0] - 1} once, got another set of {arr.shape[0]} ints")
    return np.ascontiguousarray(arr, dtype=np.int32)


CONFIG_VARIABLE = "WARP_MESHAD_CUDSS_CONFIG"
"""``CudssSolver(config=None)`` reads its config from this environment variable when set: a JSON object of names to
ints (``'{"nd_nlevels": 2}'``), so apps and batches can be tuned without code."""
ANALYSIS_CACHE_VARIABLE = "WARP_MESHAD_CUDSS_ANALYSIS_CACHE"
"""Environment variable: ``CudssSolver``'s analysis cache when the option is not given (a folder, ``auto`` (the
default) or ``0``/``off``)."""
ANALYSIS_CACHE_FOLDER = "warp_meshad_cudss"
"""``CudssSolver(analysis_cache="auto")``: this folder in Warp's kernel cache."""
ANALYSIS_CACHE_LIMIT_VARIABLE = "WARP_MESHAD_CUDSS_ANALYSIS_CACHE_MB"
"""Environment variable: the analysis cache's size limit in MiB (default 1024); past it, the entries used least
recently are deleted after each save."""


def _analysis_cache_limit_bytes() -> int:
    text = os.environ.get(ANALYSIS_CACHE_LIMIT_VARIABLE, "").strip()
    try:
        mib = float(text) if text else 1024.0
    except ValueError:
        raise ValueError(f"{ANALYSIS_CACHE_LIMIT_VARIABLE}: expected a number of MiB, got {text!r}") from None
    if not mib > 0.0:
        raise ValueError(f"{ANALYSIS_CACHE_LIMIT_VARIABLE}: expected a number of MiB > 0, got {text!r}")
    return int(mib * 1024 * 1024)


def _prune_analysis_cache(folder, limit_bytes: int, keep=None) -> list:
    """Delete the ``.npz`` entries of ``folder`` used least recently (oldest modification time: a hit touches its
    entry) until the rest fit in ``limit_bytes``; ``keep`` (the entry just written) stays. Returns the deleted
    paths. Entries that vanish meanwhile (another process pruning) are skipped."""
    entries = []
    try:
        with os.scandir(folder) as it:
            for e in it:
                if e.name.endswith(".npz") and e.is_file():
                    try:
                        st = e.stat()
                    except OSError:
                        continue
                    entries.append((st.st_mtime, st.st_size, e.path))
    except OSError:
        return []
    total = sum(size for _, size, _ in entries)
    deleted = []
    for _, size, path in sorted(entries):
        if total <= limit_bytes:
            break
        if keep is not None and os.path.abspath(path) == os.path.abspath(keep):
            continue
        try:
            os.remove(path)
        except OSError:
            continue
        total -= size
        deleted.append(path)
    return deleted


def _check_analysis_cache_option(analysis_cache):
    """``CudssSolver(analysis_cache=...)``: None (the environment's choice), False, ``"auto"`` or a folder, as a
    ``pathlib.Path`` (or None: off)."""
    import pathlib

    if analysis_cache is None:
        analysis_cache = os.environ.get(ANALYSIS_CACHE_VARIABLE, "").strip() or "auto"
        if analysis_cache in ("0", "off", "false", "no"):
            analysis_cache = False
    if analysis_cache is False:
        return None
    if isinstance(analysis_cache, str) and analysis_cache == "auto":
        root = wp.config.kernel_cache_dir
        if root is None:
            wp.init()  # sets the kernel cache folder
            root = wp.config.kernel_cache_dir
        return pathlib.Path(root) / ANALYSIS_CACHE_FOLDER
    if not isinstance(analysis_cache, (str, pathlib.PurePath)):
        raise ValueError(f"analysis_cache: expected None, False, 'auto' or a folder (str or path), got "
                         f"{type(analysis_cache).__name__}")
    return pathlib.Path(analysis_cache)


def _cudss_version() -> int:
    from nvmath.bindings import cudss

    return int(cudss.get_property(0)) * 10000 + int(cudss.get_property(1)) * 100 + int(cudss.get_property(2))


def _apply_cached_analysis(cudss, solver, path, n: int) -> bool:
    """Hand a cached ordering and partition tree (``path``, an ``.npz``) to the unplanned ``solver``: True if there
    was one that cuDSS took, False otherwise (no file, unreadable, wrong size: cuDSS analyses as usual)."""
    try:
        with np.load(path) as f:
            perm = np.ascontiguousarray(f["perm"], dtype=np.int32)
            tree = np.ascontiguousarray(f["tree"], dtype=np.uint8)
    except (OSError, KeyError, ValueError):
        return False
    if perm.shape != (n,) or tree.size == 0:
        return False
    try:
        cudss.data_set(solver.handle, solver.data_ptr, cudss.DataParam.USER_PERM, perm.ctypes.data, perm.nbytes)
        cudss.data_set(solver.handle, solver.data_ptr, cudss.DataParam.USER_ND_PARTITION_TREE, tree.ctypes.data,
                       tree.nbytes)
    except Exception as exc:  # an older cuDSS without the tree: plan without the cache (its ordering is not set twice)
        _logger.info("cudss: the cached analysis %s was not taken (%s: %s)", path, type(exc).__name__, exc)
        return False
    try:
        os.utime(path)  # used now: the size limit deletes the entries used least recently first
    except OSError:
        pass
    return True


def _save_analysis(cudss, solver, path, n: int) -> None:
    """Write the planned ``solver``'s ordering and partition tree to ``path`` (atomically); failures are logged."""
    import tempfile

    try:
        out = {}
        for key, param in (("perm", cudss.DataParam.PERM_REORDER_ROW), ("tree", cudss.DataParam.ND_PARTITION_TREE)):
            # cuDSS wants the exact size: ask for it first (a null value with size 0 writes the size needed)
            written = np.zeros(1, dtype=np.uint64)
            cudss.data_get(solver.handle, solver.data_ptr, param, 0, 0, written.ctypes.data)
            buf = np.empty(int(written[0]), dtype=np.uint8)
            cudss.data_get(solver.handle, solver.data_ptr, param, buf.ctypes.data, buf.nbytes, written.ctypes.data)
            out[key] = buf
        perm, tree = out["perm"].view(np.int32), out["tree"]
        if perm.shape != (n,):
            raise ValueError(f"expected an ordering of {n} rows, cuDSS gave {perm.shape[0]}")
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            np.savez(f, perm=perm, tree=tree)
        os.replace(tmp, path)
        _prune_analysis_cache(path.parent, _analysis_cache_limit_bytes(), keep=path)
    except Exception as exc:
        _logger.warning("cudss: could not keep the analysis in %s (%s: %s)", path, type(exc).__name__, exc)


def _import_nvmath():
    try:
        import nvmath.sparse.advanced as nva
    except ImportError as exc:
        raise ImportError(f"the 'cudss' linear back-end needs nvmath-python with cuDSS: {_CUDSS_INSTALL}") from exc
    _import_cupy()
    return nva


def _require_cuda(A, name: str) -> None:
    if not A.device.is_cuda:
        raise ValueError(f"the {name!r} linear back-end runs on a CUDA device, got a matrix on {A.device}")


_bound = threading.local()  # per thread: the CUDA device ordinals made current for cuda.core (nvmath) there


def _bind_thread(device) -> None:
    """Make ``device``'s primary CUDA context current in the calling thread for cuda.core (nvmath-python).

    A back-end may be called from any thread: PyTorch runs a backward (``warp_meshad.torch.minimize``) on its own
    autograd thread, Ray runs tasks on worker threads, a user may use a thread pool. nvmath-python (cuDSS) goes
    through ``cuda.core``, which refuses a device that was not ``set_current()`` in the calling thread ("Device 0 is
    not yet initialized"). Warp names its context at each call and CuPy's ``Device`` context sets it, so they need
    nothing more; all three share the device's primary context. Done once per thread and device.
    """
    done = getattr(_bound, "ordinals", None)
    if done is None:
        done = _bound.ordinals = set()
    if device.ordinal in done:
        return
    try:
        from cuda.core import Device  # cuda-core >= 0.4
    except ImportError:
        try:
            from cuda.core.experimental import Device
        except ImportError:  # no cuda.core (CuPy only): CuPy's own context handling suffices
            Device = None
    if Device is not None:
        Device(device.ordinal).set_current()
    done.add(device.ordinal)


class _GpuCsrSolver(LinearSolver):
    """Common part of the CuPy and cuDSS back-ends: zero-copy CuPy views of our CSR buffers on Warp's stream."""

    defers_checks = True

    def __init__(self, compute_residual: bool = True):
        super().__init__(compute_residual)
        self._cp = _import_cupy()
        self._csr = None

    def _stream(self, device):
        """CuPy's device and stream contexts for Warp's stream of ``device``, with that device's context made
        current in the calling thread (see :func:`_bind_thread`)."""
        _bind_thread(device)
        cp = self._cp
        stream = wp.get_stream(device)
        with warnings.catch_warnings():  # CuPy 14 deprecates ExternalStream for Stream.from_external (not in CuPy 13)
            warnings.simplefilter("ignore", DeprecationWarning)
            return cp.cuda.Device(device.ordinal), cp.cuda.ExternalStream(stream.cuda_stream, device.ordinal)

    def _views(self, device):
        cp = self._cp
        import cupyx.scipy.sparse as cpsp

        csr = self._csr
        n = csr.size
        data = cp.asarray(csr.data)[: csr.nnz]
        indices = cp.asarray(csr.indices)[: csr.nnz]
        indptr = cp.asarray(csr.indptr)
        return cpsp.csr_matrix((data, indices, indptr), shape=(n, n), copy=False)

    @staticmethod
    def _flat(cp, arr: wp.array):
        return cp.asarray(arr).reshape(-1)


class CupySolver(_GpuCsrSolver):
    """CuPy on a zero-copy CuPy CSR view (GPU only).

    ``method="spsolve"`` (default) is ``cupyx.scipy.sparse.linalg.spsolve``, cuSOLVER's direct sparse QR: exact,
    but its fill-in makes it impractical beyond ~10^5 unknowns on mesh Hessians (17.9 s for 120k unknowns on an
    H200). ``method="cg"`` is ``cupyx.scipy.sparse.linalg.cg`` with a Jacobi (diagonal) preconditioner, for large
    SPD systems.

    Args:
        method: ``"spsolve"`` or ``"cg"``.
        tol: relative residual tolerance of ``"cg"``.
        maxiter: iteration cap of ``"cg"`` (default 10 n).
        compute_residual: compute ``||b - A x||`` after each solve (one SpMV).
    """

    name = "cupy"
    METHODS = ("spsolve", "cg")

    def __init__(self, method: str = "spsolve", tol: float = 1e-8, maxiter: int | None = None, compute_residual: bool = True):
        super().__init__(compute_residual)
        if method not in self.METHODS:
            raise ValueError(f"cupy: method must be one of {self.METHODS}, got {method!r}")
        self.method = method
        self.tol = float(tol)
        self.maxiter = maxiter

    def _cg(self, cp, rhs):
        import cupyx.scipy.sparse.linalg as cpla

        A = self._mat
        dinv = 1.0 / A.diagonal()
        M = cpla.LinearOperator(A.shape, matvec=lambda v: dinv * v, dtype=A.dtype)
        iterations = [0]

        def count(_):
            iterations[0] += 1

        maxiter = self.maxiter or 10 * A.shape[0]
        try:
            sol, info = cpla.cg(A, rhs, tol=self.tol, maxiter=maxiter, M=M, callback=count)
        except TypeError:  # newer CuPy names it rtol
            sol, info = cpla.cg(A, rhs, rtol=self.tol, maxiter=maxiter, M=M, callback=count)
        return sol, max(iterations[0], 1), info == 0

    def solve(self, A, b, x):
        import cupyx.scipy.sparse.linalg as cpla

        _check_system(A, b, x)
        _require_cuda(A, self.name)
        device = A.device
        cp = self._cp
        dev_ctx, stream_ctx = self._stream(device)
        with dev_ctx, stream_ctx:
            t0 = self._now(device)
            key = _pattern_key(A)
            if self._pattern != key:
                self._csr = _CsrBuffers(A)
                self._mat = self._views(device)
                self._pattern = _pattern_key(A)  # after nnz_sync() made A.nnz exact
            analysis_ms = self._ms_since(t0, device)

            t0 = time.perf_counter()
            self._csr.update_values(A)
            factor_ms = self._ms_since(t0, device)

            t0 = time.perf_counter()
            iterations, converged = 1, True
            try:
                if self.method == "cg":
                    sol, iterations, converged = self._cg(cp, self._flat(cp, b))
                else:
                    sol = cpla.spsolve(self._mat, self._flat(cp, b))
            except Exception as exc:  # cuSOLVER errors surface as several exception types
                raise LinearSolveError(f"cupy: {self.method} failed: {exc}") from exc
            self._flat(cp, x)[...] = sol.astype(self._mat.dtype, copy=False)
            solve_ms = self._ms_since(t0, device)
        info = LinearSolveInfo(self.name, iterations, self._residual(A, b, x), analysis_ms, factor_ms, solve_ms)
        info.converged = converged
        return info


class CudssSolver(_ReusedFactors, _GpuCsrSolver):
    """cuDSS sparse direct solver through ``nvmath.sparse.advanced.DirectSolver`` (GPU only).

    Reordering + symbolic factorization (``plan()``) run once per sparsity pattern; each :meth:`solve` refills the CSR
    values in place (same device buffers, so the plan stays valid), refactorizes numerically and solves.

    Args:
        matrix_type: ``"general"`` (LU, default), ``"symmetric"`` (LDLt), ``"spd"`` (Cholesky) or
            ``"spd_or_general"``: Cholesky until a factorization fails, then LU for good (:attr:`active_matrix_type`
            says which). A failure is, after the first factorization of a plan, a non-zero cuDSS ``info`` or a
            residual above :attr:`SPD_CHECK_RTOL` times ``||b||`` (read on the host even inside
            :meth:`solve_deferred`), and after any later one a residual that is not finite or above
            :attr:`SPD_CHECK_RTOL` times ``||b||`` (:meth:`solve`; inside :meth:`solve_deferred` the device loop
            checks it, :attr:`direction_rtol`, and calls :meth:`direction_rejected`); the failed solve is redone
            with LU, after a new analysis. Projected Hessians with pinned variables (or
            a mass term) are SPD: on the 1M-tet box of ``newton_tet.py`` Cholesky factorizes in 462 ms against
            LU's 889 ms (H200); without pins a projected Hessian keeps its rigid null space (param), where Cholesky
            fails once and LU takes over. ``NewtonSolver`` asks for it when it projects and pins.
        reordering: optional cuDSS reordering algorithm number (``plan_config.reordering_algorithm``: 0 default, 1,
            2, 3; see the cuDSS documentation).
        compute_residual: compute ``||b - A x||`` after each solve (one SpMV).
        reuse_factorization: one factorization serves at most this many solves (1: factorize every solve); between
            factorizations, PCG on the current matrix preconditioned by the kept factors (module docstring). The
            matrices must be symmetric positive definite for it to pay (projected Newton's Hessians).
        factor_dtype: ``"float64"`` or ``"float32"``: factors of a float32 copy of a float64 matrix (its own plan,
            made on first use; a second plan in float64 only if a solve falls back to float64 factors), refined in
            float64 to ``refine_tol`` (module docstring).
        refine_tol: relative residual the refined solves reach (reused or float32 factors).
        refine_maxiter: iteration cap of a refined solve, past which it refactorizes (reuse) or falls back to
            float64 factors.
        refine_budget: a solve with reused factors gives up (and refactorizes) once its predicted time exceeds this
            factor times the time of the numeric factorization that made the factors; None: the cap only.
        execution: ``"cuda"`` (default) or ``"hybrid"``: cuDSS's hybrid execute mode
            (``nvmath.sparse.advanced.ExecutionHybrid``, ``CUDSS_CONFIG_HYBRID_EXECUTE_MODE``), where cuDSS may run
            parts of the factorization and solve on the host: meant for small systems, where kernel launches
            dominate.
        host_threads: host threads of cuDSS's analysis (``plan_config.host_nthreads``); None: cuDSS's default.
            nvmath refuses it unless ``CUDSS_THREADING_LIB`` names cuDSS's threading layer
            (``libcudss_mtlayer_gomp.so.0`` beside ``libcudss``). Measured on the H200 it does not shorten the
            analysis (8 threads: 92 ms against 94 ms for param/armadillo's 64k unknowns).
        use_matching: cuDSS's matching step of the analysis (``plan_config.matching_algorithm``: ``AUTO`` for
            True, ``NONE`` for False); None: cuDSS's default (no matching in cuDSS 0.8).
        permutation: the fill-reducing ordering of the analysis, an int array of the scalar row count (entry ``i``
            is the row placed at position ``i``, the convention of ``plan_info.row_permutation``), handed to cuDSS as
            ``CUDSS_DATA_USER_PERM``; None: cuDSS computes it. Measured on the H200 (benchmarks/README.md, session
            10), cuDSS 0.8 factorizes 5-15x slower with a user ordering, even its own handed back, since it then
            lacks its partition tree: an option for orderings cuDSS cannot find, not for speed.
        direct_calls: after nvmath's plan, run each numeric factorization and solve as two direct cuDSS calls
            (``nvmath.bindings.cudss.execute``) on dense descriptors that point at ``b`` and ``x`` themselves, instead
            of nvmath's ``factorize()``/``solve()`` (which, per call, wrap the stream, allocate the solution and copy
            it, and copy ``b`` into the plan's buffer). Same cuDSS work, less host work per solve; False: nvmath's
            calls. Hybrid execution always uses nvmath's calls.
        analysis_cache: a folder (str or path) where the analysis's fill-reducing ordering and nested-dissection
            partition tree (``CUDSS_DATA_PERM_REORDER_ROW``, ``CUDSS_DATA_ND_PARTITION_TREE``) are kept per sparsity
            pattern, matrix type and analysis options; a later plan of the same pattern (in this or another process)
            hands both back to cuDSS (``CUDSS_DATA_USER_PERM`` + ``CUDSS_DATA_USER_ND_PARTITION_TREE``, cuDSS >=
            0.7.1), which then skips its reordering and keeps its factorization speed (an ordering alone costs the
            factorization 5-15x, see ``permutation``). ``"auto"``: the folder ``warp_meshad_cudss`` in Warp's
            kernel cache (``wp.config.kernel_cache_dir``, beside the toolkit's module records). None (the
            default): the environment variable ``WARP_MESHAD_CUDSS_ANALYSIS_CACHE`` (a folder, ``auto``, or ``0`` /
            ``off`` for none) if set, else ``"auto"``. False: off. Ignored with ``permutation``. Measured on the
            H200 (benchmarks/README.md, session 11): param/armadillo's analysis 237 ms without, 31 ms with the
            cached ordering and tree, the same factors (non-zeros, factorization time).
            A file that cannot be read or applied is ignored (cuDSS analyses as usual) and rewritten. An entry holds
            4 bytes per unknown and the tree (armadillo's 64k unknowns: about 0.26 MB). The folder keeps at most
            ``WARP_MESHAD_CUDSS_ANALYSIS_CACHE_MB`` MiB (default 1024, some 4,000 entries of armadillo's size);
            past it each save deletes the entries used least recently (a hit counts as a use).
        handle: an existing cuDSS library handle (``nvmath.bindings.cudss.create()``, an int) for the plans of this
            solver, which then neither creates nor destroys one; None: each plan makes its own. cuDSS requires one
            handle per value type (float32 and float64 systems must not share one), and a plan of a small system
            costs about 90 ms on the H200, against 1.2 s for 50 patches analysed as one matrix. Sharing a handle
            does not remove that fixed cost (50 patches: 4.22 s against 4.26-4.41 s, session 12).
        deterministic: cuDSS's deterministic mode (``CUDSS_CONFIG_DETERMINISTIC_MODE``, set before the plan): the
            factorization and solve repeat bitwise run to run. Without it, two solves of the same matrix may differ
            at round-off; on a singular system (param without pins: the rigid motions) by far more, as the component
            along the null space is arbitrary. On the H200 (cuDSS 0.8) the mode repeated param/bunny_cut bitwise,
            but over the 200-patch dataset a process that planned patch 44 and then patch 45 in this mode died of
            an illegal memory access (with nvmath's own calls too, with or without the analysis cache, LU or
            Cholesky; not without the mode; benchmarks/README.md, session 13), so nothing asks for it on its own.
        config: more of cuDSS's configuration, set before the plan: ``{name: value}`` with ``name`` a member of
            ``nvmath.bindings.cudss.ConfigParam`` (case-insensitive, e.g. ``"factorization_alg"``, ``"solve_alg"``,
            ``"nd_nlevels"``, ``"use_superpanels"``) and ``value`` an int (an ``AlgType`` for the algorithms), set
            with ``cudssConfigSet`` as its documented type. None: the environment variable
            ``WARP_MESHAD_CUDSS_CONFIG`` (a JSON object, e.g. ``'{"nd_nlevels": 2}'``) where set, else nothing.
            The analysis cache keys on it. Measured choices: ``benchmarks/cudss_calls.py --factorizations``.

    Not for concurrent use: planning several solvers at once from a thread pool (one solver per thread) crashed the
    process on the H200 (segmentation fault; ``cudss_calls.py --threads 4``). A solver may move between threads
    (``PyTorch``'s autograd thread, a Ray task), one call at a time.

    With ``reuse_factorization > 1`` or ``factor_dtype="float32"`` a solve reads residual norms on the host (the PCG),
    so :meth:`solve_deferred` then synchronizes like :meth:`solve` (``defers_checks`` is False).
    """

    keeps_factors = True

    name = "cudss"
    MATRIX_TYPES = ("general", "symmetric", "spd", "spd_or_general")
    SPD_CHECK_RTOL = 1e-6
    """``spd_or_general``: the first Cholesky solve of a plan must reach ``||b - A x|| <= SPD_CHECK_RTOL ||b||``."""
    EXECUTIONS = ("cuda", "hybrid")

    def __init__(
        self,
        matrix_type: str = "general",
        reordering: int | None = None,
        compute_residual: bool = True,
        reuse_factorization: int = 1,
        factor_dtype: str = "float64",
        refine_tol: float = 1e-10,
        refine_maxiter: int = 20,
        refine_budget: float | None = 1.0,
        execution: str = "cuda",
        host_threads: int | None = None,
        use_matching: bool | None = None,
        permutation=None,
        handle: int | None = None,
        direct_calls: bool = True,
        analysis_cache=None,
        deterministic: bool = False,
        config: dict | None = None,
    ):
        permutation = _check_permutation_option(permutation)  # the options first: errors before imports
        config = _check_cudss_config_option(config)
        if not isinstance(deterministic, bool):
            raise ValueError(f"deterministic: expected a bool, got {deterministic!r}")
        analysis_cache = _check_analysis_cache_option(analysis_cache)
        if not isinstance(direct_calls, bool):
            raise ValueError(f"direct_calls: expected a bool, got {direct_calls!r}")
        if handle is not None and (isinstance(handle, bool) or not isinstance(handle, (int, np.integer))):
            raise ValueError(f"handle: expected None or a cuDSS handle (an int), got {type(handle).__name__}")
        if handle is not None and factor_dtype != "float64":
            raise ValueError(f"handle: expected None with factor_dtype={factor_dtype!r} (its float32 plan would share "
                             "the float64 plan's handle, which cuDSS does not allow)")
        if host_threads is not None and not (isinstance(host_threads, int) and host_threads >= 1):
            raise ValueError(f"host_threads: expected None or an int >= 1, got {host_threads!r}")
        if use_matching is not None and not isinstance(use_matching, bool):
            raise ValueError(f"use_matching: expected None or a bool, got {use_matching!r}")
        if matrix_type not in self.MATRIX_TYPES:
            raise ValueError(f"matrix_type: expected one of {self.MATRIX_TYPES}, got {matrix_type!r}")
        if execution not in self.EXECUTIONS:
            raise ValueError(f"execution: expected one of {self.EXECUTIONS}, got {execution!r}")
        super().__init__(compute_residual)
        self.permutation = permutation
        self.handle = None if handle is None else int(handle)
        self._solver = None
        self._solver32 = None
        self._init_reuse(reuse_factorization, factor_dtype, refine_tol, refine_maxiter, refine_budget)
        self._nva = _import_nvmath()
        self.matrix_type = matrix_type
        self.active_matrix_type = "spd" if matrix_type == "spd_or_general" else matrix_type
        self._check_spd = False  # the next factorization is a plan's first under spd_or_general: check it
        self.reordering = reordering
        self.execution = execution
        self.host_threads = host_threads
        self.use_matching = use_matching
        self.direct_calls = direct_calls
        self.analysis_cache = analysis_cache
        self.deterministic = deterministic
        self.config = config
        if config:
            from nvmath.bindings import cudss

            unknown = sorted(name for name in config if not hasattr(cudss.ConfigParam, name.upper()))
            if unknown:
                known = ", ".join(m.name.lower() for m in cudss.ConfigParam)
                raise ValueError(f"config: unknown cuDSS configuration {unknown} (expected names of "
                                 f"nvmath.bindings.cudss.ConfigParam: {known})")
        self.analysis_cache_hit = None  # the last plan: True (ordering and tree from the cache), False, None (off)
        self._dense = None  # direct calls: (b descriptor, x descriptor) of the planned float64 solver
        self._factored = None  # the pattern the solver's factors belong to (resolve)
        self._quiet = logging.getLogger("warp_meshad.linear.cudss")
        if self._quiet.level == logging.NOTSET:
            self._quiet.setLevel(logging.ERROR)

    @property
    def defers_checks(self) -> bool:
        return not self._policy

    def _free(self) -> None:
        try:
            if self._dense is not None:
                from nvmath.bindings import cudss

                dense, self._dense = self._dense, None
                if self._solver is not None:  # queued direct calls may still read the descriptors
                    wp.synchronize_device(self._csr_device)
                for desc in dense:
                    cudss.matrix_destroy(desc)
            if self._solver is not None:
                self._solver.free()
        finally:
            self._solver = None
            try:
                if self._solver32 is not None:
                    self._solver32.free()
            finally:
                self._solver32 = None

    def __del__(self):
        try:
            self._free()
        except Exception:
            pass

    def invalidate_pattern(self) -> None:
        self._free()
        self._pattern = None
        self._factored = None
        self.forget_factors()

    def _build(self, A, device) -> None:
        """CSR buffers and CuPy views for A's pattern; the cuDSS solvers are planned on first use."""
        self._free()
        self._csr_device = device
        self._csr = _CsrBuffers(A)
        self._csr.update_values(A)
        self._mat = self._views(device)
        self._rhs = self._cp.zeros(self._csr.size, dtype=self._mat.dtype)

    def _direct_solver(self, mat, rhs, device, use_cache: bool = True):
        """A planned ``DirectSolver`` (reordering and symbolic factorization) of ``mat`` with right-hand side ``rhs``."""
        nva = self._nva
        mtype = {
            "general": nva.DirectSolverMatrixType.GENERAL,
            "symmetric": nva.DirectSolverMatrixType.SYMMETRIC,
            "spd": nva.DirectSolverMatrixType.SPD,
        }[self.active_matrix_type]
        options = nva.DirectSolverOptions(sparse_system_type=mtype, logger=self._quiet, handle=self.handle)
        stream = wp.get_stream(device).cuda_stream
        extra = {} if self.execution == "cuda" else {"execution": self.execution}
        solver = nva.DirectSolver(mat, rhs, options=options, stream=stream, **extra)
        cache_file = None
        try:
            if self.reordering is not None:
                solver.plan_config.reordering_algorithm = int(self.reordering)
            if self.host_threads is not None:
                solver.plan_config.host_nthreads = int(self.host_threads)
            from nvmath.bindings import cudss

            if self.deterministic:  # nvmath 1.0 has no plan_config attribute for it: set on the config itself
                param = cudss.ConfigParam.DETERMINISTIC_MODE
                flag = np.ones(1, dtype=cudss.get_config_param_dtype(int(param)))
                cudss.config_set(solver.config_ptr, param, flag.ctypes.data, flag.nbytes)
            for name, value in sorted(self.config.items()):
                param = getattr(cudss.ConfigParam, name.upper())
                arr = np.array([value], dtype=cudss.get_config_param_dtype(int(param)))
                cudss.config_set(solver.config_ptr, param, arr.ctypes.data, arr.nbytes)
            if self.use_matching is not None:  # nvmath 1.0: a matching algorithm, NONE for off
                solver.plan_config.matching_algorithm = (cudss.MatchingAlg.AUTO if self.use_matching
                                                         else cudss.MatchingAlg.NONE)
            if self.permutation is not None:
                perm = self.permutation
                if perm.shape != (mat.shape[0],):
                    raise ValueError(f"permutation: expected {mat.shape[0]} entries (the scalar rows), got {perm.shape[0]}")
                cudss.data_set(solver.handle, solver.data_ptr, cudss.DataParam.USER_PERM, perm.ctypes.data, perm.nbytes)
            elif self.analysis_cache is not None and use_cache:
                cache_file = self.analysis_cache / f"{self._analysis_key(mat)}.npz"
                self.analysis_cache_hit = _apply_cached_analysis(cudss, solver, cache_file, mat.shape[0])
            solver.plan(stream=stream)
            if cache_file is not None and not self.analysis_cache_hit:
                _save_analysis(cudss, solver, cache_file, mat.shape[0])
        except Exception as exc:
            solver.free()
            if cache_file is None or not self.analysis_cache_hit:
                raise
            # cuDSS refused the cached ordering and tree: analyse anew (the entry is rewritten)
            _logger.warning("cudss: the cached analysis %s failed (%s: %s); analysing anew", cache_file,
                            type(exc).__name__, exc)
            self.analysis_cache_hit = False
            solver = self._direct_solver(mat, rhs, device, use_cache=False)
            _save_analysis(cudss, solver, cache_file, mat.shape[0])
        except BaseException:
            solver.free()
            raise
        return solver

    def _analysis_key(self, mat) -> str:
        """What an analysis depends on: the scalar CSR pattern, the value type, the matrix type and the options."""
        import hashlib

        cp = self._cp
        h = hashlib.sha256()
        h.update(repr((mat.shape, str(mat.dtype), self.active_matrix_type, self.reordering, self.use_matching,
                       self.execution, _cudss_version())).encode())
        if self.config:  # (absent when empty: the keys of existing entries stay)
            h.update(repr(sorted((k.lower(), int(v)) for k, v in self.config.items())).encode())
        h.update(cp.asnumpy(mat.indptr).tobytes())
        h.update(cp.asnumpy(mat.indices).tobytes())
        return h.hexdigest()[:32]

    def _direct_descriptors(self):
        """Direct calls: (b descriptor, x descriptor) for the planned float64 solver, made once per plan."""
        if self._dense is None:
            from nvmath.bindings import cudss

            solver = self._solver
            n = self._csr.size
            vt = int(solver.cuda_value_type)
            ptr = int(self._rhs.data.ptr)  # valid until the first call points them at b and x
            bdesc = cudss.matrix_create_dn(n, 1, n, ptr, vt, cudss.Layout.COL_MAJOR)
            try:
                xdesc = cudss.matrix_create_dn(n, 1, n, ptr, vt, cudss.Layout.COL_MAJOR)
            except BaseException:
                cudss.matrix_destroy(bdesc)
                raise
            self._dense = (bdesc, xdesc)
        return self._dense

    def _execute_direct(self, b: wp.array, x: wp.array, factorize: bool) -> None:
        """Direct calls: cuDSS's numeric factorization (``factorize``) or solve of ``A x = b``, queued on Warp's
        stream with ``b`` and ``x`` as the dense operands (``b`` is copied first where it aliases ``x``)."""
        from nvmath.bindings import cudss

        bdesc, xdesc = self._direct_descriptors()
        solver = self._solver
        handle = solver.handle
        bptr = int(b.ptr)
        if bptr == int(x.ptr) or not b.is_contiguous:
            self._rhs[...] = self._flat(self._cp, b)
            bptr = int(self._rhs.data.ptr)
        if not x.is_contiguous:
            raise ValueError("cudss: expected a contiguous x (direct calls write the solution in place)")
        cudss.set_stream(handle, int(wp.get_stream(x.device).cuda_stream))
        cudss.matrix_set_values(bdesc, bptr)
        cudss.matrix_set_values(xdesc, int(x.ptr))
        phase = cudss.Phase.FACTORIZATION if factorize else cudss.Phase.SOLVE
        cudss.execute(handle, phase, solver.config_ptr, solver.data_ptr, solver.a_ptr, xdesc, bdesc)
        if factorize:
            solver.solver_factorized = True  # nvmath's own solve() (refinement) accepts the factors

    @property
    def _direct(self) -> bool:
        return self.direct_calls and self.execution == "cuda"

    def capturable_for(self, A) -> bool:
        """Whether :meth:`solve_deferred` on ``A`` queues only device work that a CUDA graph can hold: direct calls,
        a plan for A's pattern already made, no reuse or float32 policy and no first-factorization check pending
        (those read the host). The device loop then captures the solve in its slot's graph."""
        return (self._direct and not self._policy and self._solver is not None and not self._check_spd
                and self._pattern == _pattern_key(A))

    def _first_cholesky_failed(self, A, b, x) -> bool:
        """Under ``spd_or_general``, after a plan's first Cholesky factorization and solve: whether it failed (cuDSS's
        info, then the residual, read on the host even inside :meth:`solve_deferred`)."""
        if not self._check_spd:
            return False
        self._check_spd = False
        if int(self._solver.factorization_info.info) != 0:
            return True
        residual = _residual_norm(A, b, x, self._work_like(b))
        b_norm = norm(b)
        # a failed Cholesky may give NaN or, with cuDSS's pivot perturbation, a finite wrong answer
        return not (math.isfinite(residual) and residual <= self.SPD_CHECK_RTOL * b_norm)

    @property
    def direction_rtol(self) -> float:
        """:attr:`SPD_CHECK_RTOL` while ``spd_or_general`` factors by Cholesky (a matrix that stopped being positive
        definite can give a finite wrong answer), else 0 (LU's and a chosen type's directions pass when finite)."""
        if self.matrix_type == "spd_or_general" and self.active_matrix_type == "spd":
            return self.SPD_CHECK_RTOL
        return 0.0

    def direction_rejected(self) -> bool:
        return self._to_lu()

    def _to_lu(self) -> bool:
        """Switch ``spd_or_general`` from Cholesky to LU for good (True), or say there is nothing to switch (False)."""
        if self.matrix_type != "spd_or_general" or self.active_matrix_type != "spd":
            return False
        self.active_matrix_type = "general"
        self.invalidate_pattern()
        self._quiet.info("cudss: Cholesky failed (the matrix is not positive definite): LU from now on")
        return True

    def _redone_by_lu(self, A, b, x, failed_ms: float) -> LinearSolveInfo:
        """The solve again with LU after a failed Cholesky, whose time counts as analysis."""
        info = self._plain_solve(A, b, x)
        info.analysis_ms += failed_ms
        return info

    def _plain_solve(self, A, b, x):
        _check_system(A, b, x)
        _require_cuda(A, self.name)
        device = A.device
        stream = wp.get_stream(device).cuda_stream
        dev_ctx, stream_ctx = self._stream(device)
        with dev_ctx, stream_ctx:
            t0 = self._now(device)
            key = _pattern_key(A)
            try:
                if self._pattern != key or self._csr is None:
                    self._build(A, device)
                    self._pattern = _pattern_key(A)  # after nnz_sync() made A.nnz exact
                if self._solver is None:
                    self._solver = self._direct_solver(self._mat, self._rhs, device)
                    self._check_spd = self.matrix_type == "spd_or_general" and self.active_matrix_type == "spd"
                analysis_ms = self._ms_since(t0, device)

                t0 = time.perf_counter()
                self._csr.update_values(A)
                if self._direct:
                    self._execute_direct(b, x, factorize=True)
                else:
                    self._solver.factorize(stream=stream)
                factor_ms = self._ms_since(t0, device)

                t0 = time.perf_counter()
                self._apply_native(b, x)
                solve_ms = self._ms_since(t0, device)
            except ImportError:
                raise
            except Exception as exc:
                self.invalidate_pattern()
                raise LinearSolveError(f"cudss: {type(exc).__name__}: {exc}") from exc
        if self._first_cholesky_failed(A, b, x) and self._to_lu():
            return self._redone_by_lu(A, b, x, analysis_ms + factor_ms + solve_ms)
        residual = self._residual(A, b, x)
        if self.compute_residual and self._deferred is None:
            if not math.isfinite(residual):
                if self._to_lu():
                    return self._redone_by_lu(A, b, x, analysis_ms + factor_ms + solve_ms)
                raise LinearSolveError(f"cudss: residual is {residual} (singular matrix?)")
            # a later Cholesky on a matrix that stopped being positive definite: finite but wrong (the device loop
            # checks the same bound on the device, direction_rtol)
            rtol = self.direction_rtol
            if rtol > 0.0 and residual > rtol * norm(b) and self._to_lu():
                return self._redone_by_lu(A, b, x, analysis_ms + factor_ms + solve_ms)
        self._factored = _pattern_key(A)
        return LinearSolveInfo(self.name, 1, residual, analysis_ms, factor_ms, solve_ms)

    # -- reuse and float32 factors (_ReusedFactors) ----------------------------------------------------------------

    @contextlib.contextmanager
    def _policy_scope(self, A):
        _require_cuda(A, self.name)
        dev_ctx, stream_ctx = self._stream(A.device)
        with dev_ctx, stream_ctx:
            try:
                yield
            except (ImportError, LinearSolveError):
                raise
            except Exception as exc:
                self.invalidate_pattern()
                raise LinearSolveError(f"cudss: {type(exc).__name__}: {exc}") from exc

    def _apply_with(self, solver, rhs, r, z) -> None:
        cp = self._cp
        rhs[...] = self._flat(cp, r).astype(rhs.dtype, copy=False)  # the solver's own buffer: its plan stays valid
        sol = solver.solve(stream=wp.get_stream(r.device).cuda_stream)
        out = self._flat(cp, z)
        out[...] = sol.reshape(-1).astype(out.dtype, copy=False)

    def _apply_native(self, r, z) -> None:
        if self._direct:
            self._execute_direct(r, z, factorize=False)
        else:
            self._apply_with(self._solver, self._rhs, r, z)

    def _factor32(self, A) -> tuple[float, float]:
        import cupyx.scipy.sparse as cpsp

        cp = self._cp
        device = A.device
        t0 = self._now(device)
        key = _pattern_key(A)
        if self._pattern != key or self._csr is None:
            self._build(A, device)
            self._pattern = _pattern_key(A)
        if self._solver32 is None:
            csr = self._csr
            data32 = cp.asarray(csr.data)[: csr.nnz].astype(cp.float32)
            self._mat32 = cpsp.csr_matrix((data32, self._mat.indices, self._mat.indptr), shape=self._mat.shape,
                                          copy=False)  # fmt: skip
            self._rhs32 = cp.zeros(csr.size, dtype=cp.float32)
            self._solver32 = self._direct_solver(self._mat32, self._rhs32, device)
        analysis_ms = self._ms_since(t0, device)
        t0 = time.perf_counter()
        self._csr.update_values(A)
        cp.copyto(self._mat32.data, cp.asarray(self._csr.data)[: self._csr.nnz], casting="same_kind")  # in place
        self._solver32.factorize(stream=wp.get_stream(device).cuda_stream)
        return analysis_ms, self._ms_since(t0, device)

    def _apply32(self, r, z) -> None:
        self._apply_with(self._solver32, self._rhs32, r, z)

    def _plain_resolve(self, A, b, x):
        _check_system(A, b, x)
        if self._solver is None or self._factored != _pattern_key(A):
            return self.solve(A, b, x)
        dev_ctx, stream_ctx = self._stream(A.device)
        with dev_ctx, stream_ctx:
            t0 = time.perf_counter()
            try:
                self._apply_native(b, x)
            except Exception as exc:
                self.invalidate_pattern()
                raise LinearSolveError(f"cudss: {type(exc).__name__}: {exc}") from exc
            solve_ms = self._ms_since(t0, A.device)
        return LinearSolveInfo(self.name, 1, self._residual(A, b, x), 0.0, 0.0, solve_ms)


# ----------------------------------------------------------------------------------------------------------------------
# Factory and "auto"
# ----------------------------------------------------------------------------------------------------------------------

_BACKENDS = {"scipy": ScipySolver, "qdldl": QdldlSolver, "cg": CGSolver, "cupy": CupySolver, "cudss": CudssSolver}
_probe_cache: dict[tuple[str, str, str], tuple[bool, str]] = {}
_logged_auto: set[tuple[str, str]] = set()
_warned_auto: set[tuple[str, str]] = set()


def _probe(name: str, device, dtype=wp.float64) -> tuple[bool, str]:
    """Whether back-end ``name`` imports and solves a 2x2 SPD system of ``dtype`` on ``device``, and if not, why.

    Cached per back-end, device and dtype. Returns ``(True, "")`` or ``(False, reason)``.
    """
    key = (name, str(device), _type_name(dtype))
    if key not in _probe_cache:
        try:
            solver = _BACKENDS[name]()
            rows = wp.array([0, 0, 1, 1], dtype=int, device=device)
            cols = wp.array([0, 1, 0, 1], dtype=int, device=device)
            vals = wp.array([4.0, 1.0, 1.0, 3.0], dtype=dtype, device=device)
            A = wps.bsr_from_triplets(2, 2, rows, cols, vals)
            b = wp.array([1.0, 2.0], dtype=dtype, device=device)
            x = wp.zeros(2, dtype=dtype, device=device)
            solver.solve(A, b, x)
            atol = 1e-8 if dtype == wp.float64 else 1e-5
            got = x.numpy()
            if np.allclose(got, [1.0 / 11.0, 7.0 / 11.0], atol=atol):
                result = (True, "")
            else:
                result = (False, f"its {_type_name(dtype)} test solve returned {got.tolist()}, not [1/11, 7/11]")
        except ImportError as exc:
            result = (False, f"not importable: {exc}")
        except Exception as exc:  # any other failure also means "does not work here"
            result = (False, f"its {_type_name(dtype)} test solve failed: {type(exc).__name__}: {exc}")
        if not result[0]:
            _logger.debug("linear back-end %r unusable on %s: %s", name, device, result[1])
        _probe_cache[key] = result
    return _probe_cache[key]


def _filter_options(cls, options: dict) -> dict:
    accepted = set(inspect.signature(cls.__init__).parameters) - {"self"}
    return {k: v for k, v in options.items() if k in accepted}


def make_linear_solver(name: str = "auto", *, device=None, dtype=None, **options) -> LinearSolver:
    """Create a linear back-end by name.

    Args:
        name: one of :data:`LINEAR_SOLVER_NAMES`: ``"auto"``, ``"scipy"``, ``"qdldl"``, ``"cg"``, ``"cupy"``,
            ``"cudss"``.
        device: device the systems will live on (only used by ``"auto"``); default ``wp.get_device()``.
        dtype: scalar type of the systems, ``wp.float32`` or ``wp.float64`` (default); ``"auto"`` probes the GPU
            back-ends with a system of this type.
        **options: keyword options of the chosen back-end class (:class:`ScipySolver`, :class:`QdldlSolver`,
            :class:`CGSolver`,
            :class:`CupySolver`, :class:`CudssSolver`). With ``"auto"``, each option goes to the picked back-end only if
            that back-end accepts it; an option that no back-end accepts is an error.

    Returns:
        The back-end instance; ``solver.name`` says which one (for ``"auto"``, the one picked, and
        ``solver.cudss_skipped_reason`` why it is not cuDSS; on a CUDA device that reason is also warned once per
        device and reason with ``warnings.warn``).

    Raises:
        ValueError: unknown ``name`` (the message lists the valid ones), or a ``dtype`` other than float32/float64.
        TypeError: an option the back-end does not accept.
        ImportError: an optional package is missing (the message names the pip extra to install).
    """
    if isinstance(name, LinearSolver):
        if options:
            raise TypeError(f"options {sorted(options)} given with a LinearSolver instance")
        return name
    if name not in LINEAR_SOLVER_NAMES:
        raise ValueError(f"unknown linear solver {name!r}; expected one of {LINEAR_SOLVER_NAMES}")
    dtype = wp.float64 if dtype is None else dtype
    if dtype not in (wp.float32, wp.float64):
        raise ValueError(f"dtype: expected wp.float32 or wp.float64, got {_type_name(dtype)}")
    if name != "auto":
        cls = _BACKENDS[name]
        unknown = set(options) - (set(inspect.signature(cls.__init__).parameters) - {"self"})
        if unknown:
            raise TypeError(f"{name!r} linear solver: unknown options {sorted(unknown)}")
        return cls(**options)

    all_accepted = set()
    for cls in _BACKENDS.values():
        all_accepted |= set(inspect.signature(cls.__init__).parameters) - {"self"}
    unknown = set(options) - all_accepted
    if unknown:
        raise TypeError(f"'auto' linear solver: unknown options {sorted(unknown)}")

    picked, skipped = _pick_auto(wp.get_device(device), dtype, options)
    cls = _BACKENDS[picked]
    solver = cls(**_filter_options(cls, options))
    solver.cudss_skipped_reason = skipped
    return solver


def _pick_auto(device, dtype, options: dict) -> tuple[str, str | None]:
    """The back-end ``"auto"`` picks on ``device`` and why it is not cuDSS (None when it is); on a CUDA device that
    reason is warned once per device and reason."""
    if device.is_cuda:
        ok, why = _probe("cudss", device, dtype)
        if ok:
            picked, skipped = "cudss", None
        else:
            picked = "cupy" if _probe("cupy", device, dtype)[0] else "cg"
            skipped = f"cuDSS {why}"
            if (str(device), skipped) not in _warned_auto:
                _warned_auto.add((str(device), skipped))
                warnings.warn(f"linear_solver='auto' on {device}: cuDSS is not used ({skipped}); using {picked!r}",
                              stacklevel=3)
    else:
        # SuperLU's own options (an unsymmetric matrix, an ordering, float32 factors) ask for SuperLU
        superlu = (options.get("symmetric", True) is False or "ordering" in options
                   or options.get("factor_dtype", "float64") != "float64")  # QDLDL factors in float64 only
        picked = "qdldl" if not superlu and _probe("qdldl", device, dtype)[0] else "scipy"
        skipped = f"the device is the CPU ({device}); cuDSS runs on CUDA devices only"
    key = (str(device), picked)
    if key not in _logged_auto:
        _logged_auto.add(key)
        _logger.info("linear solver 'auto' picked %r on %s", picked, device)
    return picked, skipped
