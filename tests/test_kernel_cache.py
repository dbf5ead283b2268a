"""The warm first call (warp_meshad/_src/codegen/module_keys.py, kernel_cache._cached_kernel): a term module whose
binary and record are in the kernel cache is loaded without rebuilding it, with the same results; a changed energy
never loads a stale binary.

Each case runs small scripts in fresh processes over a private kernel cache (CPU, scalar variables, one gradient
kernel per energy: a few seconds of compile each).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    import warp as wp
    wp.config.log_level = wp.LOG_WARNING
    import warp_meshad as wm
    from warp_meshad._src.codegen import kernel_cache
    sys.path.insert(0, sys.argv[1])
    out = {}
    for name in sys.argv[2:]:
        mod = __import__(name)
        p = wm.Problem(4, 1, dtype=wp.float64, device="cpu")
        p.add_term(np.array([[0, 1], [1, 2], [2, 3]], dtype=np.int32), mod.pair_energy)
        x = wp.array(np.array([0.1, 0.7, -0.4, 1.3]), dtype=wp.float64, device="cpu")
        e, g = p.eval_with_gradient(x)
        kern = next(iter(p.terms[0].kernels.values()))
        recorded = isinstance(kern.func.__globals__.get("_energy"), kernel_cache._RecordedEnergy)
        out[name] = {"e": float(e).hex(), "g": [float(v).hex() for v in np.asarray(g.numpy() if hasattr(g, "numpy") else g)],
                     "recorded": recorded}
    print("RESULT " + json.dumps(out))
    """
)

ENERGY = textwrap.dedent(
    """
    import warp as wp
    from typing import Any

    @wp.func
    def pair_energy(e: int, a: Any, b: Any):
        d = a - b
        return {body}
    """
)


def _write(folder, name: str, body: str) -> None:
    (folder / f"{name}.py").write_text(ENERGY.format(body=body))


def _run(tmp_path, *names) -> dict:
    env = dict(os.environ, WARP_CACHE_PATH=str(tmp_path / "cache"), WARP_MESHAD_CACHE_PATH=str(tmp_path / "gen"),
               WARP_MESHAD_MODULE_RECORDS="1")
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    proc = subprocess.run([sys.executable, "-B", "-c", SCRIPT, str(tmp_path / "src"), *names], env=env,
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    line = next((s for s in proc.stdout.splitlines() if s.startswith("RESULT ")), None)
    assert line is not None, proc.stderr[-3000:]
    return json.loads(line[len("RESULT "):])


def _expected(body_fn, x=(0.1, 0.7, -0.4, 1.3)):
    e = sum(body_fn(x[i] - x[i + 1]) for i in range(3))
    return e


@pytest.fixture
def src(tmp_path):
    (tmp_path / "src").mkdir()
    return tmp_path / "src"


def test_warm_first_call_loads_the_recorded_module_with_equal_results(tmp_path, src):
    _write(src, "energy_a", "d * d * d * d")
    cold = _run(tmp_path, "energy_a")["energy_a"]
    warm = _run(tmp_path, "energy_a")["energy_a"]
    assert not cold["recorded"] and warm["recorded"]  # the second process made its kernel from the record
    assert warm["e"] == cold["e"] and warm["g"] == cold["g"]  # bitwise
    assert float.fromhex(warm["e"]) == pytest.approx(_expected(lambda d: d**4), rel=1e-14)


def test_changed_energy_of_same_name_never_loads_a_stale_binary(tmp_path, src):
    # two energies named alike (same function name), different source, in one process
    _write(src, "energy_a", "d * d * d * d")
    _write(src, "energy_b", "d * d")
    both = _run(tmp_path, "energy_a", "energy_b")
    assert float.fromhex(both["energy_a"]["e"]) == pytest.approx(_expected(lambda d: d**4), rel=1e-14)
    assert float.fromhex(both["energy_b"]["e"]) == pytest.approx(_expected(lambda d: d**2), rel=1e-14)
    # across processes: the file of energy_a changes, its name stays
    _write(src, "energy_a", "d * d * 3.0")
    changed = _run(tmp_path, "energy_a")["energy_a"]
    assert not changed["recorded"]
    assert float.fromhex(changed["e"]) == pytest.approx(_expected(lambda d: 3.0 * d**2), rel=1e-14)


def test_emptied_cache_folder_recompiles(tmp_path, src):
    import shutil

    _write(src, "energy_a", "d * d * d * d")
    first = _run(tmp_path, "energy_a")["energy_a"]
    version = next((tmp_path / "cache").iterdir())
    for sub in version.iterdir():  # binaries gone, records kept: the record must not be trusted without them
        if sub.name.startswith("wp_wm_"):
            shutil.rmtree(sub)
    again = _run(tmp_path, "energy_a")["energy_a"]
    assert not again["recorded"]
    assert again["e"] == first["e"] and again["g"] == first["g"]
