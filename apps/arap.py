"""As-rigid-as-possible deformation: move handle vertices to targets, and let the rest of the surface follow as rigidly
as it can.

Run: ``warp-meshad run configs/arap/homer.yaml`` (``--viewer`` to watch the local/global iterations).

Over the deformed positions x' (handle vertices pinned at their targets) and one rotation R_i per vertex,

    E(x', R) = sum_i sum_{j in N(i)} w_ij / 2 |(x'_i - x'_j) - R_i (x_i - x_j)|^2     (Sorkine & Alexa 2007)

with cotangent weights w_ij = 1/2 (cot alpha_ij + cot beta_ij) of the rest shape x, negative ones clamped to 0 by
default (:mod:`warp_meshad.kernels.energies.arap`, one term per edge). Each :meth:`App.step` is one round of the
alternating minimization:

- local step: for every vertex, R_i = V_i U_i^T from the SVD of S_i = sum_j w_ij (x_i - x_j)(x'_i - x'_j)^T
  (``wp.svd3``, one thread per vertex; the column of U of the smallest singular value is negated if det R_i < 0);
- global step: with R fixed, E is quadratic in x', so one Newton step (assembled Hessian 2 L (x) I, the handles pinned
  through ``fixed=``) is its exact minimizer.

Neither step raises E, so the energy falls monotonically. The handles: vertices whose normalized height along
``handle_axis`` is at most ``fixed_below`` stay at rest; those at least ``moved_above`` are rotated about their
centroid by ``rotation_degrees`` around ``rotation_axis`` and translated by ``translation``.
"""

from __future__ import annotations

import pathlib
from typing import Literal

import numpy as np
from pydantic import Field
import warp as wp

import warp_meshad as wm
from warp_meshad.app import App as _AppBase
from warp_meshad.app import AppConfig, ConfigError
from warp_meshad.kernels.energies import ArapData, arap

__all__ = ["App", "ArapConfig", "cotangent_weights", "handle_targets"]

_HOMER = str(pathlib.Path(__file__).resolve().parents[1] / "assets" / "meshes" / "homer.obj")
_AXES = {"x": 0, "y": 1, "z": 2}


class ArapConfig(AppConfig):
    """Config of the arap app (fields beyond :class:`AppConfig`).

    Attributes:
        mesh: a triangle mesh (default: homer.obj); the rest shape.
        dtype: ``"float64"`` (the ARAP energy is float64).
        solver: ``"newton"``: the global step is Newton on the quadratic (``iterations`` 1 is exact).
        steps: local/global rounds.
        iterations: Newton iterations of each global step (the energy is quadratic in x': 1 suffices).
        tolerance: Newton decrement tolerance of the global step [length^2].
        weights: ``"cotangent"`` (Sorkine & Alexa), ``"cotangent_clamped"`` (negative cotangent weights set to 0) or
            ``"uniform"`` (w_ij = 1). Negative weights (obtuse triangles; 11% of homer's edges) make a cell's
            covariance indefinite, so the local step no longer recovers a rigid motion and E can fall below 0;
            clamping keeps E >= 0 with E = 0 exactly at rigid motions.
        handle_axis: the axis the handle regions are cut along.
        fixed_below: vertices with (p - min) / extent <= fixed_below along ``handle_axis`` stay at rest.
        moved_above: vertices with (p - min) / extent >= moved_above are moved (rotated, then translated).
        translation: translation of the moved handle [length units of the mesh].
        rotation_axis: axis of the moved handle's rotation (normalized; through the handle's centroid).
        rotation_degrees: angle of that rotation [degrees].
        fixed_vertices: more vertex indices held at rest.
    """

    app: str = "arap"
    mesh: str = _HOMER
    dtype: Literal["float64"] = "float64"
    solver: Literal["newton"] = "newton"
    steps: int = 20
    iterations: int = 1
    tolerance: float = 1e-12
    weights: Literal["cotangent", "cotangent_clamped", "uniform"] = "cotangent_clamped"
    handle_axis: Literal["x", "y", "z"] = "y"
    fixed_below: float = 0.03
    moved_above: float = 0.9
    translation: tuple[float, float, float] = (0.0, 0.0, 0.0)
    rotation_axis: tuple[float, float, float] = (0.0, 0.0, 1.0)
    rotation_degrees: float = 0.0
    fixed_vertices: list[int] = Field(default_factory=list)

    def validate(self):
        errors = super().validate()
        if self.mesh == "grid":
            errors.append(("mesh", "expected a mesh file; the arap app has no generator"))
        if not 0.0 <= self.fixed_below < self.moved_above <= 1.0:
            errors.append(("moved_above", f"expected 0 <= fixed_below < moved_above <= 1, got fixed_below "
                                          f"{self.fixed_below}, moved_above {self.moved_above}"))
        if not np.linalg.norm(self.rotation_axis) > 0.0:
            errors.append(("rotation_axis", f"expected a non-zero vector, got {list(self.rotation_axis)}"))
        if any(i < 0 for i in self.fixed_vertices):
            errors.append(("fixed_vertices", f"expected indices >= 0, got {self.fixed_vertices}"))
        return errors


