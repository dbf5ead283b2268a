"""Mesh files (warp_meshad/_src/mesh/files.py): the OBJ and OFF writers write the bytes np.savetxt writes (exact
coordinates, ``%.17g``), a chunk of rows per format operation."""

import io

import numpy as np
import pytest

import warp_meshad as wm
from warp_meshad._src.mesh import files


def _savetxt(rows, fmt) -> bytes:
    out = io.BytesIO()
    np.savetxt(out, rows, fmt=fmt)
    return out.getvalue()


@pytest.mark.parametrize("count", [0, 1, 7, 65536 + 3])  # none, one, a few, past one chunk
def test_rows_are_written_as_savetxt_writes_them(count):
    rng = np.random.default_rng(count)
    v = rng.standard_normal((count, 3)) * 10.0 ** rng.integers(-300, 300, (count, 3))
    if count >= 7:
        v[:7, 0] = [np.nan, np.inf, -np.inf, -0.0, 0.0, 5e-324, np.finfo(np.float64).max]
    f = rng.integers(0, 2**31 - 1, (count, 6))
    for rows, fmt in ((v, "v %.17g %.17g %.17g"), (rng.standard_normal((count, 2)).astype(np.float32), "vt %.17g %.17g"),
                      (f, "f %d/%d %d/%d %d/%d")):
        out = io.BytesIO()
        files._write_rows(out, fmt, rows)
        assert out.getvalue() == _savetxt(rows, fmt)


@pytest.mark.parametrize("ext", [".obj", ".off"])
def test_a_saved_mesh_reads_back_exactly(tmp_path, ext):
    rng = np.random.default_rng(1)
    mesh = wm.TriMesh.grid(5, 4)
    v = mesh.vertices + rng.standard_normal(mesh.vertices.shape) * 1e-3
    uv = rng.random((mesh.vertex_count, 2)) if ext == ".obj" else None
    path = tmp_path / f"m{ext}"
    wm.TriMesh(v, mesh.faces).save(path, uv=uv)
    back = wm.TriMesh.from_file(path)
    np.testing.assert_array_equal(back.vertices, v)  # %.17g round-trips every float64
    np.testing.assert_array_equal(back.faces, mesh.faces)
    if uv is not None:
        vt = np.array([[float(t) for t in ln.split()[1:]] for ln in path.read_text().splitlines()
                       if ln.startswith("vt ")])
        np.testing.assert_array_equal(vt, uv)
