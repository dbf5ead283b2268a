"""Kernels of the device-side first-order loops (:mod:`~warp_meshad._src.solve.first_order_loop`): L-BFGS's
two-loop recursion over a ring of curvature pairs, its pair bookkeeping, and the step that records ``s``.

The ring holds ``m`` pairs ``(s, y)`` in rows of two ``[m, n]`` arrays with ``rho = 1 / (s . y)`` and
``gamma = (s . y) / (y . y)`` per row, and three ints (``ring``): the number of stored pairs, the row the next pair
goes to, and 1 + the row of a step waiting for its ``y`` (0: none). Stored pairs are the ``count`` rows before
``next`` (cyclically), newest first: the layout of the host loop's list of pairs
(:class:`~warp_meshad._src.solve.solvers.LBFGSSolver`), so both loops build the same directions.

Every kernel reads the loop's float64 ``state`` (:mod:`~warp_meshad._src.solve.device_loop_kernels`) and works only
where the host loop would: a new direction is built at a point that needs one (``STATUS`` 0, ``PHASE`` 0), a step
is recorded when a trial was accepted. Scalars are combined in float64 and cast to the variables' scalar type where
the host loop casts them (its ``axpy_into``/``scale_into`` arguments), and :func:`ring_dot` sums in the variables'
scalar type in index order on the CPU, as ``wp.utils.array_inner`` does there: on the CPU both loops give the same
bits; on a GPU the sums run in blocks, so they agree to round-off.
"""

from typing import Any

import warp as wp

from warp_meshad._src.solve.device_loop_kernels import ACCEPTED, FALLBACK, FRESH, GNORM, PHASE, STATUS
from warp_meshad._src.solve.policy import device as policy

COUNT = wp.constant(0)  # stored pairs
NEXT = wp.constant(1)  # the row of the next pair
PENDING = wp.constant(2)  # 1 + the row of the accepted step waiting for its y (0: none)
RING_SIZE = 3

NEWEST = wp.constant(0)  # ring_dot's row: the j-th newest stored pair
WAITING = wp.constant(1)  # ring_dot's row: the pending step's


@wp.func
def _needs_direction(state: wp.array(dtype=wp.float64)):
    return state[STATUS] == wp.float64(0.0) and state[PHASE] == wp.float64(0.0)


@wp.func
def _stepped(state: wp.array(dtype=wp.float64)):
    return state[STATUS] == wp.float64(0.0) and state[PHASE] == wp.float64(1.0) and state[ACCEPTED] != wp.float64(0.0)


@wp.func
def _newest_row(ring: wp.array(dtype=wp.int32), j: int, m: int):
    return (ring[NEXT] - 1 - j + 2 * m) % m


@wp.func
def _add_dot(acc: Any, u: Any, v: Any):
    # acc + u . v, the components added one at a time into acc (array_inner's order on the CPU)
    total = acc
    for k in range(len(u)):
        total += u[k] * v[k]
    return total


@wp.func
def _block_total(acc: Any):
    # the sum of every lane's acc, on every lane of the block
    return wp.tile_extract(wp.tile_sum(wp.tile(acc)), 0)


@wp.kernel(enable_backward=False, module="unique")
def ring_dot(rows: wp.array2d(dtype=Any), v: wp.array(dtype=Any), ring: wp.array(dtype=wp.int32),
             state: wp.array(dtype=wp.float64), which: int, j: int, stride: int, out: wp.array(dtype=Any), slot: int):
    # blocks stride over the variables (one block of one thread on the CPU: index order, as array_inner there):
    # out[slot] += row . v for the j-th newest pair's row (which = NEWEST, while a direction is built) or the pending
    # step's (WAITING); vectors only (scalar variables come as vec1 views)
    b, lane = wp.tid()
    row = int(-1)
    if which == NEWEST:
        if _needs_direction(state) and j < ring[COUNT]:
            row = _newest_row(ring, j, rows.shape[0])
    elif ring[PENDING] > 0:
        row = ring[PENDING] - 1
    if row < 0:
        return
    acc = out.dtype(0.0)
    i = b * wp.block_dim() + lane
    while i < v.shape[0]:
        acc = _add_dot(acc, rows[row, i], v[i])
        i += stride
    total = _block_total(acc)
    if lane == 0:
        wp.atomic_add(out, slot, total)


@wp.kernel(enable_backward=False, module="unique")
def dot(a: wp.array(dtype=Any), b: wp.array(dtype=Any), stride: int, out: wp.array(dtype=Any), slot: int):
    # blocks stride over the variables (one block of one thread on the CPU: index order, as array_inner there):
    # out[slot] += a . b (out zeroed before); vectors only (scalar variables come as vec1 views). Unlike
    # wp.utils.array_inner it allocates nothing on a GPU, so it can run in a captured while node's body
    blk, lane = wp.tid()
    acc = out.dtype(0.0)
    i = blk * wp.block_dim() + lane
    while i < a.shape[0]:
        acc = _add_dot(acc, a[i], b[i])
        i += stride
    total = _block_total(acc)
    if lane == 0:
        wp.atomic_add(out, slot, total)


