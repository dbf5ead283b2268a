"""Hessian-vector product of the symmetric Dirichlet energy on an n x n grid, side by side.

Run on a GPU host (writes benchmarks/results/param_hvp.json and .png, or $BENCH_OUT; ``--dtype float64`` writes
param_hvp_float64.*):

    python -m benchmarks.param_hvp --sizes 10 100 500 1000
    python -m benchmarks.param_hvp --sizes 10 100 500 1000 --dtype float64
    BENCH_OUT=/tmp/bench_smoke python -m benchmarks.param_hvp --device cpu --sizes 10 --runs 3   # CPU smoke run

The energy is the parametrization energy of ``apps/param.py``: E(u) = sum_f A_f (|J_f|_F^2 + |J_f^-1|_F^2),
J_f = [u_1 - u_0, u_2 - u_0] D_m,f^-1 (+inf when det J_f <= 0), over 2D variables u (one per vertex), with the rest
frames D_m,f and areas A_f of the flat grid ``wm.TriMesh.grid(n, n)``. The uv point is the rest shape stretched by
(1.1, 0.95) plus uniform noise of +-0.1 grid spacings (flip-free, not at the minimum); v is a seeded normal vector.
Every method computes H(u) v:

* ``warp_meshad``: matrix-free ``Problem.hessian_vector_product`` (element Hessians in registers applied to v locally,
  nothing assembled), CUDA graph;
* ``warp_meshad_assembled``: the Hessian assembled once (``Problem.assemble_hessian``, not timed), then only the BSR
  SpMV ``warp.sparse.bsr_mv`` with 2x2 blocks is timed, CUDA graph;
* ``warp_meshad_assemble_spmv``: assembly (energy, gradient, Hessian) + SpMV, both timed, CUDA graph;
* ``jax``: ``jit`` of ``jvp(grad(E))`` (forward-over-reverse; ``block_until_ready``, host clock);
* ``torch``: ``torch.func.jvp`` of ``torch.func.grad`` (CUDA events).

Correctness first: every method's H v is compared with ``warp_meshad``'s (relative Frobenius error <= 1e-4 in float32,
1e-9 in float64) before anything is timed. torch and jax are optional: where they do not import they are skipped with
a message.

Both dtypes run the built-in ``symmetric_dirichlet`` with ``SymmetricDirichletData`` made for the run's dtype.
"""

from __future__ import annotations

import argparse
import os
import traceback

import numpy as np
import warp as wp

from benchmarks.common import setup_run, time_checked, time_host, time_torch, time_warp, write

NAME = "param_hvp"
TOLERANCE = {"float32": 1e-4, "float64": 1e-9}  # relative Frobenius error allowed against warp_meshad
ALL = ["warp_meshad", "warp_meshad_assembled", "warp_meshad_assemble_spmv", "jax", "torch"]


def sd_energy(u, faces, rinv, area, where):
    """Vectorized symmetric Dirichlet energy (NumPy, JAX or PyTorch arrays; ``where`` from the same library).
    The 2x2 products are written out (no matmul, so no reduced-precision TF32 paths)."""
    u0, u1, u2 = u[faces[:, 0]], u[faces[:, 1]], u[faces[:, 2]]
    a, b = u1 - u0, u2 - u0  # columns of D_s
    j00 = a[:, 0] * rinv[:, 0, 0] + b[:, 0] * rinv[:, 1, 0]
    j01 = a[:, 0] * rinv[:, 0, 1] + b[:, 0] * rinv[:, 1, 1]
    j10 = a[:, 1] * rinv[:, 0, 0] + b[:, 1] * rinv[:, 1, 0]
    j11 = a[:, 1] * rinv[:, 0, 1] + b[:, 1] * rinv[:, 1, 1]
    det = j00 * j11 - j01 * j10
    fro = j00 * j00 + j01 * j01 + j10 * j10 + j11 * j11
    return where(det > 0.0, area * (fro + fro / (det * det)), float("inf")).sum()


def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


