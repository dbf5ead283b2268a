"""Projected Newton over a :class:`~warp_meshad.ProblemBatch`: B meshes in one loop, each with its own stops.

Each round evaluates energy, gradient and Hessian of all meshes with one launch per term, solves the one block-diagonal
Newton system (one analysis and factorization for the batch), then makes per mesh the decisions
:class:`~warp_meshad.NewtonSolver` makes for one mesh: gradient-norm stop, descent test (``-g`` fallback), Newton
decrement stop, Armijo backtracking with its own step size, energy-change stop. The trial points of all meshes'
line searches are evaluated together (one launch per try round; a mesh whose step is already accepted keeps its
step). A mesh that has stopped is pinned (its variables become Dirichlet rows of the system, its step 0): it no
longer moves and cannot disturb the others. The batch stops when every mesh has stopped. Per-mesh energies, gradient
norms and directional derivatives are segmented reductions on the device, read as B numbers per evaluation.

Each mesh's :class:`~warp_meshad.SolveResult` then equals its single-mesh solve up to round-off (the sums run in
another order), with the same stop reasons.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import warp as wp

from warp_meshad._src.problem.batch import ProblemBatch
from warp_meshad._src.solve import policy
from warp_meshad._src.solve.constraints import fixed_indices
from warp_meshad._src.solve.linear import LinearSolveError, LinearSolver
from warp_meshad._src.solve.options import (
    LineSearch,
    Projection,
    check_compatible,
    check_line_search,
    check_projection,
)
from warp_meshad._src.solve.solvers import NewtonSolver, SolveResult, check_hessian_shift, solve_tolerances
from warp_meshad._src.solve.vector_ops import check_finite_variables

__all__ = ["BatchNewtonSolver", "BatchSolveResult"]


@wp.kernel(enable_backward=False, module="unique")
def _batch_axpy(x: wp.array(dtype=Any), d: wp.array(dtype=Any), alpha: wp.array(dtype=Any),
                mesh_of: wp.array(dtype=wp.int32), out: wp.array(dtype=Any)):  # fmt: skip
    # one thread per variable: out = x + alpha[its mesh] * d
    i = wp.tid()
    out[i] = x[i] + alpha[mesh_of[i]] * d[i]


@wp.kernel(enable_backward=False, module="unique")
def _batch_negate_where(g: wp.array(dtype=Any), flag: wp.array(dtype=wp.int32), mesh_of: wp.array(dtype=wp.int32),
                        d: wp.array(dtype=Any)):  # fmt: skip
    # one thread per variable: d = -g on the meshes flagged (steepest-descent fallback)
    i = wp.tid()
    if flag[mesh_of[i]] != 0:
        d[i] = -g[i]


@wp.kernel(enable_backward=False, module="unique")
def _pin_mask(base: wp.array(dtype=wp.int32), stopped: wp.array(dtype=wp.int32), mesh_of: wp.array(dtype=wp.int32),
              mask: wp.array(dtype=wp.int32)):  # fmt: skip
    # one thread per variable: pinned by the user, or its mesh has stopped
    i = wp.tid()
    mask[i] = wp.where(base[i] != 0 or stopped[mesh_of[i]] != 0, 1, 0)


@dataclass
class BatchSolveResult:
    """Outcome of :meth:`BatchNewtonSolver.solve`.

    Attributes:
        results: one :class:`~warp_meshad.SolveResult` per mesh (its ``x`` mesh b's final variables, a new wp.array;
            ``time_ms`` empty: the phases are the batch's).
        x: the final merged variables (a new wp.array).
        rounds: loop rounds taken (the most iterations of any mesh, plus the last evaluation).
        compactions: times the loop moved on to a batch of the still active meshes only.
        time_ms: milliseconds per phase of the whole batch: ``derivatives``, ``linear_solve``, ``line_search``,
            ``total``.
        linear_solver: the back-end's name.
    """

    results: list
    x: wp.array
    rounds: int = 0
    compactions: int = 0
    time_ms: dict = field(default_factory=lambda: {"derivatives": 0.0, "linear_solve": 0.0, "line_search": 0.0})
    linear_solver: str | None = None

    @property
    def converged(self) -> list[bool]:
        """Per mesh, whether a convergence test stopped it."""
        return [r.converged for r in self.results]

    @property
    def iterations(self) -> list[int]:
        """Per mesh, its iterations."""
        return [r.iterations for r in self.results]

    @property
    def energies(self) -> np.ndarray:
        """Per mesh, its final energy (float64 numpy [B])."""
        return np.array([r.energies[-1] if r.energies else math.nan for r in self.results])


class _Stage:
    """The batch the loop currently runs on (all meshes, or the still active ones after a compaction), its driver
    (Hessian + linear solve) and its per-mesh device buffers."""

    def __init__(self, batch: ProblemBatch, fixed: list, newton_options: dict):
        p = batch.problem
        B, n, dev = batch.size, p.variable_count, p.device
        user_fixed = fixed_indices(batch.join_indices(fixed)) if any(f is not None for f in fixed) else None
        base = np.zeros(n, dtype=np.int32)
        if user_fixed is not None:
            base[user_fixed] = 1
        self.batch = batch
        # the driver owns the Hessian and the linear solve; its pin mask is ours (user pins + stopped meshes)
        # user pins: the driver picks its linear solver as for a single problem with them (Cholesky with cuDSS)
        self.newton = NewtonSolver(p, fixed=user_fixed, **newton_options)
        self.base_mask = wp.array(base, dtype=wp.int32, device=dev)
        self.mask = wp.array(base, dtype=wp.int32, device=dev)
        self.stopped = wp.zeros(B, dtype=wp.int32, device=dev)
        self.newton.fixed_mask = self.mask

        def vec():
            return wp.zeros(n, dtype=p.variable_type, device=dev)

        self.x, self.trial, self.g, self.d = vec(), vec(), vec(), vec()
        self.alpha = wp.zeros(B, dtype=p.dtype, device=dev)
        self.flag = wp.zeros(B, dtype=wp.int32, device=dev)
        self.per_mesh = wp.zeros(B, dtype=p.dtype, device=dev)

    def update_mask(self, stopped: np.ndarray) -> None:
        self.stopped.assign(stopped.astype(np.int32))
        wp.launch(_pin_mask, dim=self.mask.shape[0], inputs=[self.base_mask, self.stopped,
                  self.batch.mesh_of_variable, self.mask], device=self.mask.device)  # fmt: skip

    def axpy(self, out, x, alphas: np.ndarray, d) -> None:
        self.alpha.assign(alphas.astype(np.float64 if self.batch.dtype == wp.float64 else np.float32))
        wp.launch(_batch_axpy, dim=x.shape[0], inputs=[x, d, self.alpha, self.batch.mesh_of_variable, out],
                  device=x.device)  # fmt: skip

    def energies(self) -> np.ndarray:
        return self.batch.energies_into(self.per_mesh).numpy().astype(np.float64)

    def dots(self, a, c) -> np.ndarray:
        return self.batch.dot_per_mesh(a, c, self.per_mesh).numpy().astype(np.float64)


class BatchNewtonSolver:
    """Newton / projected Newton on a :class:`~warp_meshad.ProblemBatch`, with per-mesh stops and line searches.

    The settings mean what they mean for :class:`~warp_meshad.NewtonSolver` and apply to every mesh.

    Meshes need different numbers of iterations (on the 200-patch param dataset 4 to 138, median 13), and a stopped
    mesh still sits in the batch's system. The loop can continue on a new batch of the active meshes only
    (*compaction*, :meth:`ProblemBatch.subset`: the same kernels, a new Hessian pattern and linear-solver analysis);
    each round then costs what the active meshes cost, but the new analysis costs too: on the H200 cuDSS's analysis
    takes about 3 us per unknown and a factorization plus solve of a batch about 26 ns per unknown
    (benchmarks/history/2026-12-02_cudss_analysis_and_factorization.md), so one analysis costs as much as ~100
    rounds. With
    ``compact="auto"`` the loop compacts once the rounds it expects to save pay for the analysis, from the times this
    solve measured: with ``r`` rounds run, ``t_f`` the last round's factorization + solve, ``t_a`` the current
    batch's analysis and ``a`` the active meshes' share of its variables, when ``r * t_f * (1 - a) > t_a * a`` (it
    expects as many rounds to come as have run).

    Args:
        batch: the :class:`~warp_meshad.ProblemBatch`.
        linear_solver: back-end name or :class:`~warp_meshad.LinearSolver` (``"auto"``: cuDSS on a GPU where
            installed); it factors the block-diagonal system of all meshes. A ``LinearSolver`` instance is used for
            the first batch only; the compacted batches get new back-ends of its name.
        projection, hessian_shift: as :class:`~warp_meshad.NewtonSolver`.
        fixed: per mesh, the indices of its pinned variables (None for none), or None.
        linear_solver_options, line_search: as :class:`~warp_meshad.NewtonSolver` (the line search of every mesh).
            The other options of a Newton solver (hooks, step bound, device loop) have no batch counterpart.
        compact: ``"auto"`` (the rule above), or a fraction: compact when the active meshes hold at most this
            fraction of the batch's variables (0: never).
    """

    def __init__(
        self,
        batch: ProblemBatch,
        *,
        linear_solver: str | LinearSolver = "auto",
        projection: Projection | None = Projection(),
        fixed=None,
        linear_solver_options: dict | None = None,
        line_search: LineSearch = LineSearch(),
        compact: float | str = "auto",
        hessian_shift: float = 0.0,
    ):
        if not isinstance(batch, ProblemBatch):
            raise TypeError(f"BatchNewtonSolver(batch=...): expected a ProblemBatch, got {type(batch).__name__}")
        check_projection(projection, "BatchNewtonSolver(projection=...)")
        check_line_search(line_search, "BatchNewtonSolver(line_search=...)")
        check_compatible("BatchNewtonSolver", device=batch.device, linear_solver=linear_solver,
                         linear_solver_options=linear_solver_options)
        if compact != "auto" and not (isinstance(compact, (int, float)) and 0.0 <= compact < 1.0):
            raise ValueError(f"BatchNewtonSolver(compact=...): expected 'auto' or a fraction in [0, 1), got "
                             f"{compact!r}")
        if fixed is not None:
            fixed = list(fixed)
            batch.join_indices(fixed)  # checks the count and every index now
        self.batch = batch
        self.fixed = fixed if fixed is not None else [None] * batch.size
        self._options = {"linear_solver": linear_solver, "projection": projection,
                         "hessian_shift": check_hessian_shift(hessian_shift, "BatchNewtonSolver(hessian_shift=...)"),
                         "linear_solver_options": linear_solver_options}  # fmt: skip
        self._first = _Stage(batch, self.fixed, self._options)
        self.linear_solver = self._first.newton.linear_solver
        self.projection = projection
        self.line_search = line_search
        self.compact = compact if compact == "auto" else float(compact)

    @classmethod
    def like(cls, solver: NewtonSolver, batch: ProblemBatch, *, fixed=None, compact: float | str = "auto"):
        """A batch solver with the settings of ``solver`` (an app's :class:`~warp_meshad.NewtonSolver`): its linear
        back-end as it was asked for (``linear_solver_request``, by name) with its ``linear_solver_options``, its
        ``projection``, ``line_search`` and ``hessian_shift``; ``fixed`` per mesh as in the constructor. So an app
        states its solver once, and a batch of its meshes solves as one of them would.

        Raises:
            TypeError: ``solver`` is not a plain NewtonSolver (Gauss-Newton, Newton-CG and the first-order solvers
                have no batch form).
        """
        if type(solver) is not NewtonSolver:
            raise TypeError(f"BatchNewtonSolver.like(solver=...): expected a NewtonSolver, got {type(solver).__name__}")
        return cls(batch, linear_solver=solver.linear_solver_request,
                   linear_solver_options=solver.linear_solver_options or None, projection=solver.projection,
                   line_search=solver.line_search, hessian_shift=solver.hessian_shift, fixed=fixed, compact=compact)

    def _compacts(self, active_share: float, rounds: int, times_ms: dict) -> bool:
        """Whether to move on to a batch of the active meshes (``active_share``: their share of the current batch's
        variables; ``rounds``: rounds run so far; ``times_ms``: the current batch's ``analysis`` and last ``round``
        linear-solve times)."""
        if self.compact != "auto":
            return self.compact > 0.0 and active_share <= self.compact
        if "round" not in times_ms:
            return False
        return rounds * times_ms["round"] * (1.0 - active_share) > times_ms.get("analysis", 0.0) * active_share

    def _compacted(self, st: _Stage, ids: np.ndarray, active: np.ndarray, xk, saved: dict):
        """A stage of the active meshes (``active``: original indices), started at their current points; the
        stopped meshes' points are kept in ``saved``."""
        local = {int(b): k for k, b in enumerate(ids)}
        parts = st.batch.split(xk)
        keep = set(active.tolist())
        for b in ids:
            if int(b) not in keep:
                saved[int(b)] = parts[local[int(b)]]
        options = dict(self._options, linear_solver=self.linear_solver.name)
        new = _Stage(self.batch.subset(active), [self.fixed[b] for b in active], options)
        x = new.batch.join([parts[local[int(b)]] for b in active])
        wp.copy(new.x, x)
        return new, active.copy(), new.x

    def solve(
        self,
        x: wp.array,
        max_iterations: int = 100,
        tolerance: float = 1e-6,
        gradient_tolerance: float | None = None,
        energy_tolerance: float = 1e-12,
        callback: Callable[[int, wp.array, np.ndarray], Any] | None = None,
        check_finite: bool = True,
    ) -> BatchSolveResult:
        """Minimize every mesh's energy from the merged start ``x`` (see :meth:`ProblemBatch.join`).

        Args:
            x: merged start point, wp.array [batch.variable_count] of the variable dtype on the batch's device (not
                modified).
            max_iterations, tolerance, gradient_tolerance, energy_tolerance, check_finite: as
                :meth:`~warp_meshad.NewtonSolver.solve`, per mesh.
            callback: optional ``callback(round, x, energies)`` after every round's steps (``x`` the merged points
                of the meshes still in the loop's batch, ``energies`` float64 [B] of all meshes); returning True stops
                every mesh still running (reason ``"callback"``).

        Returns:
            :class:`BatchSolveResult`.
        """
        batch = self.batch
        st = self._first
        st.newton.check_x(x)
        if check_finite:
            check_finite_variables(x, "BatchNewtonSolver.solve(x=...)")
        gtol = solve_tolerances(max_iterations, tolerance, gradient_tolerance, energy_tolerance)
        max_it = int(max_iterations)
        B = batch.size
        dev = batch.device
        wp.synchronize_device(dev)
        t_start = time.perf_counter()
        out = BatchSolveResult(results=[SolveResult(x=None, linear_solver=self.linear_solver.name, time_ms={})
                                        for _ in range(B)], x=None, linear_solver=self.linear_solver.name)  # fmt: skip
        res = out.results
        times = out.time_ms
        stopped = np.zeros(B, dtype=bool)
        ids = np.arange(B)  # the original index of each mesh of the current stage
        st.update_mask(stopped[ids])
        xk = st.x
        wp.copy(xk, x)
        f = np.full(B, math.nan)
        started = np.zeros(B, dtype=bool)
        saved: dict = {}
        counts = batch.variable_counts
        times_ms: dict = {}  # the current stage's linear-solve times (the compaction rule)

        def stop(b: int, reason: str, converged: bool = False) -> None:
            stopped[b] = True
            res[b].reason = reason
            res[b].converged = converged

        for it in range(max_it + 1):
            if stopped.all():
                break
            live = ids[~stopped[ids]]
            if live.size < ids.size and self._compacts(counts[live].sum() / counts[ids].sum(), it, times_ms):
                st, ids, xk = self._compacted(st, ids, live, xk, saved)
                out.compactions += 1
                st.update_mask(stopped[ids])
                times_ms = {}
            p, nt = st.batch.problem, st.newton
            out.rounds += 1
            t0 = time.perf_counter()
            if it == max_it and it > 0:
                _, g_p = p.eval_with_gradient(xk)  # past the cap: gradient norms only
            else:
                _, g_p, H = nt.system(xk)
            f_eval = st.energies()
            g = nt.pinned_gradient(g_p, st.g)
            gn = policy.gradient_norm(st.dots(g, g))
            times["derivatives"] += (time.perf_counter() - t0) * 1000.0
            for k, b in enumerate(ids):
                if not stopped[b] and not started[b]:
                    started[b] = True
                    f[b] = f_eval[k]
                    res[b].energies.append(float(f[b]))
            status = policy.point_status(f[ids], gn, it, max_it, gtol)
            for k, b in enumerate(ids):
                if stopped[b]:
                    continue
                if status[k] != policy.NON_FINITE_ENERGY:
                    res[b].gradient_norms.append(float(gn[k]))
                if status[k] != policy.RUNNING:
                    reason = policy.REASONS[int(status[k])]
                    stop(b, reason, reason in policy.CONVERGED)
            if stopped.all():
                break

            t0 = time.perf_counter()
            st.update_mask(stopped[ids])  # stopped meshes: Dirichlet rows, d = 0 there
            d = st.d
            try:
                info = nt.solve_direction(H, g, d)
            except LinearSolveError:
                info = None
            failed = info is None
            linear = SolveResult(x=None)
            if failed:
                linear.record_linear_solve(0, False, failed=True)
            else:  # the compaction rule's times: the stage's analysis, its last factorization + solve
                linear.record_linear_solve(info.iterations, info.converged)
                times_ms["analysis"] = times_ms.get("analysis", 0.0) + info.analysis_ms
                times_ms["round"] = info.factor_ms + info.solve_ms
            dd = st.dots(g, d)
            times["linear_solve"] += (time.perf_counter() - t0) * 1000.0
            codes = policy.direction_fallback(dd, failed)
            fallback = np.zeros(ids.size, dtype=np.int32)
            for k, b in enumerate(ids):
                if stopped[b]:
                    continue
                r = res[b]
                r.linear_iterations.append(linear.linear_iterations[-1])
                r.linear_converged.append(linear.linear_converged[-1])
                r.linear_solves_capped += linear.linear_solves_capped
                if codes[k] == policy.NO_FALLBACK:
                    continue
                fallback[k] = 1
                r.record_fallback(policy.FALLBACKS[int(codes[k])])
                dd[k] = policy.fallback_slope(gn[k])
            if fallback.any():
                st.flag.assign(fallback)
                wp.launch(_batch_negate_where, dim=d.shape[0], inputs=[g, st.flag, st.batch.mesh_of_variable, d],
                          device=dev)  # fmt: skip
            decrements = policy.newton_decrement(dd)
            for k, b in enumerate(ids):
                if stopped[b]:
                    continue
                res[b].newton_decrements.append(float(decrements[k]))
                if policy.decrement_converged(decrements[k], tolerance):
                    stop(b, policy.REASONS[policy.NEWTON_DECREMENT], True)
            moving = [k for k, b in enumerate(ids) if not stopped[b]]
            if not moving:
                break

            # per-mesh Armijo, all trial points of a round in one evaluation
            t0 = time.perf_counter()
            n_local = ids.size
            alpha = np.zeros(n_local)
            alpha[moving] = 1.0
            tries = np.zeros(n_local, dtype=np.int64)
            accepted = np.zeros(n_local, dtype=bool)
            f0 = f[ids]
            f_new = f0.copy()
            pending = np.zeros(n_local, dtype=bool)
            pending[moving] = True
            trial = st.trial
            while pending.any():
                st.axpy(trial, xk, alpha, d)
                p.assemble_energy(trial)
                ft = st.energies()
                passed = policy.armijo_accepts(ft, f0, alpha, dd, self.line_search.c)
                for k in np.flatnonzero(pending):
                    tries[k] += 1
                    if passed[k]:
                        accepted[k], pending[k], f_new[k] = True, False, ft[k]
                    elif tries[k] >= self.line_search.tries:
                        pending[k], alpha[k] = False, 0.0
                    else:
                        alpha[k] *= self.line_search.shrink
            st.axpy(trial, xk, alpha, d)  # the accepted points (x itself where no step was taken)
            times["line_search"] += (time.perf_counter() - t0) * 1000.0
            st.x, st.trial = st.trial, st.x
            xk = st.x
            for k in moving:
                b = ids[k]
                r = res[b]
                r.iterations += 1
                r.line_search_tries.append(int(tries[k]))
                r.step_sizes.append(float(alpha[k]))
                if not accepted[k]:
                    stop(b, policy.REASONS[policy.LINE_SEARCH_FAILED])
                    continue
                f_old, f[b] = f[b], f_new[k]
                r.energies.append(float(f[b]))
                if policy.energy_change_converged(f_old, f[b], energy_tolerance):
                    stop(b, policy.REASONS[policy.ENERGY_CHANGE], True)
            if callback is not None and callback(it + 1, xk, f.copy()):
                for b in np.flatnonzero(~stopped):
                    stop(b, "callback")
                break

        parts = st.batch.split(xk)
        for k, b in enumerate(ids):
            saved[int(b)] = parts[k]
        out.x = batch.join([saved[b] for b in range(B)])
        for b in range(B):
            res[b].x = wp.clone(batch.segment(out.x, b))
        wp.synchronize_device(dev)
        times["total"] = (time.perf_counter() - t_start) * 1000.0
        return out

    def __repr__(self) -> str:
        return f"BatchNewtonSolver({self.batch!r}, linear_solver={self.linear_solver.name!r})"
