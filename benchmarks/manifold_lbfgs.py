"""manifold_opt's L-BFGS: warp_meshad's solver beside the same algorithm as one jitted JAX loop, and optax (issue 32).

Run on a GPU host (writes benchmarks/results/manifold_lbfgs.json and .png, or $BENCH_OUT):

    python -m benchmarks.manifold_lbfgs                                  # sphere_lbfgs and spot_lbfgs, 5 timed runs
    python -m benchmarks.manifold_lbfgs --scenes spot_lbfgs --set device_loop=true --runs 10
    BENCH_OUT=/tmp/bench_smoke python -m benchmarks.manifold_lbfgs --device cpu --scenes sphere_lbfgs \\
        --set steps=2 --set iterations=10 --runs 1                       # CPU smoke run

Each scene is a config of ``configs/manifold_opt`` (6 steps x 500 L-BFGS iterations, float64), read with the
app's config loader and ``--set KEY=VALUE`` overrides, as ``warp-meshad run`` reads it. Methods:

* ``warp_meshad``: the manifold_opt App built from the config (untimed: mesh, Tutte start), then ``app.run()``
  timed (every step: the solve from v = 0 and the re-centering; the device synchronized before each clock read).
  The untimed first run prepares the solver (on a GPU: its CUDA graphs); each timed run restarts that App from its
  start embedding (``App.restart``) and keeps what its solver prepared, as the JAX methods keep their jitted
  executables.
* ``jax_transcription``: the same algorithm in JAX, float64: the App's start points and tangent bases, the same
  energy (Dirichlet + log-volume barrier + target term) over the same faces, the same retraction, and each step one
  jitted function: a ``jax.lax.while_loop`` of warp_meshad's L-BFGS (history ``m``; a pair is formed from the step
  just accepted at the next gradient evaluation and skipped when ``s.y <= 1e-12 |s| |y|`` or not finite, its slot
  freed when the step is accepted; ``gamma = s.y / y.y`` of the newest pair; with no pair ``-g`` scaled to
  ``step_size / ||g||``; ``-g`` and an emptied history when ``d.g >= 0`` or not finite; Armijo backtracking from
  alpha = 1, shrink 0.8, 64 tries, c = 1e-4, +inf/NaN rejected; stops on ``||g|| <= tolerance``, ``|f_old - f_new|
  <= 1e-12 max(1, |f_old|)``, a failed line search, ``iterations``), then the app's re-centering. The host reads one
  small result per step, for the app's rule that a step after a converged one does nothing.
* ``optax``: ``optax.lbfgs(memory_size=history)`` with ``optax.scale_by_backtracking_linesearch`` (shrink 0.8, at
  most 64 trials, c = 1e-4, each line search from step 1) in a jitted while loop per step, the same stop tests and
  re-centering. A different algorithm (its own first step, no pair skipping): its energy and iterations are reported,
  not checked.

Correctness first: the JAX transcription must end within ``--energy-rtol`` (default 1e-9, relative) of
warp_meshad's final energy with the same iterations in every step; otherwise both are printed, with the first
iteration where their energies part by more, and it is not timed. On spot (and on the sphere with a target term) the
iterates of two float64 implementations part after a few iterations from round-off alone (the same loop from a
start one ulp away parts as early), so agreement rests on the final energy there; the JAX transcription's check
records, as ``roundoff_spread``, how far the same loop ends from a start about one ulp away (points times
1 + 1e-16 z). Timing: one untimed run (compiles; it is the reference), then ``--runs`` timed runs; median and min,
the iterations of every run recorded. JAX and optax are optional (skipped with a message where they do not import);
JAX runs on its default device (recorded as ``jax_devices``, beside the Warp device's name). Prints a table at the
end.
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
import time
import traceback

import numpy as np

from benchmarks.common import guard_cpu_out, record, write

NAME = "manifold_lbfgs"
SCENES = ["sphere_lbfgs", "spot_lbfgs"]
METHODS = ["warp_meshad", "jax_transcription", "optax"]
ENERGY_RTOL = 1e-9  # final energies of warp_meshad and the JAX transcription

# warp_meshad's L-BFGS settings (LBFGSSolver defaults, the ones the app uses) and the app's solve arguments
SHRINK = 0.8
LINE_SEARCH_TRIES = 64
ARMIJO_C = 1e-4
PAIR_EPS = 1e-12  # a pair is kept when s.y > PAIR_EPS |s| |y|
ENERGY_TOLERANCE = 1e-12  # stop when |f_old - f_new| <= ENERGY_TOLERANCE max(1, |f_old|)
_TARGETS = {"none": 0, "equator": 1, "north_pole": 2}

# stop reasons of the JAX loops (codes in the jitted loop, names as warp_meshad's SolveResult.reason)
RUNNING = 0
REASONS = {1: "gradient_norm", 2: "energy_change", 3: "max_iterations", 4: "line_search_failed",
           5: "non_finite_energy", 6: "non_finite_gradient"}
CONVERGED = (1, 2)


class _Skip(Exception):
    """A method that cannot run here (a missing package): reported, not an error."""


# ----------------------------------------------------------------------------------------------------------------------
# warp_meshad: the app
# ----------------------------------------------------------------------------------------------------------------------


def load_scene(scene: str, device: str, overrides: dict | None = None):
    """The scene's config (``manifold_opt/<scene>``) on ``device`` with ``overrides`` (``--set``), as ``warp-meshad
    run`` reads it (no screenshot).

    Raises:
        ConfigError: a bad override or config; ValueError: the config's solver is not L-BFGS.
    """
    from warp_meshad import app as appmod

    name = scene if "/" in scene else f"manifold_opt/{scene}"
    config = appmod.load_config(name, overrides={"screenshot": False, "device": device, **(overrides or {})})
    if config.app != "manifold_opt" or config.solver != "lbfgs":
        raise ValueError(f"{scene}: expected a manifold_opt config with solver lbfgs, got app {config.app!r} solver "
                         f"{getattr(config, 'solver', None)!r}")
    return config


def build_app(config):
    """A new manifold_opt App of ``config`` (its start embedding made, nothing solved)."""
    from warp_meshad import app as appmod

    return appmod.app_class(config.app)(config)


class Scene:
    """What the JAX methods need of one scene, taken from a new App: faces, start points and tangent bases, and the
    config's solver settings.

    Attributes:
        faces: int32 (face_count, 3). points, tangent1, tangent2: float64 (vertex_count, 3), the App's after its
            first re-centering (the start of step 0).
        barrier_weight, target (0 none, 1 equator, 2 north pole), steps, iterations, tolerance, history, step_size:
            from the config.
    """

    def __init__(self, app):
        c = app.config
        self.name = c.scene
        self.faces = np.ascontiguousarray(app.mesh.faces, dtype=np.int32)
        self.points = app.data.points.numpy().astype(np.float64)
        self.tangent1 = app.data.tangent1.numpy().astype(np.float64)
        self.tangent2 = app.data.tangent2.numpy().astype(np.float64)
        self.vertex_count = int(app.mesh.vertex_count)
        self.barrier_weight = float(c.barrier_weight)
        self.target = _TARGETS[c.target]
        self.steps = int(c.steps)
        self.iterations = int(c.iterations)
        self.tolerance = float(c.tolerance)
        self.history = int(c.history)
        self.step_size = float(c.step_size)


def _sync(device: str) -> float:
    import warp as wp

    wp.synchronize_device(device)
    return time.perf_counter()


def run_warp(config, app=None) -> dict:
    """Time ``app.run()`` (all steps) of a new App (built untimed), or of ``app`` restarted from its start embedding
    (:meth:`App.restart`: its solver keeps its captured graphs, as a jitted JAX function keeps its executable).
    Returns the run's summary with ``ms`` and the app."""
    if app is None:
        app = build_app(config)
    else:
        app.restart()
    t0 = _sync(app.device)
    app.run()
    ms = (_sync(app.device) - t0) * 1e3
    return {
        "ms": ms,
        "step_iterations": [int(r["iterations"]) for r in app.history],
        "step_reasons": [r["reason"] for r in app.history],
        "step_energies": [float(r["energies"][-1]) for r in app.history],
        "traces": [list(map(float, r["energies"])) for r in app.history],
        "fallbacks": sum(int(r["steepest_descent_fallbacks"]) for r in app.history),
        "start_energy": float(app.history[0]["energies"][0]) if app.history else float("nan"),
        "final_energy": float(app.energy),
        "points": app.positions(),
        "app": app,
    }


