"""The content cache of mesh results (warp_meshad/_src/mesh/content_cache.py): used only inside ``enabled()``, keyed
by the inputs' bytes, damaged entries recomputed, bounded in size; TriMesh.from_file and tutte_embedding through it
give exactly what they compute without it; an app run fills it."""

import os
import pathlib
import shutil

import numpy as np
import pytest

import warp_meshad as wm
from warp_meshad._src.mesh import content_cache, trimesh, tutte

ROOT = pathlib.Path(__file__).resolve().parents[1]
PATCH = ROOT / "assets" / "datasets" / "param_patches_small" / "patch_001.obj"


@pytest.fixture
def folder(tmp_path, monkeypatch):
    """The cache in a folder of this test's own."""
    where = tmp_path / "content"
    monkeypatch.setattr(content_cache, "cache_folder", lambda: where)
    monkeypatch.delenv(content_cache.SWITCH_VARIABLE, raising=False)
    return where


def _entries(folder: pathlib.Path) -> list[str]:
    return sorted(p.name for p in folder.glob("*.npz")) if folder.exists() else []


class Counter:
    def __init__(self, fn):
        self.fn, self.calls = fn, 0

    def __call__(self, *a, **k):
        self.calls += 1
        return self.fn(*a, **k)


def test_outside_enabled_nothing_is_read_or_written(folder):
    compute = Counter(lambda: {"a": np.arange(3.0)})
    for _ in range(2):
        np.testing.assert_array_equal(content_cache.cached("k", [b"x"], compute, ("a",))["a"], np.arange(3.0))
    assert compute.calls == 2 and _entries(folder) == [] and not content_cache.is_enabled()


def test_an_entry_is_keyed_by_its_inputs_and_read_back_exactly(folder):
    rng = np.random.default_rng(0)
    value = {"a": rng.standard_normal((5, 2)), "b": rng.integers(0, 9, (4, 3)).astype(np.int32)}
    compute = Counter(lambda: value)
    x = rng.standard_normal(7)
    with content_cache.enabled():
        first = content_cache.cached("k", [x, "opt"], compute, ("a", "b"))
        again = content_cache.cached("k", [x.copy(), "opt"], compute, ("a", "b"))
        assert compute.calls == 1 and len(_entries(folder)) == 1
        for name in ("a", "b"):
            np.testing.assert_array_equal(again[name], value[name])
            assert again[name].dtype == value[name].dtype and again[name].flags.writeable
        assert first is value  # a miss returns what was computed
        # any input differing (a value, an option, the dtype of the same numbers, the kind) is another entry
        content_cache.cached("k", [np.nextafter(x, np.inf), "opt"], compute, ("a", "b"))  # one ulp
        content_cache.cached("k", [x, "other"], compute, ("a", "b"))
        content_cache.cached("k", [x.astype(np.float32), "opt"], compute, ("a", "b"))
        content_cache.cached("j", [x, "opt"], compute, ("a", "b"))
        assert compute.calls == 5 and len(_entries(folder)) == 5
        # an entry lacking a name asked for is computed again (and rewritten with it)
        more = Counter(lambda: {**value, "c": np.zeros(2)})
        content_cache.cached("k", [x, "opt"], more, ("a", "b", "c"))
        content_cache.cached("k", [x, "opt"], more, ("a", "b", "c"))
        assert more.calls == 1
    assert not content_cache.is_enabled()


def test_a_damaged_entry_is_computed_again_and_replaced(folder):
    compute = Counter(lambda: {"a": np.arange(4)})
    with content_cache.enabled():
        content_cache.cached("k", [b"x"], compute, ("a",))
        (entry,) = folder.glob("*.npz")
        entry.write_bytes(entry.read_bytes()[:20])  # truncated
        np.testing.assert_array_equal(content_cache.cached("k", [b"x"], compute, ("a",))["a"], np.arange(4))
        assert compute.calls == 2
        content_cache.cached("k", [b"x"], compute, ("a",))
        assert compute.calls == 2  # replaced by a good one
    assert not [p for p in folder.iterdir() if p.name.startswith(".")]  # no temporary file left


