"""Meshes on the host (numpy; Warp is not imported): validated storage, element stencils and rest shapes.

- ``trimesh``: :class:`TriMesh`, a triangle mesh and its stencils (edges, faces, diamonds, ...) and rest geometry.
- ``tetmesh``: :class:`TetMesh`, a tetrahedral mesh, its boundary surface and rest shapes (files through meshio).
- ``one_rings``: :class:`OneRings`, every vertex's ordered one-ring padded to one width (``TriMesh.vertex_one_rings``).
- ``vertex_mesh``: ``VertexMesh``, the vertex side both share (counts, positions, bounds).
- ``checks``: :class:`MeshError` and the array, option, unreferenced-vertex and file-path checks both use.
- ``files``: OBJ/OFF/PLY reading and writing, and ``atomic_write`` / ``new_file_mode`` used by every saved output.
- ``sorting``: ``sorted_groups``, the runs of equal keys that group half-edges into edges and tet faces.
- ``locality``: ``locality_order``, a Morton-curve vertex order.
- ``tutte``: ``tutte_embedding``, a disk-topology mesh mapped into the unit disk.
"""