# ----------------------------------------------------------------------------------------------------------------------
# JAX: energy, retraction, re-centering
# ----------------------------------------------------------------------------------------------------------------------


def import_jax():
    """jax and jax.numpy with float64 enabled (jax's client does not preallocate GPU memory, leaving it to Warp).

    Raises:
        _Skip: jax does not import.
    """
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    try:
        import jax
    except ImportError as exc:
        raise _Skip(f"jax not importable ({exc})") from None
    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp

    return jax, jnp


def _cross(jnp, a, b):
    return jnp.stack([a[:, 1] * b[:, 2] - a[:, 2] * b[:, 1], a[:, 2] * b[:, 0] - a[:, 0] * b[:, 2],
                      a[:, 0] * b[:, 1] - a[:, 1] * b[:, 0]], axis=1)


def _dot3(a, b):
    return a[:, 0] * b[:, 0] + a[:, 1] * b[:, 1] + a[:, 2] * b[:, 2]


def retract(jnp, v, points, tangent1, tangent2):
    """normalize(p + v_1 b1 + v_2 b2) per vertex (sphere_retract): v (n, 2), the others (n, 3); returns (n, 3)."""
    q = points + v[:, 0:1] * tangent1 + v[:, 1:2] * tangent2
    return q / jnp.sqrt(_dot3(q, q))[:, None]


