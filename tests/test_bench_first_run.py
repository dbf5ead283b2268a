"""benchmarks/first_run.py's bookkeeping: warm medians per phase and the printed table (synthetic records; the
processes themselves are what the benchmark times, on a GPU host)."""

from benchmarks import first_run


def _rec(run, index, wall, phases, total=None, error=False):
    r = {"benchmark": "first_run", "scene": "cloth/hanging", "test_size": True, "device": "cpu", "set": [],
         "run": run, "index": index, "wall_s": wall, "rc": 0, "phases_s": phases, "phases_total_s": total,
         "time_ms": {"setup": 100.0 * wall}}
    if error:
        r["error"] = "boom"
    return r


def test_warm_medians_take_every_phase_of_the_warm_runs_only():
    records = [
        _rec("cold", 0, 9.0, {"setup": {"config": 5.0}}, 9.0),
        _rec("warm", 1, 1.0, {"setup": {"config": 0.1, "mesh read": 0.3}, "steps": {"first": 0.5}}, 0.9),
        _rec("warm", 2, 3.0, {"setup": {"config": 0.3}, "steps": {"first": 0.7}}, 2.9),
        _rec("warm", 3, 2.0, {"setup": {"config": 0.2, "mesh read": 0.1}, "steps": {"first": 0.6}}, 1.9),
        _rec("warm", 4, 0.1, {}, None, error=True),  # a failed run counts for nothing
    ]
    med = first_run.warm_median(records)
    assert (med["run"], med["runs"], med["wall_s"], med["phases_total_s"]) == ("warm median", 3, 2.0, 1.9)
    assert med["phases_s"] == {"setup": {"config": 0.2, "mesh read": 0.1}, "steps": {"first": 0.6}}  # missing: 0
    assert med["time_ms"] == {"setup": 200.0}
    text = first_run.table(records + [med, {"benchmark": "first_run", "run": "import", "module": "warp_meshad",
                                            "median_s": 0.05, "min_s": 0.04}])
    lines = text.splitlines()
    assert lines[0] == "cloth/hanging (test size): cold 9.0 s wall, warm median 2.0 s wall over 3 runs"
    assert "  setup    mesh read           0.100" in lines and "           (setup)             0.300" in lines
    assert lines[-1] == "python -c 'import warp_meshad': median 0.05 s, min 0.04 s"
    assert first_run.warm_median([records[0]]) is None
