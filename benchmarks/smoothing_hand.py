"""AD against hand-written gradients of the smoothing app's energies (float64), side by side.

Run on a GPU host (writes benchmarks/results/smoothing_hand.json and .png, or $BENCH_OUT):

    python -m benchmarks.smoothing_hand --sizes 10 100 500 1000          # n x n grids, and spot.obj
    BENCH_OUT=/tmp/bench_smoke python -m benchmarks.smoothing_hand --device cpu --sizes 10 --runs 3   # CPU smoke run

The problems are those of ``apps/smoothing.py`` (``configs/smoothing``), built through the public API: one
``wm.Problem`` over the vertex positions x (vec3d) with one term,

    dirichlet:  E(x) = sum_e 1/2 |x_a - x_b|^2                     (built-in ``dirichlet`` on ``mesh.edges``)
    area:       E(x) = sum_f 1/2 |(x_1 - x_0) x (x_2 - x_0)|        (built-in ``surface_area`` on ``mesh.faces``)

on ``wm.TriMesh.grid(n, n)`` with z-noise of 0.2 grid spacings (so the area gradient is not zero out of the plane) and
on each ``--mesh`` file at its own positions (default: spot.obj, the app's default scene). Methods, each computing the
energy and its gradient with respect to every vertex position once (records name them ``<energy>_<method>``):

* ``ad``: ``Problem.assemble_gradient`` (forward-mode duals, one thread per element), CUDA graph;
* ``hand``: a hand-written Warp kernel, one thread per element, ``atomic_add`` of the energy and the gradients
  (dirichlet: dE/dx_a = x_a - x_b = -dE/dx_b; area: dA_f/dx_i = 1/2 n_f x (x_{i+2} - x_{i+1}), corners
  counter-clockwise, n_f the unit normal), CUDA graph.

Correctness first: ``hand``'s energy and gradient are compared with ``ad``'s (relative error <= 1e-12) before anything
is timed; ``tests/test_benchmarks_smoke.py`` also checks ``hand`` against central differences.
"""

from __future__ import annotations

import argparse
import pathlib
import traceback

import numpy as np
import warp as wp

from benchmarks.common import setup_run, time_checked, time_warp, write

NAME = "smoothing_hand"
TOLERANCE = 1e-12  # relative error allowed between the float64 AD and hand-written results
ENERGIES = ["dirichlet", "area"]
METHODS = ["ad", "hand"]
SPOT = pathlib.Path(__file__).resolve().parents[1] / "assets" / "meshes" / "spot.obj"


@wp.kernel(enable_backward=False)
def _dirichlet_hand(
    edges: wp.array2d(dtype=wp.int32),
    x: wp.array(dtype=wp.vec3d),
    energy: wp.array(dtype=wp.float64),
    grad: wp.array(dtype=wp.vec3d),
):
    # one thread per edge: E_e = 1/2 |x_a - x_b|^2, dE/dx_a = x_a - x_b = -dE/dx_b
    e = wp.tid()
    a = edges[e, 0]
    b = edges[e, 1]
    d = x[a] - x[b]
    wp.atomic_add(energy, 0, wp.float64(0.5) * wp.dot(d, d))
    wp.atomic_add(grad, a, d)
    wp.atomic_sub(grad, b, d)


@wp.kernel(enable_backward=False)
def _area_hand(
    faces: wp.array2d(dtype=wp.int32),
    x: wp.array(dtype=wp.vec3d),
    energy: wp.array(dtype=wp.float64),
    grad: wp.array(dtype=wp.vec3d),
):
    # one thread per face: A = 1/2 |N|, N = (x1 - x0) x (x2 - x0); dA/dx_i = 1/2 n x (x_{i+2} - x_{i+1})
    f = wp.tid()
    i0 = faces[f, 0]
    i1 = faces[f, 1]
    i2 = faces[f, 2]
    x0 = x[i0]
    x1 = x[i1]
    x2 = x[i2]
    nrm = wp.cross(x1 - x0, x2 - x0)
    twice = wp.length(nrm)
    wp.atomic_add(energy, 0, wp.float64(0.5) * twice)
    n = nrm / twice
    h = wp.float64(0.5)
    wp.atomic_add(grad, i0, h * wp.cross(n, x2 - x1))
    wp.atomic_add(grad, i1, h * wp.cross(n, x0 - x2))
    wp.atomic_add(grad, i2, h * wp.cross(n, x1 - x0))


