"""The ``"cupy"`` back-end: :class:`CupySolver`, ``cupyx.scipy.sparse.linalg.spsolve`` (cuSOLVER's sparse QR) or
its Jacobi-preconditioned ``cg`` on a zero-copy CuPy CSR view of our device buffers (GPU only). The file is named for
what the back-end runs: a module named ``cupy`` would read as CuPy itself in ``sys.modules``.

Not here: the CuPy views, the lazy CuPy import and the thread binding (``gpu_csr.py``), the CSR kernels (``csr.py``).
"""

from __future__ import annotations

import time

from warp_meshad._src.solve.linear.base import LinearSolveError, LinearSolveInfo, _check_system, _pattern_key
from warp_meshad._src.solve.linear.csr import _CsrBuffers
from warp_meshad._src.solve.linear.gpu_csr import _GpuCsrSolver, _require_cuda

__all__ = ["CupySolver"]

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
