"""The ``"cg"`` back-end: :class:`CGSolver`, Warp's preconditioned conjugate gradient (``warp.optim.linear.cg``) with
a ``"none"``, ``"diag"`` or ``"block_jacobi"`` preconditioner, on CPU and GPU; its buffers are allocated once per
system shape.

Not here: the other back-ends (no CSR copy, no factors: CG works on the BSR matrix itself).
"""

from __future__ import annotations

import math
import time

from warp_meshad._src.solve.linear.base import LinearSolveError, LinearSolveInfo, LinearSolver, _check_system

__all__ = ["CGSolver"]

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
