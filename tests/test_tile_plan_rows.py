"""``assembly="auto"`` on a GPU builds no tile plan for a pattern with fewer block rows than the device has
multiprocessors: every patch holds at least one row, so such a plan has too few patches and ``auto_uses_tiles`` would
refuse it; building it would only compile and run the plan's kernels (a first call of a small problem)."""

import types

import numpy as np
import pytest
import warp as wp

import warp_meshad as wm
from warp_meshad._src.problem import assembly
from warp_meshad.kernels.energies import MassSpringData, mass_spring

pytestmark = pytest.mark.cpu  # the GPU is stood in for: the decision is made on the host


def _assembler(n: int, mode: str = "auto"):
    mesh = wm.TriMesh.grid(n, n)
    rest = wp.array(mesh.edge_lengths().astype(np.float32), dtype=wp.float32, device="cpu")
    p = wm.Problem(mesh.vertex_count, 3, dtype=wp.float32, device="cpu", assembly=mode)
    p.add_term(mesh.edges, mass_spring, MassSpringData(wp.float32, rest=rest, stiffness=1.0))
    asm = p._assembler
    asm.storage.hessian_pattern(asm.terms)
    asm.device = types.SimpleNamespace(is_cuda=True, sm_count=132)  # an H200's count
    return mesh, asm


@pytest.fixture
def built(monkeypatch):
    calls = []

    def build(offsets, *args, **kwargs):
        calls.append(len(offsets) - 1)
        return None  # no plan: the test only asks whether one is built

    monkeypatch.setattr(assembly, "build_tile_plan", build)
    return calls


def test_no_plan_is_built_for_fewer_rows_than_multiprocessors(built):
    mesh, asm = _assembler(11)  # 121 rows < 132
    assert asm.tile_plan("hessian") is None
    assert asm.tile_plan("hessian_proj") is None
    assert built == []


def test_a_plan_is_built_from_as_many_rows_as_multiprocessors(built):
    mesh, asm = _assembler(12)  # 144 rows
    asm.tile_plan("hessian")
    assert built == [mesh.vertex_count]


def test_tiled_assembly_always_builds_its_plan(built):
    mesh, asm = _assembler(4, mode="tiled")
    asm.tile_plan("hessian")
    assert built == [mesh.vertex_count]
