"""Curl-reduced 4-direction (cross) fields on the faces of a surface: PolyVector curl reduction by Gauss-Newton.

Run: ``warp-meshad run configs/frame_field/cheburashka.yaml`` (``--viewer`` to see the field and its curl).

Each face f carries two tangent vectors alpha_f, beta_f (complex numbers in the face's frame t1 = x1 - x0 normalized,
t2 = n x t1): the variable of a face is the vec4 (alpha, beta), and the field is the cross {+-alpha, +-beta}. Starting
from the smoothest unit cross field, every step takes ``iterations`` Gauss-Newton iterations on

    E(x) = sum_e |r_smooth|^2 + |r_curl|^2            (interior edges: :mod:`...energies.polycurl`)
         + sum_f |r_close|^2 + |r_barrier|^2          (faces: :mod:`...energies.polyvector_barrier`)

where r_smooth compares the PolyVector coefficients of the two faces of an edge after transporting them across it,
r_curl holds the polycurl (the mismatch of the fields' edge components, which vanishes for a locally integrable
field) and the polyquotient, r_close = sqrt(w) (x_f - x_f^ref) keeps each step close to the field at the start of the
step (with a large weight on constrained faces: a soft constraint to the start field there), and the barrier keeps
beta counter-clockwise of alpha. The smoothness weight decays by ``smoothness_decay`` every ``decay_interval`` steps,
so the field trades smoothness for integrability (Diamanti et al. 2015, "Integrable PolyVector Fields"; weights,
terms and schedule of TinyAD-Examples' ``polycurl_reduction.cc``).

Differences from TinyAD's example: the start field is computed (the smoothest 4-RoSy field by inverse iteration,
Knöppel et al. 2013, "Globally Optimal Direction Fields") instead of read from a ``.rawfield`` file; the closeness
reference is the field at the start of each step (TinyAD lags it by one iteration), which makes the energy decrease
monotonically over the whole run; the line search is Armijo backtracking from a full Gauss-Newton step (TinyAD: an
adaptive step that doubles after each success).
"""

from __future__ import annotations

import pathlib
import time
from typing import Literal

import numpy as np
from pydantic import Field
import warp as wp

import warp_meshad as wm
from warp_meshad.app import App as _AppBase
from warp_meshad.app import AppConfig, ConfigError
from warp_meshad.kernels.energies import (
    PolyCurlData,
    PolyVectorFaceData,
    polycurl,
    polyvector_barrier,
    polyvector_closeness,
    polyvector_smoothness,
)

__all__ = ["App", "FrameFieldConfig", "face_frames", "polycurl_per_edge", "smoothest_cross_field"]

_CHEBURASHKA = str(pathlib.Path(__file__).resolve().parents[1] / "assets" / "meshes" / "cheburashka.off")


