"""Dual numbers in your own Warp kernel: each triangle's area energy, its gradient and Hessian, checked against
central differences.

Run: python examples/own_kernel.py [--device cuda:0]

No :class:`warp_meshad.Problem` here: the kernel seeds the three corners of its triangle as dual 3-vectors, evaluates
``E = (area - rest)^2`` with ordinary operators, and stores the value, the 9-entry gradient and the 9 x 9 Hessian.
"""

import argparse

import numpy as np
import warp as wp

import warp_meshad as wm
from warp_meshad.kernels import ad

D = ad.duals(9, wp.float64)  # gradient + Hessian duals of 9 scalars: three vec3d corners
add, sub, mul, div = D.add, D.sub, D.mul, D.div  # Warp resolves + - * / in this file's kernels through these


@wp.kernel(enable_backward=False)
def area_energy(
    x: wp.array(dtype=wp.vec3d),
    faces: wp.array2d(dtype=wp.int32),
    rest: wp.array(dtype=wp.float64),
    energy: wp.array(dtype=wp.float64),
    gradient: wp.array(dtype=D.vecK),
    hessian: wp.array(dtype=D.matK),
):
    """One thread per triangle."""
    t = wp.tid()
    a = D.seed(x[faces[t, 0]], 0)  # a DVec3 whose components are variables 0, 1, 2
    b = D.seed(x[faces[t, 1]], 3)  # 3, 4, 5
    c = D.seed(x[faces[t, 2]], 6)  # 6, 7, 8
    area = 0.5 * D.length(D.cross(b - a, c - a))
    e = D.sq(area - rest[t])
    energy[t] = D.value(e)
    gradient[t] = D.gradient(e)
    hessian[t] = D.hessian(e)


def evaluate(x: np.ndarray, faces: wp.array, rest: wp.array, device):
    """Per-triangle energy (m,), gradient (m, 9) and Hessian (m, 9, 9) at positions x (n, 3)."""
    m = faces.shape[0]
    energy = wp.zeros(m, dtype=wp.float64, device=device)
    gradient = wp.zeros(m, dtype=D.vecK, device=device)
    hessian = wp.zeros(m, dtype=D.matK, device=device)
    xs = wp.array(x, dtype=wp.vec3d, device=device)
    wp.launch(area_energy, dim=m, inputs=[xs, faces, rest], outputs=[energy, gradient, hessian], device=device)
    return energy.numpy(), gradient.numpy(), hessian.numpy()


def assemble(faces: np.ndarray, gradient: np.ndarray, hessian: np.ndarray, n: int):
    """The total's gradient (3n,) and dense Hessian (3n, 3n): slot 3 * corner + axis of triangle t is coordinate
    3 * faces[t, corner] + axis."""
    rows = (3 * faces[:, :, None] + np.arange(3)).reshape(-1, 9)  # (m, 9) global coordinate of each slot
    g = np.zeros(3 * n)
    np.add.at(g, rows, gradient)
    H = np.zeros((3 * n, 3 * n))
    np.add.at(H, (rows[:, :, None], rows[:, None, :]), hessian)
    return g, H


def main(device=None):
    wp.config.log_level = wp.LOG_WARNING
    device = wp.get_device(device)
    mesh = wm.TriMesh.grid(4, 3)
    n = mesh.vertex_count
    x = mesh.vertices + 0.1 * np.random.default_rng(0).standard_normal(mesh.vertices.shape)
    faces = wp.array(mesh.faces, dtype=wp.int32, device=device)
    rest = wp.array(mesh.face_areas(), dtype=wp.float64, device=device)
    energy, gradient, hessian = evaluate(x, faces, rest, device)
    g, H = assemble(mesh.faces, gradient, hessian, n)

    # central differences of the total energy (for the gradient) and of the assembled gradient (for the Hessian)
    step = 1e-6
    fd_g, fd_H = np.zeros(3 * n), np.zeros((3 * n, 3 * n))
    for i in range(3 * n):
        plus, minus = x.copy(), x.copy()
        plus[i // 3, i % 3] += step
        minus[i // 3, i % 3] -= step
        e_plus, g_plus, _ = evaluate(plus, faces, rest, device)
        e_minus, g_minus, _ = evaluate(minus, faces, rest, device)
        fd_g[i] = (e_plus.sum() - e_minus.sum()) / (2 * step)
        fd_H[:, i] = (assemble(mesh.faces, g_plus, hessian, n)[0] - assemble(mesh.faces, g_minus, hessian, n)[0]) / (
            2 * step
        )
    np.testing.assert_allclose(g, fd_g, rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(H, fd_H, rtol=1e-5, atol=1e-7)
    print(f"{mesh.face_count} triangles on {device}: energy {energy.sum():.6g}")
    print(f"max |gradient - central difference| = {np.abs(g - fd_g).max():.1e}")
    print(f"max |Hessian - central difference of the gradient| = {np.abs(H - fd_H).max():.1e}")
    return g, H, fd_g, fd_H


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default=None, help="Warp device (default: Warp's default)")
    main(parser.parse_args().device)