def smoothing_energy(x, mesh, energy: str) -> float:
    """The energy in NumPy, float64 (the independent reference of the smoke test's central differences)."""
    if energy == "dirichlet":
        d = x[mesh.edges[:, 0]] - x[mesh.edges[:, 1]]
        return float(0.5 * np.sum(d * d))
    x0, x1, x2 = (x[mesh.faces[:, i]] for i in range(3))
    return float(0.5 * np.linalg.norm(np.cross(x1 - x0, x2 - x0), axis=1).sum())


class Case:
    """One mesh at one point on one device: positions X (numpy, float64) and x (wp.array of vec3d).

    Args:
        mesh: the triangle mesh (``wm.TriMesh``).
        X: vertex positions, shape [vertex_count, 3], float64.
        label: the mesh's name in the printed lines and records.
        device: Warp device.
    """

    def __init__(self, mesh, X: np.ndarray, label: str, device):
        self.mesh, self.label = mesh, label
        self.device = wp.get_device(device)
        self.vertex_count = mesh.vertex_count
        self.X = np.asarray(X, dtype=np.float64)
        if self.X.shape != (self.vertex_count, 3):
            raise ValueError(f"X: expected shape ({self.vertex_count}, 3), got {self.X.shape}")
        self.x = wp.array(self.X, dtype=wp.vec3d, device=self.device)

    @classmethod
    def grid(cls, n: int, device, seed: int = 0) -> Case:
        """``wm.TriMesh.grid(n, n)`` with seeded z-noise of 0.2 grid spacings."""
        import warp_meshad as wm

        mesh = wm.TriMesh.grid(n, n)
        X = mesh.vertices.copy()
        X[:, 2] = 0.2 / (n - 1) * np.random.default_rng(seed).normal(size=mesh.vertex_count)
        return cls(mesh, X, f"grid {n}x{n}", device)

    @classmethod
    def from_file(cls, path, device) -> Case:
        """A mesh file at its own vertex positions (the smoothing app's start point)."""
        import warp_meshad as wm

        mesh = wm.TriMesh.from_file(path)
        return cls(mesh, mesh.vertices, pathlib.Path(path).stem, device)


# Each method: setup(case, energy) -> (run, result). ``run`` launches energy + gradient once (graph-capturable);
# ``result`` returns (energy float, gradient numpy [vertex_count, 3]) of the last run.


def setup_ad(case: Case, energy: str):
    import warp_meshad as wm
    from warp_meshad.kernels.energies import dirichlet, surface_area

    problem = wm.Problem(case.vertex_count, 3, wp.float64, case.device)
    if energy == "dirichlet":
        problem.add_term(case.mesh.edges, dirichlet, name="dirichlet")
    else:
        problem.add_term(case.mesh.faces, surface_area, name="area")
    out = {}

    def run():
        out["e"], out["g"] = problem.assemble_gradient(case.x)

    return run, lambda: (float(out["e"].numpy()[0]), out["g"].numpy().copy())


def setup_hand(case: Case, energy: str):
    kernel, elements = (_dirichlet_hand, case.mesh.edges) if energy == "dirichlet" else (_area_hand, case.mesh.faces)
    elements = wp.array(elements, dtype=wp.int32, device=case.device)
    e = wp.zeros(1, dtype=wp.float64, device=case.device)
    g = wp.zeros(case.vertex_count, dtype=wp.vec3d, device=case.device)

    def run():
        e.zero_()
        g.zero_()
        wp.launch(kernel, dim=elements.shape[0], inputs=[elements, case.x, e, g], device=case.device)

    return run, lambda: (float(e.numpy()[0]), g.numpy().copy())


