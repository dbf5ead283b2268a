"""Handing results to other libraries, without copies where the device allows.

- ``convert``: ``to_scipy`` / ``to_cupy``, a BSR matrix as a SciPy or CuPy CSR matrix.
- ``torch_bridge``: :mod:`warp_meshad.torch`: the energy and gradient as autograd functions (double backward: Hessian-
  vector products) and ``minimize``, a solve differentiable in the parameters through the implicit gradient.
"""
