import numpy as np, cupy as cp, cupyx.scipy.sparse as sp, nvmath.sparse.advanced as nva
from nvmath.bindings import cudss
n = 300
a = sp.random(n, n, density=0.02, format="csr", dtype="float64", random_state=1)
a = a + a.T + sp.diags([10.0] * n, format="csr")
a = a.tocsr(); b = cp.ones(n)
s = nva.DirectSolver(a, b); s.plan()
w = np.zeros(1, dtype=np.uint64)
for param in ("PERM_REORDER_ROW", "ND_PARTITION_TREE"):
    p = getattr(cudss.DataParam, param)
    for size in (0, 4 * n, 1 << 16, 1 << 22):
        buf = np.zeros(max(size, 1), dtype=np.uint8)
        try:
            cudss.data_get(s.handle, s.data_ptr, p, buf.ctypes.data if size else 0, size, w.ctypes.data)
            print(param, size, "ok written", int(w[0]), buf[:32].view(np.int32)[:8] if size else "")
        except Exception as e:
            print(param, size, type(e).__name__, e)
try:
    print("config nd_nlevels", s.plan_config.nd_nlevels if hasattr(s.plan_config, "nd_nlevels") else "n/a")
except Exception as e:
    print("cfg", e)
print([x for x in dir(cudss.DataParam) if not x.startswith("_")])