class Case:
    """The flat grid of one size on one device: rest data, the uv point u and the direction v (numpy and Warp)."""

    def __init__(self, n: int, device, dtype: str = "float32", seed: int = 0):
        import warp_meshad as wm

        self.n = n
        self.device = wp.get_device(device)
        self.dtype = dtype
        self.np_dtype = np.float32 if dtype == "float32" else np.float64
        self.wp_scalar = wp.float32 if dtype == "float32" else wp.float64
        self.wp_vec = wp.vec2f if dtype == "float32" else wp.vec2d
        self.mesh = wm.TriMesh.grid(n, n)
        self.vertex_count, self.face_count = self.mesh.vertex_count, self.mesh.face_count
        rng = np.random.default_rng(seed)
        h = 1.0 / (n - 1)
        U = self.mesh.vertices[:, :2] * np.array([1.1, 0.95]) + rng.uniform(-0.1 * h, 0.1 * h, (self.vertex_count, 2))
        self.rinv_np = self.mesh.face_rest_frame_inverses().astype(self.np_dtype)
        self.area_np = self.mesh.face_areas().astype(self.np_dtype)
        self.U = U.astype(self.np_dtype)
        self.V = rng.normal(size=(self.vertex_count, 2)).astype(self.np_dtype)
        self.faces_np = self.mesh.faces.astype(np.int32)
        e = sd_energy(self.U.astype(np.float64), self.faces_np, self.rinv_np.astype(np.float64),
                      self.area_np.astype(np.float64), np.where)
        assert np.isfinite(e), "the perturbed uv map has a flipped triangle"
        self.u = wp.array(self.U, dtype=self.wp_vec, device=self.device)
        self.v = wp.array(self.V, dtype=self.wp_vec, device=self.device)


def _problem(case: Case, deterministic: bool = False):
    """One symmetric Dirichlet term over the faces, its data of the case's dtype."""
    import warp_meshad as wm
    from warp_meshad.kernels.energies import SymmetricDirichletData, symmetric_dirichlet

    dev, dtype = case.device, case.wp_scalar
    data = SymmetricDirichletData(
        dtype,
        rest_inverse=wp.array(case.rinv_np, dtype=wp.types.matrix((2, 2), dtype), device=dev),
        area=wp.array(case.area_np, dtype=dtype, device=dev),
    )
    problem = wm.Problem(case.vertex_count, 2, dtype=dtype, device=dev, deterministic=deterministic)
    problem.add_term(case.mesh.faces, symmetric_dirichlet, data)
    return problem, data


class _Skip(Exception):
    """A method that cannot run here (missing package or backend): reported, not an error."""


# Each method: setup(case, shared) -> (run, result, timer, extras). ``run`` computes H v once (launches, or a blocking
# call); ``result`` returns H v of the last run as numpy (n, 2); ``timer(run, runs)`` returns times in ms. ``shared``
# holds the one Problem the three warp_meshad methods use.


def _shared_problem(case: Case, shared: dict):
    if "problem" not in shared:
        shared["problem"], shared["data"] = _problem(case)
    return shared["problem"]


def _warp_timer(case: Case):
    return lambda fn, runs: time_warp(fn, case.device, runs)


def setup_warp_meshad(case: Case, shared: dict):
    problem = _shared_problem(case, shared)
    out = {}

    def run():
        out["hv"] = problem.hessian_vector_product(case.u, case.v)

    return run, lambda: out["hv"].numpy().copy(), _warp_timer(case), {}


def setup_warp_meshad_assembled(case: Case, shared: dict):
    from warp.sparse import bsr_mv

    problem = _shared_problem(case, shared)
    _, _, H = problem.assemble_hessian(case.u)  # once, not timed
    y = wp.zeros(case.vertex_count, dtype=case.wp_vec, device=case.device)

    def run():
        bsr_mv(H, case.v, y, alpha=1.0, beta=0.0)

    return run, lambda: y.numpy().copy(), _warp_timer(case), {"hessian_blocks": int(H.nnz)}


def setup_warp_meshad_assemble_spmv(case: Case, shared: dict):
    from warp.sparse import bsr_mv

    problem = _shared_problem(case, shared)
    y = wp.zeros(case.vertex_count, dtype=case.wp_vec, device=case.device)

    def run():
        _, _, H = problem.assemble_hessian(case.u)
        bsr_mv(H, case.v, y, alpha=1.0, beta=0.0)

    return run, lambda: y.numpy().copy(), _warp_timer(case), {"hessian_blocks": int(problem.hessian_block_count)}


def setup_jax(case: Case, shared: dict):
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    import jax

    if case.dtype == "float64":
        jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp

    jdev = jax.devices("cpu")[0] if not case.device.is_cuda else jax.devices()[0]
    if case.device.is_cuda and jdev.platform != "gpu":
        raise _Skip(f"jax has no GPU backend (default device {jdev})")
    put = lambda a: jax.device_put(jnp.asarray(a), jdev)  # noqa: E731
    u, v, faces, rinv, area = put(case.U), put(case.V), put(case.faces_np), put(case.rinv_np), put(case.area_np)
    if u.dtype != case.np_dtype:
        raise _Skip(f"jax made {u.dtype} arrays from {case.dtype} data")
    grad = jax.grad(lambda p: sd_energy(p, faces, rinv, area, jnp.where))
    hvp = jax.jit(lambda p, d: jax.jvp(grad, (p,), (d,))[1])
    out = {}

    def run():
        out["hv"] = jax.block_until_ready(hvp(u, v))

    return run, lambda: np.asarray(out["hv"]), lambda f, runs: time_host(f, runs), {"jax_device": str(jdev)}


