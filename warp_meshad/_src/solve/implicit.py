"""Gradients through a minimization (implicit differentiation): one adjoint linear solve with the Hessian.

For x* a minimizer of E(., theta) (g(x*, theta) = 0 on the free variables) and a loss L(x*), the implicit
function theorem gives dx*/dtheta = -H^-1 d2E/dx dtheta, hence (H symmetric)

    dL/dtheta = -(d2E/dx dtheta)^T lambda,   H lambda = dL/dx,

one adjoint solve with the Hessian at x* (:func:`implicit_gradient`); fixed variables (Dirichlet) have
lambda = 0. Any direct dependence of L on theta is the caller's to add. The mixed derivatives d2E/dx dtheta
come from ``Problem.eval_parameter_derivatives`` (see :mod:`warp_meshad._src.problem.parameters`).
"""

from __future__ import annotations

import numpy as np
import warp as wp
import warp.sparse as wps

from warp_meshad._src.problem.variables import check_variable_array
from warp_meshad._src.solve.constraints import apply_dirichlet, fixed_indices, fixed_mask_from_indices, zero_fixed_rows
from warp_meshad._src.solve.linear import LinearSolver, make_linear_solver

__all__ = ["implicit_gradient"]


def implicit_gradient(
    problem, x_star, dL_dx, fixed=None, linear_solver="auto", hessian: str = "exact", reuse_factorization: bool = False
):
    """Gradient of a loss L(x*(theta)) in the parameters theta, x* a minimizer of the problem's energy.

    One adjoint solve ``H lambda = dL/dx`` with the Hessian at ``x_star`` (one factorization, reused for
    every column when ``dL_dx`` holds several losses), then ``dL/dtheta = -(d2E/dx dtheta)^T lambda``. See
    the module docstring for the derivation; the result is exact to the extent that x_star is a minimizer
    (g(x_star) = 0 on the free variables) and the linear solve is.

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
    """
    if problem.parameter_count == 0:
        raise ValueError("implicit_gradient: the problem has no parameters (add_term(..., parameters=[...]))")
    if hessian not in ("exact", "clamp"):
        raise ValueError(f"implicit_gradient(hessian=...) must be 'exact' or 'clamp', got {hessian!r}")
    _check(problem, x_star, "x_star")
    several = isinstance(dL_dx, (list, tuple))
    losses = [_as_variable_array(problem, b, f"dL_dx[{i}]" if several else "dL_dx") for i, b in enumerate(dL_dx if several else [dL_dx])]
    idx = fixed_indices(fixed)
    fixed = None if idx is None else fixed_mask_from_indices(
        idx, problem.variable_count, problem.device, what="implicit_gradient(fixed=...)")
    if hessian == "exact":
        _, _, H = problem.eval_with_hessian(x_star)
    else:
        _, _, H = problem.eval_with_hessian_proj(x_star, mode="clamp")
    _, _, M = problem.eval_parameter_derivatives(x_star)
    if fixed is not None:
        apply_dirichlet(H, None, fixed)
    solver = linear_solver if isinstance(linear_solver, LinearSolver) else make_linear_solver(
        linear_solver, device=problem.device, dtype=problem.dtype
    )
    out = []
    for i, b in enumerate(losses):
        if fixed is not None:
            b = zero_fixed_rows(b, fixed)
        lam = wp.zeros_like(b)
        if i == 0 and not reuse_factorization:
            solver.solve(H, b, lam)
        else:  # the factors of the first solve (or, reuse_factorization, of the linear solver's last one)
            solver.resolve(H, b, lam)
        y = wps.bsr_mv(M, lam, transpose=True)
        out.append(-y.numpy().astype(np.float64))
    return np.stack(out) if several else out[0]


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
