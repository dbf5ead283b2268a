"""Timing and result records shared by the benchmarks.

Every benchmark writes ``benchmarks/results/<name>.json``: a list of records with the keys
``benchmark, method, vertex_count, dtype, ms_median, ms_min, runs, device, date`` (plus free-form
extras), and a log-log plot ``benchmarks/results/<name>.png`` (time vs vertex count, one line per
method).
"""

from __future__ import annotations

import datetime
import json
import os
import pathlib
import statistics
import time
import traceback

RESULTS = pathlib.Path(__file__).resolve().parent / "results"


def out_dir() -> pathlib.Path:
    """Where results go: ``$BENCH_OUT`` if set (e.g. a device run's $OUT), else benchmarks/results."""
    d = pathlib.Path(os.environ.get("BENCH_OUT", RESULTS))
    d.mkdir(parents=True, exist_ok=True)
    return d


def record(benchmark, method, vertex_count, dtype, times_ms, device, **extra) -> dict:
    return {
        "benchmark": benchmark,
        "method": method,
        "vertex_count": int(vertex_count),
        "dtype": dtype,
        "ms_median": float(statistics.median(times_ms)),
        "ms_min": float(min(times_ms)),
        "runs": len(times_ms),
        "device": device,
        "date": datetime.date.today().isoformat(),
        **extra,
    }


def run_sizes(name: str, sizes, run, key: str = "size") -> list[dict]:
    """``run(n, records)`` for every size n; a size that raises is printed and recorded as ``{"benchmark": name,
    key: n, "error": ...}`` and the next one runs; the records are written after each size. Returns the records."""
    records: list[dict] = []
    for n in sizes:
        try:
            run(n, records)
        except Exception:
            traceback.print_exc()
            records.append({"benchmark": name, key: n, "error": traceback.format_exc(limit=3)})
        write(name, records)
    print(f"wrote {len(records)} records")
    return records


def write(name: str, records: list[dict]) -> pathlib.Path:
    """Write records atomically and redraw the plot."""
    path = out_dir() / f"{name}.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(records, indent=1))
    os.replace(tmp, path)
    try:
        plot(name, records)
    except Exception as exc:  # plotting is a convenience; never lose the numbers for it
        print(f"(plot skipped: {exc})")
    return path


def plot(name: str, records: list[dict]):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4.5))
    methods = sorted({r["method"] for r in records if "ms_median" in r})
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, m in enumerate(methods):  # more methods than colours: the line style and marker tell them apart
        pts = sorted((r["vertex_count"], r["ms_median"]) for r in records if r.get("method") == m and "ms_median" in r)
        if pts:
            ax.loglog(*zip(*pts), color=colors[i % len(colors)], linestyle=("-", "--", ":")[i // len(colors) % 3],
                      marker="os^D"[i // len(colors) % 4], label=m)  # fmt: skip
    ax.set_xlabel("vertices")
    ax.set_ylabel("time [ms] (median)")
    ax.set_title(name)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out_dir() / f"{name}.png", dpi=120)
    plt.close(fig)


def time_warp(fn, device, runs=30, warmup=3, graph=True) -> list[float]:
    """Median-ready times (ms) of ``fn`` (Warp launches) on ``device``: CUDA-graph replays timed with
    events on a GPU, host timing with synchronization on the CPU."""
    import warp as wp

    device = wp.get_device(device)
    for _ in range(warmup):
        fn()
    wp.synchronize_device(device)
    if not device.is_cuda:
        times = []
        for _ in range(runs):
            t = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t) * 1e3)
        return times
    g = None
    if graph:
        with wp.ScopedCapture(device=device) as cap:
            fn()
        g = cap.graph
    times = []
    start = wp.Event(device, enable_timing=True)
    end = wp.Event(device, enable_timing=True)
    for _ in range(runs):
        wp.record_event(start)
        if g is not None:
            wp.capture_launch(g)
        else:
            fn()
        wp.record_event(end)
        wp.synchronize_event(end)
        times.append(wp.get_event_elapsed_time(start, end))
    return times


def time_torch(fn, runs=30, warmup=3) -> list[float]:
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(runs):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e))
    return times


def time_host(fn, runs=30, warmup=3) -> list[float]:
    """Host wall time (ms) of a function that blocks until its result is ready (e.g. JAX with
    ``block_until_ready``)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e3)
    return times


def time_checked(benchmark, ready, errors, methods, runs, records, vertex_count, dtype, device, width=14):
    """Time every method that passed its correctness check and append its record.

    Args:
        ready: ``{method: (run, timer, extras)}`` for the methods that passed; ``timer(run, runs)`` gives times in ms.
        errors: ``{method: relative error vs the reference}``, stored as ``check_rel_error``.
        records: list the records go to; a method that fails while timed gets an ``error`` record instead.
    """
    for m in methods:
        if m not in ready:
            continue
        run, timer, extras = ready[m]
        try:
            times = timer(run, runs)
        except Exception:
            traceback.print_exc()
            records.append({"benchmark": benchmark, "method": m, "vertex_count": vertex_count, "dtype": dtype,
                            "device": device, "error": traceback.format_exc(limit=2)})
            continue
        r = record(benchmark, m, vertex_count, dtype, times, device, check_rel_error=errors[m], **extras)
        records.append(r)
        print(f"   {m:{width}s} median {r['ms_median']:9.4f} ms  min {r['ms_min']:9.4f} ms")


def setup_run(device_arg, runs: int) -> str:
    """Initialize Warp and pick the device (the first CUDA device by default, else the CPU). Warns when ``runs``
    is too few to be a measurement; a CPU run without ``$BENCH_OUT`` writes to a temporary folder, so CPU numbers
    never overwrite the committed GPU results."""
    import warp as wp

    wp.config.log_level = wp.LOG_WARNING
    wp.init()
    device = device_arg or ("cuda:0" if wp.get_cuda_device_count() else "cpu")
    if runs < 20:
        print(f"--runs {runs} < 20: a smoke run, not a measurement (medians of >= 20 runs are reported)")
    guard_cpu_out(wp.get_device(device).is_cuda)
    return device


def guard_cpu_out(is_cuda: bool):
    """A CPU run without ``$BENCH_OUT`` writes to a temporary folder, never over the committed GPU results."""
    import tempfile

    if not is_cuda and "BENCH_OUT" not in os.environ:
        os.environ["BENCH_OUT"] = os.path.join(tempfile.gettempdir(), "bench_cpu")
        print(f"CPU run without $BENCH_OUT: writing to {os.environ['BENCH_OUT']}")
