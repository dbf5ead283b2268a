"""Optimization on a manifold: embed a genus-0 mesh on the unit sphere with tangent-space variables and retraction.

Run: ``warp-meshad run configs/manifold_opt/spot_newton.yaml`` (``--viewer`` to watch the embedding relax).

The unknowns are the points p_i on the unit sphere, one per vertex. A step does not move them directly: each vertex
gets a 2D tangent vector v_i in an orthonormal basis (b1_i, b2_i) of the sphere's tangent plane at p_i, the energy is
evaluated at the retracted points normalize(p_i + v_i,1 b1_i + v_i,2 b2_i), the solver (L-BFGS or projected Newton)
runs ``iterations`` iterations on v from v = 0, and then every p_i moves to its retracted point, the bases are rebuilt
and v is reset to 0 (re-centering). The energy per face is Dirichlet plus a log barrier on the volume of the
tetrahedron (origin, A, B, C), which is +inf for a flipped triangle (:mod:`...energies.sphere_embedding`), so the
embedding stays injective. This is TinyAD-Examples' ``manifold_optimization.cc`` (Schmidt et al. 2022), which
re-centers after every projected Newton iteration.

The start embedding (``initial: tutte``) removes the star of ``cut_vertex``, maps the remaining disk to the unit disk
(Tutte, uniform weights, boundary on the circle), scales it by R and maps it to the sphere by inverse stereographic
projection, with the cut vertex at the north pole; R (scanned over 1e-2 .. 1e3) and the plane's orientation are
chosen to give every face a positive volume and the lowest energy. (TinyAD reads a precomputed embedding instead.)
``initial: normalize`` projects the vertices radially from their centroid (for star-shaped meshes such as a sphere).
"""

from __future__ import annotations

import math
import pathlib
import time
from typing import ClassVar, Literal

import numpy as np
import warp as wp

import warp_meshad as wm
from warp_meshad.app import App as _AppBase
from warp_meshad.app import AppConfig, ConfigError
from warp_meshad.kernels.energies import SphereEmbeddingData, sphere_embedding, sphere_retract

__all__ = ["App", "ManifoldOptConfig", "face_volumes", "initial_sphere_embedding"]

_SPHERE = str(pathlib.Path(__file__).resolve().parents[1] / "assets" / "meshes" / "sphere.obj")
_TARGETS = {"none": 0, "equator": 1, "north_pole": 2}


class ManifoldOptConfig(AppConfig):
    """Config of the manifold optimization app (fields beyond :class:`AppConfig`).

    Attributes:
        mesh: a closed genus-0 triangle mesh (default: sphere.obj).
        dtype: ``"float64"`` (the built-in energy is float64).
        solver: ``"lbfgs"`` or ``"newton"`` (projected Newton: per-face Hessians projected to PSD).
        steps: re-centerings: each step runs the solver from v = 0, then moves the points and rebuilds the bases.
        iterations: solver iterations per step (TinyAD: 1 Newton iteration between re-centerings).
        tolerance: Newton: stop when the Newton decrement falls below it (TinyAD: 0.1); L-BFGS: when the gradient
            norm does.
        barrier_weight: weight w of the log-volume barrier (TinyAD: 0.1).
        target: extra pull of every corner: ``"none"``, ``"equator"`` (y^2) or ``"north_pole"`` ((1 - y)^2), as TinyAD.
        initial: start embedding: ``"tutte"`` (any genus-0 mesh) or ``"normalize"`` (radial projection).
        cut_vertex: vertex whose star is cut out for the Tutte start (it goes to the north pole).
        step_size: L-BFGS: length of the first step of each solve along -g (tangent units, ~radians).
        history: L-BFGS: number of stored curvature pairs.
    """

    app: str = "manifold_opt"
    mesh: str = _SPHERE
    dtype: Literal["float64"] = "float64"
    solver: Literal["lbfgs", "newton"] = "lbfgs"
    device_loop_supported: ClassVar[bool] = True
    steps: int = 20
    iterations: int = 50
    tolerance: float = 1e-6
    barrier_weight: float = 0.1
    target: Literal["none", "equator", "north_pole"] = "none"
    initial: Literal["tutte", "normalize"] = "tutte"
    cut_vertex: int = 0
    step_size: float = 1e-3
    history: int = 10

    def validate(self):
        errors = super().validate()
        if not self.barrier_weight > 0.0:
            errors.append(("barrier_weight", f"expected a number > 0, got {self.barrier_weight}"))
        if not self.step_size > 0.0:
            errors.append(("step_size", f"expected a number > 0, got {self.step_size}"))
        if self.history < 1:
            errors.append(("history", f"expected an int >= 1, got {self.history}"))
        if self.cut_vertex < 0:
            errors.append(("cut_vertex", f"expected an index >= 0, got {self.cut_vertex}"))
        return errors


