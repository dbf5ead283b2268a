"""Newton's loop with its decisions on the device: ``NewtonSolver(..., device_loop=True)``.

The host loop (:meth:`warp_meshad._src.solve.solvers._Driver.solve`) reads the energy, the gradient norm, ``g . d``
and every Armijo trial energy back to the host and synchronizes around each phase timer. This loop queues the same
work and takes the same decisions in small kernels (:mod:`~warp_meshad._src.solve.device_loop_kernels`) that read
and write one float64 ``state`` array and a per-iteration ``history`` table, both views of one ``record`` array:

- a *slot* is what the host queues per iteration: the right-hand side ``-g`` and the pins, the linear solve
  (:meth:`~warp_meshad._src.solve.linear.LinearSolver.solve_deferred`: cuDSS/CuPy queue their residual check as a
  device reduction), the descent test with its ``-g`` fallback and the Newton decrement, ``trials`` Armijo trials of
  the host loop's step sequence ``1, shrink, shrink^2, ...`` (each: trial point, energy with
  :meth:`~warp_meshad.Problem.assemble_energy`, test; a trial after the accepted one does nothing), the step, the
  energy-change test, then the derivatives at the new point with the gradient-norm and iteration-cap tests;
- with ``poll=True`` the host reads ``state`` once per slot (:func:`read_record`, one copy of 14 numbers) to learn
  whether to stop; with ``poll=False`` it queues ``max_iterations`` slots with no read (kernels after a stop do
  nothing) and reads once at the end. Either way the history is read once at the end and becomes the
  :class:`~warp_meshad._src.solve.solvers.SolveResult`;
- a line search that needs more than ``trials`` trials goes on in the next slot (one more read with ``poll=True``;
  with ``poll=False`` that slot counts against ``max_iterations``, so fewer steps may be taken); a captured slot
  runs its line search as a while node of the graph instead (``conditional``, where CUDA's conditional nodes exist):
  trials until one is accepted, none after it, and the whole line search in its slot;
- phase timers record CUDA events (:class:`~warp_meshad._src.solve.phase_timer.PhaseTimer`), read at the end;
- ``capture=True`` (CUDA only) replays the slot as CUDA graphs (``wp.ScopedCapture`` / ``wp.capture_launch``). Where
  the linear back-end says its solve can be captured (``capturable_for(H)``: cuDSS with direct calls, planned, no
  host-side check pending; see :class:`~warp_meshad._src.solve.linear.CudssSolver`) and ``capture_solve`` allows it,
  the whole slot is one graph, the numeric factorization and solve included; a failed capture falls back (once per
  runner, logged) to two graphs, the part before the linear solve and the part after it, with the solve queued
  between them outside the graphs. The first slot of the first run runs uncaptured (kernel loading, cuDSS
  analysis); a later run of the same solver (a time step) replays the graphs from its first slot on, and the
  derivatives at its start point as one more graph (captured by the second run).
  The last slot of ``max_iterations`` runs uncaptured (gradient only, as the host loop). Capture with a
  ``before_derivatives`` hook (host code) is refused (:func:`~warp_meshad._src.solve.options.check_compatible`).
- a back-end may ask for a residual bound on its directions (``LinearSolver.direction_rtol``, cuDSS's Cholesky under
  ``spd_or_general``): a solve whose ``||b - A d||`` exceeds it leaves its point without a direction once (with
  ``poll=True``); the host sees the rejection at its next read, the back-end switches (cuDSS: to LU, for good) and
  the next slot solves again at the same point, as the host loop redoes the solve. A second rejection at the same
  point, or any with ``poll=False``, steps along ``-g`` (``"linear_solve_inaccurate"``).

The iterates are the host loop's to round-off (the same kernels, the same float64 decisions); tested in
tests/test_device_loop.py. The hooks that need the host between device steps (``NewtonHooks.stop``,
``NewtonHooks.line_search_energy``, ``step_bound_fn``) are refused by
:func:`~warp_meshad._src.solve.options.check_compatible`, with every other option this loop cannot take;
``before_derivatives`` runs before each derivative launch.
"""

from __future__ import annotations