def test_the_switch_turns_it_off_and_an_unwritable_folder_costs_only_the_write(folder, monkeypatch, tmp_path):
    compute = Counter(lambda: {"a": np.ones(2)})
    monkeypatch.setenv(content_cache.SWITCH_VARIABLE, "0")
    with content_cache.enabled():
        assert not content_cache.is_enabled()
        content_cache.cached("k", [b"x"], compute, ("a",))
    assert _entries(folder) == []
    monkeypatch.delenv(content_cache.SWITCH_VARIABLE)
    blocker = tmp_path / "file"
    blocker.write_text("a file where the folder should be")
    monkeypatch.setattr(content_cache, "cache_folder", lambda: blocker / "content")
    with content_cache.enabled():
        np.testing.assert_array_equal(content_cache.cached("k", [b"x"], compute, ("a",))["a"], np.ones(2))
    assert compute.calls == 2


def test_past_its_limit_the_entries_used_least_recently_go(folder, monkeypatch):
    monkeypatch.setenv(content_cache.LIMIT_VARIABLE, "0.01")  # ~10 kB: one 8 kB entry fits, two do not
    with content_cache.enabled():
        for k in range(3):
            content_cache.cached("k", [k], lambda: {"a": np.zeros(1000)}, ("a",))
            names = _entries(folder)
            assert len(names) == 1, names  # the one just written stays
    monkeypatch.setenv(content_cache.LIMIT_VARIABLE, "many")
    with content_cache.enabled(), pytest.raises(ValueError, match="expected a number of MiB, got 'many'"):
        content_cache.cached("k", [9], lambda: {"a": np.zeros(1)}, ("a",))


def test_a_mesh_file_is_parsed_once_and_again_when_it_changes(folder, tmp_path, monkeypatch):
    read = Counter(trimesh.read_obj)
    monkeypatch.setattr(trimesh, "read_obj", read)
    path = tmp_path / "m.obj"
    shutil.copy(PATCH, path)
    plain = wm.TriMesh.from_file(path)
    with content_cache.enabled():
        first = wm.TriMesh.from_file(path)
        second = wm.TriMesh.from_file(path)
        assert read.calls == 2  # the plain read, then one for both cached reads
        for m in (first, second):
            np.testing.assert_array_equal(m.vertices, plain.vertices)
            np.testing.assert_array_equal(m.faces, plain.faces)
            assert m.source == str(path) and m.edge_count == plain.edge_count
        text = path.read_text()
        path.write_text(text.replace("v ", "v  ", 1))  # the same numbers, other bytes: parsed again
        wm.TriMesh.from_file(path)
        assert read.calls == 3
        path.write_text(text + "f 1 1 2\n")  # a bad file: its error, nothing cached
        with pytest.raises(wm.MeshError):
            wm.TriMesh.from_file(path)
    assert {n.split("-")[0] for n in _entries(folder)} == {"obj"}


def test_tutte_through_the_cache_is_the_same_uv_bit_for_bit(folder, monkeypatch):
    mesh = wm.TriMesh.from_file(PATCH)
    plain = wm.tutte_embedding(mesh)
    solve = Counter(tutte._embedding)
    monkeypatch.setattr(tutte, "_embedding", solve)
    with content_cache.enabled():
        uv = [wm.tutte_embedding(mesh), wm.tutte_embedding(wm.TriMesh(mesh.vertices.copy(), mesh.faces.copy()))]
    assert solve.calls == 1
    for u in uv:
        np.testing.assert_array_equal(u, plain)
    closed = wm.TriMesh.from_file(ROOT / "assets" / "meshes" / "spot.obj")
    with content_cache.enabled(), pytest.raises(wm.MeshError, match="needs a mesh with a boundary"):
        wm.tutte_embedding(closed)


def test_a_param_run_fills_the_cache_and_the_next_one_reads_it(folder, tmp_path):
    from warp_meshad.app import load_config, run

    c = load_config("param/patches", test=True, overrides={"screenshot": False, "device": "cpu", "mesh": str(PATCH),
                                                            "output": str(tmp_path / "a")})
    first = run(c, quiet=True, plot=False)
    names = _entries(folder)
    assert {n.split("-")[0] for n in names} == {"obj", "tutte"}, names
    second = run(c.model_copy(update={"output": str(tmp_path / "b")}), quiet=True, plot=False)
    assert _entries(folder) == names
    np.testing.assert_array_equal(second.app.uv0, first.app.uv0)
    np.testing.assert_array_equal(second.app.positions(), first.app.positions())
    assert os.path.isfile(tmp_path / "b" / "final.obj")
