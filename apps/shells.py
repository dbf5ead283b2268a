"""Elastic shells with IPC contact: copies of a closed mesh (Spot) fall onto a ground plane and onto each other.

Run: ``warp-meshad run configs/shells/spot_drop.yaml`` (``--test`` for the small size); the ~700-Spot
``configs/shells/spot_pile.yaml`` is GPU-sized.

Each time step h minimizes, over all vertex positions x (float64, variable_dim 3),

    E(x) = sum_i m_i / (2 h^2) |x_i - x~_i|^2 - sum_i m_i g . x_i       (inertia + gravity, per vertex)
         + sum_f t A_f psi_NH(F_f)                                      (Neo-Hookean membrane, per face)
         + sum_e k_b w_e (theta_e - theta_e^rest)^2                     (discrete shells bending, per interior edge)
         + sum_i kappa b(s_i^2)                                         (ground plane barrier, per vertex)
         + sum_pt kappa b(d_pt^2) + sum_ee kappa m_ee b(d_ee^2)         (IPC barriers: interaction terms)

with x~ = x^n + h v^n, then v^{n+1} = (x^{n+1} - x^n) / h. Masses are lumped (density x thickness x a third of the
incident rest areas).

The contact pairs change at run time; the step runs the shared projected Newton loop (``wm.NewtonSolver``) with its
hooks (``NewtonHooks``):

1. contact detection (hook ``before_derivatives``): point-triangle and edge-edge pairs closer than d_hat
   (``ContactSearch.find_pairs``) become the elements of the two interaction terms
   (``Problem.set_interaction_elements``);
2. derivatives + assembly: ``Problem.eval_with_hessian_proj`` (per-element PSD projection);
3. linear solve: ``H d = -g`` with ``wm.make_linear_solver(config.linear_solver)``;
4. line search: the trial energy (hook ``line_search_energy``) is evaluated with the pairs of the swept broad phase
   inflated by d_hat (a superset of every pair within d_hat along the step, so the energy is exact); the step is
   bounded by continuous collision detection (``step_bound_fn``), t_max = min(ACCD over those pairs, exact plane
   bound); Armijo backtracking (shrink 0.5, c = 1e-4) rejects +inf.

Newton stops (hook ``stop``, reason ``"newton_step"``) when the step's infinity norm divided by h falls below
``tolerance`` [m/s] (the IPC criterion); the driver's own gradient, decrement and energy-change tests are off.

Choice of kappa (``contact_stiffness: null``): kappa = Y t / d_hat^2 [J/m^4]. The barrier's stiffness along the
distance s is d^2 (kappa b(s^2)) / ds^2 ~ kappa d_hat^2 x O(1) [N/m] at s ~ d_hat / 2, so this makes it comparable to
the membrane's stretching stiffness Y t [N/m] (Young's modulus x thickness); the same kappa serves the ground barrier.
d_hat defaults to 1e-3 x the bounding-box diagonal of one (scaled) Spot: a larger d_hat inflates the pair count.

Per step, the record holds ``phase_ms`` (contact detection, derivatives+assembly, linear solve, line search, in ms),
``intersections`` (pairs of non-adjacent faces that intersect after the step, exact test; must be 0),
``linear_solves_capped`` (CG solves that stopped at ``cg_max_iterations`` above ``cg_tolerance``) and
``steepest_descent_fallbacks`` (Newton iterations that stepped along -g: a failed linear solve or a direction that
does not descend), with ``fallback_reasons``.
"""

from __future__ import annotations

from typing import ClassVar, Literal, Optional

import numpy as np
import warp as wp

import warp_meshad as wm
from warp_meshad.app import App as _AppBase
from warp_meshad.app import AppConfig
from warp_meshad.contact import ContactSearch, edge_edge_mollifier_thresholds, max_step, plane_max_step
from warp_meshad import TriMesh
from warp_meshad.dynamics import add_inertia_gravity, predict_positions
from warp_meshad.kernels.energies import (
    BarrierData,
    DiscreteShellsBendingData,
    EdgeEdgeBarrierData,
    GroundPlaneData,
    NeoHookeanMembraneData,
    discrete_shells_bending,
    discrete_shells_rest_state,
    edge_edge_barrier,
    ground_plane_barrier,
    neo_hookean_membrane,
    point_triangle_barrier,
)