class FrameFieldConfig(AppConfig):
    """Config of the frame field app (fields beyond :class:`AppConfig`).

    Attributes:
        mesh: a triangle mesh (closed or with boundary; only interior edges couple faces). Default: cheburashka.off.
        dtype: ``"float64"`` (the built-in energies are float64).
        solver: ``"gauss_newton"``.
        steps: Gauss-Newton rounds; each has its own closeness reference and smoothness weight (TinyAD: 60).
        iterations: Gauss-Newton iterations per step (TinyAD: 1).
        tolerance: Newton decrement below which a step's solve stops.
        smoothness_weight: w_s of the first steps (TinyAD: 1).
        smoothness_decay: factor applied to w_s every ``decay_interval`` steps (TinyAD: 0.8 every 5).
        decay_interval: steps between decays of w_s.
        curl_weight: w_c of the polycurl residuals (TinyAD: 100; the first coefficient is scaled by w_c, the second
            by sqrt(w_c)).
        quotient_weight: w_q of the polyquotient residual (TinyAD: 10).
        closeness_weight: w of the closeness to the field at the start of each step (TinyAD: 1e-3).
        constraint_weight: w of the closeness to the start field on ``constrained_faces`` (TinyAD: 100).
        constrained_faces: faces softly held at their start field (TinyAD: face 0).
        barrier_weight: w_b of the barrier keeping beta counter-clockwise of alpha (TinyAD: 0.1).
        barrier_start: s^ of that barrier, in (0, 1) (TinyAD: 0.9; unit orthogonal vectors have s = 1).
        damping: Levenberg damping added to the Gauss-Newton matrix (0: plain Gauss-Newton).
        start_iterations: inverse-power iterations computing the smoothest start field.
    """

    app: str = "frame_field"
    mesh: str = _CHEBURASHKA
    dtype: Literal["float64"] = "float64"
    solver: Literal["gauss_newton"] = "gauss_newton"
    steps: int = 60
    iterations: int = 1
    tolerance: float = 1e-12
    smoothness_weight: float = 1.0
    smoothness_decay: float = 0.8
    decay_interval: int = 5
    curl_weight: float = 100.0
    quotient_weight: float = 10.0
    closeness_weight: float = 1e-3
    constraint_weight: float = 100.0
    constrained_faces: list[int] = Field(default_factory=lambda: [0])
    barrier_weight: float = 0.1
    barrier_start: float = 0.9
    damping: float = 0.0
    start_iterations: int = 30

    def validate(self):
        errors = super().validate()
        for key in ("smoothness_weight", "curl_weight", "quotient_weight", "closeness_weight", "constraint_weight",
                    "barrier_weight", "damping"):
            if not getattr(self, key) >= 0.0:
                errors.append((key, f"expected a number >= 0, got {getattr(self, key)}"))
        if not 0.0 < self.smoothness_decay <= 1.0:
            errors.append(("smoothness_decay", f"expected a number in (0, 1], got {self.smoothness_decay}"))
        if self.decay_interval < 1:
            errors.append(("decay_interval", f"expected an int >= 1, got {self.decay_interval}"))
        if not 0.0 < self.barrier_start < 1.0:
            errors.append(("barrier_start", f"expected a number in (0, 1), got {self.barrier_start}"))
        if self.start_iterations < 1:
            errors.append(("start_iterations", f"expected an int >= 1, got {self.start_iterations}"))
        if any(i < 0 for i in self.constrained_faces):
            errors.append(("constrained_faces", f"expected indices >= 0, got {self.constrained_faces}"))
        return errors


# ----------------------------------------------------------------------------------------------------------------------
# Geometry of the field: frames, transport, the start field, the polycurl
# ----------------------------------------------------------------------------------------------------------------------


def face_frames(mesh: wm.TriMesh) -> tuple[np.ndarray, np.ndarray]:
    """Orthonormal frame (t1, t2) of each face: t1 along x1 - x0, t2 = n x t1 (libigl's ``local_basis``).

    Returns:
        t1, t2: float64, shape (face_count, 3) each.
    """
    x = mesh.vertices
    f = mesh.faces
    e1 = x[f[:, 1]] - x[f[:, 0]]
    t1 = e1 / np.linalg.norm(e1, axis=1, keepdims=True)
    n = mesh.face_normals()
    t2 = np.cross(n, t1)
    return t1, t2


