"""The warm first call (warp_meshad/_src/codegen/module_keys.py, kernel_cache._cached_kernel): a term module whose
binary and record are in the kernel cache is loaded without rebuilding it, with the same results; a changed energy
never loads a stale binary; problems over the same energy in one process share one kernel (one module), also when
it was made from a record, and Warp may hash such a module again; WARP_MESHAD_MODULE_RECORDS=0 turns the records
off.

Each case runs small scripts in fresh processes over a private kernel cache (CPU, scalar variables, one gradient
kernel per energy: a few seconds of compile each).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
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


def _run(tmp_path, *names, records: str = "1") -> dict:
    env = dict(os.environ, WARP_CACHE_PATH=str(tmp_path / "cache"), WARP_MESHAD_CACHE_PATH=str(tmp_path / "gen"),
               WARP_MESHAD_MODULE_RECORDS=records)
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
    off = _run(tmp_path, "energy_a", records="0")["energy_a"]  # the records turned off: Warp's normal path
    assert not off["recorded"] and off["e"] == cold["e"] and off["g"] == cold["g"]


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


TWO_PROBLEMS = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    import warp as wp
    wp.config.log_level = wp.LOG_WARNING
    import warp_meshad as wm
    from warp_meshad._src.codegen import kernel_cache
    sys.path.insert(0, sys.argv[1])
    mod = __import__(sys.argv[2])
    problems, out = [], []
    for n in (4, 6):  # two problems over the same energy (different sizes, same kernel facts)
        p = wm.Problem(n, 1, dtype=wp.float64, device="cpu")
        p.add_term(np.array([[i, i + 1] for i in range(n - 1)], dtype=np.int32), mod.pair_energy)
        x = wp.array(np.linspace(-0.5, 0.9, n) ** 2, dtype=wp.float64, device="cpu")
        e, g = p.eval_with_gradient(x)
        kern = next(iter(p.terms[0].kernels.values()))
        recorded = isinstance(kern.func.__globals__.get("_energy"), kernel_cache._RecordedEnergy)
        problems.append((p, x, kern))
        out.append({"e": float(e).hex(), "g": [float(v).hex() for v in g.numpy()], "kernel": id(kern),
                    "module": kern.module.name, "live": len(kern.module._get_live_kernels()), "recorded": recorded})
    for (p, x, kern), r in zip(problems, out):
        # Warp made to hash the module again (a public call that marks it modified): a kernel made from a record must
        # still be complete enough for Warp to hash, and if needed generate, its module
        wp.set_module_options({"enable_backward": False}, module=kern.module)
        e, g = p.eval_with_gradient(x)
        r.update(e2=float(e).hex(), g2=[float(v).hex() for v in g.numpy()])
    print("RESULT " + json.dumps(out))
    """
)


def _run_two_problems(tmp_path, name: str) -> list:
    env = dict(os.environ, WARP_CACHE_PATH=str(tmp_path / "cache"), WARP_MESHAD_CACHE_PATH=str(tmp_path / "gen"),
               WARP_MESHAD_MODULE_RECORDS="1")
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    proc = subprocess.run([sys.executable, "-B", "-c", TWO_PROBLEMS, str(tmp_path / "src"), name], env=env,
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    line = next((s for s in proc.stdout.splitlines() if s.startswith("RESULT ")), None)
    assert line is not None, proc.stderr[-3000:]
    return json.loads(line[len("RESULT "):])


def test_problems_sharing_an_energy_share_its_kernel_made_from_a_record(tmp_path, src):
    # the module-records bug: a second problem over the same energy in one process built a second kernel into the
    # module of the first; where the first was made from a record, Warp then hashed and generated that module again
    # from a kernel without its energy ("Could not find function _energy")
    _write(src, "energy_a", "d * d * d * d")
    cold = _run_two_problems(tmp_path, "energy_a")  # writes the records
    warm = _run_two_problems(tmp_path, "energy_a")  # makes the kernel from its record
    for run in (cold, warm):
        first, second = run
        assert second["kernel"] == first["kernel"] and first["live"] == second["live"] == 1  # one kernel, one module
        for r in run:
            assert r["e2"] == r["e"] and r["g2"] == r["g"]
    assert not cold[0]["recorded"] and warm[0]["recorded"]
    for c, w in zip(cold, warm):
        assert w["e"] == c["e"] and w["g"] == c["g"]  # bitwise: the same binary
    x = np.linspace(-0.5, 0.9, 6) ** 2
    assert float.fromhex(warm[1]["e"]) == pytest.approx(sum((x[i] - x[i + 1]) ** 4 for i in range(5)), rel=1e-14)


def test_tiled_variants_of_one_energy_get_modules_of_their_own():
    # one kernel per term module: two tile capacities of one energy never share a Warp module (a second kernel
    # added to a module makes Warp hash and generate it again, with every kernel in it)
    import warp as wp

    import warp_meshad as wm
    from warp_meshad._src.codegen.kernel_cache import TileVariant, term_kernel
    from warp_meshad.kernels.energies import MassSpringData, mass_spring

    p = wm.Problem(3, 2, dtype=wp.float32, device="cpu")
    data = MassSpringData(wp.float32, rest=wp.array([1.0, 1.0], dtype=wp.float32, device="cpu"), stiffness=1.0)
    p.add_term(np.array([[0, 1], [1, 2]], dtype=np.int32), mass_spring, data)
    term = p.terms[0]
    a = term_kernel(term, "hessian", p.kernel_facts, TileVariant(cap=8))
    b = term_kernel(term, "hessian", p.kernel_facts, TileVariant(cap=16))
    c = term_kernel(term, "hessian", p.kernel_facts, TileVariant(cap=8))
    assert a is c and a is not b
    assert a.module is not b.module
    assert len(a.module._get_live_kernels()) == len(b.module._get_live_kernels()) == 1
