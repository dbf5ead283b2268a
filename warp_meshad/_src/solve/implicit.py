"""Gradients through a minimization (implicit differentiation): one adjoint linear solve with the Hessian.

For x* a minimizer of E(., theta) (g(x*, theta) = 0 on the free variables) and a loss L(x*), the implicit
function theorem gives dx*/dtheta = -H^-1 d2E/dx dtheta, hence (H symmetric)

    dL/dtheta = -(d2E/dx dtheta)^T lambda,   H lambda = dL/dx,

one adjoint solve with the Hessian at x* (:func:`implicit_gradient`); fixed variables (Dirichlet) have
lambda = 0. Any direct dependence of L on theta is the caller's to add. The mixed derivatives d2E/dx dtheta
come from ``Problem.eval_parameter_derivatives`` (see :mod:`warp_meshad._src.problem.parameters`).

Two things make the result wrong, and :func:`implicit_gradient` checks both with the factorization it makes anyway:

- H(x*) singular on the free variables (x* not a strict minimizer, or free rigid motions: nothing pins the
  translations and rotations): the adjoint solve fails or leaves a residual above ``ADJOINT_RESIDUAL`` ||dL/dx||; it
  raises :class:`~warp_meshad.LinearSolveError` saying so.
- x* not a minimizer (a solve that stopped on its energy change before its gradient was small): x* lies about
  delta = H^-1 g(x*) from the minimizer (the Newton step at x*, free variables), and the gradient computed at x*
  instead of there is off by a relative amount of the order of |delta| over the length on which the Hessian varies
  (an element's size). It warns when |delta|_inf > ``STATIONARITY_TOLERANCE`` times the extent of x* (the largest
  max - min of a coordinate over the variables, 1 where that is 0): 1e-6 of a mesh's size, 1e-4 of the element size
  of a mesh 100 elements across.
"""

from __future__ import annotations

import warnings

import numpy as np
import warp as wp
import warp.sparse as wps

from warp_meshad._src.problem.variables import check_variable_array
from warp_meshad._src.solve.constraints import apply_dirichlet, fixed_indices, fixed_mask_from_indices, zero_fixed_rows
from warp_meshad._src.solve.linear import LinearSolveError, LinearSolver, make_linear_solver

__all__ = ["ADJOINT_RESIDUAL", "STATIONARITY_TOLERANCE", "implicit_gradient"]

ADJOINT_RESIDUAL = 1e-6  # relative residual ||H lambda - dL/dx|| / ||dL/dx|| above which H(x*) is taken as singular
STATIONARITY_TOLERANCE = 1e-6  # |H^-1 g(x*)|_inf over the extent of x* above which x* is not taken as a minimizer


def implicit_gradient(
    problem, x_star, dL_dx, fixed=None, linear_solver="auto", hessian: str = "exact", reuse_factorization: bool = False
):
    """Gradient of a loss L(x*(theta)) in the parameters theta, x* a minimizer of the problem's energy.

    One adjoint solve ``H lambda = dL/dx`` with the Hessian at ``x_star`` (one factorization, reused for
    every column when ``dL_dx`` holds several losses), then ``dL/dtheta = -(d2E/dx dtheta)^T lambda``. See
    the module docstring for the derivation; the result is exact to the extent that x_star is a minimizer
    (g(x_star) = 0 on the free variables) and the linear solve is: a singular H(x*) raises, a gradient g(x_star)
    far from zero warns (the module docstring gives both rules).

    Args:
        problem: a :class:`~warp_meshad.Problem` with parameters (``add_term(..., parameters=...)``).
        x_star: wp.array [variable_count] of the variable dtype: the minimizer.
        dL_dx: dL/dx at x_star: a wp.array like ``x_star``, or a numpy array of shape (variable_count,
            variable_dim) (or (variable_count,) for scalar variables), or a list of those (several losses).
        fixed: indices of the variables held fixed in the solve (sequence, numpy or wp.array of ints, as the
            solvers' ``fixed``), or None.
        linear_solver: a back-end name for :func:`~warp_meshad.make_linear_solver`, or a LinearSolver: pass the one
            of the solve (``NewtonSolver(...).linear_solver``) to reuse its ordering and symbolic analysis (cuDSS's
            ``plan``, QDLDL's AMD ordering: the expensive part); only the numbers of H(x*) are factored again.
        hessian: ``"exact"`` (the true Hessian at x*; the default) or ``"clamp"`` (element Hessians projected
            to PSD, as projected Newton factors: only an approximation where an element Hessian is indefinite).
        reuse_factorization: also reuse the numbers: solve with the factors ``linear_solver`` kept from its last
            solve (SciPy, QDLDL, cuDSS keep them; other back-ends factor), without factoring H(x*). Exact where that
            last matrix was H(x*) itself, as after a Newton solve without projection that stopped on its decrement
            (it factors at x*, then stops); a projected solve factored the projected Hessian, an approximation.

    Returns:
        numpy float64 array (parameter_count,) (or (losses, parameter_count) for a list of losses).

    Raises:
        LinearSolveError: H(x_star) is singular on the free variables (the back-end failed, or its solution leaves a
            relative residual above ``ADJOINT_RESIDUAL``): x_star is not a strict minimizer, or rigid motions are
            free; the message says what to fix and ends with the back-end's message.

    Warns:
        UserWarning: x_star is not a minimizer: the Newton step H^-1 g(x_star) on the free variables exceeds
            ``STATIONARITY_TOLERANCE`` times the extent of x_star (solve with ``gradient_tolerance``).
    """
    if problem.parameter_count == 0:
        raise ValueError("implicit_gradient: the problem has no parameters (add_term(..., parameters=[...]))")
    if hessian not in ("exact", "clamp"):
        raise ValueError(f"implicit_gradient(hessian=...) must be 'exact' or 'clamp', got {hessian!r}")
    _check(problem, x_star, "x_star")
    several = isinstance(dL_dx, (list, tuple))
    losses = [_as_variable_array(problem, b, f"dL_dx[{i}]" if several else "dL_dx")
              for i, b in enumerate(dL_dx if several else [dL_dx])]
    idx = fixed_indices(fixed)
    fixed = None if idx is None else fixed_mask_from_indices(
        idx, problem.variable_count, problem.device, what="implicit_gradient(fixed=...)")
    if hessian == "exact":
        _, g, H = problem.eval_with_hessian(x_star)
    else:
        _, g, H = problem.eval_with_hessian_proj(x_star, mode="clamp")
    g = wp.clone(g)  # the evaluations below may reuse the problem's gradient buffer
    _, _, M = problem.eval_parameter_derivatives(x_star)
    if fixed is not None:
        apply_dirichlet(H, None, fixed)
        zero_fixed_rows(g, fixed)
    solver = linear_solver if isinstance(linear_solver, LinearSolver) else make_linear_solver(
        linear_solver, device=problem.device, dtype=problem.dtype
    )
    out = []
    for i, b in enumerate(losses):
        if fixed is not None:
            b = zero_fixed_rows(b, fixed)
        lam = _adjoint_solve(solver, H, b, factor=i == 0 and not reuse_factorization)
        y = wps.bsr_mv(M, lam, transpose=True)
        out.append(-y.numpy().astype(np.float64))
    _warn_unless_stationary(solver, H, g, x_star)
    return np.stack(out) if several else out[0]