def edge_directions(mesh: wm.TriMesh, t1: np.ndarray, t2: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Unit direction of each interior edge (``edges[e, 0] -> edges[e, 1]``) in the frames of its two faces.

    Returns:
        e_f, e_g: float64, shape (interior edge count, 2), rows as ``mesh.edge_faces``.
    """
    ev = mesh.edges[mesh.interior_edges]
    x = mesh.vertices
    e = x[ev[:, 1]] - x[ev[:, 0]]
    e /= np.linalg.norm(e, axis=1, keepdims=True)
    out = []
    for side in (0, 1):
        fi = mesh.edge_faces[:, side]
        out.append(np.stack([np.einsum("ij,ij->i", e, t1[fi]), np.einsum("ij,ij->i", e, t2[fi])], axis=1))
    return out[0], out[1]


def _complex(v: np.ndarray) -> np.ndarray:
    return v[..., 0] + 1j * v[..., 1]


def smoothest_cross_field(mesh: wm.TriMesh, e_f: np.ndarray, e_g: np.ndarray, iterations: int = 30
                          ) -> tuple[np.ndarray, float]:
    """The smoothest unit cross field: the power field u = alpha^4 minimizing sum_e |u_f t_fg^4 - u_g|^2 over
    sum_f A_f |u_f|^2 = 1 (smallest generalized eigenvector, by inverse iteration; Knöppel et al. 2013), then
    alpha = u^(1/4) / |u|^(1/4) and beta = i alpha.

    Args:
        mesh: the surface.
        e_f, e_g: :func:`edge_directions`.
        iterations: inverse-power iterations.

    Returns:
        (x, eigenvalue): x float64 of shape (face_count, 4) = (alpha, beta) per face in the face frames, and the
        Rayleigh quotient (smoothness energy of the unit-mass power field; 0 for a parallel field).
    """
    import scipy.sparse as sp
    import scipy.sparse.linalg as spla

    n = mesh.face_count
    f, g = mesh.edge_faces[:, 0].astype(np.int64), mesh.edge_faces[:, 1].astype(np.int64)
    t = np.conj(_complex(e_f)) * _complex(e_g)
    t4 = t**4
    # real form of the complex rows (t4 at f, -1 at g): [[Re, -Im], [Im, Re]] blocks
    m = f.size
    rows = np.concatenate([2 * np.arange(m)] * 3 + [2 * np.arange(m) + 1] * 3)
    cols = np.concatenate([2 * f, 2 * f + 1, 2 * g, 2 * f, 2 * f + 1, 2 * g + 1])
    vals = np.concatenate([t4.real, -t4.imag, -np.ones(m), t4.imag, t4.real, -np.ones(m)])
    a = sp.csr_matrix((vals, (rows, cols)), shape=(2 * m, 2 * n))
    lap = (a.T @ a).tocsc()
    mass = np.repeat(mesh.face_areas(), 2)
    shift = 1e-8 * max(lap.diagonal().mean() / mass.mean(), 1e-300)
    solve = spla.factorized((lap + sp.diags(shift * mass)).tocsc())
    u = np.zeros(2 * n)
    u[0::2] = 1.0
    u /= np.sqrt(u @ (mass * u))
    for _ in range(iterations):
        u = solve(mass * u)
        u /= np.sqrt(u @ (mass * u))
    eigenvalue = float(u @ (lap @ u))
    z = u[0::2] + 1j * u[1::2]
    theta = np.angle(z) / 4.0
    theta[np.abs(z) == 0.0] = 0.0
    x = np.stack([np.cos(theta), np.sin(theta), -np.sin(theta), np.cos(theta)], axis=1)
    return x, eigenvalue


def polycurl_per_edge(x: np.ndarray, mesh: wm.TriMesh, e_f: np.ndarray, e_g: np.ndarray) -> np.ndarray:
    """Unweighted polycurl of each interior edge: |(a_f^2 b_f^2 - a_g^2 b_g^2, (a_f^2 + b_f^2) - (a_g^2 + b_g^2))|
    with a, b the components of alpha, beta along the edge (Diamanti et al. 2015, Eq. 11); 0 where the field is
    locally integrable. NumPy, independent of the Warp residuals.

    Returns:
        float64, shape (interior edge count,).
    """
    comps = []
    for side, e in ((0, e_f), (1, e_g)):
        xs = x[mesh.edge_faces[:, side]]
        a = xs[:, 0] * e[:, 0] + xs[:, 1] * e[:, 1]
        b = xs[:, 2] * e[:, 0] + xs[:, 3] * e[:, 1]
        comps.append((a * a * b * b, a * a + b * b))
    (c0f, c2f), (c0g, c2g) = comps
    return np.hypot(c0f - c0g, c2f - c2g)


@wp.kernel(enable_backward=False)
def _set_reference(x: wp.array(dtype=wp.vec4d), start: wp.array(dtype=wp.vec4d), constrained: wp.array(dtype=wp.int32),
                   reference: wp.array(dtype=wp.vec4d)):
    # one thread per face: the closeness reference is the start field on constrained faces, else the current field
    f = wp.tid()
    if constrained[f] != 0:
        reference[f] = start[f]
    else:
        reference[f] = x[f]


# ----------------------------------------------------------------------------------------------------------------------
# The app
# ----------------------------------------------------------------------------------------------------------------------


class App(_AppBase):
    """The frame field app: each :meth:`step` is one Gauss-Newton round with its own weights and reference field.

    Attributes (beyond :class:`~warp_meshad.app.App`):
        problem: the :class:`warp_meshad.Problem` over the faces (variable_dim 4: alpha, beta).
        x: the field, wp.array [face_count] of wp.vec4d; ``x_start`` the start field (numpy).
        frames: (t1, t2) per face (numpy); ``edge_f``, ``edge_g`` the interior edges' directions in them.
        edge_data, face_data: the residuals' data structs (weights and reference updated every step).
    """

    name = "frame_field"
    config_class = FrameFieldConfig

    def __init__(self, config: FrameFieldConfig, prepared: dict | None = None):
        super().__init__(config, prepared)
        c = self.config
        mesh = self.mesh
        if any(i >= mesh.face_count for i in c.constrained_faces):
            raise ConfigError(c.origin("constrained_faces"), "constrained_faces",
                              f"indices must be < face_count {mesh.face_count}, got {c.constrained_faces}")
        if mesh.interior_edges.size == 0:
            raise ConfigError(c.origin("mesh"), "mesh",
                              f"{mesh.source} has no interior edge: nothing couples its faces")
        self.require_nondegenerate(faces="a face's tangent frame is undefined without area")
        dev = self.device
        t0 = time.perf_counter()
        self.frames = face_frames(mesh)
        self.edge_f, self.edge_g = edge_directions(mesh, *self.frames)
        self.x_start, self.start_eigenvalue = smoothest_cross_field(mesh, self.edge_f, self.edge_g,
                                                                    c.start_iterations)
        self.start_ms = (time.perf_counter() - t0) * 1000.0
        self.x = wp.array(self.x_start, dtype=wp.vec4d, device=dev)
        self._x_start_dev = wp.array(self.x_start, dtype=wp.vec4d, device=dev)

        edge = PolyCurlData()
        edge.edge_f = wp.array(self.edge_f, dtype=wp.vec2d, device=dev)
        edge.edge_g = wp.array(self.edge_g, dtype=wp.vec2d, device=dev)
        edge.smoothness_weight = wp.float64(c.smoothness_weight)
        edge.curl_weight = wp.float64(c.curl_weight)
        edge.quotient_weight = wp.float64(c.quotient_weight)
        self.edge_data = edge

        constrained = np.zeros(mesh.face_count, dtype=np.int32)
        constrained[np.asarray(c.constrained_faces, dtype=np.int64)] = 1
        self.constrained = wp.array(constrained, dtype=wp.int32, device=dev)
        face = PolyVectorFaceData()
        face.reference = wp.array(self.x_start, dtype=wp.vec4d, device=dev)
        face.closeness_weight = wp.array(np.where(constrained != 0, c.constraint_weight, c.closeness_weight),
                                         dtype=wp.float64, device=dev)
        face.barrier_weight = wp.float64(c.barrier_weight)
        face.barrier_start = wp.float64(c.barrier_start)
        self.face_data = face

        # weight 2: the energy is the plain sum of squared residuals (TinyAD's eval_sum_of_squares)
        self.problem = wm.Problem(mesh.face_count, 4, wp.float64, dev, deterministic=self.config.deterministic)
        self.problem.add_residual_term(mesh.edge_faces, polyvector_smoothness, edge, weight=2.0, name="smoothness")
        self.problem.add_residual_term(mesh.edge_faces, polycurl, edge, weight=2.0, name="polycurl")
        faces = np.arange(mesh.face_count, dtype=np.int32)[:, None]
        self.problem.add_residual_term(faces, polyvector_closeness, face, weight=2.0, name="closeness")
        self.problem.add_residual_term(faces, polyvector_barrier, face, weight=2.0, name="barrier")
        self.solver = wm.GaussNewtonSolver(self.problem, linear_solver=c.linear_solver, damping=c.damping)
        self.start_polycurl = float(np.sum(self.polycurl(self.x_start) ** 2))

    def smoothness_weight_at(self, step: int) -> float:
        """w_s during step ``step`` (0-based): decayed every ``decay_interval`` steps."""
        c = self.config
        return c.smoothness_weight * c.smoothness_decay ** (step // c.decay_interval)

    def step(self) -> dict:
        """One Gauss-Newton round: set w_s and the closeness reference (the current field), then solve."""
        c = self.config
        w = self.smoothness_weight_at(self.steps_done)
        self.edge_data.smoothness_weight = wp.float64(w)
        wp.launch(_set_reference, dim=self.mesh.face_count,
                  inputs=[self.x, self._x_start_dev, self.constrained, self.face_data.reference], device=self.device)
        result = self.solver.solve(self.x, max_iterations=c.iterations, tolerance=c.tolerance)
        wp.copy(self.x, result.x)
        curl = float(np.sum(self.polycurl() ** 2))
        return self.record(result, smoothness_weight=w, polycurl=curl)

    # -- results ---------------------------------------------------------------------------------------------------

    def field(self) -> np.ndarray:
        """The field (alpha, beta) per face in the face frames, float64, shape (face_count, 4)."""
        return self.x.numpy().astype(np.float64)

    def field_vectors(self, x: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """alpha and beta per face in 3D, float64, shape (face_count, 3) each."""
        x = self.field() if x is None else x
        t1, t2 = self.frames
        return x[:, 0:1] * t1 + x[:, 1:2] * t2, x[:, 2:3] * t1 + x[:, 3:4] * t2

    def polycurl(self, x: np.ndarray | None = None) -> np.ndarray:
        """Unweighted polycurl per interior edge (:func:`polycurl_per_edge`)."""
        return polycurl_per_edge(self.field() if x is None else x, self.mesh, self.edge_f, self.edge_g)

    def positions(self) -> np.ndarray:
        return np.array(self.mesh.vertices, dtype=np.float64)

    def quantities(self) -> dict:
        alpha, beta = self.field_vectors()
        curl = self.polycurl()
        per_face = np.zeros(self.mesh.face_count)
        np.maximum.at(per_face, self.mesh.edge_faces[:, 0], curl)
        np.maximum.at(per_face, self.mesh.edge_faces[:, 1], curl)
        return {
            "polycurl, max over the face's edges [1]": ("faces", per_face),
            "field alpha [1]": ("face_vectors", alpha),
            "field beta [1]": ("face_vectors", beta),
            "field -alpha [1]": ("face_vectors", -alpha),
            "field -beta [1]": ("face_vectors", -beta),
        }

    def check_final(self) -> None:
        """No NaN; the energy decreased over the run (monotonically: each step starts where the last one ended, with
        a smaller or equal weight); no zero or collapsed vectors (beta stays counter-clockwise of alpha); the
        polycurl is below that of the smoothest start field."""
        super().check_final()
        x = self.field()
        assert np.all(np.isfinite(x)), f"frame_field: {int(np.sum(~np.isfinite(x)))} non-finite field coefficients"
        energies = [e for rec in self.history for e in rec["energies"]]
        if sum(r["iterations"] for r in self.history) > 0:
            assert energies[-1] < energies[0], f"frame_field: energy did not decrease ({energies[0]} -> {energies[-1]})"
        rises = np.diff(energies)
        tol = 1e-10 * max(1.0, abs(energies[0]))
        assert np.all(rises <= tol), f"frame_field: energy rose by {rises.max():.3e} at iteration {int(rises.argmax())}"
        lengths = np.minimum(np.linalg.norm(x[:, :2], axis=1), np.linalg.norm(x[:, 2:], axis=1))
        assert lengths.min() > 1e-3, (f"frame_field: face {int(lengths.argmin())} has a vector of length "
                                      f"{lengths.min():.3e}")
        sine = x[:, 0] * x[:, 3] - x[:, 1] * x[:, 2]
        assert sine.min() > 0.0, f"frame_field: face {int(sine.argmin())} has beta not counter-clockwise of alpha"
        curl = float(np.sum(self.polycurl(x) ** 2))
        assert curl < self.start_polycurl, (f"frame_field: polycurl {curl:.6g} not below the start field's "
                                            f"{self.start_polycurl:.6g}")

    def extra_metrics(self) -> dict:
        x = self.field()
        curl = float(np.sum(self.polycurl(x) ** 2))
        return {
            "start_field": {"method": "smoothest 4-RoSy power field (inverse iteration)",
                            "iterations": self.config.start_iterations, "eigenvalue": self.start_eigenvalue,
                            "time_ms": self.start_ms},
            "start_polycurl": self.start_polycurl,
            "final_polycurl": curl,
            "polycurl_reduction": curl / self.start_polycurl if self.start_polycurl > 0 else None,
            "min_vector_length": float(np.minimum(np.linalg.norm(x[:, :2], axis=1),
                                                  np.linalg.norm(x[:, 2:], axis=1)).min()),
            "min_cross_sine": float((x[:, 0] * x[:, 3] - x[:, 1] * x[:, 2]).min()),
            "interior_edge_count": int(self.mesh.interior_edges.size),
            "final_smoothness_weight": self.history[-1]["smoothness_weight"] if self.history else None,
            "linear_solver": getattr(self.solver.linear_solver, "name", None),
            "cudss_skipped_reason": self.solver.linear_solver.cudss_skipped_reason,
        }