SETUP = {"ad": setup_ad, "hand": setup_hand}


def check(case: Case, energy: str, verbose: bool = True):
    """Run both methods once and compare ``hand`` with ``ad``.

    Args:
        case: the mesh and point.
        energy: ``"dirichlet"`` or ``"area"``.

    Returns:
        (ready, errors, results): ready maps each method to its ``run``; errors to its relative error against ``ad``
        (the larger of the energy's and the gradient's Frobenius error); results to its (energy, gradient).

    Raises:
        ValueError: an unknown energy.
        AssertionError: ``ad``'s result is not finite, or ``hand`` disagrees with it by more than ``TOLERANCE``.
    """
    if energy not in ENERGIES:
        raise ValueError(f"energy: expected one of {ENERGIES}, got {energy!r}")
    ready, results = {}, {}
    for m in METHODS:
        run, result = SETUP[m](case, energy)
        run()
        wp.synchronize_device(case.device)
        ready[m], results[m] = run, result()
    f_ad, g_ad = results["ad"]
    assert np.isfinite(f_ad) and np.all(np.isfinite(g_ad)), f"{energy}: AD energy or gradient is not finite"
    errors = {}
    for m, (f, g) in results.items():
        errors[m] = max(abs(f - f_ad) / max(abs(f_ad), 1e-300),
                        float(np.linalg.norm(g - g_ad) / max(np.linalg.norm(g_ad), 1e-300)))
    if verbose:
        print(f"   {energy}: hand vs ad {errors['hand']:.2e}")
    assert errors["hand"] <= TOLERANCE, f"{energy}: hand-written and AD results differ by {errors['hand']:.3e}"
    return ready, errors, results


def run_case(case: Case, energies, runs, records, suffix: str = ""):
    """Check, then time both methods of each energy on ``case``; records name them ``<energy>_<method><suffix>``."""
    print(f"-- {case.label}: {case.vertex_count} vertices, {case.mesh.edge_count} edges, {case.mesh.face_count} faces")
    timer = lambda fn, n: time_warp(fn, case.device, n)  # noqa: E731
    for energy in energies:
        ready, errors, _ = check(case, energy)  # correctness before anything is timed
        names = {m: f"{energy}_{m}{suffix}" for m in METHODS}
        time_checked(NAME, {names[m]: (run, timer, {"mesh": case.label}) for m, run in ready.items()},
                     {names[m]: err for m, err in errors.items()}, list(names.values()), runs, records,
                     case.vertex_count, "float64", str(case.device), width=22)  # fmt: skip


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="*", default=[10, 100, 500, 1000], help="n of the n x n grids")
    ap.add_argument("--mesh", nargs="*", default=[str(SPOT)], help="mesh files (none: --mesh alone)")
    ap.add_argument("--energies", nargs="+", default=ENERGIES, choices=ENERGIES)
    ap.add_argument("--device", default=None)
    ap.add_argument("--runs", type=int, default=30)
    args = ap.parse_args(argv)
    device = setup_run(args.device, args.runs)
    records = []
    # grids share one line per method in the plot; each mesh file gets its own (its name as a suffix)
    cases = [(f"grid {n}x{n}", "", lambda n=n: Case.grid(n, device)) for n in args.sizes]
    cases += [(p, f"_{pathlib.Path(p).stem}", lambda p=p: Case.from_file(p, device)) for p in args.mesh]
    for label, suffix, make in cases:
        try:
            run_case(make(), args.energies, args.runs, records, suffix)
        except Exception:
            traceback.print_exc()
            records.append({"benchmark": NAME, "mesh": label, "dtype": "float64",
                            "error": traceback.format_exc(limit=3)})
        path = write(NAME, records)
    print(f"wrote {len(records)} records to {path}")
    return records


if __name__ == "__main__":
    main()