# ----------------------------------------------------------------------------------------------------------------------
# Start embedding and measures (NumPy)
# ----------------------------------------------------------------------------------------------------------------------


def face_volumes(points: np.ndarray, faces: np.ndarray) -> np.ndarray:
    """Signed volume det[A, B, C] / 6 of each face's tetrahedron with the origin (> 0: positively oriented as seen
    from outside the sphere), float64, shape (face_count,)."""
    a, b, c = points[faces[:, 0]], points[faces[:, 1]], points[faces[:, 2]]
    return np.einsum("ij,ij->i", a, np.cross(b, c)) / 6.0


def _energy(points: np.ndarray, faces: np.ndarray, barrier_weight: float) -> float:
    """The sphere-embedding energy without target term (NumPy), +inf when a face is flipped."""
    vol = face_volumes(points, faces)
    if vol.min() <= 0.0:
        return math.inf
    a, b, c = points[faces[:, 0]], points[faces[:, 1]], points[faces[:, 2]]
    dirichlet = np.sum((a - b) ** 2) + np.sum((b - c) ** 2) + np.sum((c - a) ** 2)
    return float(np.sum(-barrier_weight * np.log(vol)) + dirichlet)


def initial_sphere_embedding(mesh: wm.TriMesh, method: str = "tutte", cut_vertex: int = 0,
                             barrier_weight: float = 0.1) -> tuple[np.ndarray, dict]:
    """A flip-free start embedding of a closed genus-0 mesh on the unit sphere.

    Args:
        mesh: closed, genus 0.
        method: ``"tutte"``: Tutte embedding of the mesh minus the star of ``cut_vertex``, scaled by R and inverse
            stereographically projected (the cut vertex at the north pole); R and the orientation minimize the
            energy among flip-free choices. ``"normalize"``: (x - centroid) / |x - centroid|.
        cut_vertex: see above.
        barrier_weight: the energy's barrier weight (used to choose R).

    Returns:
        (points, info): points float64 of shape (vertex_count, 3) on the unit sphere; info the choices made.

    Raises:
        ValueError: the mesh is not a closed genus-0 mesh, or no flip-free start was found (the message says why).
    """
    if not mesh.is_closed or mesh.euler_characteristic != 2:
        raise ValueError(f"{mesh.source}: expected a closed genus-0 mesh (V - E + F = 2, no boundary); got "
                         f"V - E + F = {mesh.euler_characteristic}, {mesh.boundary_edges.size} boundary edges")
    faces = mesh.faces
    if method == "normalize":
        x = mesh.vertices - mesh.vertices.mean(axis=0)
        points = x / np.linalg.norm(x, axis=1, keepdims=True)
        vol = face_volumes(points, faces)
        if vol.min() <= 0.0:
            raise ValueError(f"{mesh.source}: radial projection from the centroid flips {int(np.sum(vol <= 0))} faces "
                             "(the mesh is not star-shaped from its centroid); use initial: tutte")
        return points, {"method": "normalize"}
    if not 0 <= cut_vertex < mesh.vertex_count:
        raise ValueError(f"cut_vertex {cut_vertex} out of range [0, {mesh.vertex_count})")
    keep = ~np.any(faces == cut_vertex, axis=1)
    disk = wm.TriMesh(mesh.vertices, faces[keep], unreferenced="remove", source=mesh.source)
    uv = wm.tutte_embedding(disk)
    best = (math.inf, None, None, None)
    for mirror in (-1.0, 1.0):
        for scale in np.geomspace(1e-2, 1e3, 81):
            w = scale * uv * np.array([1.0, mirror])
            s = np.sum(w * w, axis=1)
            points = np.empty((mesh.vertex_count, 3))
            points[disk.vertex_map] = np.stack([2.0 * w[:, 0], 2.0 * w[:, 1], s - 1.0], axis=1) / (s + 1.0)[:, None]
            points[cut_vertex] = (0.0, 0.0, 1.0)
            e = _energy(points, faces, barrier_weight)
            if e < best[0]:
                best = (e, points, float(scale), mirror)
    if best[1] is None:
        raise ValueError(f"{mesh.source}: no flip-free stereographic Tutte embedding found (cut vertex {cut_vertex}); "
                         "try another cut_vertex")
    return best[1], {"method": "tutte", "cut_vertex": int(cut_vertex), "scale": best[2], "mirror": best[3],
                     "energy": best[0]}


