"""Make the parametrization dataset: disk-topology patches cut from the shipped surfaces (issue 20, item 4).

    python benchmarks/make_dataset.py                      # 200 patches, 500 to 100k faces -> output/datasets/param_patches
    python benchmarks/make_dataset.py --small              # the 20 small ones the tests use -> assets/datasets/param_patches_small
    python benchmarks/make_dataset.py --count 50 --out DIR --min-faces 500 --max-faces 20000

Patch ``i`` is made from seed ``seed + i`` alone (``np.random.default_rng``), so the set is the same on every machine
and any one patch can be made again by itself. Its asset is ``ASSETS[i % len(ASSETS)]`` (assets/meshes/, sources in
assets/meshes/README.md); its target face count is log-uniform in ``[min_faces, max_faces]``. An asset too small for
the target is first refined by midpoint subdivision (each triangle into 4, the surface unchanged) as often as needed.
From a random seed face, faces are taken in order of their geodesic distance from it (Dijkstra on the edge graph,
a face's distance = its farthest vertex's) until the target count; then the connected piece holding the seed face is
kept and its holes are filled (every piece of the rest of the surface but the largest joins the patch). The patch must
be a disk: one boundary loop, Euler characteristic V - E + F = 1, no vertex where the boundary touches itself, and a
face count in range; otherwise another seed face is drawn (same rng). Written as ``patch_XXX.obj`` with
``sources.json``: for each file its asset, seed, subdivision level, seed face and counts.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time

import numpy as np
import scipy.sparse as sp
from scipy.sparse.csgraph import connected_components, dijkstra

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import warp_meshad as wm  # noqa: E402

MESHES = ROOT / "assets" / "meshes"
# the shipped surfaces (beetle.obj is refused by design: non-manifold); unreferenced vertices removed where present
ASSETS = ["spot.obj", "armadillo-cut-low.obj", "bunny-cut.obj", "homer.obj", "fandisk.obj", "cheburashka.off",
          "stanford-bunny.obj", "sphere.obj", "woody.obj"]
FULL_DIR = ROOT / "output" / "datasets" / "param_patches"
SMALL_DIR = ROOT / "assets" / "datasets" / "param_patches_small"
TRIES = 40

__all__ = ["ASSETS", "cut_patch", "make_dataset", "subdivide"]


def subdivide(mesh: wm.TriMesh) -> wm.TriMesh:
    """Midpoint subdivision: a vertex at each edge's midpoint, each face into 4 (same surface, 4x the faces)."""
    v, f, e = mesh.vertices, mesh.faces, mesh.edges
    mid = 0.5 * (v[e[:, 0]] + v[e[:, 1]])
    fe = mesh.face_edges.astype(np.int64) + mesh.vertex_count  # new vertex of edges (f0,f1), (f1,f2), (f2,f0)
    a, b, c = f[:, 0], f[:, 1], f[:, 2]
    m01, m12, m20 = fe[:, 0], fe[:, 1], fe[:, 2]
    faces = np.concatenate([np.stack(t, axis=1) for t in
                            ((a, m01, m20), (m01, b, m12), (m20, m12, c), (m01, m12, m20))])
    return wm.TriMesh(np.concatenate([v, mid]), faces, source=f"{mesh.source} (subdivided)")


def _face_graph(mesh: wm.TriMesh, keep: np.ndarray) -> sp.csr_matrix:
    """Adjacency of the faces in ``keep`` (bool, shape (face_count,)) through interior edges."""
    ef = mesh.edge_faces
    ef = ef[keep[ef[:, 0]] & keep[ef[:, 1]]]
    n = mesh.face_count
    return sp.coo_matrix((np.ones(len(ef)), (ef[:, 0], ef[:, 1])), shape=(n, n)).tocsr()


def _disk_problem(patch: wm.TriMesh, min_faces: int, max_faces: int) -> str | None:
    """Why ``patch`` is not a disk of the wanted size (None: it is)."""
    if not min_faces <= patch.face_count <= max_faces:
        return f"{patch.face_count} faces"
    loops = patch.boundary_loops
    if len(loops) != 1:
        return f"{len(loops)} boundary loops"
    if patch.euler_characteristic != 1:
        return f"Euler characteristic {patch.euler_characteristic}"
    if len(patch.boundary_vertices) != len(patch.boundary_edges):
        return "the boundary touches itself at a vertex"
    return None


def cut_patch(mesh: wm.TriMesh, graph: sp.csr_matrix, seed_face: int, target: int) -> wm.TriMesh:
    """The geodesic patch of about ``target`` faces around ``seed_face``, holes filled (may not be a disk yet).

    Args:
        mesh: the surface.
        graph: its vertex graph weighted by edge length (sparse, shape (vertex_count, vertex_count)).
        seed_face: the face the patch grows from.
        target: face count before hole filling.
    """
    f = mesh.faces
    dist = dijkstra(graph, directed=False, indices=int(f[seed_face, 0]))
    face_dist = dist[f].max(axis=1)
    order = np.argsort(face_dist, kind="stable")
    keep = np.zeros(mesh.face_count, dtype=bool)
    keep[order[:target]] = True
    keep[seed_face] = True
    _, label = connected_components(_face_graph(mesh, keep), directed=False)
    keep &= label == label[seed_face]
    rest = ~keep  # fill holes: every piece of the rest but the largest joins the patch
    if rest.any():
        _, label = connected_components(_face_graph(mesh, rest), directed=False)
        sizes = np.bincount(label[rest])
        outside = int(np.argmax(sizes))
        keep |= rest & (label != outside)
    faces = f[keep]
    used, inverse = np.unique(faces, return_inverse=True)
    return wm.TriMesh(mesh.vertices[used], inverse.reshape(-1, 3))


