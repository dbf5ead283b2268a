"""PyTorch autograd Functions over a :class:`~warp_meshad.Problem`'s evaluations (behind :mod:`warp_meshad.torch`).

The module has two layers.

The boundary (``_check_variables``, ``_as_warp``, ``_owned``, ``_on_torch_stream``) turns a torch tensor of the
problem's variables into the ``wp.array`` its methods take, and back. Every tensor that crosses it is checked
(type, shape, dtype, device, contiguity) with a message naming the call, what was expected and what came; it is
then wrapped without a copy (``wp.from_torch``: the Warp array aliases the tensor's storage) and the problem's
launches go to torch's current CUDA stream, so they are ordered with the torch work around them.

The Functions, one ``torch.autograd.Function`` per evaluation, each with the public function that checks its
arguments and applies it:

- :class:`_Energy` (``energy``): E(x); backward grad_output * g(x), differentiable again through :class:`_Gradient`.
- :class:`_Gradient` (``gradient``): g(x); backward H(x) v through :class:`_HessianVectorProduct` (H is symmetric,
  so that is the vector-Jacobian product).
- :class:`_HessianVectorProduct`: H(x) v by ``Problem.hessian_vector_product``. Its derivative in x would need
  third derivatives, so its backward raises (``torch.autograd.function.once_differentiable`` would instead drop
  that term silently where the incoming gradient does not require grad).

They share one contract: a Function takes the problem (and any other non-tensor setting) first, saves only its
input tensors, and returns fresh tensors, never the problem's preallocated buffers, which its next evaluation
overwrites behind autograd's back (torch's version counters do not see Warp's writes). A Function for a new
evaluation follows the same pattern with the same boundary: for instance a minimizer x*(theta) of a problem whose
element data depend on theta, whose backward solves with the Hessian at x* (implicit function theorem), would be
one more Function here and one more name in :mod:`warp_meshad.torch`.
"""

from __future__ import annotations

import contextlib

import warp as wp

try:
    import torch
except ImportError as _e:  # only where torch is missing
    raise ImportError(
        "warp_meshad.torch needs PyTorch, which is not installed: pip install 'warp-meshad[torch]'"
    ) from _e

from warp_meshad._src.problem.problem import Problem

__all__ = ["energy", "gradient", "minimize"]

_TORCH_DTYPES = {wp.float32: torch.float32, wp.float64: torch.float64}


# ------------------------------------------------------------------------------------------------
# boundary
# ------------------------------------------------------------------------------------------------


def _variables_shape(problem: Problem) -> tuple[int, ...]:
    """The torch shape of the problem's variables: (variable_count, variable_dim), or (variable_count,) for dim 1."""
    n, d = problem.variable_count, problem.variable_dim
    return (n,) if d == 1 else (n, d)


def _expected(problem: Problem) -> str:
    return (
        f"a torch.Tensor of shape {_variables_shape(problem)}, dtype {_TORCH_DTYPES[problem.dtype]}, "
        f"on the problem's device {problem.device}, contiguous"
    )


def _check_problem(problem, fn: str) -> None:
    if not isinstance(problem, Problem):
        raise TypeError(
            f"warp_meshad.torch.{fn}(problem=...) must be a warp_meshad.Problem; got {type(problem).__name__}"
        )


def _check_variables(problem: Problem, t, argname: str, fn: str) -> None:
    """Raise unless ``t`` is a tensor of the problem's variables that :func:`_as_warp` can wrap without a copy.

    Args:
        problem: the problem whose variables ``t`` holds.
        t: the candidate, expected a torch.Tensor of shape [variable_count, variable_dim] ([variable_count] when
            ``variable_dim == 1``), dtype torch.float32/float64 as ``problem.dtype``, on ``problem.device``,
            contiguous.
        argname: the argument's name, for the message.
        fn: the public function's name, for the message.
    """
    want = _expected(problem)
    where = f"warp_meshad.torch.{fn}({argname}=...)"
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{where} must be {want}; got {type(t).__name__}")
    if t.layout != torch.strided:
        raise ValueError(f"{where} must be {want}; got layout {t.layout}")
    if tuple(t.shape) != _variables_shape(problem):
        raise ValueError(f"{where} must be {want}; got shape {tuple(t.shape)}")
    if t.dtype != _TORCH_DTYPES[problem.dtype]:
        want_dtype = _TORCH_DTYPES[problem.dtype]
        raise TypeError(f"{where} must be {want}; got dtype {t.dtype} (convert with .to({want_dtype}))")
    try:
        device = wp.device_from_torch(t.device)
    except (RuntimeError, ValueError, IndexError):
        device = None
    if device != problem.device:
        raise ValueError(f"{where} must be {want}; got device {t.device}")
    if not t.is_contiguous():
        raise ValueError(
            f"{where} must be {want}; got strides {t.stride()} (not contiguous: pass .contiguous(), which copies)"
        )


