"""Shared derivative check of a whole ``wm.Problem`` against central differences (float64).

One call checks every derivative mode of a problem at one point, so a new energy costs one test
line::

    from derivcheck import check_problem_derivatives
    check_problem_derivatives(problem, x0)

Checked, with ``|AD - FD| <= atol + rtol |FD|`` (as Warp's ``autograd.gradcheck``):

* ``eval`` is finite and equals the energy of every other mode; no NaN anywhere;
* gradient against central differences of ``eval`` (every coordinate when the problem has at most
  ``dense_limit`` scalars, else ``directions`` random directional derivatives and
  ``coordinates`` random coordinates);
* Hessian against central differences of the gradient (every column when small, else products
  with ``directions`` random vectors); the Hessian is symmetric;
* ``hessian_vector_product(x, v) == H @ v`` (to round-off);
* projected Hessians (``mode="clamp"`` and ``"abs"``) are PSD: smallest eigenvalue >= -tol when
  small, else ``v^T H v >= -tol`` for random v and a non-negative diagonal.

Central differences carry round-off: about ``eps |F| / h`` for the gradient (the summed energy)
and ``eps max|g| / h`` for the Hessian (a gradient entry that cancels to a small value). That noise
floor (times 8) is added to ``atol``; it is far below ``rtol |FD|`` for all but entries that cancel,
and keeps large or badly conditioned meshes from failing on round-off alone.
"""

from __future__ import annotations

import numpy as np
import warp as wp

import warp_meshad as wm

__all__ = ["check_problem_derivatives"]

_EPS64 = np.finfo(np.float64).eps


def _close(what: str, ad, fd, rtol: float, atol: float) -> float:
    """Assert |ad - fd| <= atol + rtol |fd| elementwise; return the largest error ratio."""
    ad = np.asarray(ad, dtype=np.float64)
    fd = np.asarray(fd, dtype=np.float64)
    assert np.all(np.isfinite(ad)), f"{what}: AD has NaN/inf entries at {np.argwhere(~np.isfinite(ad))[:5].ravel()}"
    err = np.abs(ad - fd)
    bound = atol + rtol * np.abs(fd)
    ratio = err / bound
    if np.any(ratio > 1.0):
        i = int(np.argmax(ratio))
        raise AssertionError(
            f"{what}: |AD - FD| exceeds atol + rtol |FD| at {int(np.sum(ratio > 1.0))} of {ratio.size} entries; "
            f"worst flat index {i}: AD = {ad.ravel()[i]!r}, FD = {fd.ravel()[i]!r}, |AD - FD| = {err.ravel()[i]:.3e}, "
            f"bound = {bound.ravel()[i]:.3e} (rtol={rtol}, atol={atol:.3e})"
        )
    return float(ratio.max(initial=0.0))


