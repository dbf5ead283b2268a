"""Validation shared by TriMesh and TetMesh: the MeshError they raise, their array, option and unreferenced-vertex
checks, the checks of a mesh file to read or a path to save to, and the degenerate-element checks an app runs on its
input before its energies see it (:func:`check_nondegenerate`).

The messages name the elements with the words of an :class:`ElementWords` ("faces" / "triangle" for TriMesh, "tets" /
"tetrahedron" for TetMesh). Pure numpy on the host.
"""

from __future__ import annotations

import dataclasses
import itertools
import pathlib

import numpy as np

from warp_meshad._src.plural import plural

__all__ = [
    "DEGENERATE_RTOL",
    "SHOW",
    "UNREFERENCED_MODES",
    "ElementWords",
    "MeshError",
    "check_arrays",
    "check_folder",
    "check_mesh_file",
    "check_nondegenerate",
    "check_option",
    "check_save_path",
    "degenerate_tets",
    "degenerate_triangles",
    "first_items",
    "readonly",
    "referenced_vertices",
    "short_edges",
]

UNREFERENCED_MODES = ("error", "remove")
SHOW = 5  # how many offending items a message lists
# an element is degenerate when its measure is at most this fraction of the one its longest edge spans (triangle:
# |(x1-x0) x (x2-x0)| <= rtol L^2; tet: |6 V| <= rtol L^3), an edge when its length is at most rtol times the mesh's
# bounding-box diagonal: TriMesh's and TetMesh's own rule
DEGENERATE_RTOL = 1e-12


class MeshError(ValueError):
    """Invalid mesh input.

    The message names the source (a file path, or ``TriMesh(...)`` for arrays), what is wrong,
    where (indices: the first few and the total count) and what was expected.
    """


def first_items(items, count: int | None = None) -> str:
    """Formats the first few offending items and the total count, e.g. ``"[3, 7] (2 in total)"``."""
    total = len(items) if count is None else count
    shown = ", ".join(str(int(i)) for i in items[:SHOW])
    more = ", ..." if total > SHOW else ""
    return f"[{shown}{more}] ({total} in total)"


def readonly(a: np.ndarray) -> np.ndarray:
    """``a`` made read-only in place (a mesh's cached arrays), returned for chaining."""
    a.flags.writeable = False
    return a


@dataclasses.dataclass(frozen=True)
class ElementWords:
    """What a mesh's elements are called in its messages, and how many vertices each has."""

    mesh: str  # the class named in hints: "TriMesh", "TetMesh"
    array: str  # the element array, also the plural in messages: "faces", "tets"
    single: str  # one element: "face", "tet"
    noun: str  # what an empty mesh lacks one of: "triangle", "tetrahedron"
    valence: int  # vertices per element: 3, 4
    shape_hint: str  # appended to a 2D array's wrong-shape message
    index_dtype: str  # how the dtype message says the indices are kept
    repeat_hint: str  # leads the parenthesis of the repeated-vertex message
    file_kind: str  # the kind of file from_file reads: "mesh", "tet mesh"

_VALENCE_WORDS = {3: "three", 4: "four"}


def check_option(source: str, name: str, value, options: tuple[str, ...]) -> None:
    """Refuses a keyword argument ``name=value`` that is not one of ``options``."""
    if value not in options:
        raise MeshError(f"{source}: {name}={value!r} is not an option; expected one of {options}")