def recenter(jnp, v, points, tangent1, tangent2):
    """The app's re-centering: p <- retract(v), b1 <- p x (the axis most orthogonal to p), normalized; b2 <- p x b1.

    Returns:
        (points, tangent1, tangent2), each float64 (n, 3).
    """
    p = retract(jnp, v, points, tangent1, tangent2)
    ax, ay, az = jnp.abs(p[:, 0]), jnp.abs(p[:, 1]), jnp.abs(p[:, 2])
    use_y = (ay < ax) & (ay <= az)
    use_z = ~use_y & (az < ax) & (az < ay)
    axis = jnp.where(use_y[:, None], jnp.array([0.0, 1.0, 0.0]),
                     jnp.where(use_z[:, None], jnp.array([0.0, 0.0, 1.0]), jnp.array([1.0, 0.0, 0.0])))
    t = _cross(jnp, axis, p)
    b1 = t / jnp.sqrt(_dot3(t, t))[:, None]
    return p, b1, _cross(jnp, p, b1)


def make_energy(jnp, scene: Scene):
    """``energy(v, points, tangent1, tangent2) -> float64``: the sum over faces of sphere_embedding (+inf when a face's
    volume is <= 0)."""
    faces = jnp.asarray(scene.faces)
    w = scene.barrier_weight
    target = scene.target

    def corner_target(q):
        if target == 1:
            return q[:, 1] * q[:, 1]
        return (1.0 - q[:, 1]) * (1.0 - q[:, 1])

    def energy(v, points, tangent1, tangent2):
        r = retract(jnp, v, points, tangent1, tangent2)
        a, b, c = r[faces[:, 0]], r[faces[:, 1]], r[faces[:, 2]]
        volume = _dot3(a, _cross(jnp, b, c)) / 6.0
        positive = volume > 0.0
        e = -w * jnp.log(jnp.where(positive, volume, 1.0))
        e = e + _dot3(a - b, a - b) + _dot3(b - c, b - c) + _dot3(c - a, c - a)
        if target != 0:
            e = e + corner_target(a) + corner_target(b) + corner_target(c)
        return jnp.sum(jnp.where(positive, e, jnp.inf))

    return energy


# ----------------------------------------------------------------------------------------------------------------------
# JAX: warp_meshad's L-BFGS as one while loop
# ----------------------------------------------------------------------------------------------------------------------


