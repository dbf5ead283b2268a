"""One-ring stencils of a triangle mesh: each vertex's neighbours in counter-clockwise order, padded to one width.

A one-ring energy (a Laplacian, an angle defect, a vertex's area or normal) needs a variable number of variables per
element, while :meth:`~warp_meshad.Problem.add_term` takes elements of one valence. :class:`OneRings` holds the rings
padded to the largest valence with the centre vertex itself, so one term covers every vertex (the padded slots hold
the centre's own value: ``x[ring[k]] - x[centre]`` is zero there), and groups the vertices by valence for terms
written for one valence each.

Built by :meth:`TriMesh.vertex_one_rings <warp_meshad.TriMesh.vertex_one_rings>` from the mesh's half-edges; pure
numpy on the host.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np

from warp_meshad._src.mesh.checks import readonly

__all__ = ["OneRings", "build_one_rings"]


@dataclasses.dataclass(frozen=True, eq=False)
class OneRings:
    """Every vertex's one-ring, ordered counter-clockwise and padded with the centre vertex.

    Row ``i`` describes vertex ``i`` (n = vertex_count rows, R = ``max_valence`` columns):

    - ``ring[i, :valence[i]]`` are the distinct neighbours of ``i``, counter-clockwise seen from the side the face
      normals point to: for each ``k``, ``(i, ring[i, k], ring[i, k + 1])`` is a face of the mesh in its own vertex
      order, up to rotation, where ``faces[i, k] >= 0`` says which (see ``faces``).
    - An interior vertex's ring is closed: it starts at its smallest neighbour index and its last slot is joined to
      its first by a face (``faces[i, valence[i] - 1] >= 0``).
    - A boundary vertex's ring is open: it starts at the neighbour across the boundary edge that leaves ``i``
      (``i -> ring[i, 0]`` runs along the boundary as the faces orient it) and ends at the neighbour across the one
      that enters ``i``; no face joins its last slot to its first (``faces[i, valence[i] - 1] == -1``).
    - A vertex where several fans of faces meet (the boundary touching itself, or two sheets sharing a vertex) lists
      its fans one after another, by their first neighbour index, each ordered as above; ``faces`` is -1 between
      two fans, and the face that closes a closed fan among several is not recorded in ``faces``.
    - Padding: ``ring[i, k] = i`` and ``faces[i, k] = -1`` for ``k >= valence[i]``.

    Attributes:
        ring: neighbours, int32, shape (vertex_count, max_valence), padded with the row's own index.
        valence: number of neighbours of each vertex, int32, shape (vertex_count,); ``>= 2``.
        faces: ``faces[i, k]`` is the index of the face ``(i, ring[i, k], ring[i, (k + 1) % valence[i]])`` where that
            triangle is a face of the mesh, else -1; int32, shape (vertex_count, max_valence).

    All arrays are read-only numpy arrays.
    """

    ring: np.ndarray
    valence: np.ndarray
    faces: np.ndarray

    @property
    def vertex_count(self) -> int:
        """Number of rows n (the mesh's vertices)."""
        return self.ring.shape[0]

    @property
    def max_valence(self) -> int:
        """R, the width of ``ring`` and ``faces``: the largest valence."""
        return self.ring.shape[1]

    @functools.cached_property
    def mask(self) -> np.ndarray:
        """True on the real slots of ``ring`` (``k < valence[i]``), False on padding; bool, shape (vertex_count,
        max_valence)."""
        return readonly(np.arange(self.max_valence)[None, :] < self.valence[:, None])

    @functools.cached_property
    def closed(self) -> np.ndarray:
        """True where the ring is a single closed fan (an interior, manifold vertex); bool, shape (vertex_count,)."""
        last = self.faces[np.arange(self.vertex_count), self.valence - 1]
        return readonly(last >= 0)

    @functools.cached_property
    def elements(self) -> np.ndarray:
        """The one-ring stencil for :meth:`~warp_meshad.Problem.add_term`: ``[i, ring[i, 0], ..., ring[i, R - 1]]``
        per vertex; int32, shape (vertex_count, 1 + max_valence).

        The energy then takes the element index, the centre and R ring variables; the padded ones are the centre's
        own variable again (so a difference ``xk - xc`` is zero there), and the energy reads ``valence`` from its data
        where it must tell them apart (e.g. to divide by the valence, or where a zero vector would be normalised).
        A variable repeated in one element is differentiated correctly: its slots' derivatives add up.
        """
        centre = np.arange(self.vertex_count, dtype=np.int32)[:, None]
        return readonly(np.concatenate([centre, self.ring], axis=1))

    def by_valence(self) -> dict[int, np.ndarray]:
        """The vertices of each valence, for terms written for one valence each.

        Returns:
            ``{valence: vertex indices}``, keys ascending, each an int32 array ascending. Elements of valence v
            for :meth:`~warp_meshad.Problem.add_term`: ``rings.elements[idx, : 1 + v]`` (the centre, then its ring).
        """
        order = np.argsort(self.valence, kind="stable").astype(np.int32)
        values, starts = np.unique(self.valence[order], return_index=True)
        groups = np.split(order, starts[1:])
        return {int(v): readonly(g) for v, g in zip(values, groups)}


def build_one_rings(faces: np.ndarray, twin: np.ndarray, vertex_count: int) -> OneRings:
    """The :class:`OneRings` of a triangle mesh given by its faces and half-edge twins.

    A wedge is a face seen from one of its corners: half-edge ``h = 3 * f + k`` leaves corner ``k`` (the centre) and
    the wedge runs from corner ``k + 1`` to corner ``k + 2``. The next wedge counter-clockwise around the centre is
    the twin of the half-edge entering the centre in ``f``; walking those links orders each fan.

    Args:
        faces: int array (m, 3), the mesh's counter-clockwise triangles.
        twin: int64 (3m,), the opposite half-edge of each half-edge, -1 on the boundary.
        vertex_count: n; every vertex is used by some face.

    Returns:
        The rings, one row per vertex.
    """
    m = faces.shape[0]
    corners = faces.reshape(-1).astype(np.int64)
    h = np.arange(3 * m, dtype=np.int64)
    base, k = 3 * (h // 3), h % 3
    centre = corners
    first = corners[base + (k + 1) % 3]  # the wedge's first neighbour ...
    last = corners[base + (k + 2) % 3]  # ... and its last
    succ = twin[base + (k + 2) % 3]  # the next wedge around the centre, -1 at an open fan's end
    has_pred = np.zeros(3 * m, dtype=bool)
    has_pred[succ[succ >= 0]] = True

    head = np.full(3 * m, -1, dtype=np.int64)  # the first wedge of each wedge's fan
    rank = np.zeros(3 * m, dtype=np.int64)  # the wedge's position in its fan
    fan_length = np.zeros(3 * m, dtype=np.int64)  # per head: wedges in its fan
    fan_closed = np.zeros(3 * m, dtype=bool)  # per head

    def walk(starts: np.ndarray, closed: bool) -> None:
        cur, step = starts.copy(), 0
        alive = np.ones(starts.size, dtype=bool)
        while alive.any():
            c = cur[alive]
            head[c], rank[c] = starts[alive], step
            nxt = succ[c]
            ok = nxt >= 0
            ok[ok] = head[nxt[ok]] < 0  # a closed fan ends where it comes back to its head
            cur[alive] = np.where(ok, nxt, c)
            alive[alive] = ok
            step += 1
        fan_length[starts] = rank[cur] + 1
        fan_closed[starts] = closed

    walk(np.flatnonzero(~has_pred), closed=False)  # open fans start at a wedge with no predecessor
    while True:  # closed fans: start each at its smallest neighbour; one round per closed fan at a vertex
        free = np.flatnonzero(head < 0)
        if free.size == 0:
            break
        by_vertex = free[np.lexsort((first[free], centre[free]))]
        is_first = np.ones(by_vertex.size, dtype=bool)
        is_first[1:] = centre[by_vertex[1:]] != centre[by_vertex[:-1]]
        walk(by_vertex[is_first], closed=True)

    # ring entries: each wedge's first neighbour at its rank, and an open fan's last neighbour after its wedges
    heads = np.flatnonzero(fan_length > 0)
    tails = np.flatnonzero((rank + 1 == fan_length[head]) & ~fan_closed[head])  # last wedge of each open fan
    e_centre = np.concatenate([centre, centre[tails]])
    e_head = np.concatenate([head, head[tails]])
    e_rank = np.concatenate([rank, rank[tails] + 1])
    e_vertex = np.concatenate([first, last[tails]])
    e_face = np.concatenate([h // 3, np.full(tails.size, -1, dtype=np.int64)])
    # the wedge closing a closed fan points back to slot 0 of its fan: right only where that fan is its vertex's only
    fans_at = np.bincount(centre[heads], minlength=vertex_count)
    closes = np.concatenate([(rank + 1 == fan_length[head]) & fan_closed[head], np.zeros(tails.size, dtype=bool)])
    e_face[closes & (fans_at[e_centre] > 1)] = -1

    order = np.lexsort((e_rank, first[e_head], e_centre))  # by vertex, fans by first neighbour, then around
    e_centre, e_vertex, e_face = e_centre[order], e_vertex[order], e_face[order]
    valence = np.bincount(e_centre, minlength=vertex_count)
    row_start = np.concatenate([[0], np.cumsum(valence)[:-1]])
    slot = np.arange(e_centre.size) - row_start[e_centre]
    width = int(valence.max())
    ring = np.repeat(np.arange(vertex_count, dtype=np.int32)[:, None], width, axis=1)
    ring[e_centre, slot] = e_vertex
    face = np.full((vertex_count, width), -1, dtype=np.int32)
    face[e_centre, slot] = e_face
    return OneRings(ring=readonly(ring), valence=readonly(valence.astype(np.int32)), faces=readonly(face))