def check_arrays(src: str, vertices, elements, kind: ElementWords) -> tuple[np.ndarray, np.ndarray]:
    """Reads and validates vertex positions and element vertex indices.

    Returns:
        The vertices as float64, shape (n, 3), and the elements as int64, shape (m, kind.valence).

    Raises:
        MeshError: unreadable arrays, an empty mesh, wrong shapes or dtypes, more than int32 indices, non-finite
            coordinates, indices out of range, or a vertex repeated within an element.
    """
    name, k = kind.array, kind.valence
    try:
        v = np.asarray(vertices)
    except Exception as exc:  # ragged nested lists, ...
        raise MeshError(f"{src}: vertices could not be read as an array ({exc}); expected shape (n, 3) floats")
    try:
        e = np.asarray(elements)
    except Exception as exc:
        raise MeshError(f"{src}: {name} could not be read as an array ({exc}); expected shape (m, {k}) integers")

    if v.size == 0 or e.size == 0:
        raise MeshError(
            f"{src}: empty mesh: {plural(v.shape[0] if v.ndim else 0, 'vertex', 'vertices')} (array shape {v.shape}) "
            f"and {plural(e.shape[0] if e.ndim else 0, kind.single, name)} (array shape {e.shape}); expected at least "
            f"one vertex and one {kind.noun}"
        )
    if v.ndim != 2 or v.shape[1] != 3:
        raise MeshError(f"{src}: vertices have shape {v.shape}; expected (n, 3)")
    if e.ndim != 2 or e.shape[1] != k:
        hint = kind.shape_hint if e.ndim == 2 else ""
        raise MeshError(f"{src}: {name} have shape {e.shape}; expected (m, {k}){hint}")
    if v.dtype == bool or not (np.issubdtype(v.dtype, np.floating) or np.issubdtype(v.dtype, np.integer)):
        raise MeshError(f"{src}: vertices have dtype {v.dtype}; expected a real floating-point dtype (float64)")
    if not np.issubdtype(e.dtype, np.integer):
        raise MeshError(
            f"{src}: {name} have dtype {e.dtype}; expected an integer dtype (vertex indices, {kind.index_dtype})"
        )
    n, m = v.shape[0], e.shape[0]
    if n > np.iinfo(np.int32).max or k * m > np.iinfo(np.int32).max:
        raise MeshError(f"{src}: {n} vertices, {m} {name} exceed the int32 index range")

    v = v.astype(np.float64, copy=False)
    finite = np.isfinite(v).all(axis=1)
    if not finite.all():
        bad = np.flatnonzero(~finite)
        raise MeshError(
            f"{src}: vertices {first_items(bad)} have NaN or infinite coordinates "
            f"(vertex {bad[0]} = {v[bad[0]].tolist()}); expected finite coordinates"
        )

    e = e.astype(np.int64, copy=False)
    out = (e < 0) | (e >= n)
    if out.any():
        bad = np.flatnonzero(out.any(axis=1))
        b = bad[0]
        raise MeshError(
            f"{src}: {name} {first_items(bad)} have vertex indices out of range "
            f"({kind.single} {b} = {e[b].tolist()} uses index {e[b][out[b]][0]}); expected 0 <= index < {n} "
            f"(the vertex count; indices are 0-based)"
        )

    repeated = np.zeros(m, dtype=bool)
    for i, j in itertools.combinations(range(k), 2):  # k (k - 1) / 2 column comparisons: faster than a row sort
        repeated |= e[:, i] == e[:, j]
    if repeated.any():
        bad = np.flatnonzero(repeated)
        b = bad[0]
        raise MeshError(
            f"{src}: {name} {first_items(bad)} repeat a vertex ({kind.repeat_hint}{kind.single} {b} = {e[b].tolist()}); "
            f"expected {_VALENCE_WORDS[k]} distinct vertices per {kind.single}"
        )
    return v, e


def referenced_vertices(src: str, v: np.ndarray, e: np.ndarray, unreferenced: str, kind: ElementWords):
    """Drops (``unreferenced="remove"``) or reports the vertices that no element uses.

    Returns:
        Read-only ``(vertices float64, elements int32, vertex_map int32, removed_vertices int32)`` and the
        `MeshError` to raise for unreferenced vertices under ``unreferenced="error"`` (None when there is none). The
        caller raises it after its topology checks, so that a non-manifold mesh reports that first.
    """
    n = v.shape[0]
    used = np.zeros(n, dtype=bool)
    used[e.ravel()] = True
    removed = np.flatnonzero(~used)
    if removed.size and unreferenced == "remove":
        kept = np.flatnonzero(used)
        new_index = np.full(n, -1, dtype=np.int64)
        new_index[kept] = np.arange(kept.size)
        v = v[kept]
        e = new_index[e]
        vertex_map = kept
    else:
        vertex_map = np.arange(n)
    error = None
    if removed.size and unreferenced == "error":
        error = MeshError(
            f"{src}: {plural(removed.size, f'of {n} vertices is', f'of {n} vertices are')} not used by any "
            f"{kind.single} (unreferenced vertices {first_items(removed)}); expected every vertex in a {kind.single}. "
            f'Pass unreferenced="remove" to drop them ({kind.mesh}(..., unreferenced="remove") or '
            f'{kind.mesh}.from_file(path, unreferenced="remove"); mesh.vertex_map then maps kept '
            f"vertices to their original indices)"
        )
    return (
        readonly(np.ascontiguousarray(v, dtype=np.float64)),
        readonly(np.ascontiguousarray(e, dtype=np.int32)),
        readonly(vertex_map.astype(np.int32)),
        readonly((removed if unreferenced == "remove" else removed[:0]).astype(np.int32)),
        error,
    )


def check_mesh_file(path, extensions: tuple[str, ...], kind: ElementWords) -> tuple[pathlib.Path, str]:
    """``(path, lower-case extension)`` of an existing regular file with one of ``extensions``, else MeshError."""
    p = pathlib.Path(path)
    ext = p.suffix.lower()
    if ext not in extensions:
        raise MeshError(
            f"{p}: unsupported {kind.file_kind} file extension {p.suffix!r}; supported: {', '.join(extensions)}"
        )
    if not p.exists():
        raise MeshError(f"{p}: mesh file not found (resolved: {p.resolve()}); expected an existing {ext} file")
    if not p.is_file():
        raise MeshError(f"{p}: not a regular file; expected a {ext} {kind.file_kind} file")
    return p, ext