def make_lbfgs_step(jax, jnp, scene: Scene):
    """One step of the app as one jitted function: ``step(points, tangent1, tangent2) -> dict`` with the re-centered
    ``points, tangent1, tangent2``, ``iterations``, ``code`` (stop reason, :data:`REASONS`), ``energies`` (float64
    [iterations cap + 1]: the energy at the start and after every accepted step; NaN past the last) and
    ``fallbacks`` (steps along -g).

    The loop body is one pass of warp_meshad's ``_Driver.solve`` loop with LBFGSSolver's hooks, in its order:
    gradient at x (and, from the second pass on, the pair of the step just accepted: y = g - g_prev into the pending
    slot, kept if s.y > 1e-12 |s| |y| and finite, the next slot advanced only then); the stop tests; g_prev <- g;
    the direction (with no pair: -step_size g / max(||g||, 1e-300); else the two-loop recursion with gamma of the
    newest pair); -g and an emptied history when d.g is not finite or >= 0 (then d.g = -||g||^2); Armijo from alpha =
    1; on acceptance x <- x + alpha d, the slot at next_slot freed and s = x_new - x_old written there.
    """
    lax = jax.lax
    energy = make_energy(jnp, scene)
    value_and_grad = jax.value_and_grad(energy)
    n, m, cap = scene.vertex_count, scene.history, scene.iterations
    tol, step_size = scene.tolerance, scene.step_size

    def vdot(a, b):
        return jnp.sum(a * b)

    def norm(a):
        return jnp.sqrt(vdot(a, a))

    def two_loop(g, S, Y, rho, gam, valid, age):
        order = jnp.argsort(jnp.where(valid, -age, jnp.iinfo(age.dtype).max))  # valid pairs newest first
        newest = order[0]
        d = -1.0 * g

        def first(k, carry):
            d, alphas = carry
            slot = order[k]
            a = rho[slot] * vdot(S[slot], d)
            use = valid[slot]
            return jnp.where(use, d + (-a) * Y[slot], d), alphas.at[k].set(jnp.where(use, a, 0.0))

        d, alphas = lax.fori_loop(0, m, first, (d, jnp.zeros(m)))
        d = gam[newest] * d

        def second(j, d):
            k = m - 1 - j  # oldest first
            slot = order[k]
            b = rho[slot] * vdot(Y[slot], d)
            return jnp.where(valid[slot], d + (alphas[k] - b) * S[slot], d)

        return lax.fori_loop(0, m, second, d)

    def step(points, tangent1, tangent2):
        def fun(v):
            return energy(v, points, tangent1, tangent2)

        def line_search(x, f0, d, dd):
            """armijo(): trials x + alpha d from alpha = 1, alpha *= shrink after a rejection."""

            def cond(c):
                return ~c["accepted"] & (c["tries"] < LINE_SEARCH_TRIES)

            def body(c):
                trial = x + c["alpha"] * d
                ft = fun(trial)
                ok = jnp.isfinite(ft) & (ft <= f0 + ARMIJO_C * c["alpha"] * dd)
                return {"alpha": jnp.where(ok, c["alpha"], c["alpha"] * SHRINK), "tries": c["tries"] + 1,
                        "accepted": ok, "f": ft, "trial": trial}

            start = {"alpha": jnp.asarray(1.0), "tries": jnp.asarray(0), "accepted": jnp.asarray(False), "f": f0,
                     "trial": x}
            possible = jnp.isfinite(f0) & jnp.isfinite(dd) & (dd < 0.0)
            return lax.cond(possible, lambda: lax.while_loop(cond, body, start), lambda: start)

        def iterate(c, g, gnorm):
            """Direction, line search, acceptance: the part of a pass after the stop tests."""
            c = dict(c)
            c["g_prev"], c["have_prev"] = g, jnp.asarray(True)
            no_pair = ~jnp.any(c["valid"])
            d = lax.cond(no_pair, lambda: (-step_size / jnp.maximum(gnorm, 1e-300)) * g,
                         lambda: two_loop(g, c["S"], c["Y"], c["rho"], c["gam"], c["valid"], c["age"]))
            dd = vdot(g, d)
            fallback = ~jnp.isfinite(dd) | (dd >= 0.0)
            d = jnp.where(fallback, -1.0 * g, d)
            dd = jnp.where(fallback, -gnorm * gnorm, dd)
            c["valid"] = c["valid"] & ~fallback
            c["fallbacks"] = c["fallbacks"] + fallback.astype(c["fallbacks"].dtype)
            ls = line_search(c["x"], c["f"], d, dd)
            it = c["it"] + 1
            accepted = ls["accepted"]
            slot = c["next_slot"]
            x_new = jnp.where(accepted, ls["trial"], c["x"])
            f_new = jnp.where(accepted, ls["f"], c["f"])
            f_old = c["f"]
            converged = jnp.abs(f_old - f_new) <= ENERGY_TOLERANCE * jnp.maximum(1.0, jnp.abs(f_old))
            c["code"] = jnp.where(accepted, jnp.where(converged, 2, RUNNING), 4)
            # accepted: the slot at next_slot is freed and gets s = x_new - x_old (rows touched only when accepted)
            c["valid"] = c["valid"].at[slot].set(c["valid"][slot] & ~accepted)
            c["S"] = c["S"].at[slot].set(jnp.where(accepted, x_new - c["x"], c["S"][slot]))
            c["pending"] = jnp.where(accepted, slot, c["pending"])
            c["energies"] = c["energies"].at[it].set(jnp.where(accepted, f_new, c["energies"][it]))
            c["x"], c["f"], c["it"] = x_new, f_new, it
            return c

        def solve_pass(c):
            """One pass of the solve loop: derivatives (and the pending pair), stop tests, then an iteration."""
            c = dict(c)
            f_eval, g = value_and_grad(c["x"], points, tangent1, tangent2)
            first_pass = c["it"] == 0
            c["f"] = jnp.where(first_pass, f_eval, c["f"])
            c["energies"] = c["energies"].at[0].set(jnp.where(first_pass, f_eval, c["energies"][0]))
            # the pair of the step just accepted (not past the cap, where warp_meshad skips it: the loop ends there)
            slot = c["pending"]
            y = g - c["g_prev"]
            s = c["S"][slot]
            sy = vdot(s, y)
            keep = c["have_prev"] & (c["it"] < cap) & jnp.isfinite(sy) & (sy > PAIR_EPS * norm(s) * norm(y))
            c["Y"] = c["Y"].at[slot].set(y)  # written whether kept or not (the slot is not a pair unless kept)
            c["valid"] = c["valid"].at[slot].set(c["valid"][slot] | keep)
            c["age"] = c["age"].at[slot].set(jnp.where(keep, c["counter"], c["age"][slot]))
            c["counter"] = c["counter"] + keep.astype(c["counter"].dtype)
            c["rho"] = c["rho"].at[slot].set(jnp.where(keep, 1.0 / sy, c["rho"][slot]))
            c["gam"] = c["gam"].at[slot].set(jnp.where(keep, sy / vdot(y, y), c["gam"][slot]))
            c["next_slot"] = jnp.where(keep, (slot + 1) % m, c["next_slot"])
            gnorm = norm(g)
            c["code"] = jnp.where(~jnp.isfinite(c["f"]), 5,
                                  jnp.where(~jnp.isfinite(gnorm), 6,
                                            jnp.where(gnorm <= tol, 1, jnp.where(c["it"] == cap, 3, RUNNING))))
            return lax.cond(c["code"] == RUNNING, lambda c: iterate(c, g, gnorm), lambda c: c, c)

        x0 = jnp.zeros((n, 2))
        state = {
            "it": jnp.asarray(0), "x": x0, "f": jnp.asarray(0.0), "code": jnp.asarray(RUNNING),
            "S": jnp.zeros((m, n, 2)), "Y": jnp.zeros((m, n, 2)), "rho": jnp.zeros(m), "gam": jnp.zeros(m),
            "valid": jnp.zeros(m, dtype=bool), "age": jnp.zeros(m, dtype=jnp.int32),
            "counter": jnp.asarray(0, jnp.int32), "next_slot": jnp.asarray(0), "pending": jnp.asarray(0),
            "have_prev": jnp.asarray(False), "g_prev": x0, "fallbacks": jnp.asarray(0),
            "energies": jnp.full(cap + 1, jnp.nan),
        }
        out = lax.while_loop(lambda c: c["code"] == RUNNING, solve_pass, state)
        p, b1, b2 = recenter(jnp, out["x"], points, tangent1, tangent2)
        return {"points": p, "tangent1": b1, "tangent2": b2, "iterations": out["it"], "code": out["code"],
                "energy": out["f"], "energies": out["energies"], "fallbacks": out["fallbacks"]}

    return jax.jit(step)


