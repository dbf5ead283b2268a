"""The interface of the linear back-ends and what they all share.

- :class:`LinearSolver`: the base class (``solve``, ``resolve``, ``solve_deferred``, ``resolve_deferred``,
  ``invalidate_pattern``), its residual and timer helpers, and the flags a back-end sets (``defers_checks``,
  ``keeps_factors``).
- :class:`LinearSolveInfo`: what one solve did; :class:`LinearSolveError`: what a back-end raises when it fails.
- The checks of a system ``A x = b`` at the public boundary (``_check_system``: types, shapes, dtypes, devices, with
  expected and got in the message), the key of a sparsity pattern (``_pattern_key``) and the residual ``b - A x`` on
  the device (``_residual_into``, ``_residual_norm``).
- ``_logger``, the ``warp_meshad.linear`` logger every file of the package writes to.

Not here: the BSR -> CSR conversion (``csr.py``), the reuse of factors across matrices and float32 factors
(``reuse.py``), the back-ends themselves (one file each) and the choice of one by name (``registry.py``).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import warp as wp
import warp.sparse as wps

from warp_meshad._src.codegen.warp_compat import matrix_pattern_version
from warp_meshad._src.solve.vector_ops import norm

__all__ = ["LinearSolveError", "LinearSolveInfo", "LinearSolver"]

_logger = logging.getLogger("warp_meshad.linear")


class LinearSolveError(RuntimeError):
    """A back-end failed to factorize or solve the system (singular matrix, NaN input, library error)."""


@dataclass
class LinearSolveInfo:
    """What one :meth:`LinearSolver.solve` call did.

    Attributes:
        backend: name of the back-end that ran (its :attr:`LinearSolver.name`, e.g. ``"scipy"``; a ``"qdldl"``
            call that fell back to SuperLU says ``"scipy"``).
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
        name: back-end name, its key in the registration table (``registry.py``; ``"scipy"``, ``"qdldl"``, ...).
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
