"""A mass-spring cloth pinned at two corners, stepped by backward Euler: each step one minimization by Newton.

Run: python examples/hanging_cloth.py [--device cuda:0] [--steps 20] [--n 16]

Each step minimizes inertia + gravity (``warp_meshad.dynamics``) plus the springs on the edges (the built-in
``mass_spring``) over the positions, with the two pinned corners held fixed (``fixed=``); the cloth app
(``warp-meshad run cloth/hanging``) is this loop with a config, outputs and a viewer.
"""

import argparse

import numpy as np
import warp as wp

import warp_meshad as wm
from warp_meshad.dynamics import add_inertia_gravity, predict_positions, update_velocities
from warp_meshad.kernels.energies import MassSpringData, mass_spring

TEST_SIZE = {"steps": 2, "n": 6}  # what tests/test_docs_examples.py runs


def main(device=None, steps: int = 20, n: int = 16, time_step: float = 0.02):
    wp.config.log_level = wp.LOG_WARNING  # no init banner, no module-load lines
    mesh = wm.TriMesh.grid(n, n)  # 1 m x 1 m in the xy-plane: y is up, the top row hangs from its two ends
    problem = wm.Problem(variable_count=mesh.vertex_count, variable_dim=3, dtype=wp.float64, device=device)
    x = wp.array(mesh.vertices, dtype=wp.vec3d, device=problem.device)
    v = wp.zeros_like(x)

    masses = np.full(mesh.vertex_count, 1.0 / mesh.vertex_count)  # 1 kg in all
    inertia = add_inertia_gravity(problem, mesh.vertex_indices, x, masses, gravity=(0.0, -9.81, 0.0),
                                  time_step=time_step)
    springs = MassSpringData(wp.float64, rest=wp.array(mesh.edge_lengths(), dtype=wp.float64, device=problem.device),
                             stiffness=1000.0)
    problem.add_term(elements=mesh.edges, energy=mass_spring, data=springs)

    top = n * (n - 1)  # first vertex of the top row
    solver = wm.NewtonSolver(problem, fixed=np.array([top, top + n - 1]))
    for step in range(steps):
        predict_positions(x, v, time_step, inertia.target)
        result = solver.solve(x, max_iterations=30, tolerance=1e-8)
        update_velocities(result.x, x, time_step, v)
        x = result.x
        print(f"step {step}: {result.iterations} Newton iterations, E {result.energies[-1]:.6g}")

    y = x.numpy()[:, 1]
    print(f"lowest point y = {y.min():.4f} m (the pinned corners stay at y = {y[top]:.4f} m)")
    assert np.all(np.isfinite(x.numpy())) and y.min() < y[top]  # finite, and the cloth has fallen below its pins
    return x


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default=None)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--n", type=int, default=16, help="vertices per side")
    args = parser.parse_args()
    main(args.device, args.steps, args.n)