def cotangent_weights(mesh) -> np.ndarray:
    """w_e = 1/2 (cot alpha + cot beta) per edge of ``mesh`` (the angles opposite the edge; one on a boundary edge),
    float64, shape (edge_count,). Negative where the opposite angles sum to more than pi."""
    x = mesh.vertices
    faces = mesh.faces
    w = np.zeros(mesh.edge_count)
    for k in range(3):
        # the edge (f_k, f_k+1) is opposite corner f_k+2
        o, a, b = faces[:, (k + 2) % 3], faces[:, k], faces[:, (k + 1) % 3]
        u, v = x[a] - x[o], x[b] - x[o]
        cot = np.einsum("ij,ij->i", u, v) / np.linalg.norm(np.cross(u, v), axis=1)
        np.add.at(w, mesh.face_edges[:, k], 0.5 * cot)
    return w


def _rotation_matrix(axis, degrees: float) -> np.ndarray:
    k = np.asarray(axis, dtype=np.float64)
    k = k / np.linalg.norm(k)
    t = np.radians(degrees)
    kx = np.array([[0.0, -k[2], k[1]], [k[2], 0.0, -k[0]], [-k[1], k[0], 0.0]])
    return np.eye(3) + np.sin(t) * kx + (1.0 - np.cos(t)) * (kx @ kx)