__all__ = ["App", "ShellsConfig"]

PHASES = ("contact_detection", "derivatives_assembly", "linear_solve", "line_search")


class ShellsConfig(AppConfig):
    """Config of the shells app (fields beyond :class:`AppConfig`; ``mesh`` is the object instanced on the grid).

    Attributes:
        dtype: only ``"float64"`` (the contact kernels are float64).
        solver: only ``"newton"`` (projected Newton with contact, see the module docstring).
        layout: copies along x, layers along y (up), copies along z: ``count = product``.
        size: each copy is scaled so its largest bounding-box extent is this [m].
        gap: space between neighbouring copies' bounding boxes [m].
        height: gap between the lowest copy and the ground [m].
        ground_height: y of the ground plane [m] (normal +y).
        time_step: h [s].
        tolerance: Newton stops when max |step| / h < tolerance [m/s].
        density: shell material density [kg/m^3]; mass = density x thickness x area.
        thickness: shell thickness t [m].
        young: Young's modulus Y [Pa]; poisson: Poisson's ratio nu.
        bending_stiffness: k_b of the discrete shells bending [J].
        dhat_ratio: d_hat = dhat_ratio x the bounding-box diagonal of one copy.
        contact_stiffness: kappa [J/m^4]; null: Y t / d_hat^2 (see the module docstring).
        gravity: acceleration of gravity [m/s^2].
        max_line_search_tries: Armijo backtracking cap (shrink 0.5).
        cg_tolerance: relative residual tolerance of the ``"cg"`` linear solver (inexact Newton steps).
        cg_max_iterations: iteration cap of the ``"cg"`` linear solver (0: no cap).
    """

    deterministic_supported: ClassVar[bool] = False  # the contact terms are interaction terms
    app: str = "shells"
    dtype: Literal["float64"] = "float64"
    solver: Literal["newton"] = "newton"
    steps: int = 20
    iterations: int = 50
    tolerance: float = 1e-3
    layout: tuple[int, int, int] = (2, 1, 1)
    size: float = 0.2
    gap: float = 0.01
    height: float = 0.005
    ground_height: float = 0.0
    time_step: float = 0.01
    density: float = 1000.0
    thickness: float = 1e-3
    young: float = 1e6
    poisson: float = 0.3
    bending_stiffness: float = 1e-3
    dhat_ratio: float = 1e-3
    contact_stiffness: Optional[float] = None
    gravity: tuple[float, float, float] = (0.0, -9.81, 0.0)
    max_line_search_tries: int = 60
    cg_tolerance: float = 1e-8
    cg_max_iterations: int = 0

    def validate(self):
        errors = super().validate()
        if not self.cg_tolerance > 0.0:
            errors.append(("cg_tolerance", f"expected a number > 0, got {self.cg_tolerance}"))
        if self.cg_max_iterations < 0:
            errors.append(("cg_max_iterations", f"expected an int >= 0, got {self.cg_max_iterations}"))
        for key in ("size", "time_step", "density", "thickness", "young", "dhat_ratio"):
            if not getattr(self, key) > 0.0:
                errors.append((key, f"expected a number > 0, got {getattr(self, key)}"))
        for key in ("gap", "height", "bending_stiffness"):
            if not getattr(self, key) >= 0.0:
                errors.append((key, f"expected a number >= 0, got {getattr(self, key)}"))
        if not -1.0 < self.poisson < 0.5:
            errors.append(("poisson", f"expected a number in (-1, 0.5), got {self.poisson}"))
        if any(k < 1 for k in self.layout):
            errors.append(("layout", f"expected three ints >= 1, got {list(self.layout)}"))
        if self.contact_stiffness is not None and not self.contact_stiffness > 0.0:
            errors.append(("contact_stiffness", f"expected a number > 0 or null, got {self.contact_stiffness}"))
        return errors