def _as_warp(problem: Problem, t: torch.Tensor) -> wp.array:
    """The problem's variables as a ``wp.array`` aliasing ``t``'s storage (no copy; ``t`` checked before).

    Args:
        problem: the problem the array is for.
        t: a contiguous tensor of shape [variable_count, variable_dim] (or [variable_count]) and the problem's
            dtype, on its device.

    Returns:
        wp.array of shape [variable_count], dtype ``problem.variable_type``, sharing memory with ``t``.
    """
    # requires_grad=False: from_torch would otherwise allocate and attach a zero t.grad of its own
    return wp.from_torch(t.detach(), dtype=problem.variable_type, requires_grad=False)


def _owned(a: wp.array) -> torch.Tensor:
    """A fresh tensor holding a copy of the problem buffer ``a`` (which the problem's next evaluation overwrites).

    Args:
        a: wp.array of shape [variable_count], dtype ``problem.variable_type``.

    Returns:
        torch.Tensor of shape [variable_count, variable_dim] (or [variable_count]), the problem's dtype and device,
        in memory of its own (one device copy, on torch's current stream).
    """
    return wp.to_torch(a, requires_grad=False).clone()


def _on_torch_stream(t: torch.Tensor):
    """A context in which Warp launches on torch's current stream for ``t``'s CUDA device (nothing on the CPU).

    On entering, torch's stream waits for Warp's current one; on leaving, Warp's waits for torch's, so a later
    evaluation of the problem outside this module cannot overwrite a buffer that a pending copy still reads.
    """
    if t.device.type == "cuda":
        return wp.ScopedStream(wp.stream_from_torch(t.device), sync_enter=True, sync_exit=True)
    return contextlib.nullcontext()


# ------------------------------------------------------------------------------------------------
# Functions
# ------------------------------------------------------------------------------------------------


class _Energy(torch.autograd.Function):
    """E(x) as a 0-d tensor; backward grad_output * g(x)."""

    @staticmethod
    def forward(ctx, problem: Problem, x: torch.Tensor) -> torch.Tensor:
        ctx.problem = problem
        ctx.save_for_backward(x)
        with _on_torch_stream(x):
            value = problem.eval(_as_warp(problem, x))
        return torch.tensor(value, dtype=x.dtype, device=x.device)

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor):
        (x,) = ctx.saved_tensors
        problem = ctx.problem
        if torch.is_grad_enabled():  # create_graph=True: g must be differentiable again (its backward is H v)
            return None, grad_output * _Gradient.apply(problem, x)
        with _on_torch_stream(x):
            _, g = problem.eval_with_gradient(_as_warp(problem, x))
            # g read in place from the problem's buffer; the product is a fresh tensor
            return None, grad_output * wp.to_torch(g, requires_grad=False)


class _Gradient(torch.autograd.Function):
    """g(x), the gradient of E; backward H(x) grad_output (H symmetric), matrix-free."""

    @staticmethod
    def forward(ctx, problem: Problem, x: torch.Tensor) -> torch.Tensor:
        ctx.problem = problem
        ctx.save_for_backward(x)
        with _on_torch_stream(x):
            _, g = problem.eval_with_gradient(_as_warp(problem, x))
            return _owned(g)

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor):
        (x,) = ctx.saved_tensors
        return None, _HessianVectorProduct.apply(ctx.problem, x, grad_output)


class _HessianVectorProduct(torch.autograd.Function):
    """H(x) v, matrix-free; its backward raises: differentiating it in x needs third derivatives of E.

    Only :meth:`_Gradient.backward` applies it, always with x requiring grad; a node of it is recorded only where
    that backward ran with ``create_graph=True``. Its derivative in v alone (H again) is not offered: torch tells a
    backward only which inputs require grad, not which derivatives the caller asked for.
    """

    @staticmethod
    def forward(ctx, problem: Problem, x: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        v = v.contiguous()  # a copy only where it is not contiguous (the expanded ones of .sum())
        with _on_torch_stream(x):
            return _owned(problem.hessian_vector_product(_as_warp(problem, x), _as_warp(problem, v)))

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor):
        raise RuntimeError(
            "warp_meshad.torch: differentiating H(x) v with respect to x needs third derivatives of the energy, "
            "which warp_meshad does not compute; differentiate a Problem's energy at most twice with respect to x "
            "(a backward of a backward taken with create_graph=True reached this)"
        )


def _set_theta(problem: Problem, theta: torch.Tensor) -> None:
    """Write theta (any float dtype and device) into the problem's parameter fields, through the host."""
    problem.set_parameters(theta.detach().to("cpu", torch.float64).numpy())