import logging
import math
import time

import numpy as np
import warp as wp

from warp_meshad._src.solve import device_loop_kernels as k
from warp_meshad._src.solve.constraints import apply_dirichlet, zero_fixed_rows
from warp_meshad._src.solve.linear import LinearSolveError
from warp_meshad._src.solve.options import DeviceLoop
from warp_meshad._src.solve.phase_timer import PhaseTimer
from warp_meshad._src.solve.vector_ops import add_to_diagonal, mark_if_different, scale_into

__all__ = ["DeviceLoopBase", "DeviceLoopRunner", "read_record"]

_WIDTH = max(k.STATE_SIZE, k.HISTORY_SIZE)
_logger = logging.getLogger("warp_meshad.device_loop")


def read_record(arr: wp.array) -> np.ndarray:
    """The device loop's one host read: a copy of ``arr`` (waits for the work queued before it)."""
    return np.array(arr.numpy(), copy=True)


class DeviceLoopBase:
    """What the device loops share (:class:`DeviceLoopRunner`, Newton's; the first-order loops'
    :class:`~warp_meshad._src.solve.first_order_loop.FirstOrderLoopRunner`): the point, gradient, direction and trial
    buffers, the ``record`` of ``state`` and ``history``, the phase timer, and the Armijo trials (queued ``trials`` at
    a time, or captured as a while node)."""

    def __init__(self, solver, options: DeviceLoop):
        self.solver = solver
        self.options = options
        p = solver.problem
        self.device = p.device
        scalar = getattr(p.variable_type, "_wp_scalar_type_", p.variable_type)
        self.scalar = scalar
        self.x, self.g, self.d, self.trial = self._vector(), self._vector(), self._vector(), self._vector()
        self.alpha = wp.zeros(1, dtype=scalar, device=self.device)
        self.searching = wp.zeros(1, dtype=wp.int32, device=self.device)  # the while node's condition
        self.conditional = bool(options.capture and options.conditional and self.device.is_cuda
                                and wp.is_conditional_graph_supported())
        self.conditional_error: str | None = None  # why the line search's while node could not be captured
        self.record = None
        self.timer = PhaseTimer(self.device)
        self._graphs: dict = {}

    def _vector(self) -> wp.array:
        p = self.solver.problem
        return wp.zeros(p.variable_count, dtype=p.variable_type, device=self.device)

    # -- buffers ----------------------------------------------------------------------------------------------------

    def _records(self, rows: int) -> None:
        if self.record is None or self.history.shape[0] < rows:
            self.record = wp.zeros((rows + 1) * _WIDTH, dtype=wp.float64, device=self.device)
            self.state = self.record[: k.STATE_SIZE]
            self.history = self.record[_WIDTH:].reshape((rows, _WIDTH))
            self._graphs.clear()
        else:
            self.record.zero_()

    # -- the line search's trials -----------------------------------------------------------------------------------

    def _trial(self, tries: int) -> None:
        """One Armijo trial (nothing once one was accepted or the tries are spent)."""
        solver, dev, p = self.solver, self.device, self.solver.problem
        wp.launch(k.trial_step, dim=1, device=dev, inputs=[tries, self.state, self.alpha])
        wp.launch(k.trial_point, dim=p.variable_count, device=dev,
                  inputs=[self.x, self.d, self.alpha, tries, self.state, self.trial])
        energy = p.assemble_energy(self.trial)
        wp.launch(k.armijo_test, dim=1, device=dev,
                  inputs=[energy, wp.float64(solver.line_search.c), wp.float64(solver.line_search.shrink), tries,
                          self.state])

    def _trial_while_open(self, tries: int) -> None:
        """The body of the captured line search's while node: one trial, then its condition for the next."""
        self._trial(tries)
        wp.launch(k.search_open, dim=1, device=self.device, inputs=[tries, self.state, self.searching])

    def _trials(self, captured: bool) -> None:
        """The line search's trials after its direction: a while node in a capture (``conditional``), else
        ``trials`` of them (the rest in the next slot)."""
        tries = self.solver.line_search.tries
        if captured and self.conditional:
            wp.launch(k.search_open, dim=1, device=self.device, inputs=[tries, self.state, self.searching])
            wp.capture_while(self.searching, self._trial_while_open, tries=tries)
        else:
            for _ in range(self.options.trials):
                self._trial(tries)
            if self.conditional:  # load the while node's kernel before a capture needs it
                wp.launch(k.search_open, dim=1, device=self.device, inputs=[tries, self.state, self.searching])

    def _poll(self, callback, seen: list):
        """A slot's one read of ``state``, and the callback after a newly accepted step (``seen``: ``[iterations
        reported so far]``, updated). Returns ``(state, stop)``: stop is ``"callback"`` when the callback asked,
        ``"status"`` when the loop has stopped, else None."""
        state = read_record(self.state)
        iterations = int(state[k.ITERATIONS])
        if callback is not None and iterations > seen[0] and state[k.PHASE] == 0.0:
            seen[0] = iterations
            if callback(iterations, self.x, float(state[k.F])):
                return state, "callback"
        return state, ("status" if state[k.STATUS] != 0.0 else None)

    def _fill_from(self, result, record: np.ndarray, stopped_by_callback: bool, direction) -> None:
        """Fill ``result`` from the record read at the end: energies, gradient norms, steps and tries, iterations,
        stop reason; ``direction(row)`` books each history row that holds a direction (what a loop records of it)."""
        state = record[: k.STATE_SIZE]
        history = record[_WIDTH:].reshape(-1, _WIDTH)
        last = int(state[k.IT])
        result.energies = [float(v) for v in history[: last + 1, k.H_ENERGY]]
        for row in history[: last + 1]:
            if row[k.H_HAS_GNORM]:
                result.gradient_norms.append(float(row[k.H_GNORM]))
            if row[k.H_HAS_DIRECTION]:
                direction(row)
            if row[k.H_HAS_STEP]:
                result.step_sizes.append(float(row[k.H_ALPHA]))
                result.line_search_tries.append(int(row[k.H_TRIES]))
        result.iterations = int(state[k.ITERATIONS])
        if stopped_by_callback:
            result.reason = "callback"
        else:  # no stop code: the slots ran out before a stop (poll=False)
            result.reason = k.REASONS.get(int(state[k.STATUS]), "max_iterations")
        result.converged = result.reason in k.CONVERGED

    def _conditional_failed(self, exc: Exception) -> bool:
        """A capture with the line search's while node failed: capture without it from now on (``trials`` per
        slot) and keep the reason in :attr:`conditional_error`. False where no while node was captured."""
        if not self.conditional:
            return False
        self.conditional = False
        self.conditional_error = f"{type(exc).__name__}: {exc}"[:500]
        _logger.info("device loop: the line search could not be captured as a while node (%s); %d trials per slot",
                     self.conditional_error, self.options.trials)
        return True


