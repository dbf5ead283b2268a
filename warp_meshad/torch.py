"""PyTorch autograd for a :class:`~warp_meshad.Problem`: its energy and gradient as nodes of a torch graph.

.. code-block:: python

    import torch
    import warp_meshad.torch as wmt

    x = torch.tensor(mesh.vertices, dtype=torch.float64, requires_grad=True)  # (vertex_count, 3), problem's device
    loss = wmt.energy(problem, x) + 0.5 * (x - target).square().sum()
    loss.backward()  # x.grad = g(x) + (x - target)

- :func:`energy` (E(x), a 0-d tensor) has a backward that is differentiable again: Hessian-vector products of the
  problem (``torch.autograd.gradgradcheck``, ``create_graph=True``).
- :func:`gradient` (g(x)) has the Hessian-vector product as its backward.
- :func:`minimize` (x*(theta), a minimizer of a problem whose terms have parameters theta) has implicit
  differentiation as its backward: one adjoint solve with the Hessian at x* (``warp_meshad.implicit_gradient``).

Tensors are handed to Warp without a copy (``wp.from_torch``: the Warp array aliases the tensor's memory), so
``x`` must already have the problem's shape, dtype and device and be contiguous; anything else raises. Outputs are
fresh tensors (the problem's own buffers are overwritten by its next evaluation). Importing this module imports
torch (the ``torch`` extra); importing :mod:`warp_meshad` does not.

Installing torch:

- with a GPU: ``pip install -e ".[torch]"`` (PyPI's torch for Linux comes with its CUDA libraries, several GB);
- on a CPU-only machine, the CPU wheel first, then the extra, which keeps it (``+cpu`` builds satisfy
  ``torch>=2.0``)::

      pip install torch --index-url https://download.pytorch.org/whl/cpu
      pip install -e ".[torch]"

  (about 0.75 GB installed instead of several GB). ``torch.__version__`` then ends in ``+cpu``.
"""

from warp_meshad._src.interop.torch_bridge import energy, gradient, minimize

__all__ = ["energy", "gradient", "minimize"]