# ----------------------------------------------------------------------------------------------------------------------
# optax: optax.lbfgs with backtracking
# ----------------------------------------------------------------------------------------------------------------------


def make_optax_step(jax, jnp, scene: Scene):
    """One step of the app with ``optax.lbfgs`` (memory ``history``) and ``optax.scale_by_backtracking_linesearch``
    (decrease 0.8, at most 64 trials, slope_rtol 1e-4, every search from step 1): ``step(points, tangent1, tangent2)
    -> dict`` as :func:`make_lbfgs_step`'s. A search that ends without sufficient decrease is not taken and stops the
    solve (``line_search_failed``), as in warp_meshad.

    Raises:
        _Skip: optax does not import.
    """
    try:
        import optax
    except ImportError as exc:
        raise _Skip(f"optax not importable ({exc})") from None
    lax = jax.lax
    energy = make_energy(jnp, scene)
    n, cap, tol = scene.vertex_count, scene.iterations, scene.tolerance
    search = optax.scale_by_backtracking_linesearch(
        max_backtracking_steps=LINE_SEARCH_TRIES - 1,  # optax counts trials 0..max_backtracking_steps
        slope_rtol=ARMIJO_C, decrease_factor=SHRINK, increase_factor=math.inf, max_learning_rate=1.0,
        store_grad=True)
    opt = optax.lbfgs(memory_size=scene.history, linesearch=search)

    def step(points, tangent1, tangent2):
        def fn(v):
            return energy(v, points, tangent1, tangent2)

        x0 = jnp.zeros((n, 2))
        f0, g0 = jax.value_and_grad(fn)(x0)

        def iterate(c):
            updates, state = opt.update(c["g"], c["state"], c["x"], value=c["f"], grad=c["g"], value_fn=fn)
            trial = optax.apply_updates(c["x"], updates)
            f_new = optax.tree.get(state, "value")
            accepted = optax.tree.get(state, "decrease_error") <= 0.0
            converged = jnp.abs(c["f"] - f_new) <= ENERGY_TOLERANCE * jnp.maximum(1.0, jnp.abs(c["f"]))
            it = c["it"] + 1
            return {
                "it": it, "state": state,
                "x": jnp.where(accepted, trial, c["x"]), "f": jnp.where(accepted, f_new, c["f"]),
                "g": jnp.where(accepted, optax.tree.get(state, "grad"), c["g"]),
                "code": jnp.where(accepted, jnp.where(converged, 2, RUNNING), 4),
                "energies": jnp.where(accepted, c["energies"].at[it].set(f_new), c["energies"]),
            }

        def solve_pass(c):
            gnorm = jnp.sqrt(jnp.sum(c["g"] * c["g"]))
            code = jnp.where(~jnp.isfinite(c["f"]), 5,
                             jnp.where(~jnp.isfinite(gnorm), 6,
                                       jnp.where(gnorm <= tol, 1, jnp.where(c["it"] == cap, 3, RUNNING))))
            return lax.cond(code == RUNNING, iterate, lambda c: {**c, "code": code}, c)

        state = {"it": jnp.asarray(0), "state": opt.init(x0), "x": x0, "f": f0, "g": g0,
                 "code": jnp.asarray(RUNNING), "energies": jnp.full(cap + 1, jnp.nan).at[0].set(f0)}
        out = lax.while_loop(lambda c: c["code"] == RUNNING, solve_pass, state)
        p, b1, b2 = recenter(jnp, out["x"], points, tangent1, tangent2)
        return {"points": p, "tangent1": b1, "tangent2": b2, "iterations": out["it"], "code": out["code"],
                "energy": out["f"], "energies": out["energies"], "fallbacks": jnp.asarray(0)}

    return jax.jit(step)


