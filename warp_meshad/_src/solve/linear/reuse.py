"""Factorizations that serve more than one solve: the policy the direct back-ends share (``"cudss"``, ``"qdldl"``,
``"scipy"``; keyword options of their constructors, default off), in the mixin :class:`_ReusedFactors` and the check
of its options (``_check_reuse_options``).

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

Not here: any factorization (each back-end provides its own, see :class:`_ReusedFactors`), nor the back-ends.
"""

from __future__ import annotations

import contextlib
import math
import time

import numpy as np
import warp as wp
import warp.sparse as wps

from warp_meshad._src.solve.linear.base import (LinearSolveError, LinearSolveInfo, _check_system, _logger,
                                                _pattern_key, _residual_into, _residual_norm, _type_name)
from warp_meshad._src.solve.vector_ops import axpy_into, dot, lincomb_into, norm

__all__ = ["FACTOR_DTYPES"]

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
