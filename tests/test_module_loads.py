"""The module-load monitor (warp_meshad/_src/codegen/module_loads.py): a compile is announced as it starts and recorded as
compiled, a later load of the cached binary as cached, a launch of a loaded module not at all; the wrappers on
wp.Module are gone once the last monitor exits. One tiny CPU kernel, its cache folder removed first so that it
compiles."""

import glob
import os
import re
import shutil

import numpy as np
import warp as wp

from warp_meshad._src.codegen.module_loads import ModuleLoad, ModuleLoads, describe_module, module_label


@wp.kernel(module="unique")
def _twice(a: wp.array(dtype=wp.float32)):
    """One thread per entry."""
    i = wp.tid()
    a[i] = 2.0 * a[i]


def test_compile_then_cached_load_then_fast_path():
    module = _twice.module
    original_load, original_codegen = wp.Module.load, wp.Module._run_codegen
    describe_module(module.name, "test kernel _twice")
    a = wp.ones(4, dtype=wp.float32, device="cpu")
    module.unload()
    for folder in glob.glob(os.path.join(wp.config.kernel_cache_dir, f"wp_{module.name}_*")):  # every variant
        shutil.rmtree(folder, ignore_errors=True)
    messages = []
    with ModuleLoads(log=messages.append, total=1) as loads:
        assert wp.Module.load is not original_load
        wp.launch(_twice, dim=4, inputs=[a], device="cpu")  # compiles
        module.unload()
        wp.launch(_twice, dim=4, inputs=[a], device="cpu")  # loads the cached binary
        wp.launch(_twice, dim=4, inputs=[a], device="cpu")  # loaded already: not a load
    assert wp.Module.load is original_load and wp.Module._run_codegen is original_codegen
    np.testing.assert_allclose(a.numpy(), np.full(4, 8.0))
    assert messages == ["compiling Warp module 1/1: test kernel _twice (cpu) ..."]
    assert [(r.module, r.label, r.device, r.compiled) for r in loads.loads] == [
        (module.name, "test kernel _twice", "cpu", True), (module.name, "test kernel _twice", "cpu", False)]
    assert re.fullmatch(r"[0-9a-f]{7}", loads.loads[0].hash) and loads.loads[1].hash == loads.loads[0].hash
    assert loads.cache_warm is False and len(loads.compiled) == 1
    assert 0.0 < loads.loads[1].seconds and loads.compile_s == loads.loads[0].seconds
    np.testing.assert_allclose(loads.load_s, loads.loads[1].seconds)  # the cached load only: compile time excluded
    summary = loads.summary()
    assert (summary["modules_loaded"], summary["modules_compiled"], summary["cache_warm"]) == (2, 1, False)
    assert summary["kernel_cache"] == wp.config.kernel_cache_dir
    assert re.fullmatch(r"compiled 1 Warp module in \d+\.\d s, 1 loaded from the cache in \d+\.\d\d s; later runs "
                        r"load them from the kernel cache \(.+\)", loads.describe()), loads.describe()


def test_nested_monitors_both_see_a_load_and_labels_fall_back_to_the_kernels():
    module = _twice.module
    a = wp.ones(2, dtype=wp.float32, device="cpu")
    module.unload()
    with ModuleLoads() as outer:
        with ModuleLoads() as inner:
            wp.launch(_twice, dim=2, inputs=[a], device="cpu")
        wp.launch(_twice, dim=2, inputs=[a], device="cpu")
    assert len(outer.loads) == len(inner.loads) == 1 and outer.cache_warm is True
    assert outer.describe().startswith("all 1 Warp module loaded from the kernel cache in ")

    class Unnamed:  # a module without a registered description: named by its kernels' Python module and key
        name = "unique_module_1234abcd"
        kernels = {"k": _twice}

    assert module_label(Unnamed()) == f"{__name__}: _twice"


def test_a_module_compiled_twice_under_one_name_is_told_apart():
    """Two builds of one module name (its kernels changed in between, or two devices) differ by device and hash in
    the records, and describe() names them (issue 21 point 13)."""
    loads = ModuleLoads()
    for device, digest, compiled, seconds in [("cpu", "1a2b3c4", True, 2.0), ("cpu", "5d6e7f8", True, 3.0),
                                               ("cuda:0", "1a2b3c4", True, 1.0), ("cpu", "0f0f0f0", False, 0.25)]:
        loads._loaded(ModuleLoad("wm_spring_hessian", "term 'spring': hessian", device, digest, compiled, seconds))
    rows = [(r["device"], r["hash"]) for r in loads.summary()["modules"]]
    assert len(set(rows)) == 4, rows
    assert (loads.compile_s, loads.load_s) == (6.0, 0.25)
    assert loads.describe().startswith(
        "compiled 3 Warp modules in 6.0 s (term 'spring': hessian 3 times (cpu 1a2b3c4, cpu 5d6e7f8, cuda:0 1a2b3c4)), "
        "1 loaded from the cache in 0.25 s; later runs load them from the kernel cache ("), loads.describe()
