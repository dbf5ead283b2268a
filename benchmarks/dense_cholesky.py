"""Dense Cholesky on the GPU for small SPD systems: what cuSOLVER's potrf + potrs cost at the sizes where cuDSS's
fixed costs dominate (elastic/bunny: 3,138 unknowns, 1.1 ms a captured cuDSS factorization and solve).

Needs only CuPy (the GPU host has it without Warp). For each size: a random SPD matrix (the cost of a dense
factorization does not depend on the values), then GPU ms between CUDA events, median of ``--runs``, of

- ``potrf``: the factorization, float64 (and float32 with ``--float32``);
- ``potrs``: the two triangular solves for one right-hand side;
- ``graph``: both captured in one CUDA graph and replayed (how the device loop would run them);

and the relative residual of the solution. One JSON line per size on stdout.

    python -m benchmarks.dense_cholesky --sizes 1000 2000 3138 5000 8000
"""

from __future__ import annotations

import argparse
import json
import statistics


def _time(cp, fn, runs: int) -> float:
    """Median GPU ms of ``fn()`` between two events on the current stream."""
    out = []
    for _ in range(runs):
        start, stop = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        out.append(cp.cuda.get_elapsed_time(start, stop))
    return statistics.median(out)


def measure(n: int, runs: int, dtype: str) -> dict:
    import cupy as cp
    from cupy_backends.cuda.libs import cusolver

    rng = cp.random.default_rng(n)
    dt = cp.float64 if dtype == "float64" else cp.float32
    potrf_size, potrf, potrs = {
        "float64": (cusolver.dpotrf_bufferSize, cusolver.dpotrf, cusolver.dpotrs),
        "float32": (cusolver.spotrf_bufferSize, cusolver.spotrf, cusolver.spotrs),
    }[dtype]
    m = rng.standard_normal((n, n), dtype=cp.float64)
    a0 = (m @ m.T / n + cp.eye(n)).astype(dt)
    b0 = rng.standard_normal(n, dtype=cp.float64).astype(dt)
    stream = cp.cuda.Stream(non_blocking=True)
    handle = cp.cuda.device.get_cusolver_handle()
    cusolver.setStream(handle, stream.ptr)  # else the calls run on the handle's stream: untimed, not captured
    lower = 0  # CUBLAS_FILL_MODE_LOWER; column-major lower = row-major upper, either is the symmetric matrix
    with stream:
        a = cp.empty_like(a0)
        x = cp.empty_like(b0)
        info = cp.zeros(1, dtype=cp.int32)
        lwork = potrf_size(handle, lower, n, a.data.ptr, n)
        work = cp.empty(max(lwork, 1), dtype=dt)

        def copy_in():
            a[...] = a0
            x[...] = b0

        def factor():
            potrf(handle, lower, n, a.data.ptr, n, work.data.ptr, lwork, info.data.ptr)

        def solve():
            potrs(handle, lower, n, 1, a.data.ptr, n, x.data.ptr, n, info.data.ptr)

        def all_three():
            copy_in()
            factor()
            solve()

        all_three()
        stream.synchronize()
        copy_ms = _time(cp, copy_in, runs)
        factor_ms = []
        for _ in range(runs):
            copy_in()
            factor_ms.append(_time(cp, factor, 1))
        solve_ms = _time(cp, solve, runs)
        all_three()
        r = a0.astype(cp.float64) @ x.astype(cp.float64) - b0.astype(cp.float64)
        rel = float(cp.linalg.norm(r) / cp.linalg.norm(b0.astype(cp.float64)))
        graph_ms = None
        try:
            stream.begin_capture()
            try:
                all_three()
            finally:
                graph = stream.end_capture()  # a failed capture must still end, or every later call fails
            graph.launch(stream)
            stream.synchronize()
            graph_ms = _time(cp, lambda: graph.launch(stream), runs) - copy_ms
        except Exception as exc:  # noqa: BLE001 - a failed capture is a result here
            graph_ms = f"capture failed: {type(exc).__name__}: {exc}"
        return {"n": n, "dtype": dtype, "potrf_ms": round(statistics.median(factor_ms), 4),
                "potrs_ms": round(solve_ms, 4), "copy_ms": round(copy_ms, 4),
                "graph_factor_solve_ms": graph_ms if isinstance(graph_ms, str) else round(graph_ms, 4),
                "info": int(info.get()[0]), "rel_residual": rel}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 2000, 3138, 5000, 8000])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--float32", action="store_true", help="also float32 factors")
    args = parser.parse_args(argv)
    for n in args.sizes:
        for dtype in ["float64"] + (["float32"] if args.float32 else []):
            print(json.dumps({"benchmark": "dense_cholesky", **measure(n, args.runs, dtype)}), flush=True)


if __name__ == "__main__":
    main()
