"""Parametrize a disk-like surface: symmetric Dirichlet energy from a Tutte embedding, projected Newton.

Run: python examples/parametrize.py [--device cuda:0] [--iterations 50] [--mesh path/to/disk.obj]

The uv coordinates are the variables (variable_dim = 2); the built-in energy is +inf on a flipped triangle, so the
line search keeps the map flip-free. The energy is at least 4 * area, with equality at an isometry; the shipped mesh,
woody.obj, is flat, so E / area falls to 4.
"""

import argparse
import pathlib

import numpy as np
import warp as wp

import warp_meshad as wm
from warp_meshad.kernels.energies import SymmetricDirichletData, symmetric_dirichlet

MESH = pathlib.Path(__file__).resolve().parents[1] / "assets" / "meshes" / "woody.obj"
TEST_SIZE = {"iterations": 4}  # what tests/test_docs_examples.py runs


def main(device=None, iterations: int = 50, mesh_path=MESH):
    wp.config.log_level = wp.LOG_WARNING  # no init banner, no module-load lines
    mesh = wm.TriMesh.from_file(mesh_path)
    area = mesh.total_area()
    uv0 = wm.tutte_embedding(mesh) * np.sqrt(area / np.pi)  # the unit disk scaled to the surface's area

    problem = wm.Problem(variable_count=mesh.vertex_count, variable_dim=2, dtype=wp.float64, device=device)
    data = SymmetricDirichletData(
        wp.float64,
        rest_inverse=wp.array(mesh.face_rest_frame_inverses(), dtype=wp.mat22d, device=problem.device),
        area=wp.array(mesh.face_areas(), dtype=wp.float64, device=problem.device),
    )
    problem.add_term(elements=mesh.faces, energy=symmetric_dirichlet, data=data)

    solver = wm.NewtonSolver(problem, projection=wm.Projection(mode="clamp", eps=1e-9))
    result = solver.solve(wp.array(uv0, dtype=wp.vec2d, device=problem.device), max_iterations=iterations,
                          tolerance=1e-6)

    per_area = np.array(result.energies) / area
    print(f"{mesh.vertex_count} vertices, {mesh.face_count} faces on {problem.device}, {result.linear_solver} solves")
    print(f"E/A {per_area[0]:.8f} -> {per_area[-1]:.8f} in {result.iterations} Newton iterations ({result.reason})")
    assert np.all(np.diff(per_area) <= 1e-12) and per_area[-1] >= 4.0  # monotone, never below the isometry bound
    return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default=None)
    parser.add_argument("--iterations", type=int, default=50)
    parser.add_argument("--mesh", default=MESH)
    args = parser.parse_args()
    main(args.device, args.iterations, args.mesh)