# ----------------------------------------------------------------------------------------------------------------------
# Re-centering
# ----------------------------------------------------------------------------------------------------------------------


@wp.func
def _any_tangent(p: wp.vec3d):
    """A unit tangent of the sphere at p: p crossed with the coordinate axis most orthogonal to it."""
    ax = wp.vec3d(1.0, 0.0, 0.0)
    if wp.abs(p[1]) < wp.abs(p[0]) and wp.abs(p[1]) <= wp.abs(p[2]):
        ax = wp.vec3d(0.0, 1.0, 0.0)
    elif wp.abs(p[2]) < wp.abs(p[0]) and wp.abs(p[2]) < wp.abs(p[1]):
        ax = wp.vec3d(0.0, 0.0, 1.0)
    return wp.normalize(wp.cross(ax, p))


@wp.kernel(enable_backward=False)
def _recenter(v: wp.array(dtype=wp.vec2d), points: wp.array(dtype=wp.vec3d), tangent1: wp.array(dtype=wp.vec3d),
              tangent2: wp.array(dtype=wp.vec3d)):
    # one thread per vertex: p <- retract(v), rebuild the tangent basis at p, v <- 0
    i = wp.tid()
    p = sphere_retract(v[i], points[i], tangent1[i], tangent2[i])
    b1 = _any_tangent(p)
    points[i] = p
    tangent1[i] = b1
    tangent2[i] = wp.cross(p, b1)
    v[i] = wp.vec2d(0.0, 0.0)


# ----------------------------------------------------------------------------------------------------------------------
# The app
# ----------------------------------------------------------------------------------------------------------------------


