"""Contact on the host side, behind :mod:`warp_meshad.contact`; the device functions (distances, CCD, barriers) live in
:mod:`warp_meshad.kernels.contact`.

- ``search``: :class:`ContactSearch` (BVHs over face and edge boxes, rebuilt every few calls) and its one-shot
  functions: point-triangle and edge-edge pairs within a distance (``find_contact_pairs``, two passes: count, then
  write, so no pair is dropped), the largest collision-free step fraction by CCD (``max_step``, ``plane_max_step``),
  edge-edge mollifier thresholds and intersecting face pairs (a check for outputs).
"""
