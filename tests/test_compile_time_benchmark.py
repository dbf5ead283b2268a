"""benchmarks/compile_time.py measures what it says: its energies are the log-Neo-Hookean (both forms agree with NumPy),
a run from empty caches records the modules the first projected Hessian compiles, and a second run on the caches the
first one filled compiles nothing."""

import pathlib
import sys

import numpy as np
import pytest
import warp as wp

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `benchmarks` is a folder of the checkout, not an installed package
    sys.path.insert(0, str(ROOT))

from benchmarks import compile_time as ct  # noqa: E402

pytestmark = pytest.mark.cpu  # the child processes run on the CPU


def _log_neo_hookean(x, tets, dinv, volume, mu, lam):
    e = x[tets[:, 1:]] - x[tets[:, :1]]  # (m, 3 edges, 3 coordinates)
    F = np.einsum("mai,maj->mij", e, dinv)  # F = [x1 - x0, x2 - x0, x3 - x0] D_m^-1
    J = np.linalg.det(F)
    lj = np.log(J)
    return float(np.sum(volume * (0.5 * mu * (np.einsum("mij,mij->m", F, F) - 3.0) - mu * lj + 0.5 * lam * lj * lj)))


def test_both_forms_are_the_log_neo_hookean():
    import warp_meshad as wm

    mesh = wm.TetMesh.box(4, 4, 4)
    ref = None
    for case in ("lnh_corner", "lnh_F"):
        problem, x = ct._build(case, "cpu")
        f, g = problem.eval_with_gradient(x)
        if ref is None:
            ref = _log_neo_hookean(x.numpy(), mesh.tets, mesh.rest_matrix_inverses(), mesh.volumes(), 1.0e4, 4.0e4)
            g_corner = g.numpy().copy()
        np.testing.assert_allclose(f, ref, rtol=1e-12)
    np.testing.assert_allclose(g.numpy(), g_corner, rtol=1e-10, atol=1e-8 * np.abs(g_corner).max())


def test_a_run_from_empty_caches_records_its_compiles_and_a_second_run_none(tmp_path):
    first = ct.run_case("springs32", "cpu", "hessian", keep=tmp_path)
    assert [ph["phase"] for ph in first["phases"]] == ["setup", "hessian_proj", "energy", "gradient"]
    compiled = [m["module"] for m in first["phases"][1]["modules"]]
    assert any(name.startswith("wm_spring32_hessian_proj") for name in compiled), compiled
    assert any(m["module"].startswith("wm_spring32_energy") for m in first["phases"][2]["modules"])
    assert first["modules_compiled"] >= 4 and first["compile_s"] > 0.0
    assert 0.0 < first["to_first_hessian_proj_s"] <= first["to_all_s"] < first["process_s"]
    again = ct.run_case("springs32", "cpu", "hessian", keep=tmp_path)  # the caches the first run filled
    assert again["modules_compiled"] == 0
    np.testing.assert_allclose(again["energy"], first["energy"], rtol=1e-6)


def _nvrtc_available() -> bool:
    @wp.kernel(module="unique")
    def one(a: wp.array(dtype=float)):
        a[wp.tid()] = 1.0

    try:
        wp.compile_aot_module(one.module, arch=90, module_dir=None, use_ptx=True)
    except Exception:
        return False
    return True


def test_nvrtc_compiles_are_timed_apart(tmp_path):
    if not _nvrtc_available():
        pytest.skip("this Warp build cannot compile CUDA code (no NVRTC)")
    rec = ct.run_case("springs32", "cpu", "hessian", nvrtc_arch=90, keep=tmp_path)
    mods = rec["phases"][1]["modules"]
    assert mods and all(m["nvrtc_sm90_s"] > 0.0 for m in mods)
    assert rec["to_first_hessian_proj_cuda_compile_s"] >= rec["to_first_hessian_proj_nvrtc_sm90_s"] > 0.0