class App(_AppBase):
    """The manifold optimization app: each :meth:`step` runs the solver in the current tangent spaces, then
    re-centers.

    Attributes (beyond :class:`~warp_meshad.app.App`):
        problem: the :class:`warp_meshad.Problem` over the vertices (variable_dim 2: tangent coordinates).
        v: the tangent coordinates, wp.array [vertex_count] of wp.vec2d (zero between steps).
        data: the energy's :class:`SphereEmbeddingData` (points and tangent bases, updated in place).
        points0: the start embedding (numpy); ``start`` how it was made.
    """

    name = "manifold_opt"
    config_class = ManifoldOptConfig
    continuous_objective = True

    def __init__(self, config: ManifoldOptConfig, prepared: dict | None = None):
        super().__init__(config, prepared)
        c = self.config
        mesh = self.mesh
        self.require_nondegenerate(faces="the area distortion it reports divides by each face's rest area")
        if c.cut_vertex >= mesh.vertex_count:
            raise ConfigError(c.origin("cut_vertex"), "cut_vertex",
                              f"must be < vertex_count {mesh.vertex_count}, got {c.cut_vertex}")
        t0 = time.perf_counter()
        try:
            self.points0, self.start = initial_sphere_embedding(mesh, c.initial, c.cut_vertex, c.barrier_weight)
        except ValueError as exc:
            key = "mesh" if "genus-0" in str(exc) else "initial" if c.initial == "normalize" else "cut_vertex"
            raise ConfigError(c.origin(key), key, str(exc)) from None
        self.start["time_ms"] = (time.perf_counter() - t0) * 1000.0
        dev = self.device
        n = mesh.vertex_count
        data = SphereEmbeddingData()
        data.faces = wp.array(mesh.faces, dtype=wp.int32, device=dev)
        data.points = wp.array(self.points0, dtype=wp.vec3d, device=dev)
        data.tangent1 = wp.zeros(n, dtype=wp.vec3d, device=dev)
        data.tangent2 = wp.zeros(n, dtype=wp.vec3d, device=dev)
        data.barrier_weight = wp.float64(c.barrier_weight)
        data.target = _TARGETS[c.target]
        self.data = data
        self.v = wp.zeros(n, dtype=wp.vec2d, device=dev)
        wp.launch(_recenter, dim=n, inputs=[self.v, data.points, data.tangent1, data.tangent2], device=dev)

        self.problem = wm.Problem(n, 2, wp.float64, dev, deterministic=self.config.deterministic)
        self.problem.add_term(mesh.faces, sphere_embedding, data, name="sphere_embedding")
        if c.solver == "newton":
            self.solver = wm.NewtonSolver(self.problem, linear_solver=c.linear_solver, projection=wm.Projection(),
                                          device_loop=c.device_loop_option(dev))
        else:
            self.solver = wm.LBFGSSolver(self.problem, history=c.history, initial_step=c.step_size,
                                         device_loop=c.device_loop_option(dev, poll=False))

    def step(self) -> dict:
        """``iterations`` solver iterations on the tangent coordinates from v = 0, then re-center. Once a solve has
        converged the points no longer move, so later steps record the converged state without solving again."""
        c = self.config
        if self.history and self.history[-1]["converged"]:
            last = self.history[-1]
            result = wm.SolveResult(x=self.v, energies=[last["energies"][-1]],
                                    gradient_norms=last["gradient_norms"][-1:], converged=True,
                                    reason="converged_earlier")
            return self.record(result)
        result = self.solver.solve(self.v, max_iterations=c.iterations, tolerance=c.tolerance)
        wp.launch(_recenter, dim=self.mesh.vertex_count,
                  inputs=[result.x, self.data.points, self.data.tangent1, self.data.tangent2], device=self.device)
        return self.record(result)

    def restart(self) -> None:
        """Back to the start embedding (``points0``) with its tangent bases, v = 0 and no steps taken; the solver is
        kept, with what it prepared (device-loop buffers and CUDA graphs), so a later :meth:`run` repeats the first
        one's iterates without preparing again."""
        self.data.points.assign(wp.array(self.points0, dtype=wp.vec3d, device=self.device))
        self.v.zero_()
        wp.launch(_recenter, dim=self.mesh.vertex_count,
                  inputs=[self.v, self.data.points, self.data.tangent1, self.data.tangent2], device=self.device)
        self.history = []
        self.steps_done = 0

    # -- results ---------------------------------------------------------------------------------------------------

    def positions(self) -> np.ndarray:
        """The embedding: points on the unit sphere, float64, shape (vertex_count, 3)."""
        return self.data.points.numpy().astype(np.float64)

    def area_ratio(self, points: np.ndarray | None = None) -> np.ndarray:
        """Per face: (area on the sphere / 4 pi) / (area on the mesh / total mesh area)."""
        points = self.positions() if points is None else points
        sphere = self.mesh.face_areas(points)
        rest = self.mesh.face_areas()
        return (sphere / sphere.sum()) / (rest / rest.sum())

    def quantities(self) -> dict:
        points = self.positions()
        return {
            "log2 of area ratio, sphere / mesh, each over its total [1]": ("faces", np.log2(self.area_ratio(points))),
            "volume of the face's tet with the centre [radius^3]": ("faces", face_volumes(points, self.mesh.faces)),
        }

    def check_final(self) -> None:
        """No NaN; every point on the unit sphere (to 1e-6); no flipped face (every tetrahedron with the origin has a
        positive volume); the energy decreased monotonically over the run."""
        super().check_final()
        points = self.positions()
        radius_error = np.abs(np.linalg.norm(points, axis=1) - 1.0)
        assert radius_error.max() <= 1e-6, (f"manifold_opt: vertex {int(radius_error.argmax())} is "
                                            f"{radius_error.max():.3e} off the unit sphere")
        vol = face_volumes(points, self.mesh.faces)
        assert vol.min() > 0.0, f"manifold_opt: {int(np.sum(vol <= 0.0))} flipped faces (first {int(vol.argmin())})"
        energies = [e for i, rec in enumerate(self.history) for e in rec["energies"][(1 if i else 0):]]
        rises = np.diff(energies)
        tol = 1e-12 * max(1.0, abs(energies[0]))
        assert np.all(rises <= tol), (f"manifold_opt: energy rose by {rises.max():.3e} at iteration "
                                      f"{int(rises.argmax())}")
        if sum(r["iterations"] for r in self.history) > 0:
            assert energies[-1] < energies[0], (f"manifold_opt: energy did not decrease ({energies[0]} -> "
                                                f"{energies[-1]})")

    def extra_metrics(self) -> dict:
        backend = getattr(self.solver, "linear_solver", None)  # L-BFGS and Newton-CG have none
        points = self.positions()
        ratio = self.area_ratio(points)
        return {
            "start": self.start,
            "start_energy": self.history[0]["energies"][0] if self.history else None,
            "min_volume": float(face_volumes(points, self.mesh.faces).min()),
            "max_radius_error": float(np.abs(np.linalg.norm(points, axis=1) - 1.0).max()),
            "area_ratio_min_max": [float(ratio.min()), float(ratio.max())],
            "converged": bool(self.history[-1]["converged"]) if self.history else False,
            "linear_solver": getattr(backend, "name", None),
            "cudss_skipped_reason": getattr(backend, "cudss_skipped_reason", None),
        }
