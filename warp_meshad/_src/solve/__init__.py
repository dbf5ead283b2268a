"""solve: minimizing a Problem's energy, and what the minimizers are built from.

- ``policy/``: the decisions every loop takes, stated once: stop reasons and fallback codes (``codes.py``), the stop,
  descent, Armijo and energy-change tests over arrays of one value per problem (``rules.py``) and the same as Warp
  functions for the device loops (``device.py``).
- ``solvers``: the host loop (``_Driver.solve``) and its solvers (Newton / projected Newton, Gauss-Newton,
  Newton-CG, L-BFGS, gradient descent), ``SolveResult``, and ``NewtonHooks`` (contact refresh, trial energy, stop test).
- ``options``: the grouped options (``LineSearch``, ``Projection``, ``DeviceLoop``) and ``check_compatible``, the one
  place that refuses options which cannot work together.
- ``device_loop`` (+ ``device_loop_kernels``): the Newton loop with its decisions on the device (``NewtonSolver(...,
  device_loop=True)``): at most one small host read per iteration, CUDA graphs with ``DeviceLoop(capture=True)``.
- ``first_order_loop`` (+ ``first_order_kernels``): L-BFGS's and gradient descent's loop on the device
  (``LBFGSSolver(..., device_loop=...)``): the two-loop recursion over a ring of pairs in kernels, the whole solve one
  CUDA graph with ``DeviceLoop(capture=True, poll=False)``.
- ``batch_solver``: projected Newton over a ``ProblemBatch``, each mesh with its own stops.
- ``phase_timer``: phase timers on CUDA events (no synchronization), the host clock on the CPU.
- ``line_search``: Armijo backtracking with +inf/NaN rejection and an optional step bound (CCD).
- ``linear/``: the sparse linear back-ends behind ``LinearSolver``, one file each (``scipy.py``: SuperLU,
  ``qdldl.py``: LDL^T, ``cg.py``: Warp CG, ``spsolve.py``: CuPy, ``cudss.py``: cuDSS, with its on-disk analysis cache
  in ``cudss_analysis_cache.py``); ``base.py`` the interface and the system checks, ``csr.py`` the BSR -> CSR
  conversion, ``reuse.py`` the reuse of factors across matrices and float32 factors, ``gpu_csr.py`` the CuPy views of
  the GPU back-ends, ``registry.py`` the table of back-ends by name with ``make_linear_solver`` and ``"auto"``.
- ``constraints``: Dirichlet pins applied symmetrically to a BSR system and to block vectors.
- ``vector_ops``: dot, norm, axpy, scale, linear combination on block vectors, and the diagonal add (damping).
- ``implicit``: gradients through a minimization (one adjoint solve with the Hessian at the minimizer).
- ``time_integration``: backward Euler steps as minimizations (inertia-gravity term, prediction, velocity update).
"""
