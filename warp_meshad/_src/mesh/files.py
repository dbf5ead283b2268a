"""Mesh files: reading OBJ (parsed here) and OFF/PLY (through trimesh), writing OBJ/OFF/PLY with exact coordinates,
and the atomic write (temporary file + ``os.replace``) with an ordinary new file's permissions that every saved output
of the toolkit goes through.
"""

from __future__ import annotations

import os
import pathlib
import re
import tempfile

import numpy as np

from warp_meshad._src.mesh.checks import MeshError
from warp_meshad._src.plural import plural

__all__ = ["TRIANGLE_WRITERS", "atomic_write", "new_file_mode", "read_obj", "read_with_trimesh"]


def new_file_mode() -> int:
    """The permissions ``open(path, "w")`` gives a new file: ``0o666`` less the process umask."""
    mask = os.umask(0o022)  # reading the umask means setting it: put it back at once
    os.umask(mask)
    return 0o666 & ~mask


def atomic_write(path: pathlib.Path, write, suffix: str = ".tmp") -> None:
    """``write(tmp_path)`` then ``os.replace`` onto ``path``; the temporary file is removed on failure.

    The temporary file lies in ``path``'s folder and ends with ``suffix`` (writers that pick the format by the
    extension need it); the file gets the permissions of an ordinary new file (``mkstemp`` alone would leave it
    ``0600``).
    """
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=suffix, dir=path.parent)
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, new_file_mode())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise

_V_LINE = re.compile(r"^[ \t]*v[ \t]+(.*)$", re.M)
_F_LINE = re.compile(r"^[ \t]*f[ \t]+(.*)$", re.M)
_VF_KIND = re.compile(r"^[ \t]*([vf])[ \t]", re.M)


def _tokens_per_line(joined: str, lines: int) -> np.ndarray:
    """Whitespace-separated tokens on each line of ``joined`` (``lines`` lines joined by newlines), int64 [lines]."""
    raw = np.frombuffer(joined.encode("utf-8", errors="replace"), dtype=np.uint8)
    newline = raw == 10
    gap = newline | (raw == 32) | (raw == 9) | (raw == 11) | (raw == 12)
    starts = ~gap
    starts[1:] &= gap[:-1]
    return np.bincount(np.cumsum(newline)[starts], minlength=lines).astype(np.int64)