class _Sources:
    """The assets, loaded once, and their subdivisions with their edge graphs, made on first use."""

    def __init__(self):
        self._cache: dict[tuple[str, int], tuple[wm.TriMesh, sp.csr_matrix]] = {}

    def get(self, asset: str, level: int) -> tuple[wm.TriMesh, sp.csr_matrix]:
        key = (asset, level)
        if key not in self._cache:
            if level == 0:
                mesh = wm.TriMesh.from_file(MESHES / asset, unreferenced="remove")
            else:
                mesh = subdivide(self.get(asset, level - 1)[0])
            e = mesh.edges
            w = mesh.edge_lengths()
            n = mesh.vertex_count
            graph = sp.coo_matrix((w, (e[:, 0], e[:, 1])), shape=(n, n)).tocsr()
            self._cache[key] = (mesh, graph)
        return self._cache[key]

    def face_count(self, asset: str) -> int:
        return self.get(asset, 0)[0].face_count


_SOURCES = None  # per process: the assets loaded (and subdivided) so far


def _make_one(i: int, out: pathlib.Path, min_faces: int, max_faces: int, seed: int) -> dict:
    """Patch ``i`` (from seed ``seed + i`` alone), written to ``out``; its sources record."""
    global _SOURCES
    if _SOURCES is None:
        _SOURCES = _Sources()
    sources = _SOURCES
    rng = np.random.default_rng(seed + i)
    asset = ASSETS[i % len(ASSETS)]
    target = int(round(np.exp(rng.uniform(np.log(min_faces), np.log(max_faces)))))
    level = 0  # the patch may take up to 70% of the surface
    while sources.face_count(asset) * 4 ** level * 0.7 < target:
        level += 1
    mesh, graph = sources.get(asset, level)
    why = []
    for attempt in range(TRIES):
        seed_face = int(rng.integers(mesh.face_count))
        patch = cut_patch(mesh, graph, seed_face, target)
        problem = _disk_problem(patch, min_faces, max_faces)
        if problem is None:
            break
        why.append(problem)
    else:
        raise RuntimeError(f"patch {i} ({asset}, seed {seed + i}, target {target}): no disk in {TRIES} tries "
                           f"({', '.join(why[:5])}, ...)")
    name = f"patch_{i:03d}.obj"
    patch.save(out / name)
    return {"file": name, "asset": f"assets/meshes/{asset}", "seed": seed + i, "subdivisions": level,
            "seed_face": seed_face, "target_faces": target, "tries": attempt + 1,
            "vertex_count": patch.vertex_count, "face_count": patch.face_count,
            "boundary_vertex_count": len(patch.boundary_vertices)}


def make_dataset(out: pathlib.Path, count: int, min_faces: int, max_faces: int, seed: int, log=print,
                 jobs: int = 1) -> list[dict]:
    """Write ``count`` disk patches and ``sources.json`` to ``out``; return the sources records.

    ``jobs`` > 1 makes the patches in that many processes (the same files: each patch depends on its seed alone).
    """
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    args = [(i, out, min_faces, max_faces, seed) for i in range(count)]
    if jobs > 1:
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(jobs) as pool:
            records = list(pool.map(_make_one, *zip(*args)))
    else:
        records = [_make_one(*a) for a in args]
    for rec in records:
        log(f"{rec['file']}: {pathlib.Path(rec['asset']).name} (x4^{rec['subdivisions']}) {rec['face_count']} faces, "
            f"{rec['vertex_count']} vertices")
    log(f"[{time.perf_counter() - t0:.1f} s]")
    info = {"made_by": "python benchmarks/make_dataset.py " + " ".join(sys.argv[1:]),
            "min_faces": min_faces, "max_faces": max_faces, "seed": seed,
            "asset_sources": "assets/meshes/README.md", "meshes": records}
    (out / "sources.json").write_text(json.dumps(info, indent=1) + "\n")
    return records


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--small", action="store_true",
                        help=f"the tests' subset: 20 patches of 500 to 1500 faces into {SMALL_DIR.relative_to(ROOT)}")
    parser.add_argument("--count", type=int, default=200)
    parser.add_argument("--min-faces", type=int, default=500)
    parser.add_argument("--max-faces", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=20)
    parser.add_argument("--out", type=pathlib.Path, default=None)
    parser.add_argument("--jobs", type=int, default=1, help="processes making patches (same files for any count)")
    args = parser.parse_args(argv)
    if args.small:
        count, lo, hi, out, seed = 20, 500, 1500, SMALL_DIR, 2000
    else:
        count, lo, hi, out, seed = args.count, args.min_faces, args.max_faces, FULL_DIR, args.seed
    out = args.out or out
    recs = make_dataset(out, count, lo, hi, seed, jobs=args.jobs)
    faces = np.array([r["face_count"] for r in recs])
    print(f"{len(recs)} patches, {faces.min()} to {faces.max()} faces (median {int(np.median(faces))}) in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
