"""problem: the objective F(x) = sum of energy terms over mesh elements, and its derivatives.

- ``problem.py``: the public :class:`Problem` (argument checks, then delegation to the objects below).
- ``terms.py``: the :class:`Term` record and ``make_term`` (what ``add_term`` checks); ``variables.py``: variable
  types, readable type names and the array checks every module shares.
- ``storage.py``: preallocated outputs, Hessian/Jacobian patterns, element layout, deterministic buffers.
- ``assembly.py``: the :class:`Assembler`, every kernel launch (atomic, tiled, deterministic; gradient, Hessian,
  Hessian-vector product, parameter derivatives, residuals, Jacobian).
- ``pattern.py`` / ``pattern_device.py``: the sparsity patterns built on the host / on the GPU.
- ``tiled.py``: the patch plan of the tiled assembly and its knobs (``TileConfig``); ``reduce.py``: fixed-order sums.
- ``interaction.py``: terms whose elements change at run time and their merged pattern; ``parameters.py``:
  parameter fields and mixed-derivative buffers. Kernels themselves are built in ``codegen/kernel_cache.py``.
"""