def run_jax_steps(jax, jnp, step, scene: Scene, start) -> dict:
    """The app's steps with a jitted ``step``: a step after a converged one does nothing (one small host read per
    step). ``start``: the device arrays (points, tangent1, tangent2). Returns the run's summary with ``ms``."""
    t0 = time.perf_counter()
    frame = start
    results, converged = [], False
    for _ in range(scene.steps):
        if converged:
            results.append(None)
            continue
        out = step(*frame)
        frame = (out["points"], out["tangent1"], out["tangent2"])
        small = jax.device_get({k: out[k] for k in ("iterations", "code", "energy", "fallbacks")})
        converged = int(small["code"]) in CONVERGED
        results.append((small, out["energies"]))
    jax.block_until_ready(frame)
    ms = (time.perf_counter() - t0) * 1e3
    summary = {"ms": ms, "step_iterations": [], "step_reasons": [], "step_energies": [], "traces": [],
               "fallbacks": 0}
    for r in results:
        if r is None:  # as the app: the converged state recorded, no solve
            summary["step_iterations"].append(0)
            summary["step_reasons"].append("converged_earlier")
            summary["step_energies"].append(summary["step_energies"][-1])
            summary["traces"].append(summary["traces"][-1][-1:])
            continue
        small, energies = r
        its = int(small["iterations"])
        summary["step_iterations"].append(its)
        summary["step_reasons"].append(REASONS.get(int(small["code"]), f"code {int(small['code'])}"))
        summary["step_energies"].append(float(small["energy"]))
        trace = np.asarray(energies)[: its + 1]
        summary["traces"].append([float(e) for e in trace[np.isfinite(trace)]])
        summary["fallbacks"] += int(small["fallbacks"])
    summary["start_energy"] = float(np.asarray(results[0][1])[0]) if results else float("nan")
    summary["final_energy"] = summary["step_energies"][-1]
    summary["points"] = np.asarray(frame[0])
    return summary


# ----------------------------------------------------------------------------------------------------------------------
# Comparison, timing, output
# ----------------------------------------------------------------------------------------------------------------------


def _rel(a: float, b: float) -> float:
    return abs(a - b) / max(abs(b), 1e-300)


def first_difference(traces, reference, rtol: float = ENERGY_RTOL):
    """(step, iteration, rel) of the first energy of ``traces`` that parts from ``reference``'s beyond ``rtol`` (or
    where one trace ends before the other); None where they agree."""
    for k, (a, b) in enumerate(zip(traces, reference)):
        for i in range(max(len(a), len(b))):
            if i >= len(a) or i >= len(b):
                return {"step": k, "iteration": i, "rel": None}
            r = _rel(a[i], b[i])
            if not r <= rtol:
                return {"step": k, "iteration": i, "rel": r}
    return None


def agreement(run: dict, reference: dict, energy_rtol: float = ENERGY_RTOL) -> dict:
    """Final energy (relative), iterations per step and final points of ``run`` against ``reference``; ``agree`` when
    the final energies are within ``energy_rtol`` and every step took the same iterations."""
    rel = _rel(run["final_energy"], reference["final_energy"])
    same_iterations = run["step_iterations"] == reference["step_iterations"]
    return {
        "energy_rel_diff": rel,
        "energy_rtol": energy_rtol,
        "same_iterations": same_iterations,
        "agree": bool(rel <= energy_rtol and same_iterations),
        "max_abs_points_diff": float(np.abs(run["points"] - reference["points"]).max()),
        "first_difference": first_difference(run["traces"], reference["traces"], energy_rtol),
    }


def perturbed_start(start, jnp, seed: int = 0):
    """The start points times (1 + 1e-16 z), z standard normal per vertex (about one ulp), the bases unchanged."""
    points = np.asarray(start[0])
    z = np.random.default_rng(seed).standard_normal((points.shape[0], 1))
    return (jnp.asarray(points * (1.0 + 1e-16 * z)),) + tuple(start[1:])


