"""Surface-area gradient on an n x n grid surface, side by side.

Run on a GPU host (writes benchmarks/results/area_smoothing.json and .png, or $BENCH_OUT):

    python -m benchmarks.area_smoothing                  # sizes 10 100 384 708 1000 (n = 384: 293k faces, 708: 1M)
    BENCH_OUT=/tmp/bench_smoke python -m benchmarks.area_smoothing --device cpu --sizes 10 --runs 3   # CPU smoke run

The energy is the total area E(x) = sum_f 1/2 |(x_1 - x_0) x (x_2 - x_0)| of ``wm.TriMesh.grid(n, n)`` (2 (n - 1)^2
faces) with a little z-noise (so the gradient, the mean-curvature normal, is not zero in z), float32. Every method
computes the energy and its gradient with respect to all vertex positions:

* ``warp_meshad``: ``Problem.assemble_gradient`` of the built-in ``surface_area`` energy (forward-mode duals, one
  thread per face, atomic adds into the gradient, the block's energies summed in the kernel with one atomic add per
  thread block; one memset clears gradient and energy), CUDA graph;
* ``warp_meshad_eval``: ``Problem.eval_with_gradient`` (the same launches, then the energy read back as a float),
  host clock: it returns what JAX's ``value_and_grad`` returns, timed the same way;
* ``handwritten``: an analytic Warp kernel, one thread per face, ``atomic_add`` of the three vertex gradients, the
  block's areas summed by a tile reduction with one atomic add per thread block of 256 faces (one memset clears
  gradient and energy, which share an allocation), CUDA graph;
* ``warp_tape``: reverse mode with ``wp.Tape`` over a Warp kernel writing each face's area to its own slot (backward
  seeded with ones, so no single-address atomic in the forward pass), plus a two-pass block reduction of the areas,
  CUDA graph;
* ``jax``: ``jit(value_and_grad)`` of the vectorized area (``block_until_ready``, host clock);
* ``torch``: autograd (``backward``) of the vectorized area (CUDA events).

Correctness first: every method's energy and gradient are compared with ``handwritten`` (relative Frobenius error <=
1e-4 in float32) before anything is timed. torch and jax are optional: where they do not import they are skipped with
a message.
"""

from __future__ import annotations

import argparse
import os
import traceback

import numpy as np
import warp as wp

from benchmarks.common import setup_run, time_checked, time_host, time_torch, time_warp, write

NAME = "area_smoothing"
TOLERANCE = 1e-4  # relative Frobenius error allowed between float32 methods
ALL = ["warp_meshad", "warp_meshad_eval", "handwritten", "warp_tape", "jax", "torch"]
HAND_BLOCK = 256  # faces per thread block of the hand-written kernel on a GPU


@wp.kernel(enable_backward=False)
def _handwritten_area(
    faces: wp.array2d(dtype=wp.int32),
    x: wp.array(dtype=wp.vec3f),
    count: int,
    energy: wp.array(dtype=wp.float32),
    grad: wp.array(dtype=wp.vec3f),
):
    # a thread block per block_dim faces, a thread per face: analytic area and gradient, the gradient atomically added
    # to the three vertices; the block's areas summed by a tile reduction and added to energy[0] (one atomic per block)
    p, lane = wp.tid()
    f = p * wp.block_dim() + lane
    area = wp.float32(0.0)
    if f < count:
        i0 = faces[f, 0]
        i1 = faces[f, 1]
        i2 = faces[f, 2]
        x0 = x[i0]
        e1 = x[i1] - x0
        e2 = x[i2] - x0
        c = wp.cross(e1, e2)
        l = wp.length(c)
        area = 0.5 * l
        n = c * (0.5 / l)  # dA/dx1 = 1/2 e2 x n, dA/dx2 = 1/2 n x e1, dA/dx0 = -(dA/dx1 + dA/dx2)
        g1 = wp.cross(e2, n)
        g2 = wp.cross(n, e1)
        wp.atomic_add(grad, i1, g1)
        wp.atomic_add(grad, i2, g2)
        wp.atomic_sub(grad, i0, g1 + g2)
    wp.tile_atomic_add(energy, wp.tile_sum(wp.tile(area)), offset=0, bounds_check=False)


@wp.kernel
def _face_area(faces: wp.array2d(dtype=wp.int32), x: wp.array(dtype=wp.vec3f), energy: wp.array(dtype=wp.float32)):
    # one thread per face: its area to its own slot (differentiated by wp.Tape)
    f = wp.tid()
    x0 = x[faces[f, 0]]
    energy[f] = 0.5 * wp.length(wp.cross(x[faces[f, 1]] - x0, x[faces[f, 2]] - x0))


def area_energy(x, faces, sqrt):
    """Vectorized total area (NumPy, JAX or PyTorch arrays; ``sqrt`` from the same library). No matmul, so no
    reduced-precision (TF32) paths."""
    x0, x1, x2 = x[faces[:, 0]], x[faces[:, 1]], x[faces[:, 2]]
    a, b = x1 - x0, x2 - x0
    cx = a[:, 1] * b[:, 2] - a[:, 2] * b[:, 1]
    cy = a[:, 2] * b[:, 0] - a[:, 0] * b[:, 2]
    cz = a[:, 0] * b[:, 1] - a[:, 1] * b[:, 0]
    return (0.5 * sqrt(cx * cx + cy * cy + cz * cz)).sum()


