"""Backward Euler time steps written as minimizations: the inertia-and-gravity term and the updates around each solve.

An app that takes a step of size h (cloth, shells, elastic) adds the term once with :func:`add_inertia_gravity`
(:func:`~warp_meshad.kernels.energies.inertia_gravity`, whose docstring gives the formula), then per
step predicts x~ = x^n + h v^n into the term's target with :func:`predict_positions`, minimizes, and sets
v^{n+1} = (x^{n+1} - x^n) / h with :func:`update_velocities`. Positions and velocities are wp.arrays of vec3d or
vec3f (float64 or float32 problems); the kernels are generic over the two.
"""

from __future__ import annotations

from typing import Any

import warp as wp

from warp_meshad.kernels.energies import InertiaGravityData, inertia_gravity

__all__ = ["add_inertia_gravity", "predict_positions", "update_velocities"]


@wp.kernel(enable_backward=False)
def _predict(x: wp.array(dtype=Any), v: wp.array(dtype=Any), h: Any, target: wp.array(dtype=Any)):
    # one thread per vertex: x~ = x + h v
    i = wp.tid()
    target[i] = x[i] + h * v[i]


@wp.kernel(enable_backward=False)
def _velocity(x_new: wp.array(dtype=Any), x_old: wp.array(dtype=Any), inv_h: Any, v: wp.array(dtype=Any)):
    # one thread per vertex: v = (x_new - x_old) / h
    i = wp.tid()
    v[i] = (x_new[i] - x_old[i]) * inv_h


def _scalar(x: wp.array):
    return x.dtype._wp_scalar_type_  # wp.float64 for vec3d, wp.float32 for vec3f


def add_inertia_gravity(problem, elements, x: wp.array, masses, gravity, time_step: float,
                        name: str = "inertia_gravity"):
    """Adds the inertia-and-gravity term of a backward Euler step to ``problem``, one element per vertex.

    Args:
        problem: the :class:`warp_meshad.Problem` of one time step.
        elements: the per-vertex stencil, e.g. ``mesh.vertex_indices``, shape [vertex_count, 1].
        x: positions, wp.array [vertex_count] of vec3d (float64 term) or vec3f (float32 term); the target x~ starts as
            a copy of it, on its device.
        masses: lumped vertex masses [kg], shape [vertex_count].
        gravity: acceleration of gravity [m/s^2], three numbers.
        time_step: h [s].
        name: the term's name.

    Returns:
        The term's :class:`~warp_meshad.kernels.energies.InertiaGravityData` of x's scalar type: its
        ``target`` is what :func:`predict_positions` writes.
    """
    f64 = _scalar(x) == wp.float64
    scalar, vec3 = (wp.float64, wp.vec3d) if f64 else (wp.float32, wp.vec3f)
    data = InertiaGravityData(scalar)
    data.mass = wp.array(masses, dtype=scalar, device=x.device)
    data.target = wp.clone(x)
    data.gravity = vec3(*gravity)
    data.inv_h2 = scalar(1.0 / time_step**2)
    problem.add_term(elements, inertia_gravity, data, name=name)
    return data


def predict_positions(x: wp.array, v: wp.array, time_step: float, target: wp.array) -> None:
    """``target = x + h v`` (the predicted positions x~ of a step), on ``x``'s device; arrays of one vec3 dtype."""
    wp.launch(_predict, dim=x.shape[0], inputs=[x, v, _scalar(x)(time_step), target], device=x.device)


def update_velocities(x_new: wp.array, x_old: wp.array, time_step: float, v: wp.array) -> None:
    """``v = (x_new - x_old) / h`` (multiplied by 1 / h), on ``x_new``'s device; arrays of one vec3 dtype."""
    wp.launch(_velocity, dim=x_new.shape[0], inputs=[x_new, x_old, _scalar(x_new)(1.0 / time_step), v],
              device=x_new.device)
