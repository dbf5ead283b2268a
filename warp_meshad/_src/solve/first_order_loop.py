"""L-BFGS's and gradient descent's loop with its decisions on the device: ``LBFGSSolver(..., device_loop=...)``,
``GradientDescentSolver(..., device_loop=...)``.

The host loop (:meth:`warp_meshad._src.solve.solvers._Driver.solve`) reads the energy, the gradient norm, every
``s . y``, every two-loop coefficient and every Armijo trial energy back to the host. This loop queues the same work
and takes the same decisions on the device, in the ``state``/``history`` record of Newton's device loop
(:mod:`~warp_meshad._src.solve.device_loop`, whose stop, descent and Armijo kernels it shares) plus L-BFGS's ring of
curvature pairs (:mod:`~warp_meshad._src.solve.first_order_kernels`). One iteration (a *slot*) queues:

- the direction: ``q = -g`` (L-BFGS with no pair yet: scaled to the first step's length), the two-loop recursion
  over the ``history`` rows of the ring (``2 history`` reductions and updates; rows not stored do nothing), ``g . q``,
  the descent test with its ``-g`` fallback (which drops the pairs);
- the line search: Armijo trials from the solver's first step (``trials`` per slot, or a while node of the graph in a
  capture with ``conditional``), the step, which also writes ``s`` into the ring, and the energy-change test;
- the gradient at the new point (:meth:`~warp_meshad.Problem.assemble_gradient`) with the gradient-norm and
  iteration-cap tests, then ``y``, ``s . y``, ``s . s``, ``y . y`` and the pair's curvature test.

How the host waits (:class:`~warp_meshad._src.solve.options.DeviceLoop`):

- ``poll=True``: one read of ``state`` per slot (to stop, and for ``callback``); with ``capture=True`` each slot is a
  CUDA graph replayed per iteration;
- ``poll=False``: the stop is decided on the device. With ``capture=True`` (CUDA) the whole solve is one CUDA graph:
  a while node over the slots, so the host launches it once and reads the record once at the end (the first run's
  first slot runs uncaptured, to load the kernels). Without capture the same while loop runs from the host
  (``wp.capture_while`` reads its condition once per slot).

The iterates are the host loop's: on the CPU bit for bit (the same kernels and reductions in the same order), on a
GPU to round-off (block reductions); tested in tests/test_first_order_loop.py. Refused like Newton's device loop
(:func:`~warp_meshad._src.solve.options.check_compatible`): ``step_bound_fn`` (host code inside the iteration),
``capture`` off CUDA, a ``callback`` with ``poll=False``.
"""

from __future__ import annotations

import time

import numpy as np
import warp as wp

from warp_meshad._src.solve import device_loop_kernels as k
from warp_meshad._src.solve import first_order_kernels as fk
from warp_meshad._src.solve.constraints import zero_fixed_rows
from warp_meshad._src.solve.device_loop import DeviceLoopBase, read_record
from warp_meshad._src.solve.options import DeviceLoop

__all__ = ["FirstOrderLoopRunner"]

_BLOCK = 256  # threads per block of the reductions on a GPU
_FUSED_BLOCK = 1024  # threads of the one block of a small problem's two-loop recursion
_MAX_BLOCKS = 256
_GG, _GD, _SY, _SS, _YY = 0, 1, 2, 3, 4  # the slots of FirstOrderLoopRunner.sums