def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


class Case:
    """The grid surface of one size on one device: mesh, float32 positions (numpy and Warp)."""

    def __init__(self, n: int, device, seed: int = 0):
        import warp_meshad as wm

        self.n = n
        self.device = wp.get_device(device)
        self.mesh = wm.TriMesh.grid(n, n)
        rng = np.random.default_rng(seed)
        X = self.mesh.vertices.copy()
        X[:, 2] = 0.2 / (n - 1) * rng.normal(size=self.mesh.vertex_count)  # z-noise of 0.2 grid spacings
        self.X = X.astype(np.float32)
        self.faces_np = self.mesh.faces.astype(np.int32)
        self.faces = wp.array(self.faces_np, dtype=wp.int32, device=self.device)
        self.x = wp.array(self.X, dtype=wp.vec3f, device=self.device)
        self.vertex_count = self.mesh.vertex_count
        self.face_count = self.mesh.face_count


class _WarpReduce:
    """Per-face energies summed with warp_meshad's two-pass block reduction (the one of Problem's deterministic
    mode)."""

    def __init__(self, case: Case):
        from warp_meshad._src.problem.reduce import partial_count

        m = case.face_count
        self.m, self.device = m, case.device
        self.part = wp.zeros(partial_count(m, case.device), dtype=wp.float32, device=case.device)
        self.total = wp.zeros(1, dtype=wp.float32, device=case.device)

    def __call__(self, per_face):
        from warp_meshad._src.problem.reduce import ordered_total

        ordered_total(per_face, self.m, self.part, self.total, self.device)


# Each method: setup(case) -> (run, result, timer). ``run`` launches (or computes) energy + gradient once; ``result``
# returns (energy float, gradient numpy (n, 3)) of the last run; ``timer(run, runs)`` returns times in ms.


def _area_problem(case: Case):
    import warp_meshad as wm
    from warp_meshad.kernels.energies import surface_area

    problem = wm.Problem(case.vertex_count, 3, dtype=wp.float32, device=case.device)
    problem.add_term(case.mesh.faces, surface_area)
    return problem


def setup_warp_meshad(case: Case):
    problem = _area_problem(case)
    out = {}

    def run():
        out["e"], out["g"] = problem.assemble_gradient(case.x)

    def result():
        return float(out["e"].numpy()[0]), out["g"].numpy().copy()

    extras = {"energy": "surface_area", "call": "assemble_gradient, CUDA graph", "face_count": case.face_count}
    return run, result, lambda fn, runs: time_warp(fn, case.device, runs), extras


def setup_warp_meshad_eval(case: Case):
    problem = _area_problem(case)
    out = {}

    def run():
        out["e"], out["g"] = problem.eval_with_gradient(case.x)  # waits for the device: the energy is a float

    def result():
        return out["e"], out["g"].numpy().copy()

    extras = {"energy": "surface_area", "call": "eval_with_gradient, host clock", "face_count": case.face_count}
    return run, result, lambda fn, runs: time_host(fn, runs), extras


def setup_handwritten(case: Case):
    nv, dev = case.vertex_count, case.device
    out = wp.zeros(3 * nv + 1, dtype=wp.float32, device=dev)  # gradient and energy in one allocation: one memset
    g = out[: 3 * nv].reshape((nv, 3)).view(wp.vec3f)
    energy = out[3 * nv :]
    block = HAND_BLOCK if dev.is_cuda else 1  # CPU blocks run one lane (without wp.config.enable_cpu_blocks)
    blocks = (case.face_count + block - 1) // block

    def run():
        out.zero_()
        wp.launch_tiled(_handwritten_area, dim=[blocks], inputs=[case.faces, case.x, case.face_count, energy, g],
                        block_dim=block, device=dev)  # fmt: skip

    def result():
        return float(energy.numpy()[0]), g.numpy().copy()

    extras = {"face_count": case.face_count, "block_dim": block}
    return run, result, lambda fn, runs: time_warp(fn, dev, runs), extras


def setup_warp_tape(case: Case):
    dev = case.device
    xt = wp.array(case.X, dtype=wp.vec3f, device=dev, requires_grad=True)
    e_face = wp.zeros(case.face_count, dtype=wp.float32, device=dev, requires_grad=True)
    seed = wp.ones(case.face_count, dtype=wp.float32, device=dev)
    reduce = _WarpReduce(case)
    tape = wp.Tape()

    def run():
        tape.reset()  # clears the recorded launch and zeroes xt.grad, e_face.grad
        with tape:
            wp.launch(_face_area, dim=case.face_count, inputs=[case.faces, xt, e_face], device=dev)
        tape.backward(grads={e_face: seed})
        reduce(e_face)

    def result():
        return float(reduce.total.numpy()[0]), xt.grad.numpy().copy()

    def timer(fn, runs):
        try:
            return time_warp(fn, dev, runs)
        except Exception as exc:  # Tape bookkeeping that a graph cannot hold: time plain launches
            print(f"   (warp_tape: graph capture failed ({exc}); timing plain launches)")
            return time_warp(fn, dev, runs, graph=False)

    return run, result, timer, {}