@wp.kernel(enable_backward=False, module="unique")
def begin_direction(g: wp.array(dtype=Any), lbfgs: int, initial_step: wp.float64, ring: wp.array(dtype=wp.int32),
                    state: wp.array(dtype=wp.float64), scalar: wp.array(dtype=Any), q: wp.array(dtype=Any),
                    g_prev: wp.array(dtype=Any)):
    # one thread per variable, at a point that needs a direction: q = -g (L-BFGS with no pair: -g scaled to the first
    # step's length initial_step / |g|); L-BFGS keeps g for the next pair's y
    i = wp.tid()
    if not _needs_direction(state):
        return
    scale = scalar.dtype(-1.0)
    if lbfgs != 0:
        g_prev[i] = g[i]
        if ring[COUNT] == 0:
            scale = scalar.dtype(-initial_step / wp.max(state[GNORM], wp.float64(1e-300)))
    q[i] = scale * g[i]


@wp.kernel(enable_backward=False, module="unique")
def two_loop_down(j: int, rho: wp.array(dtype=wp.float64), dots: wp.array(dtype=Any), y_rows: wp.array2d(dtype=Any),
                  ring: wp.array(dtype=wp.int32), state: wp.array(dtype=wp.float64), alphas: wp.array(dtype=wp.float64),
                  q: wp.array(dtype=Any)):
    # one thread per variable: the first loop's step for the j-th newest pair: a_j = rho (s . q), q -= a_j y
    i = wp.tid()
    if not _needs_direction(state) or j >= ring[COUNT]:
        return
    row = _newest_row(ring, j, y_rows.shape[0])
    a = rho[row] * wp.float64(dots[j])
    if i == 0:
        alphas[j] = a
    q[i] = q[i] + dots.dtype(-a) * y_rows[row, i]


@wp.kernel(enable_backward=False, module="unique")
def two_loop_block(q: wp.array(dtype=Any), s_rows: wp.array2d(dtype=Any), y_rows: wp.array2d(dtype=Any),
                   rho: wp.array(dtype=wp.float64), gamma: wp.array(dtype=wp.float64), ring: wp.array(dtype=wp.int32),
                   state: wp.array(dtype=wp.float64), scalar: wp.array(dtype=Any), alphas: wp.array(dtype=wp.float64)):
    # one block for the whole two-loop recursion over the stored pairs (a small problem: one launch instead of 4 per
    # pair); each lane owns the variables i = lane, lane + block_dim, ..., so only the dot products cross lanes (a
    # tile sum). On the CPU one lane: the dots in index order, as ring_dot and array_inner there. Vectors only
    # (scalar variables come as vec1 views)
    _b, lane = wp.tid()
    if not _needs_direction(state) or ring[COUNT] == 0:
        return
    count = ring[COUNT]
    m = rho.shape[0]
    n = q.shape[0]
    bd = wp.block_dim()
    for j in range(count):  # newest to oldest: a_j = rho (s . q), q -= a_j y
        row = _newest_row(ring, j, m)
        acc = scalar.dtype(0.0)
        i = lane
        while i < n:
            acc = _add_dot(acc, s_rows[row, i], q[i])
            i += bd
        a = rho[row] * wp.float64(_block_total(acc))
        alphas[j] = a  # every lane writes the same value and reads back its own
        i = lane
        while i < n:
            q[i] = q[i] + scalar.dtype(-a) * y_rows[row, i]
            i += bd
    g = scalar.dtype(gamma[_newest_row(ring, 0, m)])
    i = lane
    while i < n:
        q[i] = g * q[i]
        i += bd
    for jj in range(count):  # oldest to newest: b = rho (y . q), q += (a_j - b) s
        j = count - 1 - jj
        row = _newest_row(ring, j, m)
        acc = scalar.dtype(0.0)
        i = lane
        while i < n:
            acc = _add_dot(acc, y_rows[row, i], q[i])
            i += bd
        b = rho[row] * wp.float64(_block_total(acc))
        i = lane
        while i < n:
            q[i] = q[i] + scalar.dtype(alphas[j] - b) * s_rows[row, i]
            i += bd


@wp.kernel(enable_backward=False, module="unique")
def scale_by_gamma(gamma: wp.array(dtype=wp.float64), ring: wp.array(dtype=wp.int32),
                   state: wp.array(dtype=wp.float64), scalar: wp.array(dtype=Any), q: wp.array(dtype=Any)):
    # one thread per variable: q *= gamma of the newest pair (the initial inverse Hessian (s . y / y . y) I)
    i = wp.tid()
    if not _needs_direction(state) or ring[COUNT] == 0:
        return
    row = _newest_row(ring, 0, gamma.shape[0])
    q[i] = scalar.dtype(gamma[row]) * q[i]


