"""Quickstart: mass-spring energy on a mesh, its gradient and sparse Hessian.

Run: python examples/quickstart.py [--device cuda:0]
"""

import argparse
import pathlib
from typing import Any

import numpy as np
import warp as wp

import warp_meshad as wm
from warp_meshad.kernels import ad

MESH = pathlib.Path(__file__).resolve().parents[1] / "assets" / "meshes" / "spot.obj"


@wp.struct
class SpringData:
    rest: wp.array(dtype=wp.float64)
    k: wp.float64


@wp.func
def spring(e: int, xa: Any, xb: Any, data: SpringData):
    """E = k/2 (|xa - xb| - rest)^2"""
    l = ad.length(xa - xb)
    return data.k * wp.float64(0.5) * (l - data.rest[e]) * (l - data.rest[e])


def main(device=None):
    wp.config.log_level = wp.LOG_WARNING
    mesh = wm.TriMesh.from_file(MESH)
    problem = wm.Problem(variable_count=mesh.vertex_count, variable_dim=3, dtype=wp.float64, device=device)
    data = SpringData()
    data.rest = wp.array(0.9 * mesh.edge_lengths(), dtype=wp.float64, device=problem.device)
    data.k = wp.float64(10.0)
    problem.add_term(elements=mesh.edges, energy=spring, data=data)
    x = wp.array(mesh.vertices, dtype=wp.vec3d, device=problem.device)

    f = problem.eval(x)
    f, g = problem.eval_with_gradient(x)
    f, g, H = problem.eval_with_hessian(x)
    f, g, Hp = problem.eval_with_hessian_proj(x)
    hv = problem.hessian_vector_product(x, g)
    S = wm.to_scipy(H)
    np.testing.assert_allclose(hv.numpy().ravel(), S @ g.numpy().ravel(), rtol=1e-6, atol=1e-8)  # H g, two ways
    print(f"{mesh.vertex_count} vertices, {mesh.edge_count} springs on {problem.device}")
    print(f"energy {f:.6g}, |gradient| {np.linalg.norm(g.numpy()):.6g}, Hessian {S.shape} with {S.nnz} non-zeros")
    return f


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--device", default=None)
    main(parser.parse_args().device)