def setup_jax(case: Case):
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    import jax
    import jax.numpy as jnp

    jdev = jax.devices("cpu")[0] if not case.device.is_cuda else jax.devices()[0]
    if case.device.is_cuda and jdev.platform != "gpu":
        raise _Skip(f"jax has no GPU backend (default device {jdev})")
    x = jax.device_put(jnp.asarray(case.X), jdev)
    faces = jax.device_put(jnp.asarray(case.faces_np), jdev)
    fn = jax.jit(jax.value_and_grad(lambda p: area_energy(p, faces, jnp.sqrt)))
    out = {}

    def run():
        out["r"] = jax.block_until_ready(fn(x))

    def result():
        e, g = out["r"]
        return float(e), np.asarray(g)

    return run, result, lambda f, runs: time_host(f, runs), {"jax_device": str(jdev)}


def setup_torch(case: Case):
    import torch

    if case.device.is_cuda and not torch.cuda.is_available():
        raise _Skip("torch has no CUDA")
    tdev = "cuda" if case.device.is_cuda else "cpu"
    x = torch.tensor(case.X, device=tdev, requires_grad=True)
    faces = torch.tensor(case.faces_np.astype(np.int64), device=tdev)
    out = {}

    def run():
        x.grad = None
        e = area_energy(x, faces, torch.sqrt)
        e.backward()
        out["e"] = e

    def result():
        return float(out["e"].item()), x.grad.detach().cpu().numpy()

    timer = (lambda f, runs: time_torch(f, runs)) if case.device.is_cuda else (lambda f, runs: time_host(f, runs))
    return run, result, timer, {"torch_version": torch.__version__}


class _Skip(Exception):
    """A method that cannot run here (missing package or backend): reported, not an error."""


SETUP = {
    "warp_meshad": setup_warp_meshad,
    "warp_meshad_eval": setup_warp_meshad_eval,
    "handwritten": setup_handwritten,
    "warp_tape": setup_warp_tape,
    "jax": setup_jax,
    "torch": setup_torch,
}


def check(case: Case, methods=ALL, tolerance: float = TOLERANCE, verbose: bool = True):
    """Run every method once and compare energy and gradient with ``handwritten`` (always run as the reference).

    Returns:
        (ready, errors): ready maps each method that runs here to (run, timer, extras); errors maps it to the relative
        error (max of energy and gradient) against the reference. Methods that cannot run here (ImportError, no GPU
        backend) are left out with a printed message.

    Raises:
        AssertionError: a method disagrees with the reference by more than ``tolerance``.
    """
    ready, results = {}, {}
    for m in ["handwritten"] + [m for m in methods if m != "handwritten"]:
        try:
            run, result, timer, extras = SETUP[m](case)
        except ImportError as exc:
            print(f"   {m}: skipped ({exc.name or exc} not importable)")
            continue
        except _Skip as exc:
            print(f"   {m}: skipped ({exc})")
            continue
        run()
        if case.device.is_cuda:
            wp.synchronize_device(case.device)
        results[m] = result()
        ready[m] = (run, timer, extras)
    ref_e, ref_g = results["handwritten"]
    errors = {}
    for m, (e, g) in results.items():
        errors[m] = max(rel([e], [ref_e]), rel(g, ref_g))
        if verbose and m != "handwritten":
            print(f"   {m} vs handwritten: energy {rel([e], [ref_e]):.2e} gradient {rel(g, ref_g):.2e}")
    bad = {m: err for m, err in errors.items() if not err <= tolerance}
    assert not bad, f"methods disagree with handwritten beyond {tolerance:g}: {bad}"
    if "handwritten" not in methods:
        ready.pop("handwritten")
    return ready, errors


def run_size(n, device, methods, runs, records):
    case = Case(n, device)
    dev = str(case.device)
    nv = case.vertex_count
    print(f"-- {n}x{n}: {nv} vertices, {case.face_count} faces")
    ready, errors = check(case, methods)  # correctness of every method before anything is timed
    time_checked(NAME, ready, errors, methods, runs, records, nv, "float32", dev, width=14)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[10, 100, 384, 708, 1000])
    ap.add_argument("--device", default=None)
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--methods", nargs="+", default=ALL, choices=ALL)
    args = ap.parse_args(argv)
    device = setup_run(args.device, args.runs)
    records = []
    for n in args.sizes:
        try:
            run_size(n, device, args.methods, args.runs, records)
        except Exception:
            traceback.print_exc()
            records.append({"benchmark": NAME, "vertex_count": n * n, "error": traceback.format_exc(limit=3)})
        path = write(NAME, records)
    print(f"wrote {len(records)} records to {path}")
    return records


if __name__ == "__main__":
    main()
