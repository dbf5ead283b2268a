"""Backward Euler time steps written as minimizations: the inertia-and-gravity term, the predictor and the velocity
update.

An app that takes a step of size h adds the term once with :func:`add_inertia_gravity` (the formula is in
:func:`warp_meshad.kernels.energies.inertia_gravity`), then per step predicts x~ = x^n + h v^n with
:func:`predict_positions`, minimizes, and sets v^{n+1} = (x^{n+1} - x^n) / h with :func:`update_velocities`.
"""

from warp_meshad._src.solve.time_integration import add_inertia_gravity, predict_positions, update_velocities

__all__ = ["add_inertia_gravity", "predict_positions", "update_velocities"]