def _parse_numbers(joined: str, dtype, expected: int) -> np.ndarray | None:
    """The whitespace-separated numbers of ``joined`` as ``dtype``; None when one does not parse (``expected``: the
    token count)."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # older numpy: a short read only warns (the count below)
        try:
            values = np.fromstring(joined, dtype=dtype, sep=" ")
        except ValueError:  # numpy >= 2: "could not be read to its end"
            return None
    return values if values.size == expected else None


def read_obj(path: pathlib.Path) -> tuple[np.ndarray, np.ndarray]:
    """Parses ``v`` and ``f`` lines of an OBJ file; returns float64 (n, 3) and int64 (m, 3), 0-based."""
    text = path.read_bytes().decode("utf-8", errors="replace")
    text = text.replace("\r\n", "\n").replace("\r", "\n").replace("\\\n", " ")
    if "#" in text:
        text = re.sub(r"#[^\n]*", "", text)

    v_rows = _V_LINE.findall(text)
    if v_rows:
        joined = "\n".join(v_rows)
        counts = _tokens_per_line(joined, len(v_rows))
        if counts.min() < 3:
            k = int(np.argmax(counts < 3))
            raise MeshError(f"{path}: vertex {k} ('v {v_rows[k].strip()}') has {plural(counts[k], 'coordinate')}; "
                            "expected 3")
        values = _parse_numbers(joined, np.float64, int(counts.sum()))
        if values is None:
            for k, s in enumerate(v_rows):
                try:
                    [float(t) for t in s.split()]
                except ValueError:
                    raise MeshError(f"{path}: vertex {k} ('v {s.strip()}') is not a list of numbers") from None
            raise MeshError(f"{path}: the vertex lines could not be read as numbers")
        if counts.min() == counts.max():
            vertices = values.reshape(-1, counts[0])[:, :3]
        else:  # some vertices carry colours or weights: their first three numbers
            starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
            vertices = values[starts[:, None] + np.arange(3)]
    else:
        vertices = np.zeros((0, 3))

    f_rows = _F_LINE.findall(text)
    if not f_rows:
        return vertices, np.zeros((0, 3), dtype=np.int64)
    joined = "\n".join(f_rows)
    if "/" in joined:
        joined = re.sub(r"/\S*", "", joined)
    sizes = _tokens_per_line(joined, len(f_rows))
    if sizes.min() < 3:
        k = int(np.argmax(sizes < 3))
        raise MeshError(f"{path}: face line {k} ('f {f_rows[k].strip()}') has "
                        f"{plural(sizes[k], 'vertex', 'vertices')}; expected >= 3")
    corners = _parse_numbers(joined, np.int64, int(sizes.sum()))
    bad = None if corners is not None else next((t for t in joined.split() if not re.fullmatch(r"[+-]?\d+", t)), "")
    if bad is not None:
        raise MeshError(f"{path}: face vertex index {bad!r} is not an integer")
    if (corners == 0).any():
        k = int(np.searchsorted(np.cumsum(sizes), int(np.argmax(corners == 0)), side="right"))
        raise MeshError(f"{path}: face line {k} ('f {f_rows[k].strip()}') uses index 0; OBJ indices start at 1")
    if (corners < 0).any():
        # relative index: -1 is the last vertex defined before this face line
        kinds = _VF_KIND.findall(text)
        is_v = np.array([k == "v" for k in kinds])
        defined_before = np.cumsum(is_v)[~is_v]
        corners = np.where(corners < 0, np.repeat(defined_before, sizes) + corners, corners - 1)
    else:
        corners = corners - 1

    if (sizes == 3).all():
        return vertices, corners.reshape(-1, 3)
    # fan-triangulate polygons: (c0, c_i, c_{i+1}) for i = 1 .. size-2
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    tri_per_face = sizes - 2
    base = np.repeat(offsets, tri_per_face)
    i = np.arange(tri_per_face.sum()) - np.repeat(np.cumsum(tri_per_face) - tri_per_face, tri_per_face) + 1
    faces = np.stack([corners[base], corners[base + i], corners[base + i + 1]], axis=1)
    return vertices, faces


def read_with_trimesh(path: pathlib.Path, ext: str) -> tuple[np.ndarray, np.ndarray]:
    """Reads an OFF or PLY file with trimesh (vertices kept in order); returns (n, 3) vertices and (m, 3) faces."""
    import trimesh  # noqa: PLC0415 (heavy, only needed here)

    try:
        loaded = trimesh.load(str(path), file_type=ext[1:], process=False, maintain_order=True, force="mesh")
    except Exception as exc:
        raise MeshError(f"{path}: could not be read as {ext[1:].upper()} ({type(exc).__name__}: {exc})") from exc
    faces = getattr(loaded, "faces", None)
    if faces is None:
        raise MeshError(f"{path}: contains no triangle faces (read a {type(loaded).__name__}); expected a mesh")
    return np.asarray(loaded.vertices), np.asarray(faces)


_ROWS_PER_CHUNK = 65536


def _write_rows(out, fmt: str, rows: np.ndarray) -> None:
    """One line ``fmt % tuple(row)`` per row of the 2-D array ``rows`` (the bytes ``np.savetxt`` writes), formatted a
    chunk of rows at a time by one ``%`` operation (a quarter of ``np.savetxt``'s time, which formats row by row)."""
    line = fmt + "\n"
    for start in range(0, rows.shape[0], _ROWS_PER_CHUNK):
        block = rows[start:start + _ROWS_PER_CHUNK]
        out.write((line * block.shape[0] % tuple(block.ravel().tolist())).encode("latin1"))


def _write_obj(out, vertices: np.ndarray, faces: np.ndarray, uv) -> None:
    out.write(b"# written by warp_meshad\n")
    _write_rows(out, "v %.17g %.17g %.17g", vertices)
    one_based = faces.astype(np.int64) + 1
    if uv is None:
        _write_rows(out, "f %d %d %d", one_based)
    else:
        _write_rows(out, "vt %.17g %.17g", np.asarray(uv))
        _write_rows(out, "f %d/%d %d/%d %d/%d", np.repeat(one_based, 2, axis=1))


def _write_off(out, vertices: np.ndarray, faces: np.ndarray, uv) -> None:
    out.write(f"OFF\n{vertices.shape[0]} {faces.shape[0]} 0\n".encode())
    _write_rows(out, "%.17g %.17g %.17g", vertices)
    _write_rows(out, "3 %d %d %d", np.asarray(faces))


def _write_ply(out, vertices: np.ndarray, faces: np.ndarray, uv) -> None:
    header = (
        "ply\nformat binary_little_endian 1.0\ncomment written by warp_meshad\n"
        f"element vertex {vertices.shape[0]}\nproperty double x\nproperty double y\nproperty double z\n"
        f"element face {faces.shape[0]}\nproperty list uchar int vertex_indices\nend_header\n"
    )
    out.write(header.encode("ascii"))
    out.write(np.ascontiguousarray(vertices, dtype="<f8").tobytes())
    packed = np.empty(faces.shape[0], dtype=[("count", "u1"), ("index", "<i4", (3,))])
    packed["count"] = 3
    packed["index"] = faces
    out.write(packed.tobytes())


# the triangle-mesh writers, by lower-case extension: writer(binary file, vertices (n, 3), faces (m, 3), uv or None)
TRIANGLE_WRITERS = {".obj": _write_obj, ".off": _write_off, ".ply": _write_ply}