class _Minimizer(torch.autograd.Function):
    """x*(theta), a minimizer of the problem's energy with parameters theta; backward by implicit differentiation.

    Forward writes theta into the terms' data (``Problem.set_parameters``) and runs the solver from x0. Backward
    writes theta again (the problem may have been changed since) and returns ``implicit_gradient(problem, x*,
    grad_output)``: one adjoint solve with the Hessian at x* (see :mod:`warp_meshad._src.problem.parameters`). x* does not
    depend on x0 (a strict local minimizer), so x0 gets no gradient.
    """

    @staticmethod
    def forward(ctx, problem: Problem, run, fixed, linear_solver, theta: torch.Tensor, x0: torch.Tensor):
        _set_theta(problem, theta)
        with _on_torch_stream(x0):
            result = run(_as_warp(problem, x0))
        if not result.converged:
            raise RuntimeError(
                f"warp_meshad.torch.minimize: the solve stopped without converging ({result.reason!r} after "
                f"{result.iterations} iterations); its gradient would be wrong: raise max_iterations or loosen the "
                f"tolerance"
            )
        x_star = wp.to_torch(result.x, requires_grad=False).clone()
        ctx.problem, ctx.fixed, ctx.linear_solver = problem, fixed, linear_solver
        ctx.save_for_backward(theta, x_star)
        return x_star

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_output: torch.Tensor):
        from warp_meshad._src.solve.implicit import implicit_gradient

        theta, x_star = ctx.saved_tensors
        problem = ctx.problem
        _set_theta(problem, theta)
        dL_dx = grad_output.detach().to("cpu", torch.float64).numpy()
        with _on_torch_stream(x_star):
            g = implicit_gradient(problem, _as_warp(problem, x_star), dL_dx, fixed=ctx.fixed,
                                  linear_solver=ctx.linear_solver)  # fmt: skip
        return None, None, None, None, torch.as_tensor(g, dtype=theta.dtype, device=theta.device), None


# ------------------------------------------------------------------------------------------------
# public functions
# ------------------------------------------------------------------------------------------------


def energy(problem: Problem, x: torch.Tensor) -> torch.Tensor:
    """The problem's energy E(x) as a differentiable torch scalar.

    Backward gives ``grad_output * g(x)`` with g the problem's gradient (``Problem.eval_with_gradient``, evaluated
    in the backward pass, so only ``x`` is kept between the passes); that backward is differentiable again
    (``create_graph=True``, ``torch.autograd.gradgradcheck``), with Hessian-vector products
    (``Problem.hessian_vector_product``) as its backward. Third derivatives raise.

    Copies: ``x`` is handed to the problem without a copy (a Warp array over the tensor's storage). The forward
    reads E back to the host (one synchronization, as ``Problem.eval`` does). The backward reads g in place from
    the problem's buffer and returns the product with ``grad_output``, a fresh tensor. Under ``create_graph=True``
    g is copied once out of that buffer (see :func:`gradient`). On a CUDA device the launches go to torch's
    current stream.

    Args:
        problem: the problem; its variables are ``variable_count`` vectors of ``variable_dim`` numbers.
        x: the variables, a contiguous torch.Tensor of shape [variable_count, variable_dim] ([variable_count] when
            ``variable_dim == 1``), dtype torch.float32 or torch.float64 as ``problem.dtype`` (wp.float32 /
            wp.float64), on ``problem.device`` ("cpu" or "cuda:N"). Nothing is converted: another dtype,
            device or layout raises.

    Returns:
        A 0-d tensor of ``x``'s dtype and device.

    Raises:
        TypeError: ``problem`` is not a Problem, ``x`` not a tensor, or of another dtype.
        ValueError: ``x`` has another shape, device or layout, or is not contiguous.

    Example:
        >>> import warp_meshad.torch as wmt
        >>> x = torch.tensor(mesh.vertices, requires_grad=True)  # float64, (vertex_count, 3)
        >>> wmt.energy(problem, x).backward()                     # x.grad = g(x)
    """
    _check_problem(problem, "energy")
    _check_variables(problem, x, "x", "energy")
    return _Energy.apply(problem, x)


