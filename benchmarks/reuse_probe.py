"""How many PCG iterations with kept factors would elastic/bunny's Newton iterations need (issue 19: "factors reused
as a preconditioner")? Runs the app on the CPU (host loop), keeps every Newton system (H, rhs), then solves each one
by PCG preconditioned with the exact factors (SuperLU) of the previous system, or of the time step's first one, to a
relative residual of 1e-6 and 1e-9, and prints the PCG iteration counts (0: a factorization).

    python benchmarks/reuse_probe.py [steps]
"""
import sys
import numpy as np
import scipy.sparse as sps
import scipy.sparse.linalg as spla
import warp as wp
wp.config.quiet = True
import warp_meshad.app as appmod
from warp_meshad import NewtonSolver

systems = []
orig = NewtonSolver.solve_direction
def dump(self, H, g, out, kept=False):
    info = orig(self, H, g, out, kept=kept)
    nb = H.nrow; bs = H.block_shape[0]
    off = H.offsets.numpy()[: nb + 1]; nnz = off[-1]
    A = sps.bsr_matrix((H.values.numpy()[:nnz], H.columns.numpy()[:nnz], off), shape=(nb * bs, nb * bs)).tocsr()
    b = -g.numpy().reshape(-1).copy()  # the pinned rows of g are zero, as those of the right-hand side
    d = out.numpy().reshape(-1).copy()
    systems.append((A, b, d))
    return info
NewtonSolver.solve_direction = dump
steps = int(sys.argv[1]) if len(sys.argv) > 1 else 40
cfg = appmod.load_config("elastic/bunny", overrides={"screenshot": False, "device": "cpu", "steps": steps,
                                                     "device_loop": False})
app = appmod.app_class(cfg.app)(cfg)
its_per_step = []
for i in range(steps):
    n0 = len(systems); app.step(); its_per_step.append(len(systems) - n0)
print("systems", len(systems), "per step", its_per_step[:10], "E", app.energy)

def pcg(A, b, M, tol, maxit=50):
    x = np.zeros_like(b); r = b.copy(); z = M(r); p = z.copy(); rz = r @ z; nb = np.linalg.norm(b)
    for k in range(1, maxit + 1):
        Ap = A @ p; a = rz / (p @ Ap); x += a * p; r -= a * Ap
        if np.linalg.norm(r) <= tol * nb: return k, x
        z = M(r); rz2 = r @ z; p = z + (rz2 / rz) * p; rz = rz2
    return None, x

res = {}
for policy in ("previous", "step_first"):
    for tol in (1e-6, 1e-9):
        counts = []; k_sys = 0
        for s, n in enumerate(its_per_step):
            first = k_sys
            for j in range(n):
                A, b, d = systems[k_sys]
                ref = first if policy == "step_first" else k_sys - 1
                if k_sys == 0 or (policy == "step_first" and j == 0):
                    counts.append(0)  # a factorization
                else:
                    lu = spla.splu(systems[ref][0].tocsc())
                    it, x = pcg(A, b, lu.solve, tol)
                    counts.append(it if it is not None else -1)
                k_sys += 1
        c = np.array(counts)
        res[f"{policy}_{tol:g}"] = {"factorizations": int((c == 0).sum()), "pcg": c[c > 0].tolist()[:40],
                                    "median": float(np.median(c[c > 0])) if (c > 0).any() else None,
                                    "max": int(c.max()), "failed": int((c < 0).sum())}
        print(policy, tol, res[f"{policy}_{tol:g}"]["factorizations"], "median", res[f"{policy}_{tol:g}"]["median"],
              "max", res[f"{policy}_{tol:g}"]["max"], "failed", res[f"{policy}_{tol:g}"]["failed"],
              "hist", np.bincount(c[c > 0]).tolist())
