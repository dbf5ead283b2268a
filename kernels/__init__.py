"""Device library of warp_meshad: dual numbers, local math and built-in energies.

Importable from any Warp kernel without the host-side toolkit::

    from warp_meshad.kernels import ad

    @wp.func
    def spring(e: int, xa: Any, xb: Any, data: SpringData):
        return ad.sq(ad.length(xa - xb) - data.rest[e])

The dual-number modules are generated on demand (see :mod:`warp_meshad.kernels._dualgen`). Built-in energies are
in :mod:`warp_meshad.kernels.energies`; :mod:`warp_meshad.kernels.dtype_struct` declares an energy's data once for
float32 and float64 problems.

Dual numbers in your own kernel
-------------------------------
An energy given to :class:`warp_meshad.Problem` never sees a dual type: the problem rewrites it and seeds its
variables. A hand-written ``@wp.kernel`` does that itself with the module of one dual type,
``D = ad.duals(k, dtype, hessian)`` (see :func:`warp_meshad.kernels.ad.duals`):

- ``D.seed(x, offset)`` turns a plain scalar, ``vecN`` (N = 2, 3, 4) or ``matNN`` (N = 2, 3; row-major) into a dual
  (``D.Dual``, ``D.DVecN``, ``D.DMatNN``) whose components are the variables ``offset, offset + 1, ...`` of the k
  differentiated together; seed each input at its own offset, the offsets covering ``0 .. k - 1``.
- ``D.const(x)`` is a dual with zero derivatives; plain scalars also mix with duals directly (``0.5 * a``).
- ``D.value(a)``, ``D.gradient(a)`` (``D.vecK``) and, with ``hessian=True``, ``D.hessian(a)`` (``D.matK``,
  symmetric k x k) read a dual scalar's result.
- Math on duals: ``D.length, D.dot, D.cross, D.sqrt, D.sq, D.log, D.det, ...``, the names of
  :mod:`~warp_meshad.kernels.ad`, overloaded for the dual types and for plain values (the ``ad.*`` functions
  themselves are the plain overloads only).
- Operators: Warp resolves ``+ - * /`` through functions named ``add, sub, mul, div`` in the globals of the file that
  defines the kernel, so bind the dual module's there once (``add, sub, mul, div = D.add, D.sub, D.mul, D.div``).
  Unary minus and comparisons are not rewritten in your own kernels: write ``0.0 - a``, and compare values
  (``D.value(a) < 1.0``).

Example (runs on the CPU; ``examples/own_kernel.py`` adds the Hessian and checks both against central
differences)::

    import warp as wp

    from warp_meshad.kernels import ad

    D = ad.duals(6, wp.float64, hessian=False)  # gradient duals of 6 scalars: two vec3d corners
    add, sub, mul, div = D.add, D.sub, D.mul, D.div  # what + - * / on duals resolve to in this file's kernels


    @wp.kernel(enable_backward=False)
    def spring_gradients(x: wp.array(dtype=wp.vec3d), edges: wp.array2d(dtype=wp.int32), rest: wp.float64,
                         g: wp.array(dtype=D.vecK)):
        e = wp.tid()
        a = D.seed(x[edges[e, 0]], 0)  # variables 0, 1, 2
        b = D.seed(x[edges[e, 1]], 3)  # variables 3, 4, 5
        energy = 0.5 * D.sq(D.length(a - b) - rest)
        g[e] = D.gradient(energy)  # dE/d(a, b), a vec6d


    x = wp.array([[0.0, 0.0, 0.0], [2.0, 0.0, 0.0]], dtype=wp.vec3d, device="cpu")
    edges = wp.array([[0, 1]], dtype=wp.int32, device="cpu")
    g = wp.zeros(1, dtype=D.vecK, device="cpu")
    wp.launch(spring_gradients, dim=1, inputs=[x, edges, wp.float64(1.0), g], device="cpu")
    print(g.numpy()[0])  # (|a - b| - rest) (a - b) / |a - b| and its negative: [-1. 0. 0. 1. 0. 0.]
"""

__all__ = ["ad"]