class DeviceLoopRunner(DeviceLoopBase):
    """Buffers, kernels and graphs of one solver's device loop (made by ``NewtonSolver``)."""

    def __init__(self, solver, options: DeviceLoop):
        super().__init__(solver, options)
        self.solved, self.rhs = self._vector(), self._vector()
        self.gg, self.gd, self.residual_sq = (wp.zeros(1, dtype=self.scalar, device=self.device) for _ in range(3))
        self.solve_failed = wp.zeros(1, dtype=wp.int32, device=self.device)
        self.H = None
        self.solve_capture_error: str | None = None  # why capturing the linear solve failed (then never tried again)
        self.kept_capture_error: str | None = None  # why the slot with kept factors could not be captured
        # keep_start_factors: the point of the last factorization (copied by every factorizing slot, on the device)
        self.keep = bool(getattr(solver, "keeps_start_factors", False))  # refused with poll=False (options)
        self.factored_x = self._vector() if self.keep else None
        self.factored = False  # a factorizing slot has been queued (the back-end holds factors of factored_x)

    # -- launches ---------------------------------------------------------------------------------------------------

    def _derivatives(self, hessian: bool, s) -> None:
        solver, p = self.solver, self.solver.problem
        if solver.hooks.before_derivatives is not None:
            solver.hooks.before_derivatives(self.x)
        if hessian:
            proj = solver.projection
            if proj is None:
                energy, g, self.H = p.assemble_hessian(self.x)
            else:
                energy, g, self.H = p.assemble_hessian(self.x, projection=proj.mode, eps=proj.eps)
            if solver.hessian_shift > 0.0:
                add_to_diagonal(self.H, solver.hessian_shift)
        else:
            energy, g = p.assemble_gradient(self.x)
        wp.copy(self.g, g)
        if solver.fixed_mask is not None:
            zero_fixed_rows(self.g, solver.fixed_mask)
        wp.utils.array_inner(self.g, self.g, out=self.gg)
        wp.launch(k.check_point, dim=1, device=self.device,
                  inputs=[energy, self.gg, int(hessian), s["gtol"], s["max_iterations"], self.state, self.history])

    def _before_solve(self, kept: bool = False) -> None:
        if self.keep and not kept:
            wp.copy(self.factored_x, self.x)  # this slot factorizes at x
        scale_into(self.rhs, -1.0, self.g)
        if self.solver.fixed_mask is not None:
            apply_dirichlet(self.H, self.rhs, self.solver.fixed_mask)
        self.solved.zero_()
        self.solve_failed.zero_()

    def _linear_solve(self, infos: list, kept: bool = False) -> None:
        backend = self.solver.linear_solver
        solve = backend.resolve_deferred if kept else backend.solve_deferred
        try:
            infos.append(solve(self.H, self.rhs, self.solved, self.residual_sq))
        except LinearSolveError:
            infos.append(None)
            self.solve_failed.fill_(1)

    def _line_search(self, s, captured: bool = False) -> None:
        solver, dev, p = self.solver, self.device, self.solver.problem
        backend = solver.linear_solver
        wp.utils.array_inner(self.g, self.solved, out=self.gd)
        checked = int(backend.defers_checks and backend.compute_residual)
        wp.launch(k.check_direction, dim=1, device=dev,
                  inputs=[self.gd, self.residual_sq, self.solve_failed, checked, wp.float64(backend.direction_rtol),
                          int(self.options.poll), s["tolerance"], wp.float64(solver.first_step), self.state,
                          self.history])  # fmt: skip
        wp.launch(k.use_direction, dim=p.variable_count, device=dev,
                  inputs=[self.solved, self.g, self.scalar(-1.0), self.state, self.d])
        tries = solver.line_search.tries
        self._trials(captured)
        wp.launch(k.take_step, dim=p.variable_count, device=dev, inputs=[self.d, self.alpha, self.state, self.x])
        wp.launch(k.finish_line_search, dim=1, device=dev,
                  inputs=[s["energy_tolerance"], tries, self.state, self.history])

    def _slot(self, infos: list, hessian_next: bool, s, kept: bool = False) -> None:
        """Queue one slot, uncaptured, with a phase lap after each part (``kept``: solve with the back-end's kept
        factors instead of factorizing)."""
        self._before_solve(kept)
        self._linear_solve(infos, kept)
        self.timer.lap("linear_solve")
        self._line_search(s)
        self.timer.lap("line_search")
        self._derivatives(hessian_next, s)
        self.timer.lap("derivatives")

    def _has_graphs(self, s) -> bool:
        key = self._graph_key(s)
        return key in self._graphs or key + ("whole",) in self._graphs

    def _graph_key(self, s) -> tuple:
        rtol = float(self.solver.linear_solver.direction_rtol)
        return (tuple((name, float(v)) for name, v in sorted(s.items())), id(self.record), id(self.H), rtol)

    def _solve_capturable(self) -> bool:
        backend = self.solver.linear_solver
        check = getattr(backend, "capturable_for", None)
        return (self.options.capture_solve and self.solve_capture_error is None and check is not None
                and self.H is not None and check(self.H))

    def _capture_whole_slot(self, s, kept: bool = False):
        """One graph of the whole slot, the linear solve included, and the solve's info; None if the capture failed
        (the reason is kept in :attr:`solve_capture_error` and the back-end forgets its plan). ``kept``: the slot
        solves with the back-end's kept factors (:meth:`LinearSolver.resolve_deferred`) instead of factorizing; a
        failed capture of it is kept in :attr:`kept_capture_error` instead, and the other graphs are dropped (they
        hold the forgotten plan)."""
        backend = self.solver.linear_solver
        solve = backend.resolve_deferred if kept else backend.solve_deferred
        try:
            with wp.ScopedCapture(self.device, force_module_load=False) as whole:
                self._before_solve(kept)
                info = solve(self.H, self.rhs, self.solved, self.residual_sq)
                self._line_search(s, captured=True)
                self._derivatives(True, s)
        except Exception as exc:  # noqa: BLE001 (a back-end that cannot be captured: queue it between graphs)
            wp.synchronize_device(self.device)
            backend.invalidate_pattern()  # its plan saw a broken capture: the next solve plans again, uncaptured
            if kept:  # the factorizing slots captured before: their graphs go with the plan, and are captured again
                self._graphs.clear()
                self.kept_capture_error = f"{type(exc).__name__}: {exc}"[:500]
                _logger.info("device loop: the solve with kept factors could not be captured (%s); it runs uncaptured",
                             self.kept_capture_error)
                return None
            if not self._conditional_failed(exc):  # the while node is not the cause: the solve stays out of graphs
                self.solve_capture_error = f"{type(exc).__name__}: {exc}"[:500]
                _logger.info("device loop: the linear solve could not be captured (%s); it runs between two graphs",
                             self.solve_capture_error)
            return None
        return whole.graph, info

    def _capture_after_solve(self, s):
        """The graph of the slot's part after the linear solve (line search, derivatives)."""
        try:
            with wp.ScopedCapture(self.device, force_module_load=False) as after:
                self._line_search(s, captured=True)
                self._derivatives(True, s)
        except Exception as exc:
            wp.synchronize_device(self.device)
            if not self._conditional_failed(exc):
                raise
            with wp.ScopedCapture(self.device, force_module_load=False) as after:
                self._line_search(s, captured=True)
                self._derivatives(True, s)
        return after.graph

    def _captured_start(self, s) -> None:
        """The derivatives at a run's start point as a graph (captured at the first later run that has slot graphs:
        the Hessian's storage and the kernels exist by then). Kept with the slot graphs and dropped with them."""
        key = self._graph_key(s) + ("start",)
        if key not in self._graphs:
            with wp.ScopedCapture(self.device, force_module_load=False) as start:
                self._derivatives(True, s)
            self._graphs[key] = start.graph
        wp.capture_launch(self._graphs[key])

    def _captured_kept_slot(self, infos: list, s) -> bool:
        """A run's first slot that solves with the kept factors (``keep_start_factors``), as its own graph, captured
        once next to the factorizing slot's; False where it cannot be captured (the caller queues it uncaptured)."""
        if self.kept_capture_error is not None or not self._solve_capturable():
            return False
        key = self._graph_key(s) + ("kept",)
        if key not in self._graphs:
            made = self._capture_whole_slot(s, kept=True)
            if made is None:
                return False
            self._graphs[key] = made
        graph, info = self._graphs[key]
        wp.capture_launch(graph)
        infos.append(info)
        self.timer.lap("graph")
        return True

    def _captured_slot(self, infos: list, s) -> None:
        if self._solve_capturable():
            key = self._graph_key(s) + ("whole",)
            if key not in self._graphs:
                made = self._capture_whole_slot(s)
                if made is not None:
                    self._graphs.clear()
                    self._graphs[key] = made
            if key in self._graphs:
                graph, info = self._graphs[key]
                wp.capture_launch(graph)
                infos.append(info)
                self.timer.lap("graph")
                return
        key = self._graph_key(s)
        if key not in self._graphs:
            self._graphs.clear()
            with wp.ScopedCapture(self.device, force_module_load=False) as before:
                self._before_solve()
            self._graphs[key] = (before.graph, self._capture_after_solve(s))
        before, after = self._graphs[key]
        wp.capture_launch(before)
        self._linear_solve(infos)
        self.timer.lap("linear_solve")
        wp.capture_launch(after)
        self.timer.lap("graph")

    # -- the loop ---------------------------------------------------------------------------------------------------

    def run(self, x, max_iterations: int, tolerance: float, gtol: float, energy_tolerance: float, callback, result):
        """Minimize from ``x`` (checked by the caller); fills and returns ``result`` (a fresh SolveResult)."""
        t_start = time.perf_counter()
        max_iterations = int(max_iterations)
        f64 = wp.float64
        s = {"gtol": f64(gtol), "max_iterations": max_iterations, "tolerance": f64(tolerance),
             "energy_tolerance": f64(energy_tolerance)}  # fmt: skip
        self._records(max_iterations + 1)
        wp.copy(self.x, x)
        self.timer.reset()
        infos: list = []
        if self.options.capture and self._has_graphs(s):
            self._captured_start(s)  # a later run (a time step): the start's derivatives replayed too
        else:
            self._derivatives(True, s)
        if self.keep and self.factored:  # state[SAME_START]: the start is the point the kept factors belong to
            wp.launch(k.start_may_keep_factors, dim=1, device=self.device, inputs=[self.solve_failed, self.state])
            mark_if_different(self.x, self.factored_x, self.state, int(k.SAME_START))
        self.timer.lap("derivatives")
        seen, stopped_by_callback, rejected = [0], False, 0
        tries_rounds = math.ceil(self.solver.line_search.tries / self.options.trials)
        slots = max_iterations if not self.options.poll else max_iterations * tries_rounds
        kept = False
        for slot in range(slots + 1):
            if self.options.poll:
                state, stop = self._poll(callback, seen)
                if stop is not None:
                    stopped_by_callback = stop == "callback"
                    break
                kept = slot == 0 and self.keep and state[k.SAME_START] == 1.0
                if state[k.REJECTED] > rejected:
                    rejected = int(state[k.REJECTED])
                    self._direction_rejected()
                after = int(state[k.IT]) + 1  # the point this slot's step leads to
            else:
                after = slot + 1
            if slot == slots:
                break
            hessian_next = after != max_iterations  # the host loop's gradient-only evaluation at the cap
            if kept:  # the first direction from the kept factors: its own graph where it can be captured
                if not (self.options.capture and hessian_next and self._has_graphs(s)
                        and self._captured_kept_slot(infos, s)):
                    self._slot(infos, hessian_next, s, kept=True)
                self.solver.kept_solves += 1
                continue
            # a run's first slot is captured only with the graphs of an earlier run (kernels loaded, same buffers)
            if self.options.capture and hessian_next and (infos or self._has_graphs(s)):
                self._captured_slot(infos, s)
            else:
                self._slot(infos, hessian_next, s)
            self.factored = True
        record = read_record(self.record)
        self._fill(result, record, infos, stopped_by_callback)
        result.x = wp.clone(self.x)
        result.time_ms.update(self.timer.totals_ms())
        result.time_ms["total"] = (time.perf_counter() - t_start) * 1000.0
        return result

    def _direction_rejected(self) -> None:
        """A solve's residual exceeded the back-end's ``direction_rtol``; its point waits for another solve. Let the
        back-end react (cuDSS ``spd_or_general``: LU from now on) and drop the graphs that hold the old solve."""
        backend = self.solver.linear_solver
        wp.synchronize_device(self.device)
        if backend.direction_rejected():
            self._graphs.clear()
            _logger.info("device loop: a linear solve missed its residual tolerance; %s changed its method",
                         backend.name)

    def _fill(self, result, record: np.ndarray, infos: list, stopped_by_callback: bool) -> None:
        def direction(row) -> None:  # the row's linear solve, its fallback, its Newton decrement
            fallback = int(row[k.H_FALLBACK])
            info = infos[int(row[k.H_SLOT]) - 1]
            if fallback == k.LINEAR_SOLVE_FAILED:
                result.record_linear_solve(0, False, failed=True)
            else:
                result.record_linear_solve(info.iterations, info.converged)
            if fallback:
                result.record_fallback(k.FALLBACKS[fallback])
            result.newton_decrements.append(float(row[k.H_DECREMENT]))

        self._fill_from(result, record, stopped_by_callback, direction)