@wp.kernel(enable_backward=False, module="unique")
def two_loop_up(j: int, m: int, rho: wp.array(dtype=wp.float64), dots: wp.array(dtype=Any),
                s_rows: wp.array2d(dtype=Any), ring: wp.array(dtype=wp.int32), state: wp.array(dtype=wp.float64),
                alphas: wp.array(dtype=wp.float64), q: wp.array(dtype=Any)):
    # one thread per variable: the second loop's step for the j-th newest pair: b = rho (y . q), q += (a_j - b) s
    i = wp.tid()
    if not _needs_direction(state) or j >= ring[COUNT]:
        return
    row = _newest_row(ring, j, s_rows.shape[0])
    b = rho[row] * wp.float64(dots[m + j])
    q[i] = q[i] + dots.dtype(alphas[j] - b) * s_rows[row, i]


@wp.kernel(enable_backward=False, module="unique")
def forget_pairs_on_fallback(state: wp.array(dtype=wp.float64), ring: wp.array(dtype=wp.int32)):
    # one thread: a direction replaced by -g (not a descent direction) drops the stored pairs, as the host loop does
    if state[FRESH] != wp.float64(0.0) and state[FALLBACK] != wp.float64(0.0):
        ring[COUNT] = 0


@wp.kernel(enable_backward=False, module="unique")
def take_step_keeping_s(d: wp.array(dtype=Any), alpha: wp.array(dtype=Any), lbfgs: int,
                        state: wp.array(dtype=wp.float64), ring: wp.array(dtype=wp.int32),
                        x: wp.array(dtype=Any), s_rows: wp.array2d(dtype=Any), s_new: wp.array(dtype=Any)):
    # one thread per variable: x += alpha d with the accepted step (the accepted trial point, bit for bit); L-BFGS
    # writes s = x_new - x_old into the next row (dropping the pair stored there) and marks it pending
    i = wp.tid()
    if not _stepped(state):
        return
    x_old = x[i]
    x_new = x_old + alpha[0] * d[i]
    x[i] = x_new
    if lbfgs != 0:
        m = s_rows.shape[0]
        row = ring[NEXT]
        one = alpha.dtype(1.0)
        s = one * x_new + (-one) * x_old
        s_rows[row, i] = s
        s_new[i] = s
        if i == 0:
            ring[PENDING] = row + 1
            if ring[COUNT] == m:
                ring[COUNT] = m - 1


@wp.kernel(enable_backward=False, module="unique")
def new_y(g: wp.array(dtype=Any), g_prev: wp.array(dtype=Any), ring: wp.array(dtype=wp.int32),
          scalar: wp.array(dtype=Any), y_rows: wp.array2d(dtype=Any), y_new: wp.array(dtype=Any)):
    # one thread per variable, after the derivatives at the point a pending step led to: y = g - g_prev
    i = wp.tid()
    if ring[PENDING] == 0:
        return
    one = scalar.dtype(1.0)
    y = one * g[i] + (-one) * g_prev[i]
    y_rows[ring[PENDING] - 1, i] = y
    y_new[i] = y


@wp.kernel(enable_backward=False, module="unique")
def keep_pair(sy: wp.array(dtype=Any), ss: wp.array(dtype=Any), yy: wp.array(dtype=Any),
              rho: wp.array(dtype=wp.float64), gamma: wp.array(dtype=wp.float64), ring: wp.array(dtype=wp.int32)):
    # one thread: store the pending pair when s . y > 1e-12 |s| |y| (finite), else skip it; the ring moves on
    if ring[PENDING] == 0:
        return
    row = ring[PENDING] - 1
    ring[PENDING] = 0
    v = wp.float64(sy[0])
    if wp.isfinite(v) and v > wp.float64(1e-12) * policy.gradient_norm(wp.float64(ss[0])) * policy.gradient_norm(
        wp.float64(yy[0])
    ):
        rho[row] = wp.float64(1.0) / v
        gamma[row] = v / wp.float64(yy[0])
        ring[COUNT] = wp.min(ring[COUNT] + 1, rho.shape[0])
        ring[NEXT] = (row + 1) % rho.shape[0]


@wp.kernel(enable_backward=False, module="unique")
def still_running(state: wp.array(dtype=wp.float64), flag: wp.array(dtype=wp.int32)):
    # one thread: 1 while the solve has not stopped (the condition of the captured solve's while node)
    flag[0] = wp.where(state[STATUS] == wp.float64(0.0), 1, 0)