def handle_targets(x: np.ndarray, config: ArapConfig) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The handles of ``config`` on rest positions ``x``: (fixed indices, moved indices, targets of the moved ones).

    Returns:
        fixed: int64 (F,), held at rest; moved: int64 (M,); targets: float64 (M, 3).
    """
    axis = _AXES[config.handle_axis]
    h = x[:, axis]
    t = (h - h.min()) / max(float(np.ptp(h)), 1e-300)
    fixed = np.union1d(np.flatnonzero(t <= config.fixed_below), np.asarray(config.fixed_vertices, dtype=np.int64))
    moved = np.setdiff1d(np.flatnonzero(t >= config.moved_above), fixed)
    center = x[moved].mean(axis=0) if moved.size else np.zeros(3)
    rot = _rotation_matrix(config.rotation_axis, config.rotation_degrees)
    targets = (x[moved] - center) @ rot.T + center + np.asarray(config.translation, dtype=np.float64)
    return fixed.astype(np.int64), moved.astype(np.int64), targets


@wp.kernel(enable_backward=False)
def _accumulate_covariance(edges: wp.array2d(dtype=wp.int32), weight: wp.array(dtype=wp.float64),
                           rest_edge: wp.array(dtype=wp.vec3d), x: wp.array(dtype=wp.vec3d),
                           covariance: wp.array(dtype=wp.mat33d)):
    # one thread per edge: S_a += w r r'^T and S_b += w (-r)(-r')^T (the same), r = x_a - x_b at rest, r' deformed
    e = wp.tid()
    a = edges[e, 0]
    b = edges[e, 1]
    s = weight[e] * wp.outer(rest_edge[e], x[a] - x[b])
    wp.atomic_add(covariance, a, s)
    wp.atomic_add(covariance, b, s)


@wp.kernel(enable_backward=False)
def _best_rotation(covariance: wp.array(dtype=wp.mat33d), rotation: wp.array(dtype=wp.mat33d)):
    # one thread per vertex: R = V U^T from S = U diag(s) V^T, the smallest singular direction flipped if det R < 0
    i = wp.tid()
    u = wp.mat33d()
    s = wp.vec3d()
    v = wp.mat33d()
    wp.svd3(covariance[i], u, s, v)
    r = v * wp.transpose(u)
    if wp.determinant(r) < wp.float64(0.0):
        k = 0
        if s[1] < s[k]:
            k = 1
        if s[2] < s[k]:
            k = 2
        for row in range(3):
            u[row, k] = -u[row, k]
        r = v * wp.transpose(u)
    rotation[i] = r


class App(_AppBase):
    """The arap app: each :meth:`step` is one local (rotations) + global (positions) round.

    Attributes (beyond :class:`~warp_meshad.app.App`):
        problem: the :class:`warp_meshad.Problem` (vec3d variables, one ARAP term over the edges).
        x: deformed positions, wp.array [vertex_count] of vec3d; ``x0`` the rest shape (numpy).
        rotation: R_i per vertex, wp.array [vertex_count] of mat33d (the energy's data reads it).
        fixed, moved: handle vertex indices; ``targets`` the moved handle's targets; ``pinned`` both sets.
        weights: w_e per edge (numpy); ``energy_scale`` sum_e |w_e| |x_a - x_b|^2 at rest.
    """

    name = "arap"
    config_class = ArapConfig
    continuous_objective = True

    def __init__(self, config: ArapConfig, prepared: dict | None = None):
        super().__init__(config, prepared)
        c = self.config
        mesh = self.mesh
        if c.weights != "uniform":
            self.require_nondegenerate(faces="the cotangent weights divide by twice each face's area")
        dev = self.device
        n = mesh.vertex_count
        if any(i >= n for i in c.fixed_vertices):
            raise ConfigError(c.origin("fixed_vertices"), "fixed_vertices",
                              f"indices must be < vertex_count {n}, got {c.fixed_vertices}")
        self.x0 = np.array(mesh.vertices, dtype=np.float64)
        self.fixed, self.moved, self.targets = handle_targets(self.x0, c)
        self.pinned = np.union1d(self.fixed, self.moved)
        if self.pinned.size == 0:
            raise ConfigError(c.origin("fixed_below"), "fixed_below",
                              "no handle vertex selected: the deformation would be undetermined")
        cot = cotangent_weights(mesh)
        self.negative_cotangent_count = int(np.sum(cot < 0.0))
        if c.weights == "uniform":
            self.weights = np.ones(mesh.edge_count)
        else:
            self.weights = np.maximum(cot, 0.0) if c.weights == "cotangent_clamped" else cot
        edges = mesh.edges
        x = self.x0.copy()
        x[self.moved] = self.targets
        self.x = wp.array(x, dtype=wp.vec3d, device=dev)
        self.rotation = wp.array(np.broadcast_to(np.eye(3), (n, 3, 3)), dtype=wp.mat33d, device=dev)
        self.covariance = wp.zeros(n, dtype=wp.mat33d, device=dev)

        data = ArapData()
        data.rest_edge = wp.array(self.x0[edges[:, 0]] - self.x0[edges[:, 1]], dtype=wp.vec3d, device=dev)
        data.weight = wp.array(self.weights, dtype=wp.float64, device=dev)
        data.edge_vertex_indices = wp.array(edges, dtype=wp.int32, device=dev)
        data.rotation = self.rotation
        self.data = data
        self.problem = wm.Problem(n, 3, wp.float64, dev, deterministic=self.config.deterministic)
        self.problem.add_term(edges, arap, data, name="arap")
        # E is quadratic in x' with the PSD Hessian 2 L (x) I (even where cotangent weights are negative): no projection
        self.solver = wm.NewtonSolver(self.problem, linear_solver=c.linear_solver, projection=None,
                                      fixed=self.pinned)
        self.start_energy = self.problem.eval(self.x)
        # sum_e |w_e| |x_a - x_b|^2: the size of E for O(1) strains, the scale of round-off tolerances
        self.energy_scale = float(np.sum(np.abs(self.weights) * mesh.edge_lengths() ** 2))

    def local_step(self, x: wp.array | None = None) -> wp.array:
        """Set every R_i to the rotation closest to the cell's deformation (at ``x``, default the current
        positions); returns :attr:`rotation`."""
        x = self.x if x is None else x
        d = self.data
        self.covariance.zero_()
        wp.launch(_accumulate_covariance, dim=self.mesh.edge_count,
                  inputs=[d.edge_vertex_indices, d.weight, d.rest_edge, x, self.covariance], device=self.device)
        wp.launch(_best_rotation, dim=self.mesh.vertex_count, inputs=[self.covariance, self.rotation],
                  device=self.device)
        return self.rotation

    def step(self) -> dict:
        """One round: local step (rotations), then the global step (one Newton step on the quadratic)."""
        c = self.config
        before = self.problem.eval(self.x)
        self.local_step()
        result = self.solver.solve(self.x, max_iterations=c.iterations, tolerance=c.tolerance)
        wp.copy(self.x, result.x)
        rec = self.record(result)
        rec["energies"].insert(0, before)  # E(x_k, R_k), then E(x_k, R_k+1) and E(x_k+1, R_k+1)
        return rec

    def positions(self) -> np.ndarray:
        return self.x.numpy().astype(np.float64)

    def handle_labels(self) -> np.ndarray:
        """Per vertex: 0 free, 1 fixed at rest, 2 moved to a target."""
        labels = np.zeros(self.mesh.vertex_count)
        labels[self.fixed] = 1.0
        labels[self.moved] = 2.0
        return labels

    def quantities(self) -> dict:
        x = self.positions()
        return {
            "displacement [mesh length units]": ("vertices", np.linalg.norm(x - self.x0, axis=1)),
            "handles: 0 free, 1 fixed, 2 moved [label]": ("vertices", self.handle_labels()),
            "edge strain |l / l_rest - 1|, mean of the face's edges [1]": (
                "faces", self.edge_strain(x)[self.mesh.face_edges].mean(axis=1)),
        }

    def edge_strain(self, x: np.ndarray | None = None) -> np.ndarray:
        """Per edge |length / rest length - 1| (0 for a rigid motion)."""
        x = self.positions() if x is None else x
        e = self.mesh.edges
        return np.abs(np.linalg.norm(x[e[:, 0]] - x[e[:, 1]], axis=1) / self.mesh.edge_lengths() - 1.0)

    def check_final(self) -> None:
        """No NaN, the energy never rose over the local and global steps and fell overall, handles exactly at their
        targets (fixed ones at rest), every R_i a proper rotation."""
        super().check_final()
        energies = [e for rec in self.history for e in rec["energies"]]
        if energies:
            rises = np.diff(energies)
            tol = 1e-10 * max(abs(energies[0]), self.energy_scale)
            assert np.all(rises <= tol), f"arap: energy rose at iteration {int(np.argmax(rises > tol)) + 1}: {energies}"
            if energies[0] > 0.0:
                assert energies[-1] < energies[0], f"arap: energy did not decrease ({energies[0]} -> {energies[-1]})"
        x = self.positions()
        moved = np.abs(x[self.fixed] - self.x0[self.fixed]).max(initial=0.0)
        assert moved == 0.0, f"arap: fixed handle vertices moved by {moved:.3e}"
        off = np.abs(x[self.moved] - self.targets).max(initial=0.0)
        assert off == 0.0, f"arap: moved handle vertices are {off:.3e} from their targets"
        r = self.rotation.numpy()
        assert np.all(np.isfinite(r)), "arap: non-finite rotations"
        ortho = np.abs(np.einsum("nji,njk->nik", r, r) - np.eye(3)).max()
        det = np.linalg.det(r)
        assert ortho < 1e-8 and np.all(det > 0.0), f"arap: rotations not proper (|R^T R - I| {ortho:.2e}, min det " \
                                                   f"{det.min():.3f})"

    def extra_metrics(self) -> dict:
        return {
            "start_energy": self.start_energy,
            "fixed_vertex_count": int(self.fixed.size),
            "moved_vertex_count": int(self.moved.size),
            "weights": self.config.weights,
            "negative_cotangent_weight_count": self.negative_cotangent_count,
            "max_edge_strain": float(self.edge_strain().max()),
            "mean_edge_strain": float(self.edge_strain().mean()),
            "linear_solver": getattr(self.solver.linear_solver, "name", None),
            "cudss_skipped_reason": self.solver.linear_solver.cudss_skipped_reason,
        }