def _public(summary: dict) -> dict:
    """A run's summary without its arrays."""
    return {k: v for k, v in summary.items() if k not in ("ms", "traces", "points", "app")}


def _timed(run, runs: int) -> tuple[list[float], list[dict]]:
    times, summaries = [], []
    for _ in range(runs):
        s = run()
        times.append(s["ms"])
        summaries.append(s)
    return times, summaries


def run_scene(scene_name: str, device: str, overrides: dict, methods, runs: int, records: list, machine: dict,
              energy_rtol: float = ENERGY_RTOL) -> None:
    """Check and time ``methods`` on one scene; the records go to ``records``."""
    config = load_scene(scene_name, device, overrides)
    scene = Scene(build_app(config))
    nv = scene.vertex_count
    base = {"scene": scene_name, "overrides": overrides, "steps": scene.steps, "iterations_cap": scene.iterations,
            "history": scene.history, **machine}
    print(f"-- {scene_name}: {nv} vertices, {len(scene.faces)} faces, {scene.steps} steps x {scene.iterations} "
          f"iterations, history {scene.history}, on {device}")

    def add(method, times, ref_run, summaries, **extra):
        iters = [sum(s["step_iterations"]) for s in summaries]
        rec = record(NAME, method, nv, "float64", times, device, **base, **_public(ref_run),
                     total_iterations=sum(ref_run["step_iterations"]), total_iterations_per_run=iters, **extra)
        records.append(rec)
        print(f"   {method:18s} median {rec['ms_median']:10.1f} ms  min {rec['ms_min']:10.1f} ms  "
              f"{rec['total_iterations']} iterations  E {rec['final_energy']:.12g}")

    def failed(method, exc_text, **extra):
        records.append({"benchmark": NAME, "method": method, "vertex_count": nv, "dtype": "float64", "device": device,
                        **base, "error": exc_text, **extra})

    # warp_meshad: the untimed run compiles and is the reference of the others
    reference = run_warp(config)
    print(f"   warp_meshad reference: iterations per step {reference['step_iterations']} "
          f"({', '.join(reference['step_reasons'])}), E {reference['final_energy']:.15g}")
    if "warp_meshad" in methods:
        try:
            times, summaries = _timed(lambda: run_warp(config, reference["app"]), runs)
            add("warp_meshad", times, reference, summaries,
                same_iterations_every_run=all(s["step_iterations"] == reference["step_iterations"]
                                              for s in summaries))
        except Exception:
            traceback.print_exc()
            failed("warp_meshad", traceback.format_exc(limit=3))

    jax_methods = [m for m in ("jax_transcription", "optax") if m in methods]
    if not jax_methods:
        return
    try:
        jax, jnp = import_jax()
    except _Skip as exc:
        for m in jax_methods:
            print(f"   {m}: skipped ({exc})")
        return
    start = tuple(jnp.asarray(a) for a in (scene.points, scene.tangent1, scene.tangent2))
    makers = {"jax_transcription": make_lbfgs_step, "optax": make_optax_step}
    for m in jax_methods:
        try:
            step = makers[m](jax, jnp, scene)
            t0 = time.perf_counter()
            first = run_jax_steps(jax, jnp, step, scene, start)  # compiles; checked
            compile_ms = (time.perf_counter() - t0) * 1e3
        except _Skip as exc:
            print(f"   {m}: skipped ({exc})")
            continue
        except Exception:
            traceback.print_exc()
            failed(m, traceback.format_exc(limit=3))
            continue
        check = agreement(first, reference, energy_rtol)
        checked = m == "jax_transcription"  # optax is another algorithm: compared, not checked
        if checked and not check["agree"]:
            print(f"   {m}: DISAGREES with warp_meshad, not timed: energy {first['final_energy']:.15g} vs "
                  f"{reference['final_energy']:.15g} (rel {check['energy_rel_diff']:.2e}); iterations per step "
                  f"{first['step_iterations']} vs {reference['step_iterations']}; reasons {first['step_reasons']} vs "
                  f"{reference['step_reasons']}; first parting {check['first_difference']}")
        else:
            print(f"   {m} vs warp_meshad: energy rel {check['energy_rel_diff']:.2e}, iterations per step "
                  f"{first['step_iterations']} ({'same' if check['same_iterations'] else 'different'}), max |dp| "
                  f"{check['max_abs_points_diff']:.2e}")
        if checked:  # what round-off alone does: the same loop from a start about one ulp away
            try:
                spread = agreement(run_jax_steps(jax, jnp, step, scene, perturbed_start(start, jnp)), first,
                                   energy_rtol)
                check["roundoff_spread"] = {k: spread[k] for k in ("energy_rel_diff", "same_iterations",
                                                                   "first_difference")}
                print(f"   {m} from a start ~1 ulp away: energy rel {spread['energy_rel_diff']:.2e}, iterations "
                      f"{'same' if spread['same_iterations'] else 'different'}, energies part at "
                      f"{spread['first_difference']}")
            except Exception:
                traceback.print_exc()
        extra = {"first_run_ms": compile_ms, "check": check, "checked": checked, "jax_version": jax.__version__}
        if checked and not check["agree"]:
            failed(m, "disagrees with warp_meshad", **_public(first), **extra)
            continue
        try:
            times, summaries = _timed(lambda: run_jax_steps(jax, jnp, step, scene, start), runs)
        except Exception:
            traceback.print_exc()
            failed(m, traceback.format_exc(limit=3), **extra)
            continue
        add(m, times, first, summaries, **extra,
            same_iterations_every_run=all(s["step_iterations"] == first["step_iterations"] for s in summaries))