def check_problem_derivatives(
    problem,
    x_np,
    *,
    h: float = 1e-6,
    rtol: float = 1e-5,
    atol: float = 1e-7,
    check_proj: bool = True,
    directions: int = 4,
    coordinates: int = 8,
    dense_limit: int = 120,
    seed: int = 0,
) -> dict:
    """Check energy, gradient, Hessian, Hessian-vector product and projected Hessians of ``problem``.

    Args:
        problem: a float64 ``wm.Problem`` with its terms added.
        x_np: the point, shape (variable_count, variable_dim) (or (variable_count,) when
            variable_dim is 1), float.
        h: central-difference step.
        rtol, atol: tolerances of ``|AD - FD| <= atol + rtol |FD|``.
        check_proj: also check ``eval_with_hessian_proj`` (modes "clamp" and "abs").
        directions: random directions for directional checks of large problems (and extra
            Hessian directions of small ones).
        coordinates: random single coordinates of the gradient checked on large problems.
        dense_limit: problems with at most this many scalars are checked densely (every
            coordinate, every Hessian column, full eigenvalues).
        seed: seed of the random directions.

    Returns:
        dict of the largest error ratios (``err / bound``, <= 1 when passing) and facts measured,
        e.g. ``{"energy": F, "gradient": r, "hessian": r, "hessian_min_eig": ..., ...}``.

    Raises:
        AssertionError: naming the failing check with the worst entry.
    """
    assert problem.dtype == wp.float64, f"derivative checks need a float64 problem, got {problem.dtype}"
    n, d = problem.variable_count, problem.variable_dim
    x0 = np.array(x_np, dtype=np.float64)
    shape = (n,) if d == 1 else (n, d)
    assert x0.shape == shape, f"x_np has shape {x0.shape}, expected {shape}"
    size = x0.size
    dense = size <= dense_limit
    rng = np.random.default_rng(seed)
    device = problem.device
    out: dict = {}

    def warp_vec(flat):
        return wp.array(np.asarray(flat, dtype=np.float64).reshape(shape), dtype=problem.variable_type, device=device)

    def energy(flat):
        return problem.eval(warp_vec(flat))

    def gradient(flat):
        return problem.eval_with_gradient(warp_vec(flat))[1].numpy().reshape(-1).copy()

    flat0 = x0.reshape(-1)
    x = warp_vec(flat0)

    # --- energy and gradient
    f0 = problem.eval(x)
    assert np.isfinite(f0), f"energy at the check point is {f0}; choose a valid point"
    out["energy"] = f0
    fg, g = problem.eval_with_gradient(x)
    g = g.numpy().reshape(-1).copy()
    np.testing.assert_allclose(fg, f0, rtol=1e-12, atol=1e-300, err_msg="eval_with_gradient energy != eval")
    assert np.all(np.isfinite(g)), "gradient has NaN/inf entries"

    atol_g = atol + 8.0 * _EPS64 * max(abs(f0), 1.0) / h
    if dense:
        eye = np.eye(size)
        fd = np.array([(energy(flat0 + h * eye[i]) - energy(flat0 - h * eye[i])) / (2 * h) for i in range(size)])
        out["gradient"] = _close("gradient vs central differences of eval", g, fd, rtol, atol_g)
    else:
        coords = rng.choice(size, size=min(coordinates, size), replace=False)
        fd = []
        for i in coords:
            e = np.zeros(size)
            e[i] = h
            fd.append((energy(flat0 + e) - energy(flat0 - e)) / (2 * h))
        what = f"gradient coordinates {coords.tolist()} vs central differences"
        r1 = _close(what, g[coords], np.array(fd), rtol, atol_g)
        dirs = rng.normal(size=(directions, size))
        dirs /= np.linalg.norm(dirs, axis=1, keepdims=True)
        ad_dir = dirs @ g
        fd_dir = np.array([(energy(flat0 + h * v) - energy(flat0 - h * v)) / (2 * h) for v in dirs])
        r2 = _close("directional derivative g.v vs central differences", ad_dir, fd_dir, rtol, atol_g)
        out["gradient"] = max(r1, r2)

    # --- Hessian
    fh, gh, H = problem.eval_with_hessian(x)
    np.testing.assert_allclose(fh, f0, rtol=1e-12, atol=1e-300, err_msg="eval_with_hessian energy != eval")
    np.testing.assert_allclose(gh.numpy().reshape(-1), g, rtol=1e-12, atol=1e-14, err_msg="eval_with_hessian gradient")
    S = wm.to_scipy(H).tocsr()
    assert S.shape == (size, size), f"Hessian shape {S.shape}, expected {(size, size)}"
    assert np.all(np.isfinite(S.data)), "Hessian has NaN/inf entries"
    scale = max(float(np.abs(S.data).max(initial=0.0)), 1e-300)
    asym = float(np.abs((S - S.T).data).max(initial=0.0))
    assert asym <= 1e-12 * scale + 1e-14, f"Hessian not symmetric: max |H - H^T| = {asym:.3e} (max |H| = {scale:.3e})"
    out["hessian_asymmetry"] = asym

    extra = rng.normal(size=(directions, size))
    if dense:
        dirs = np.concatenate([np.eye(size), extra])
    else:
        dirs = extra / np.linalg.norm(extra, axis=1, keepdims=True)
    atol_h = atol + 8.0 * _EPS64 * max(float(np.abs(g).max(initial=0.0)), 1.0) / h
    ratios = []
    for k, v in enumerate(dirs):
        fd = (gradient(flat0 + h * v) - gradient(flat0 - h * v)) / (2 * h)
        what = f"Hessian column {k}" if dense and k < size else f"Hessian times random direction {k}"
        ratios.append(_close(f"{what} vs central differences of the gradient", S @ v, fd, rtol, atol_h))
    out["hessian"] = max(ratios)

    # --- Hessian-vector product
    for v in extra[:2]:
        hv = problem.hessian_vector_product(x, warp_vec(v)).numpy().reshape(-1)
        ref = S @ v
        tol = 1e-11 * (np.abs(S).sum(axis=1).A.ravel() * np.abs(v).max() + 1e-300)
        bad = np.abs(hv - ref) > tol
        assert not bad.any(), (
            f"hessian_vector_product != H @ v at {int(bad.sum())} entries; first {int(np.argmax(bad))}: "
            f"{hv[np.argmax(bad)]!r} vs {ref[np.argmax(bad)]!r}"
        )

    if dense:
        out["hessian_min_eig"] = float(np.linalg.eigvalsh(S.toarray()).min())

    # --- projected Hessians
    if check_proj:
        for mode in ("clamp", "abs"):
            fp, gp, Hp = problem.eval_with_hessian_proj(x, mode=mode)
            np.testing.assert_allclose(fp, f0, rtol=1e-12, atol=1e-300, err_msg=f"proj ({mode}) energy != eval")
            np.testing.assert_allclose(
                gp.numpy().reshape(-1), g, rtol=1e-12, atol=1e-14, err_msg=f"proj ({mode}) gradient"
            )
            P = wm.to_scipy(Hp).tocsr()
            assert np.all(np.isfinite(P.data)), f"projected Hessian ({mode}) has NaN/inf entries"
            pscale = max(float(np.abs(P.data).max(initial=0.0)), 1e-300)
            tol = 1e-10 * pscale
            pasym = float(np.abs((P - P.T).data).max(initial=0.0))
            assert pasym <= 1e-10 * pscale, f"projected Hessian ({mode}) not symmetric: {pasym:.3e}"
            if dense:
                lam = float(np.linalg.eigvalsh(P.toarray()).min())
                assert lam >= -tol, f"projected Hessian ({mode}) not PSD: smallest eigenvalue {lam:.3e}"
                out[f"proj_{mode}_min_eig"] = lam
            else:
                diag = P.diagonal()
                assert diag.min() >= -tol, f"projected Hessian ({mode}) has a negative diagonal entry {diag.min():.3e}"
                vs = rng.normal(size=(4 * directions, size))
                quad = np.einsum("ij,ij->i", vs, (P @ vs.T).T) / np.einsum("ij,ij->i", vs, vs)
                assert quad.min() >= -tol, f"projected Hessian ({mode}): v^T H v / |v|^2 = {quad.min():.3e} < 0"
                out[f"proj_{mode}_min_quad"] = float(quad.min())
    return out
