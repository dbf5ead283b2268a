"""Shared test setup: quiet Warp, the test device, and the ``gpu`` / ``device`` / ``cpu`` markers.

``WARP_MESHAD_TEST_DEVICE`` (default ``"cpu"``) is the device the library is tested on: the ``device`` fixture
returns it, and the tests' own arrays and kernels made without a device go there (``wp.set_device``).

Markers (``gpu`` declared in pyproject.toml, the others in :func:`pytest_configure`):

- ``gpu``: needs a CUDA device; skipped, with that reason, where none exists.
- ``device``: written to run on the test device. Every test that takes the ``device`` fixture has it; modules whose
  tests read the test device otherwise declare it (``pytestmark``). Under a CUDA test device these tests are marked
  ``gpu`` too, so that ``WARP_MESHAD_TEST_DEVICE=cuda:0 python -m pytest -q -m gpu`` runs the GPU subset: the tests
  that need CUDA (cuDSS, CuPy, GPU against CPU) and those written for the test device (problem, energies, tiled and
  deterministic assembly, contact, interaction terms, solvers, linear back-ends, ...).
- ``cpu``: runs on the CPU whatever the test device (the test's default device is ``"cpu"``, and so is its
  ``device`` fixture), for what exists on the CPU only; skipped, with that reason, where this Warp build has no CPU
  compiler (the GPU host's bundle leaves it out).

No test is skipped for the test device alone: a test that cannot run somewhere says why.
"""

import os
import pathlib

import pytest
import warp as wp

wp.config.log_level = wp.LOG_WARNING
wp.init()
TEST_DEVICE = os.environ.get("WARP_MESHAD_TEST_DEVICE", "cpu")
# the device of the tests' own kernels (launched without a device) is the one the library is tested on
wp.set_device(TEST_DEVICE)

ASSETS = pathlib.Path(__file__).resolve().parents[1] / "assets" / "meshes"


def cuda_available() -> bool:
    return wp.get_cuda_device_count() > 0


def pytest_configure(config):
    config.addinivalue_line("markers", "device: runs on $WARP_MESHAD_TEST_DEVICE (under cuda:N also marked gpu)")
    config.addinivalue_line("markers", "cpu: runs on the CPU whatever the test device (skipped without a CPU compiler)")


@pytest.hookimpl(tryfirst=True)  # before the -m selection, so that -m gpu sees the markers added here
def pytest_collection_modifyitems(config, items):
    on_cuda = TEST_DEVICE.startswith("cuda")
    no_cuda = pytest.mark.skip(reason="needs a CUDA device (none found)")
    no_cpu = pytest.mark.skip(reason="needs Warp's CPU compiler, which this Warp build lacks (wp.is_cpu_available())")
    cpu_ok = wp.is_cpu_available()
    for item in items:
        cpu = item.get_closest_marker("cpu") is not None
        if not cpu and "device" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.device)
        if on_cuda and item.get_closest_marker("device") is not None and not cpu:
            item.add_marker(pytest.mark.gpu)
        if item.get_closest_marker("gpu") is not None and not cuda_available():
            item.add_marker(no_cuda)
        if cpu and not cpu_ok:
            item.add_marker(no_cpu)


@pytest.fixture(autouse=True)
def _cpu_tests_default_to_the_cpu(request):
    """A ``cpu``-marked test makes its arrays and launches without a device on the CPU."""
    if request.node.get_closest_marker("cpu") is None:
        yield
        return
    with wp.ScopedDevice("cpu"):
        yield


@pytest.fixture
def device(request):
    """The Warp device tests evaluate on: $WARP_MESHAD_TEST_DEVICE (default "cpu"); "cpu" for a cpu-marked test."""
    return "cpu" if request.node.get_closest_marker("cpu") is not None else TEST_DEVICE