def gradient(problem: Problem, x: torch.Tensor) -> torch.Tensor:
    """The problem's gradient g(x) as a differentiable torch tensor.

    Backward gives ``H(x) grad_output`` through ``Problem.hessian_vector_product`` (matrix-free; H is symmetric, so
    this is the vector-Jacobian product). Differentiating that backward again (a third derivative of E) raises.

    Copies: ``x`` (and a contiguous ``grad_output``) are handed to the problem without a copy. The returned g, and
    the H v of the backward, are copied once out of the problem's buffers, which its next evaluation overwrites:
    a tensor that autograd keeps must not change under it. A ``grad_output`` that is not contiguous (the expanded
    ones of ``.sum()``) is copied to a contiguous one first. On a CUDA device the launches go to torch's current
    stream.

    Args:
        problem: the problem.
        x: the variables, as for :func:`energy`: a contiguous torch.Tensor of shape [variable_count,
            variable_dim] ([variable_count] when ``variable_dim == 1``), the problem's dtype, on its device.

    Returns:
        torch.Tensor of ``x``'s shape, dtype and device, in memory of its own.

    Raises:
        TypeError: ``problem`` is not a Problem, ``x`` not a tensor, or of another dtype.
        ValueError: ``x`` has another shape, device or layout, or is not contiguous.
    """
    _check_problem(problem, "gradient")
    _check_variables(problem, x, "x", "gradient")
    return _Gradient.apply(problem, x)


def minimize(
    problem: Problem,
    theta: torch.Tensor,
    x0: torch.Tensor,
    solver=None,
    fixed=None,
    max_iterations: int = 100,
    tolerance: float = 1e-24,
    gradient_tolerance: float | None = 1e-10,
    energy_tolerance: float = 0.0,
    linear_solver: str = "auto",
) -> torch.Tensor:
    """x*(theta) = argmin_x E(x; theta) as a torch tensor differentiable in theta (implicit differentiation).

    Forward: ``problem.set_parameters(theta)``, then the solver from ``x0`` (it must converge: a gradient at a point
    that is not a minimizer would be wrong, so a solve that stops short raises). Backward: for the incoming
    ``dL/dx*``, ``warp_meshad.implicit_gradient`` (one adjoint solve with the Hessian at x*, the fixed variables
    held), i.e. ``dL/dtheta = -(d2E/dx dtheta)^T H^-1 dL/dx*``. Differentiable once (its backward is not).

    Args:
        problem: a Problem whose terms have parameters (``add_term(..., parameters=...)``).
        theta: 1-d tensor of ``problem.parameter_count`` numbers (any float dtype and device; copied to the host to
            be written into the terms' data).
        x0: start point: a contiguous tensor of the problem's variables (as for :func:`energy`).
        solver: a warp_meshad solver (e.g. ``wm.NewtonSolver(problem, fixed=pins)``) whose ``solve(x, ...)`` is
            called; default a projected Newton solver with ``fixed`` and ``linear_solver``.
        fixed: indices of fixed variables (default: the solver's own ``fixed``).
        max_iterations, tolerance, gradient_tolerance, energy_tolerance: passed to ``solver.solve``. The backward
            is exact only where g(x*) = 0, and the error of x* carries into it: by default the solve stops on the
            gradient norm (1e-10) alone (a Newton decrement of 1e-12 still leaves |g| ~ 1e-6, and the energy change
            the same).
        linear_solver: back-end of the default solver; the adjoint solve of the backward uses the solver's own
            back-end object (reusing its ordering and symbolic analysis), or this name for a solver without one.

    Returns:
        x*, a fresh tensor of ``x0``'s shape, dtype and device.

    Raises:
        ValueError: the problem has no parameters, or theta has another length than ``problem.parameter_count``.
        RuntimeError: the solve did not converge.
    """
    from warp_meshad._src.solve.solvers import NewtonSolver

    _check_problem(problem, "minimize")
    if problem.parameter_count == 0:  # refused before the forward solve: only the backward would need them
        raise ValueError(
            "warp_meshad.torch.minimize(problem=...) needs a problem whose terms have parameters (add_term(..., "
            "data=..., parameters=(\"field\", ...))): x*(theta) has no theta to differentiate in; for the minimizer "
            "alone call a solver's solve(x)"
        )
    _check_variables(problem, x0, "x0", "minimize")
    if not isinstance(theta, torch.Tensor) or theta.ndim != 1 or theta.shape[0] != problem.parameter_count:
        got = f"shape {tuple(theta.shape)}" if isinstance(theta, torch.Tensor) else type(theta).__name__
        raise ValueError(
            f"warp_meshad.torch.minimize(theta=...) must be a 1-d torch.Tensor of problem.parameter_count = "
            f"{problem.parameter_count} numbers; got {got}"
        )
    if solver is None:
        solver = NewtonSolver(problem, linear_solver=linear_solver, fixed=fixed)
    if fixed is None:
        fixed = getattr(solver, "fixed_indices", None)

    def run(x):
        return solver.solve(x, max_iterations=max_iterations, tolerance=tolerance, gradient_tolerance=gradient_tolerance,
                            energy_tolerance=energy_tolerance)

    # the backward's adjoint solve reuses the solver's back-end (its ordering and symbolic analysis) where it has one
    adjoint = getattr(solver, "linear_solver", None) or linear_solver
    return _Minimizer.apply(problem, run, fixed, adjoint, theta, x0)
