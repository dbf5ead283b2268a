"""Device library of warp_meshad: dual numbers, local math and built-in energies.

Importable from any Warp kernel without the host-side toolkit::

    from warp_meshad.kernels import ad

    @wp.func
    def spring(e: int, xa: Any, xb: Any, data: SpringData):
        return ad.sq(ad.length(xa - xb) - data.rest[e])

The dual-number modules are generated on demand (see :mod:`warp_meshad.kernels._dualgen`). Built-in energies are
in :mod:`warp_meshad.kernels.energies`; :mod:`warp_meshad.kernels.dtype_struct` declares an energy's data once for
float32 and float64 problems.
"""

__all__ = ["ad"]