def machine_info(device: str, with_jax: bool) -> dict:
    """The Warp device's name, the date and, with ``with_jax`` where jax imports, jax's devices (else None)."""
    import warp as wp

    info = {"device_name": wp.get_device(device).name, "date": datetime.date.today().isoformat(), "jax_devices": None}
    if with_jax:
        try:
            jax, _ = import_jax()
            info["jax_devices"] = [f"{d.platform}:{getattr(d, 'device_kind', '?')}" for d in jax.devices()]
        except _Skip:
            pass
    return info


def print_table(records: list[dict]) -> None:
    print(f"\n{'scene':14s} {'method':18s} {'median ms':>11s} {'min ms':>11s} {'iterations':>10s} "
          f"{'final energy':>20s} {'rel vs warp':>11s}  agree")
    for r in records:
        check = r.get("check") or {}
        rel = check.get("energy_rel_diff")
        med = f"{r['ms_median']:.1f}" if "ms_median" in r else "-"
        low = f"{r['ms_min']:.1f}" if "ms_min" in r else "-"
        its = sum(r["step_iterations"]) if "step_iterations" in r else "-"
        energy = f"{r['final_energy']:.13g}" if "final_energy" in r else "-"
        agree = check.get("agree", "-") if r.get("checked") else "ref" if r.get("method") == "warp_meshad" else "-"
        print(f"{r.get('scene', '?'):14s} {r['method']:18s} {med:>11s} {low:>11s} {its!s:>10s} {energy:>20s} "
              f"{'-' if rel is None else f'{rel:.1e}':>11s}  {agree}{_error_tag(r)}")


def _error_tag(r: dict) -> str:
    if "error" not in r:
        return ""
    return "  (not timed)" if r["error"] == "disagrees with warp_meshad" else "  ERROR"


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenes", nargs="+", default=SCENES, help="configs of configs/manifold_opt (L-BFGS)")
    parser.add_argument("--methods", default=",".join(METHODS), help=f"comma-separated subset of {METHODS}")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="config override for every scene (as warp-meshad run --set), e.g. device_loop=true")
    parser.add_argument("--device", default=None, help="Warp device (default: the first CUDA device, else cpu)")
    parser.add_argument("--runs", type=int, default=5, help="timed runs per method after one untimed run")
    parser.add_argument("--energy-rtol", type=float, default=ENERGY_RTOL,
                        help="final-energy tolerance of the JAX transcription against warp_meshad (relative)")
    args = parser.parse_args(argv)
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    unknown = sorted(set(methods) - set(METHODS))
    if unknown:
        parser.error(f"--methods: unknown {unknown}; expected a subset of {METHODS}")
    if args.runs < 1:
        parser.error(f"--runs: expected >= 1, got {args.runs}")

    import warp as wp

    from warp_meshad._src.app.loader import parse_set

    wp.config.log_level = wp.LOG_WARNING
    wp.init()
    device = args.device or ("cuda:0" if wp.get_cuda_device_count() else "cpu")
    guard_cpu_out(wp.get_device(device).is_cuda)
    overrides = parse_set(args.set)
    machine = machine_info(device, with_jax=any(m != "warp_meshad" for m in methods))
    print(f"{NAME}: Warp device {device} ({machine['device_name']}), jax devices {machine['jax_devices']}, "
          f"{args.runs} timed runs")
    records: list[dict] = []
    for scene in args.scenes:
        try:
            run_scene(scene, device, overrides, methods, args.runs, records, machine, args.energy_rtol)
        except Exception:
            traceback.print_exc()
            records.append({"benchmark": NAME, "scene": scene, "method": "setup",
                            "error": traceback.format_exc(limit=3)})
        write(NAME, records)
    print_table(records)
    print(f"wrote {len(records)} records to {os.environ.get('BENCH_OUT', 'benchmarks/results')}/{NAME}.json")
    return records


if __name__ == "__main__":
    main()
