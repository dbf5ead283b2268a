"""The ``"qdldl"`` back-end: :class:`QdldlSolver`, sparse LDL^T (QDLDL, AMD ordering) on the host for symmetric
matrices: ordering and symbolic factorization once per pattern, a numeric refactorization per call; falls back to
SuperLU (:class:`~warp_meshad._src.solve.linear.scipy.ScipySolver`, whose pattern handling it shares) where LDL^T
without pivoting fails. The ``qdldl`` package is imported when a solver is made.

Not here: SuperLU itself (``scipy.py``) and the reuse of factors across matrices (``reuse.py``).
"""

from __future__ import annotations

import time

import numpy as np
import warp as wp

from warp_meshad._src.solve.linear.base import LinearSolveInfo, _check_system, _logger, _pattern_key
from warp_meshad._src.solve.linear.scipy import ScipySolver

__all__ = ["QdldlSolver"]


def _import_qdldl():
    try:
        import qdldl
    except ImportError as exc:
        raise ImportError(f"the 'qdldl' linear solver needs the qdldl package: pip install qdldl ({exc})") from exc
    return qdldl


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
