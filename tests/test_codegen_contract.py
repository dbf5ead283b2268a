"""The code-generation contract (warp_meshad/_src/codegen/contract.py) holds on both sides: the generated dual modules
provide every name the kernel text may call, the kernel text calls only those, every mode has an emitter, variants
drop what a mode does not have; and no module but codegen/warp_compat.py touches Warp's private API."""

import pathlib
import re

import pytest

import golden_cases as gc
from warp_meshad._src.codegen import contract, kernel_source
from warp_meshad.kernels import _dualgen

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_every_mode_has_one_emitter():
    assert sorted(kernel_source._EMITTERS) == sorted(contract.MODES)


@pytest.mark.parametrize("kind, k, dtype", [("plain", 0, None), ("grad", 3, "float64"), ("hess", 4, "float32"),
                                            ("hess", 12, "float64"), ("hess", 13, "float64")])  # fmt: skip
def test_generated_dual_modules_provide_the_declared_api(kind, k, dtype):
    import warp as wp

    ns = _dualgen.load(k, getattr(wp, dtype) if dtype else None, kind)
    assert contract.missing_names(ns, kind, k) == []
    # the capability says exactly whether the optional name is there
    has_unrolled = contract.UNROLLED_PROJECTION in contract.capabilities(kind, k)
    assert hasattr(ns, "project_psd_unrolled") == has_unrolled == (kind == "hess" and k <= 12)


def test_missing_names_reports_what_a_module_lacks():
    class Partial:
        seed = sq = mul = None

    missing = contract.missing_names(Partial, "grad", 3)
    assert missing == [n for n in contract.ENERGY_NAMES if n != "mul"] + ["length_sq", "Dual.v", "Dual.g"]


def test_kernel_text_calls_only_the_declared_dual_api():
    seen = set()
    for name, shape, mode, variant in gc.kernel_cases():
        text = gc.render_kernel(shape, mode, variant)
        kind = "packed" if mode == gc.PROJECTION else contract.MODES[mode].dual  # the split projection's kernel
        for called in set(re.findall(r"_D\.(\w+)\(", text)):
            api = contract.DUAL_API.get(called)
            assert api is not None and kind in api.kinds, f"{name} calls _D.{called}"
            seen.add(called)
        if kind != "hess":
            assert not re.search(r"\br\w*\.h\b", text), f"{name} reads .h of a {kind} dual"
    assert seen == set(contract.DUAL_API)  # every declared name is used by some kernel


def test_packed_hessian_fact_matches_the_text():
    spec = kernel_source.KernelSpec(2, 1, __import__("warp").float64, False)
    for mode, m in contract.MODES.items():
        if m.terms == "residual" or not m.writes or "hessian" not in m.writes:
            continue
        for unrolled in (False, True):
            text = kernel_source.kernel_source(spec, mode, "kernel", unrolled=unrolled)
            packed_read = re.search(r"h\[\d+\]\)", text) is not None
            assert packed_read == m.packed_hessian(unrolled), (mode, unrolled)


def test_variant_drops_what_the_mode_does_not_have():
    caps = contract.capabilities("hess", 6)
    v = contract.KernelVariant.of("residual", deterministic=True)
    assert not v.deterministic and v.suffix == ""
    v = contract.KernelVariant.of("hessian_proj", deterministic=True, unrolled=True, caps=caps, tile_cap=64)
    assert (v.deterministic, v.unrolled, v.tiled, v.suffix) == (True, True, True, "_det_unrolled_tiled")
    assert not contract.KernelVariant.of("hessian_proj", unrolled=True, caps=contract.capabilities("hess", 13)).unrolled
    assert not contract.KernelVariant.of("hessian", unrolled=True, caps=caps).unrolled
    assert contract.KernelVariant.of("gradient", tile_store="block") == contract.KernelVariant.of("gradient")
    with pytest.raises(ValueError, match=r"tiled variant exists for modes \['hessian', 'hessian_proj'\], got mode "
                                         r"'gradient'"):  # fmt: skip
        contract.KernelVariant.of("gradient", tile_cap=64)
    with pytest.raises(ValueError, match=r"kernel mode must be one of .*'probe'.*got 'hesian'"):
        contract.mode_of("hesian")


_PRIVATE = re.compile(r"(?<![\w.])(?:wp|warp)\._src\b|\bfrom warp\._src\b|\b_run_codegen\b|\bModuleBuilder\b|\._cls\b")


def test_private_warp_api_only_in_warp_compat():
    allowed = ROOT / "warp_meshad" / "_src" / "codegen" / "warp_compat.py"
    offenders = []
    for folder in ("warp_meshad", "kernels", "apps", "benchmarks"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path == allowed:
                continue
            for n, line in enumerate(path.read_text().splitlines(), 1):
                if _PRIVATE.search(line):
                    offenders.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert offenders == []