def _instances(single: TriMesh, c: ShellsConfig) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(positions, faces, object id per vertex) of the copies on the grid, the lowest at ``height`` above ground."""
    v = np.asarray(single.vertices, dtype=np.float64)
    lo, hi = v.min(axis=0), v.max(axis=0)
    v = (v - 0.5 * (lo + hi)) * (c.size / float((hi - lo).max()))
    ext = v.max(axis=0) - v.min(axis=0)
    nx, ny, nz = c.layout
    xs, faces, ids = [], [], []
    n = single.vertex_count
    k = 0
    for j in range(ny):
        for i in range(nx):
            for m in range(nz):
                offset = np.array([
                    (i - 0.5 * (nx - 1)) * (ext[0] + c.gap),
                    c.ground_height + c.height + 0.5 * ext[1] + j * (ext[1] + c.gap),
                    (m - 0.5 * (nz - 1)) * (ext[2] + c.gap),
                ])
                xs.append(v + offset)
                faces.append(single.faces + k * n)
                ids.append(np.full(n, k, dtype=np.int32))
                k += 1
    return np.concatenate(xs), np.concatenate(faces).astype(np.int32), np.concatenate(ids)


class App(_AppBase):
    """The shells app: one backward Euler step with IPC contact per :meth:`step`.

    Attributes (beyond :class:`~warp_meshad.app.App`):
        mesh: all copies in one :class:`TriMesh` (``single`` is one copy as loaded).
        problem: the :class:`warp_meshad.Problem` of one time step; ``pt_term`` / ``ee_term`` its interaction terms.
        search: the :class:`ContactSearch` over all copies (self-contact and between objects).
        x, v: positions and velocities, wp.array of vec3d; x0 the start positions (numpy); object_id per vertex.
        d_hat, kappa: barrier activation distance [m] and stiffness [J/m^4].
        solver: the :class:`wm.NewtonSolver` of every step, with the contact hooks; linear_solver its back-end.
    """

    name = "shells"
    config_class = ShellsConfig

    def __init__(self, config: ShellsConfig, prepared: dict | None = None):
        super().__init__(config, prepared)
        c = self.config
        self.require_nondegenerate(faces="the membrane inverts each face's rest frame; bending needs face normals")
        dev = self.device
        self.single = self.mesh
        x0, faces, self.object_id = _instances(self.single, c)
        self.mesh = TriMesh(x0, faces)
        self.count = int(np.prod(c.layout))
        self.x0 = x0
        n = self.mesh.vertex_count
        one = x0[: self.single.vertex_count]
        self.d_hat = c.dhat_ratio * float(np.linalg.norm(one.max(axis=0) - one.min(axis=0)))
        self.kappa = c.contact_stiffness if c.contact_stiffness is not None else c.young * c.thickness / self.d_hat**2

        areas = self.mesh.face_areas()
        vertex_area = np.bincount(faces.ravel(), weights=np.repeat(areas / 3.0, 3), minlength=n)
        self.masses = c.density * c.thickness * vertex_area

        p = wm.Problem(n, 3, wp.float64, dev)
        self.x = wp.array(x0, dtype=wp.vec3d, device=dev)
        self.v = wp.zeros(n, dtype=wp.vec3d, device=dev)
        self.inertia = add_inertia_gravity(p, self.mesh.vertex_indices, self.x, self.masses, c.gravity, c.time_step)

        mem = NeoHookeanMembraneData()
        mem.rest_inverse = wp.array(self.mesh.face_rest_frame_inverses(), dtype=wp.mat22d, device=dev)
        mem.area = wp.array(areas, dtype=wp.float64, device=dev)
        mu = c.young / (2.0 * (1.0 + c.poisson))
        mem.mu = wp.float64(mu)
        mem.lam = wp.float64(c.young * c.poisson / ((1.0 + c.poisson) * (1.0 - 2.0 * c.poisson)))
        mem.thickness = wp.float64(c.thickness)
        p.add_term(faces, neo_hookean_membrane, mem, name="membrane")

        diamonds = self.mesh.edge_diamonds
        if c.bending_stiffness > 0.0 and len(diamonds):
            angle, weight = discrete_shells_rest_state(x0, diamonds)
            bend = DiscreteShellsBendingData()
            bend.rest_angle = wp.array(angle, dtype=wp.float64, device=dev)
            bend.weight = wp.array(weight, dtype=wp.float64, device=dev)
            bend.stiffness = wp.float64(c.bending_stiffness)
            p.add_term(diamonds, discrete_shells_bending, bend, name="bending")

        self.ground_origin = np.array([0.0, c.ground_height, 0.0])
        self.ground_normal = np.array([0.0, 1.0, 0.0])
        ground = GroundPlaneData()
        ground.origin = wp.vec3d(*self.ground_origin)
        ground.normal = wp.vec3d(*self.ground_normal)
        ground.activation_distance = wp.float64(self.d_hat)
        ground.stiffness = wp.float64(self.kappa)
        p.add_term(self.mesh.vertex_indices, ground_plane_barrier, ground, name="ground")

        pt = BarrierData()
        pt.activation_distance = wp.float64(self.d_hat)
        pt.stiffness = wp.float64(self.kappa)
        self.pt_term = p.add_interaction_term(point_triangle_barrier, 4, pt, capacity=1024, name="point_triangle")
        ee = EdgeEdgeBarrierData()
        ee.activation_distance = wp.float64(self.d_hat)
        ee.stiffness = wp.float64(self.kappa)
        ee.mollifier_threshold = wp.zeros(1, dtype=wp.float64, device=dev)
        self.ee_data = ee
        self.ee_term = p.add_interaction_term(edge_edge_barrier, 4, ee, capacity=1024, name="edge_edge")
        self.problem = p
        self.rest = wp.array(x0, dtype=wp.vec3d, device=dev)
        self.search = ContactSearch(faces, self.mesh.edges, vertex_count=n, device=dev)
        options = {}
        if c.linear_solver == "cg":
            options = dict(tol=c.cg_tolerance, maxiter=c.cg_max_iterations or None)
        self.linear_solver = wm.make_linear_solver(c.linear_solver, device=dev, **options)
        hooks = wm.NewtonHooks(before_derivatives=self._find_pairs, line_search_energy=self._swept_energy,
                            stop=self._small_step)
        self.solver = wm.NewtonSolver(p, linear_solver=self.linear_solver,
                                      line_search=wm.LineSearch(shrink=0.5, tries=c.max_line_search_tries),
                                      step_bound_fn=self._ccd_bound, hooks=hooks)
        self._swept = None  # the pairs of the current line search's swept broad phase
        self._max_pairs = (0, 0)  # the most pairs (point-triangle, edge-edge) found in this step
        self.pair_counts: list[tuple[int, int]] = []

    # -------------------------------------------------------------------------------- contact

    def set_contact_pairs(self, pairs) -> tuple[int, int]:
        """Make ``pairs`` (device arrays, passed straight through) the elements of the interaction terms; the next
        Hessian evaluation merges their blocks into the pattern on the device."""
        pt, ee = pairs.point_triangle, pairs.edge_edge
        self.problem.set_interaction_elements(self.pt_term, pt)
        self.ee_data.mollifier_threshold = (edge_edge_mollifier_thresholds(self.rest, ee, device=self.device)
                                            if ee.shape[0] else wp.zeros(1, dtype=wp.float64, device=self.device))
        self.problem.set_interaction_elements(self.ee_term, ee)
        return int(pt.shape[0]), int(ee.shape[0])

    def _find_pairs(self, x: wp.array) -> None:
        """Hook before the derivatives at x: the pairs closer than d_hat become the interaction terms' elements."""
        self._max_pairs = max(self._max_pairs, self.set_contact_pairs(self.search.find_pairs(x, self.d_hat)))

    def _swept_energy(self, x: wp.array, d: wp.array):
        """Hook of the line search along d: the pairs of the swept broad phase (inflated by d_hat, so every pair within
        d_hat of a trial point) become the elements; the trial energy is then the problem's energy."""
        self._swept = self.search.find_pairs(x, self.d_hat, dx=d)
        self.set_contact_pairs(self._swept)
        return self.problem.eval

    def _ccd_bound(self, x: wp.array, d: wp.array) -> float:
        """Step bound along d: ACCD over the swept pairs of :meth:`_swept_energy`, and the exact ground-plane bound."""
        bound = max_step(x, d, self._swept.point_triangle, self._swept.edge_edge, device=self.device)
        return min(bound, plane_max_step(x, d, self.ground_origin, self.ground_normal, device=self.device))

    def _small_step(self, x: wp.array, d: wp.array) -> str | None:
        """Stop test (IPC): the Newton step's infinity norm divided by h below ``tolerance``."""
        c = self.config
        return "newton_step" if np.abs(d.numpy()).max() / c.time_step < c.tolerance else None

    # -------------------------------------------------------------------------------- time step

    def step(self) -> dict:
        c = self.config
        dev = self.device
        h = c.time_step
        predict_positions(self.x, self.v, h, self.inertia.target)
        self._max_pairs = (0, 0)
        # only the hook's step test stops early: no gradient, decrement or energy-change test
        res = self.solver.solve(self.x, max_iterations=c.iterations, tolerance=0.0, gradient_tolerance=0.0,
                                energy_tolerance=0.0)
        t = res.time_ms
        ms = {"contact_detection": t["before_derivatives"], "derivatives_assembly": t["derivatives"],
              "linear_solve": t["linear_solve"], "line_search": t["line_search"]}
        res.time_ms = {**ms, "total": t["total"]}

        # velocity, positions, then the exact intersection test over all non-adjacent face pairs
        vnp = (res.x.numpy() - self.x.numpy()) / h
        self.v = wp.array(vnp, dtype=wp.vec3d, device=dev)
        wp.copy(self.x, res.x)
        inter = self.search.intersecting_face_pairs(self.x)
        self.pair_counts.append(self._max_pairs)
        return self.record(res, time=(self.steps_done + 1) * h, phase_ms=dict(ms),
                           intersections=int(inter.shape[0]), point_triangle_pairs=self._max_pairs[0],
                           edge_edge_pairs=self._max_pairs[1], linear_iterations=list(res.linear_iterations))

    # -------------------------------------------------------------------------------- outputs and checks

    def positions(self) -> np.ndarray:
        return self.x.numpy().astype(np.float64)

    def heights(self, x=None) -> np.ndarray:
        x = self.positions() if x is None else x
        return (x - self.ground_origin) @ self.ground_normal

    def quantities(self) -> dict:
        return {
            "object: index of the instance [label]": ("vertices", self.object_id.astype(np.float64)),
            "speed [m/s]": ("vertices", np.linalg.norm(self.v.numpy(), axis=1)),
        }

    def check_final(self) -> None:
        """Base checks (finite positions and energies, no step raised its energy), plus: no Newton solve stopped on a
        non-finite energy, no intersecting non-adjacent face pair after any step, every vertex above the ground, and
        every object's centroid lower than at the start."""
        super().check_final()
        for rec in self.history:
            assert rec["reason"] != "non_finite_energy", f"shells: step {rec['step']}: a non-finite energy"
            assert rec["intersections"] == 0, (
                f"shells: step {rec['step']}: {rec['intersections']} intersecting face pairs")
        inter = self.search.intersecting_face_pairs(self.x)
        assert inter.shape[0] == 0, f"shells: {inter.shape[0]} intersecting face pairs at the end"
        x = self.positions()
        s = self.heights(x)
        assert s.min() > 0.0, f"shells: vertex {int(s.argmin())} is {-s.min():.3e} m below the ground"
        if self.steps_done > 0:
            h0 = np.bincount(self.object_id, weights=self.heights(self.x0)) / np.bincount(self.object_id)
            h1 = np.bincount(self.object_id, weights=s) / np.bincount(self.object_id)
            drop = h0 - h1
            assert drop.min() > 0.0, f"shells: object {int(drop.argmin())} did not fall (moved {-drop.min():.3e} m up)"

    def extra_metrics(self) -> dict:
        totals = self.history.total("phase_ms", {})
        phases = {k: totals.get(k, 0.0) for k in PHASES}
        total = sum(phases.values())
        return {
            "objects": self.count,
            "d_hat": self.d_hat,
            "kappa": self.kappa,
            "phase_ms": phases,
            "phase_fraction": {k: (v / total if total > 0 else 0.0) for k, v in phases.items()},
            "phase_ms_per_step": [r["phase_ms"] for r in self.history],
            "intersections_per_step": [r["intersections"] for r in self.history],
            "min_ground_distance": float(self.heights().min()),
            "max_point_triangle_pairs": max((p[0] for p in self.pair_counts), default=0),
            "max_edge_edge_pairs": max((p[1] for p in self.pair_counts), default=0),
            "linear_solver": getattr(self.linear_solver, "name", None),
            "cudss_skipped_reason": self.linear_solver.cudss_skipped_reason,
            "linear_solves_capped_per_step": [r["linear_solves_capped"] for r in self.history],
            "steepest_descent_fallbacks_per_step": [r["steepest_descent_fallbacks"] for r in self.history],
        }