def setup_torch(case: Case, shared: dict):
    import torch
    from torch.func import grad, jvp

    if case.device.is_cuda and not torch.cuda.is_available():
        raise _Skip("torch has no CUDA")
    tdev = "cuda" if case.device.is_cuda else "cpu"
    put = lambda a: torch.tensor(a, device=tdev)  # noqa: E731
    u, v, rinv, area = put(case.U), put(case.V), put(case.rinv_np), put(case.area_np)
    faces = torch.tensor(case.faces_np.astype(np.int64), device=tdev)
    g = grad(lambda p: sd_energy(p, faces, rinv, area, torch.where))
    out = {}

    def run():
        out["hv"] = jvp(g, (u,), (v,))[1]

    timer = (lambda f, runs: time_torch(f, runs)) if case.device.is_cuda else (lambda f, runs: time_host(f, runs))
    return run, lambda: out["hv"].detach().cpu().numpy(), timer, {"torch_version": torch.__version__}


SETUP = {
    "warp_meshad": setup_warp_meshad,
    "warp_meshad_assembled": setup_warp_meshad_assembled,
    "warp_meshad_assemble_spmv": setup_warp_meshad_assemble_spmv,
    "jax": setup_jax,
    "torch": setup_torch,
}


def check(case: Case, methods=ALL, tolerance: float | None = None, verbose: bool = True):
    """Run every method once and compare its H v with ``warp_meshad``'s (always run as the reference).

    Returns:
        (ready, errors): ready maps each method that runs here to (run, timer, extras); errors maps it to its
        relative Frobenius error against the reference. Methods that cannot run here (ImportError, no GPU backend)
        are left out with a printed message.

    Raises:
        AssertionError: a method disagrees with the reference by more than ``tolerance`` (default by dtype).
    """
    tolerance = TOLERANCE[case.dtype] if tolerance is None else tolerance
    shared, ready, results = {}, {}, {}
    for m in ["warp_meshad"] + [m for m in methods if m != "warp_meshad"]:
        try:
            run, result, timer, extras = SETUP[m](case, shared)
        except ImportError as exc:
            print(f"   {m}: skipped ({exc.name or exc} not importable)")
            continue
        except _Skip as exc:
            print(f"   {m}: skipped ({exc})")
            continue
        run()
        if case.device.is_cuda:
            wp.synchronize_device(case.device)
        results[m] = result()  # a copy: the warp_meshad methods share the problem's buffers
        ready[m] = (run, timer, extras)
    ref = results["warp_meshad"]
    assert np.all(np.isfinite(ref)) and np.linalg.norm(ref) > 0.0, "warp_meshad's H v is not finite or is zero"
    errors = {m: rel(hv, ref) for m, hv in results.items()}
    if verbose:
        for m, err in errors.items():
            if m != "warp_meshad":
                print(f"   {m} vs warp_meshad: H v {err:.2e}")
    bad = {m: err for m, err in errors.items() if not err <= tolerance}
    assert not bad, f"methods disagree with warp_meshad beyond {tolerance:g}: {bad}"
    if "warp_meshad" not in methods:
        ready.pop("warp_meshad")
    return ready, errors


def run_size(n, device, dtype, methods, runs, records):
    case = Case(n, device, dtype)
    dev = str(case.device)
    nv = case.vertex_count
    print(f"-- {n}x{n}: {nv} vertices, {case.face_count} faces, {dtype}")
    ready, errors = check(case, methods)  # correctness of every method before anything is timed
    time_checked(NAME, ready, errors, methods, runs, records, nv, dtype, dev, width=26)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[10, 100, 500, 1000])
    ap.add_argument("--device", default=None)
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    ap.add_argument("--methods", nargs="+", default=ALL, choices=ALL)
    args = ap.parse_args(argv)
    device = setup_run(args.device, args.runs)
    name = NAME if args.dtype == "float32" else f"{NAME}_{args.dtype}"
    records = []
    for n in args.sizes:
        try:
            run_size(n, device, args.dtype, args.methods, args.runs, records)
        except Exception:
            traceback.print_exc()
            records.append({"benchmark": NAME, "vertex_count": n * n, "dtype": args.dtype,
                            "error": traceback.format_exc(limit=3)})
        path = write(name, records)
    print(f"wrote {len(records)} records to {path}")
    return records


if __name__ == "__main__":
    main()