class FirstOrderLoopRunner(DeviceLoopBase):
    """Buffers, kernels and graphs of one first-order solver's device loop (made by ``LBFGSSolver`` with
    ``history = m`` pairs, or ``GradientDescentSolver`` with ``history = 0``).

    Attributes:
        fused_two_loop_max_scalars: problems of at most this many scalar unknowns run the two-loop recursion in one
            block (:func:`~warp_meshad._src.solve.first_order_kernels.two_loop_block`), larger ones as ``4 m``
            launches over the device (the same arithmetic: on the CPU the same bits).
    """

    fused_two_loop_max_scalars: int = 1 << 16

    def __init__(self, solver, options: DeviceLoop, history: int, initial_step: float = 1.0):
        super().__init__(solver, options)
        p = solver.problem
        n, dev = p.variable_count, self.device
        self.m = int(history)
        self.initial_step = float(initial_step)
        self.q = self._vector()
        self.one = wp.ones(1, dtype=self.scalar, device=dev)  # the variables' scalar type, for the kernels' casts
        self.dummy = wp.zeros(1, dtype=self.scalar, device=dev)
        self.no_failure = wp.zeros(1, dtype=wp.int32, device=dev)
        self.running = wp.zeros(1, dtype=wp.int32, device=dev)  # the captured solve's while condition
        self.captured_solve_error: str | None = None  # why the solve could not be captured as one while graph
        m = max(self.m, 1)
        self.ring = wp.zeros(fk.RING_SIZE, dtype=wp.int32, device=dev)
        self.rho = wp.zeros(m, dtype=wp.float64, device=dev)
        self.gamma = wp.zeros(m, dtype=wp.float64, device=dev)
        self.alphas = wp.zeros(m, dtype=wp.float64, device=dev)
        # every reduction of a slot, zeroed once per slot: g . g, g . q, s . y, s . s, y . y, the two loops' dots
        self.sums = wp.zeros(5 + 2 * m, dtype=self.scalar, device=dev)
        self.dots = self.sums[5:]
        self._sum = [self.sums[i:i + 1] for i in range(5)]  # one-entry views, as the one-thread kernels take them
        if self.m:
            self.g_prev, self.s_new, self.y_new = self._vector(), self._vector(), self._vector()
            self.s_rows = wp.zeros((self.m, n), dtype=p.variable_type, device=dev)
            self.y_rows = wp.zeros((self.m, n), dtype=p.variable_type, device=dev)
            self._s_view, self._y_view = self._vec_view(self.s_rows), self._vec_view(self.y_rows)
        else:  # gradient descent: no ring (the kernels get placeholders they never touch)
            self.g_prev = self.s_new = self.y_new = self.q
            self.s_rows = self.y_rows = wp.zeros((1, 1), dtype=p.variable_type, device=dev)
        # the reductions take vectors: scalar variables as vec1 views of the same memory
        self._views = {id(a): self._vec_view(a) for a in (self.g, self.q, self.s_new, self.y_new)}
        if dev.is_cuda:
            self._blocks = max(1, min(_MAX_BLOCKS, (n + 4 * _BLOCK - 1) // (4 * _BLOCK)))
            self._block_dim = _BLOCK
        else:  # one thread: index order, as wp.utils.array_inner on the CPU
            self._blocks, self._block_dim = 1, 1
        # the two-loop recursion as one block's launch where the problem is small (every pair's dot product is then
        # a tile sum, not a launch), else four launches per pair over the whole device
        scalars = n * (1 if p.variable_type == self.scalar else p.variable_type._length_)
        self._fused = self.m > 0 and scalars <= self.fused_two_loop_max_scalars
        self._fused_block_dim = _FUSED_BLOCK if dev.is_cuda else 1

    def _vec_view(self, a: wp.array) -> wp.array:
        if a.dtype != self.scalar:
            return a
        vec1 = wp.types.vector(1, self.scalar)
        return wp.array(ptr=a.ptr, dtype=vec1, shape=a.shape, device=a.device, copy=False)

    # -- launches ---------------------------------------------------------------------------------------------------

    def _derivatives(self, s, start: bool) -> None:
        """The gradient at x and the tests there; then (L-BFGS) the pending step's pair."""
        solver, p, dev = self.solver, self.solver.problem, self.device
        if solver.hooks.before_derivatives is not None:
            solver.hooks.before_derivatives(self.x)
        energy, g = p.assemble_gradient(self.x)
        wp.copy(self.g, g)
        if solver.fixed_mask is not None:
            zero_fixed_rows(self.g, solver.fixed_mask)
        self._dot(self.g, self.g, _GG)
        wp.launch(k.check_point, dim=1, device=dev,
                  inputs=[energy, self._sum[_GG], int(start), s["gtol"], s["max_iterations"], self.state,
                          self.history])
        if self.m and not start:
            wp.launch(fk.new_y, dim=p.variable_count, device=dev,
                      inputs=[self.g, self.g_prev, self.ring, self.one, self.y_rows, self.y_new])
            for a, b, slot in ((self.s_new, self.y_new, _SY), (self.s_new, self.s_new, _SS),
                               (self.y_new, self.y_new, _YY)):
                self._dot(a, b, slot)
            wp.launch(fk.keep_pair, dim=1, device=dev,
                      inputs=[self._sum[_SY], self._sum[_SS], self._sum[_YY], self.rho,
                              self.gamma, self.ring])

    def _dot(self, a, b, slot: int) -> None:
        """Queue ``sums[slot] += a . b`` (``sums`` zeroed at the slot's start)."""
        wp.launch_tiled(fk.dot, dim=[self._blocks], block_dim=self._block_dim, device=self.device,
                        inputs=[self._views[id(a)], self._views[id(b)], self._blocks * self._block_dim, self.sums,
                                slot])

    def _ring_dot(self, rows_view, j: int, slot: int) -> None:
        wp.launch_tiled(fk.ring_dot, dim=[self._blocks], block_dim=self._block_dim, device=self.device,
                        inputs=[rows_view, self._views[id(self.q)], self.ring, self.state, int(fk.NEWEST), j,
                                self._blocks * self._block_dim, self.dots, slot])

    def _direction(self) -> None:
        """q = the solver's direction at x (where x needs one), then the descent test and d."""
        solver, dev, n, m = self.solver, self.device, self.solver.problem.variable_count, self.m
        wp.launch(fk.begin_direction, dim=n, device=dev,
                  inputs=[self.g, int(m > 0), wp.float64(self.initial_step), self.ring, self.state, self.one, self.q,
                          self.g_prev])
        if m and self._fused:
            wp.launch_tiled(fk.two_loop_block, dim=[1], block_dim=self._fused_block_dim, device=dev,
                            inputs=[self._views[id(self.q)], self._s_view, self._y_view, self.rho, self.gamma,
                                    self.ring, self.state, self.one, self.alphas])
        elif m:
            for j in range(m):  # newest to oldest
                self._ring_dot(self._s_view, j, j)
                wp.launch(fk.two_loop_down, dim=n, device=dev,
                          inputs=[j, self.rho, self.dots, self.y_rows, self.ring, self.state, self.alphas, self.q])
            wp.launch(fk.scale_by_gamma, dim=n, device=dev, inputs=[self.gamma, self.ring, self.state, self.one, self.q])
            for j in reversed(range(m)):  # oldest to newest
                self._ring_dot(self._y_view, j, m + j)
                wp.launch(fk.two_loop_up, dim=n, device=dev,
                          inputs=[j, m, self.rho, self.dots, self.s_rows, self.ring, self.state, self.alphas, self.q])
        self._dot(self.g, self.q, _GD)
        wp.launch(k.check_direction, dim=1, device=dev,
                  inputs=[self._sum[_GD], self.dummy, self.no_failure, 0, wp.float64(0.0), 0, wp.float64(-1.0),
                          wp.float64(solver.first_step), self.state, self.history])
        wp.launch(k.use_direction, dim=n, device=dev, inputs=[self.q, self.g, self.scalar(-1.0), self.state, self.d])
        if m:
            wp.launch(fk.forget_pairs_on_fallback, dim=1, device=dev, inputs=[self.state, self.ring])

    def _slot(self, s, captured: bool) -> None:
        """Queue one iteration: direction, line search, gradient at the new point (``captured``: inside a graph
        capture, so no phase laps, and the trials as a while node where ``conditional``)."""
        dev, n = self.device, self.solver.problem.variable_count

        def lap(phase):
            if not captured:
                self.timer.lap(phase)

        self.sums.zero_()
        self._direction()
        lap("direction")
        self._trials(captured)
        wp.launch(fk.take_step_keeping_s, dim=n, device=dev,
                  inputs=[self.d, self.alpha, int(self.m > 0), self.state, self.ring, self.x, self.s_rows, self.s_new])
        wp.launch(k.finish_line_search, dim=1, device=dev,
                  inputs=[s["energy_tolerance"], self.solver.line_search.tries, self.state, self.history])
        lap("line_search")
        self._derivatives(s, start=False)
        wp.launch(fk.still_running, dim=1, device=dev, inputs=[self.state, self.running])
        lap("derivatives")

    def _captured_slot_graph(self, s):
        key = self._graph_key(s) + ("slot",)
        if key not in self._graphs:
            try:
                with wp.ScopedCapture(self.device, force_module_load=False) as slot:
                    self._slot(s, captured=True)
            except Exception as exc:
                wp.synchronize_device(self.device)
                if not self._conditional_failed(exc):
                    raise
                with wp.ScopedCapture(self.device, force_module_load=False) as slot:
                    self._slot(s, captured=True)
            self._graphs[key] = slot.graph
        return self._graphs[key]

    def _captured_solve_graph(self, s):
        """The rest of a solve as one graph (a while node over the slots), or None where it cannot be captured."""
        key = self._graph_key(s) + ("solve",)
        if key not in self._graphs and self.captured_solve_error is None:
            try:
                with wp.ScopedCapture(self.device, force_module_load=False) as solve:
                    wp.capture_while(self.running, self._slot, s=s, captured=True)
                self._graphs[key] = solve.graph
            except Exception as exc:  # noqa: BLE001 (e.g. no nested conditional nodes: a graph per slot instead)
                wp.synchronize_device(self.device)
                self.captured_solve_error = f"{type(exc).__name__}: {exc}"[:500]
        return self._graphs.get(key)

    def _graph_key(self, s) -> tuple:
        return (tuple((name, float(v)) for name, v in sorted(s.items())), id(self.record), self.conditional)

    # -- the loop ---------------------------------------------------------------------------------------------------

    def run(self, x, max_iterations: int, tolerance: float, gtol: float, energy_tolerance: float, callback, result):
        """Minimize from ``x`` (checked by the caller); fills and returns ``result`` (a fresh SolveResult). The same
        arguments as Newton's runner; ``tolerance`` is not used (first order has no decrement test)."""
        t_start = time.perf_counter()
        max_iterations = int(max_iterations)
        f64 = wp.float64
        s = {"gtol": f64(gtol), "max_iterations": max_iterations, "energy_tolerance": f64(energy_tolerance)}
        self._records(max_iterations + 1)
        self.ring.zero_()
        wp.copy(self.x, x)
        self.timer.reset()
        self.sums.zero_()
        self._derivatives(s, start=True)
        wp.launch(fk.still_running, dim=1, device=self.device, inputs=[self.state, self.running])
        self.timer.lap("derivatives")
        stopped_by_callback = False
        capture = self.options.capture
        if self.options.poll:
            seen = [0]
            tries_rounds = -(-self.solver.line_search.tries // self.options.trials)
            for slot in range(max_iterations * tries_rounds + 1):
                _, stop = self._poll(callback, seen)
                if stop is not None:
                    stopped_by_callback = stop == "callback"
                    break
                if capture and (slot > 0 or self._graphs):
                    wp.capture_launch(self._captured_slot_graph(s))
                    self.timer.lap("graph")
                else:
                    self._slot(s, captured=False)
        elif capture:
            graph = self._captured_solve_graph(s) if self._graphs else None
            if graph is None:  # the first run (kernels not loaded yet) or no nested while nodes: a slot, then graphs
                self._slot(s, captured=False)
                graph = self._captured_solve_graph(s)
            if graph is not None:
                wp.capture_launch(graph)
            else:
                while read_record(self.running)[0]:
                    wp.capture_launch(self._captured_slot_graph(s))
            self.timer.lap("graph")
        else:  # the stop decided on the device, the while loop run from the host (one read of its flag per slot)
            while read_record(self.running)[0]:
                self._slot(s, captured=False)
        record = read_record(self.record)
        self._fill(result, record, stopped_by_callback)
        result.x = wp.clone(self.x)
        result.time_ms.update(self.timer.totals_ms())
        result.time_ms["total"] = (time.perf_counter() - t_start) * 1000.0
        return result

    def _fill(self, result, record: np.ndarray, stopped_by_callback: bool) -> None:
        def direction(row) -> None:  # first order: only a fallback to book
            if row[k.H_FALLBACK]:
                result.record_fallback(k.FALLBACKS[int(row[k.H_FALLBACK])])

        self._fill_from(result, record, stopped_by_callback, direction)