def _adjoint_solve(solver: LinearSolver, H, b: wp.array, factor: bool) -> wp.array:
    """lambda with ``H lambda = b``: factoring H (``factor``) or with the solver's factors; a failed or inaccurate
    solve raises a LinearSolveError that says H(x*) is singular and what to fix."""
    lam = wp.zeros_like(b)
    try:
        info = solver.solve(H, b, lam) if factor else solver.resolve(H, b, lam)
    except LinearSolveError as exc:
        raise LinearSolveError(_singular_message(str(exc))) from exc
    b_norm = float(np.linalg.norm(b.numpy()))
    if info.residual_norm > ADJOINT_RESIDUAL * b_norm:  # False for NaN: a back-end that does not compute it
        raise LinearSolveError(_singular_message(
            f"{info.backend}: relative residual ||H lambda - dL/dx|| / ||dL/dx|| = {info.residual_norm / b_norm:.1e}, "
            f"expected <= {ADJOINT_RESIDUAL:.0e}"))
    return lam


def _singular_message(backend: str) -> str:
    return ("implicit_gradient: the adjoint solve H(x*) lambda = dL/dx failed: the Hessian at x_star is singular on "
            "the free variables, so x_star is not a strict minimizer, or free rigid motions remain (nothing pins the "
            "translations and rotations). Pin them (fixed=[...] indices, as in the solve), add a term that holds "
            "them (a regularizer, e.g. a weak spring to the rest positions), or pass the x of a converged solve. "
            f"Back-end: {backend}")


def _warn_unless_stationary(solver: LinearSolver, H, g: wp.array, x_star: wp.array) -> None:
    """Warn when x_star is not a minimizer: the Newton step H^-1 g on the free variables (``g`` zero at the fixed
    ones) exceeds STATIONARITY_TOLERANCE times the extent of x_star; solved with the factors of the adjoint solve."""
    g_max = float(np.abs(g.numpy()).max())
    if g_max == 0.0:
        return
    step = wp.zeros_like(g)
    solver.resolve(H, g, step)
    step_max = float(np.abs(step.numpy()).max())
    x = x_star.numpy().reshape(x_star.shape[0], -1)
    extent = float(np.ptp(x, axis=0).max()) or 1.0
    threshold = STATIONARITY_TOLERANCE * extent
    if step_max > threshold:
        warnings.warn(
            f"implicit_gradient: x_star is not a minimizer: |g(x*)|_inf = {g_max:.3e} on the free variables, so x* "
            f"lies |H^-1 g|_inf = {step_max:.3e} from the minimizer, above {STATIONARITY_TOLERANCE:.0e} x the extent "
            f"of x* ({extent:.3g}) = {threshold:.3e}; the gradient is off by a relative amount of the order of that "
            "step over the element size. Solve to a small gradient first (solve(..., gradient_tolerance=...), as "
            "energy_tolerance may stop a solve before its gradient is small).",
            UserWarning, stacklevel=3)


def _as_variable_array(problem, b, name: str) -> wp.array:
    if isinstance(b, wp.array):
        _check(problem, b, name)
        return wp.clone(b)
    a = np.asarray(b, dtype=wp.dtype_to_numpy(problem.dtype))
    want = (problem.variable_count,) if problem.variable_dim == 1 else (problem.variable_count, problem.variable_dim)
    if a.shape != want:
        raise ValueError(f"implicit_gradient({name}=...) must have shape {want}; got {a.shape}")
    return wp.array(a, dtype=problem.variable_type, device=problem.device)


def _check(problem, x, name: str) -> None:
    check_variable_array(x, name, "implicit_gradient", problem.variable_count, problem.variable_type, problem.device)
