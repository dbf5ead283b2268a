"""The ``"scipy"`` back-end: :class:`ScipySolver`, SuperLU (``scipy.sparse.linalg.splu``) on the host.

The scalar CSR pattern is built once per sparsity pattern and refilled in place; SciPy exposes no reusable symbolic
factorization, so ordering runs each call. SciPy is imported at the first solve.

Not here: the reuse of factors across matrices and the float32 factors this back-end offers (``reuse.py``), the CSR
kernels (``csr.py``); :class:`~warp_meshad._src.solve.linear.qdldl.QdldlSolver`, which builds on this class and falls
back to it, is in ``qdldl.py``.
"""

from __future__ import annotations

import time

import numpy as np
import warp as wp

from warp_meshad._src.solve.linear.base import (LinearSolveError, LinearSolveInfo, LinearSolver, _check_system,
                                                _pattern_key)
from warp_meshad._src.solve.linear.csr import _CsrBuffers
from warp_meshad._src.solve.linear.reuse import _ReusedFactors

__all__ = ["ScipySolver"]

class ScipySolver(_ReusedFactors, LinearSolver):
    """SuperLU on the host through SciPy.

    Args:
        symmetric: the matrix is symmetric (Newton Hessians are): its CSR arrays are then read directly as CSC (no
            transpose copy) and SuperLU runs in symmetric mode with a small diagonal pivot threshold.
        ordering: SuperLU column ordering (``permc_spec``): ``"MMD_AT_PLUS_A"`` (default, for symmetric patterns),
            ``"COLAMD"``, ``"MMD_ATA"``, ``"NATURAL"``.
        compute_residual: compute ``||b - A x||`` after each solve (one SpMV).
        reuse_factorization: one factorization serves at most this many solves (1: factorize every solve); between
            factorizations, PCG on the current matrix preconditioned by the kept factors (``reuse.py``).
        factor_dtype: ``"float64"`` or ``"float32"``: SuperLU of a float32 copy of a float64 matrix, refined in
            float64 (``reuse.py``; emulates cuDSS's float32 factors on the CPU).
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
