"""Shared test setup: quiet Warp, a cache folder, CPU default, GPU marker handling."""

import os
import pathlib

import pytest
import warp as wp

wp.config.log_level = wp.LOG_WARNING
wp.init()
# the device of the tests' own kernels (launched without a device) is the one the library is tested on
wp.set_device(os.environ.get("WARP_MESHAD_TEST_DEVICE", "cpu"))

ASSETS = pathlib.Path(__file__).resolve().parents[1] / "assets" / "meshes"


def cuda_available() -> bool:
    return wp.get_cuda_device_count() > 0


# modules whose unmarked tests are written for the CPU (they build problems, apps or solvers on "cpu" next to
# arrays on the default device, or run the CPU compiler): under a CUDA test device only their gpu-marked tests run
_CPU_MODULES = ("test_app_framework", "test_configs_", "test_examples", "test_linear", "test_solvers")


def pytest_collection_modifyitems(config, items):
    if not cuda_available():
        skip = pytest.mark.skip(reason="needs a CUDA device (none found)")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)
        return
    if not os.environ.get("WARP_MESHAD_TEST_DEVICE", "cpu").startswith("cuda"):
        return
    skip = pytest.mark.skip(reason="CPU test: run it without WARP_MESHAD_TEST_DEVICE=cuda:...")
    for item in items:
        if item.module.__name__.rsplit(".", 1)[-1].startswith(_CPU_MODULES) and "gpu" not in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def device():
    """The Warp device tests evaluate on: $WARP_MESHAD_TEST_DEVICE, default "cpu"."""
    return os.environ.get("WARP_MESHAD_TEST_DEVICE", "cpu")