def check_save_path(path, extensions: tuple[str, ...]) -> tuple[pathlib.Path, str]:
    """``(path, lower-case extension)`` of a destination with one of ``extensions``, else MeshError."""
    p = pathlib.Path(path)
    ext = p.suffix.lower()
    if ext not in extensions:
        raise MeshError(f"{p}: cannot save: unsupported extension {p.suffix!r}; supported: {', '.join(extensions)}")
    return p, ext


def check_folder(p: pathlib.Path) -> None:
    """Refuses a save destination whose folder does not exist (FileNotFoundError)."""
    if not p.parent.is_dir():
        raise FileNotFoundError(f"{p}: cannot save: folder {p.parent} does not exist")


def _longest(x: np.ndarray, elements: np.ndarray) -> np.ndarray:
    k = elements.shape[1]
    return np.max([np.linalg.norm(x[elements[:, j]] - x[elements[:, i]], axis=1)
                   for i, j in itertools.combinations(range(k), 2)], axis=0)


def degenerate_triangles(vertices, triangles) -> tuple[np.ndarray, np.ndarray]:
    """Which triangles have (numerically) zero area: ``|(x1 - x0) x (x2 - x0)| <= DEGENERATE_RTOL * L^2``, L the
    longest edge (a triangle with coincident corners has L area 0 as well).

    Args:
        vertices: float (n, 3).
        triangles: int (m, 3).

    Returns:
        (mask bool (m,), areas float64 (m,)).
    """
    x = np.asarray(vertices, dtype=np.float64)
    t = np.asarray(triangles, dtype=np.int64)
    twice = np.linalg.norm(np.cross(x[t[:, 1]] - x[t[:, 0]], x[t[:, 2]] - x[t[:, 0]]), axis=1)
    return twice <= DEGENERATE_RTOL * _longest(x, t) ** 2, 0.5 * twice


def degenerate_tets(vertices, tets) -> tuple[np.ndarray, np.ndarray]:
    """Which tets have (numerically) zero volume: ``|6 V| <= DEGENERATE_RTOL * L^3``, L the longest edge.

    Returns:
        (mask bool (m,), signed volumes float64 (m,)).
    """
    x = np.asarray(vertices, dtype=np.float64)
    t = np.asarray(tets, dtype=np.int64)
    six = np.einsum("ij,ij->i", x[t[:, 1]] - x[t[:, 0]], np.cross(x[t[:, 2]] - x[t[:, 0]], x[t[:, 3]] - x[t[:, 0]]))
    return np.abs(six) <= DEGENERATE_RTOL * _longest(x, t) ** 3, six / 6.0


def short_edges(vertices, edges) -> tuple[np.ndarray, np.ndarray]:
    """Which edges have (numerically) zero length: at most ``DEGENERATE_RTOL`` times the bounding-box diagonal.

    Returns:
        (mask bool (m,), lengths float64 (m,)).
    """
    x = np.asarray(vertices, dtype=np.float64)
    e = np.asarray(edges, dtype=np.int64)
    lengths = np.linalg.norm(x[e[:, 1]] - x[e[:, 0]], axis=1)
    diagonal = float(np.linalg.norm(np.ptp(x, axis=0))) if x.size else 0.0
    return lengths <= DEGENERATE_RTOL * diagonal, lengths


def check_nondegenerate(source: str, vertices, faces=None, edges=None, tets=None, needs: str = "") -> None:
    """Refuses degenerate elements that an app's energies cannot take: zero-area ``faces``, zero-length ``edges``,
    zero-volume ``tets`` (each checked when given).

    Args:
        source: what the mesh is (a file path), first in the message.
        vertices: float (n, 3).
        faces, edges, tets: int (m, 3), (m, 2), (m, 4) arrays, or None (not checked).
        needs: why the caller needs them non-degenerate (e.g. "the area energy's gradient is the unit face
            normal"), ended to the message.

    Raises:
        MeshError: naming the first few offending elements, their total count, the first one's vertices and
            measure, and what was expected.
    """
    why = f" ({needs})" if needs else ""
    # (elements, test, what they are, one of them, what is wrong, its measure, what was expected)
    kinds = (
        (faces, degenerate_triangles, "faces", "face", "have zero area", "area", "triangles of positive area"),
        (edges, short_edges, "edges", "edge", "have zero length", "length",
         "distinct positions at the two ends of every edge"),
        (tets, degenerate_tets, "tets", "tet", "are degenerate", "volume", "tets of nonzero volume"),
    )
    for elements, test, plural, one, wrong, measure, expected in kinds:
        if elements is None:
            continue
        bad, values = test(vertices, elements)
        if bad.any():
            idx = np.flatnonzero(bad)
            b = idx[0]
            raise MeshError(f"{source}: {plural} {first_items(idx)} {wrong} ({one} {b} = "
                            f"{np.asarray(elements)[b].tolist()}, {measure} {values[b]:.3g}); expected {expected}{why}")
