"""The ``"cudss"`` back-end: :class:`CudssSolver`, NVIDIA cuDSS through nvmath-python's
``nvmath.sparse.advanced.DirectSolver`` (GPU only), and the checks of its options (``config``, with the
environment's :data:`CONFIG_VARIABLE`, and ``permutation``). Reordering and symbolic factorization (``plan()``) run
once per sparsity pattern; each call refills the CSR values in place and runs the numeric factorization and the solve
as two direct cuDSS calls on ``b`` and ``x`` (no copies), which the device loop can capture in a CUDA graph.
nvmath-python and CuPy are imported when a solver is made.

Not here: the on-disk cache of analyses (``cudss_analysis_cache.py``), the reuse of factors across matrices and the
float32 factors (``reuse.py``), the CuPy views and thread binding (``gpu_csr.py``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import time

import numpy as np
import warp as wp

from warp_meshad._src.solve.linear.base import (LinearSolveError, LinearSolveInfo, _check_system, _logger,
                                                _pattern_key, _residual_norm)
from warp_meshad._src.solve.linear.csr import _CsrBuffers
from warp_meshad._src.solve.linear.cudss_analysis_cache import (_apply_cached_analysis, _check_analysis_cache_option,
                                                                _save_analysis)
from warp_meshad._src.solve.linear.gpu_csr import _GpuCsrSolver, _import_cupy, _require_cuda
from warp_meshad._src.solve.linear.reuse import _ReusedFactors
from warp_meshad._src.solve.vector_ops import norm

__all__ = ["CONFIG_VARIABLE", "CudssSolver"]

_CUDSS_INSTALL = 'pip install "warp-meshad[cudss]"'

CONFIG_VARIABLE = "WARP_MESHAD_CUDSS_CONFIG"
"""``CudssSolver(config=None)`` reads its config from this environment variable when set: a JSON object of names to
ints (``'{"nd_nlevels": 2}'``), so apps and batches can be tuned without code."""


def _check_cudss_config_option(config) -> dict:
    """``CudssSolver(config=...)``: None (the environment's :data:`CONFIG_VARIABLE`, else none) or a dict of names to
    ints; the names are checked against cuDSS later."""
    if config is None:
        text = os.environ.get(CONFIG_VARIABLE, "").strip()
        if not text:
            return {}
        try:
            config = json.loads(text)
        except ValueError as exc:
            raise ValueError(f"{CONFIG_VARIABLE}: expected a JSON object of cuDSS configuration names to ints, got "
                             f"{text!r} ({exc})") from None
        where = CONFIG_VARIABLE
    else:
        where = "config"
    if not isinstance(config, dict):
        raise ValueError(f"{where}: expected None or a dict {{name: int}}, got {type(config).__name__}")
    out = {}
    for name, value in config.items():
        if not isinstance(name, str):
            raise ValueError(f"{where}: expected str keys (cuDSS configuration names), got {name!r}")
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise ValueError(f"{where}[{name!r}]: expected an int, got {value!r}")
        out[name.lower()] = int(value)
    return out


def _check_permutation_option(permutation) -> np.ndarray | None:
    """``CudssSolver(permutation=...)``: None or a permutation (1-D ints, each of 0..n-1 once), as contiguous int32."""
    if permutation is None:
        return None
    arr = np.asarray(permutation)
    if arr.ndim != 1 or arr.dtype.kind not in "iu":
        raise ValueError(f"permutation: expected None or a 1-D int array, got dtype {arr.dtype} and shape {arr.shape}")
    if not np.array_equal(np.sort(arr), np.arange(arr.shape[0])):
        raise ValueError(f"permutation: expected each of 0..{arr.shape[0] - 1} once, got another set of {arr.shape[0]} ints")
    return np.ascontiguousarray(arr, dtype=np.int32)


def _cudss_version() -> int:
    from nvmath.bindings import cudss

    return int(cudss.get_property(0)) * 10000 + int(cudss.get_property(1)) * 100 + int(cudss.get_property(2))


def _import_nvmath():
    try:
        import nvmath.sparse.advanced as nva
    except ImportError as exc:
        raise ImportError(f"the 'cudss' linear back-end needs nvmath-python with cuDSS: {_CUDSS_INSTALL}") from exc
    _import_cupy()
    return nva


class CudssSolver(_ReusedFactors, _GpuCsrSolver):
    """cuDSS sparse direct solver through ``nvmath.sparse.advanced.DirectSolver`` (GPU only).

    Reordering + symbolic factorization (``plan()``) run once per sparsity pattern; each :meth:`solve` refills the CSR
    values in place (same device buffers, so the plan stays valid), refactorizes numerically and solves.

    Args:
        matrix_type: ``"general"`` (LU, default), ``"symmetric"`` (LDLt), ``"spd"`` (Cholesky) or
            ``"spd_or_general"``: Cholesky until a factorization fails, then LU for good (:attr:`active_matrix_type`
            says which). A failure is, after the first factorization of a plan, a non-zero cuDSS ``info`` or a
            residual above :attr:`SPD_CHECK_RTOL` times ``||b||`` (read on the host even inside
            :meth:`solve_deferred`), and after any later one a residual that is not finite or above
            :attr:`SPD_CHECK_RTOL` times ``||b||`` (:meth:`solve`; inside :meth:`solve_deferred` the device loop
            checks it, :attr:`direction_rtol`, and calls :meth:`direction_rejected`); the failed solve is redone
            with LU, after a new analysis. Projected Hessians with pinned variables (or
            a mass term) are SPD: on the 1M-tet box of ``newton_tet.py`` Cholesky factorizes in 462 ms against
            LU's 889 ms (H200); without pins a projected Hessian keeps its rigid null space (param), where Cholesky
            fails once and LU takes over. ``NewtonSolver`` asks for it when it projects and pins.
        reordering: optional cuDSS reordering algorithm number (``plan_config.reordering_algorithm``: 0 default, 1,
            2, 3; see the cuDSS documentation).
        compute_residual: compute ``||b - A x||`` after each solve (one SpMV).
        reuse_factorization: one factorization serves at most this many solves (1: factorize every solve); between
            factorizations, PCG on the current matrix preconditioned by the kept factors (``reuse.py``). The
            matrices must be symmetric positive definite for it to pay (projected Newton's Hessians).
        factor_dtype: ``"float64"`` or ``"float32"``: factors of a float32 copy of a float64 matrix (its own plan,
            made on first use; a second plan in float64 only if a solve falls back to float64 factors), refined in
            float64 to ``refine_tol`` (``reuse.py``).
        refine_tol: relative residual the refined solves reach (reused or float32 factors).
        refine_maxiter: iteration cap of a refined solve, past which it refactorizes (reuse) or falls back to
            float64 factors.
        refine_budget: a solve with reused factors gives up (and refactorizes) once its predicted time exceeds this
            factor times the time of the numeric factorization that made the factors; None: the cap only.
        execution: ``"cuda"`` (default) or ``"hybrid"``: cuDSS's hybrid execute mode
            (``nvmath.sparse.advanced.ExecutionHybrid``, ``CUDSS_CONFIG_HYBRID_EXECUTE_MODE``), where cuDSS may run
            parts of the factorization and solve on the host: meant for small systems, where kernel launches
            dominate.
        host_threads: host threads of cuDSS's analysis (``plan_config.host_nthreads``); None: cuDSS's default.
            nvmath refuses it unless ``CUDSS_THREADING_LIB`` names cuDSS's threading layer
            (``libcudss_mtlayer_gomp.so.0`` beside ``libcudss``). Measured on the H200 it does not shorten the
            analysis (8 threads: 92 ms against 94 ms for param/armadillo's 64k unknowns).
        use_matching: cuDSS's matching step of the analysis (``plan_config.matching_algorithm``: ``AUTO`` for
            True, ``NONE`` for False); None: cuDSS's default (no matching in cuDSS 0.8).
        permutation: the fill-reducing ordering of the analysis, an int array of the scalar row count (entry ``i``
            is the row placed at position ``i``, the convention of ``plan_info.row_permutation``), handed to cuDSS as
            ``CUDSS_DATA_USER_PERM``; None: cuDSS computes it. Measured on the H200 (the orderings table of
            benchmarks/history/2026-12-02_cudss_analysis_and_factorization.md), cuDSS 0.8 factorizes 5-15x slower
            with a user ordering, even its own handed back, since it then lacks its partition tree: an option for
            orderings cuDSS cannot find, not for speed.
        direct_calls: after nvmath's plan, run each numeric factorization and solve as two direct cuDSS calls
            (``nvmath.bindings.cudss.execute``) on dense descriptors that point at ``b`` and ``x`` themselves, instead
            of nvmath's ``factorize()``/``solve()`` (which, per call, wrap the stream, allocate the solution and copy
            it, and copy ``b`` into the plan's buffer). Same cuDSS work, less host work per solve; False: nvmath's
            calls. Hybrid execution always uses nvmath's calls.
        analysis_cache: a folder (str or path) where the analysis's fill-reducing ordering and nested-dissection
            partition tree (``CUDSS_DATA_PERM_REORDER_ROW``, ``CUDSS_DATA_ND_PARTITION_TREE``) are kept per sparsity
            pattern, matrix type and analysis options; a later plan of the same pattern (in this or another process)
            hands both back to cuDSS (``CUDSS_DATA_USER_PERM`` + ``CUDSS_DATA_USER_ND_PARTITION_TREE``, cuDSS >=
            0.7.1), which then skips its reordering and keeps its factorization speed (an ordering alone costs the
            factorization 5-15x, see ``permutation``). ``"auto"``: the folder ``warp_meshad_cudss`` in Warp's
            kernel cache (``wp.config.kernel_cache_dir``, beside the toolkit's module records). None (the
            default): the environment variable ``WARP_MESHAD_CUDSS_ANALYSIS_CACHE`` (a folder, ``auto``, or ``0`` /
            ``off`` for none) if set, else ``"auto"``. False: off. Ignored with ``permutation``. Measured on the
            H200 (benchmarks/README.md, section ``cudss_direct.py``): param/armadillo's analysis 237 ms without, 31 ms
            with the cached ordering and tree, the same factors (non-zeros, factorization time).
            A file that cannot be read or applied is ignored (cuDSS analyses as usual) and rewritten. An entry holds
            4 bytes per unknown and the tree (armadillo's 64k unknowns: about 0.26 MB). The folder keeps at most
            ``WARP_MESHAD_CUDSS_ANALYSIS_CACHE_MB`` MiB (default 1024, some 4,000 entries of armadillo's size);
            past it each save deletes the entries used least recently (a hit counts as a use).
        handle: an existing cuDSS library handle (``nvmath.bindings.cudss.create()``, an int) for the plans of this
            solver, which then neither creates nor destroys one; None: each plan makes its own. cuDSS requires one
            handle per value type (float32 and float64 systems must not share one), and a plan of a small system
            costs about 90 ms on the H200, against 1.2 s for 50 patches analysed as one matrix. Sharing a handle
            does not remove that fixed cost (50 patches: 4.22 s against 4.26-4.41 s; "plans of many small meshes" in
            benchmarks/history/2026-12-02_cudss_analysis_and_factorization.md).
        deterministic: cuDSS's deterministic mode (``CUDSS_CONFIG_DETERMINISTIC_MODE``, set before the plan): the
            factorization and solve repeat bitwise run to run. Without it, two solves of the same matrix may differ
            at round-off; on a singular system (param without pins: the rigid motions) by far more, as the component
            along the null space is arbitrary. On the H200 (cuDSS 0.8) the mode repeated param/bunny_cut bitwise,
            but over the 200-patch dataset a process that planned patch 44 and then patch 45 in this mode died of
            an illegal memory access (with nvmath's own calls too, with or without the analysis cache, LU or
            Cholesky; not without the mode; benchmarks/README.md, section ``cudss_deterministic.py``), so nothing asks
            for it on its own.
        config: more of cuDSS's configuration, set before the plan: ``{name: value}`` with ``name`` a member of
            ``nvmath.bindings.cudss.ConfigParam`` (case-insensitive, e.g. ``"factorization_alg"``, ``"solve_alg"``,
            ``"nd_nlevels"``, ``"use_superpanels"``) and ``value`` an int (an ``AlgType`` for the algorithms), set
            with ``cudssConfigSet`` as its documented type. None: the environment variable
            ``WARP_MESHAD_CUDSS_CONFIG`` (a JSON object, e.g. ``'{"nd_nlevels": 2}'``) where set, else nothing.
            The analysis cache keys on it. Measured choices: ``benchmarks/cudss_calls.py --factorizations``.

    Not for concurrent use: planning several solvers at once from a thread pool (one solver per thread) crashed the
    process on the H200 (segmentation fault; ``cudss_calls.py --threads 4``). A solver may move between threads
    (``PyTorch``'s autograd thread, a Ray task), one call at a time.

    With ``reuse_factorization > 1`` or ``factor_dtype="float32"`` a solve reads residual norms on the host (the PCG),
    so :meth:`solve_deferred` then synchronizes like :meth:`solve` (``defers_checks`` is False).
    """

    keeps_factors = True

    name = "cudss"
    MATRIX_TYPES = ("general", "symmetric", "spd", "spd_or_general")
    SPD_CHECK_RTOL = 1e-6
    """``spd_or_general``: the first Cholesky solve of a plan must reach ``||b - A x|| <= SPD_CHECK_RTOL ||b||``."""
    EXECUTIONS = ("cuda", "hybrid")

    def __init__(
        self,
        matrix_type: str = "general",
        reordering: int | None = None,
        compute_residual: bool = True,
        reuse_factorization: int = 1,
        factor_dtype: str = "float64",
        refine_tol: float = 1e-10,
        refine_maxiter: int = 20,
        refine_budget: float | None = 1.0,
        execution: str = "cuda",
        host_threads: int | None = None,
        use_matching: bool | None = None,
        permutation=None,
        handle: int | None = None,
        direct_calls: bool = True,
        analysis_cache=None,
        deterministic: bool = False,
        config: dict | None = None,
    ):
        permutation = _check_permutation_option(permutation)  # the options first: errors before imports
        config = _check_cudss_config_option(config)
        if not isinstance(deterministic, bool):
            raise ValueError(f"deterministic: expected a bool, got {deterministic!r}")
        analysis_cache = _check_analysis_cache_option(analysis_cache)
        if not isinstance(direct_calls, bool):
            raise ValueError(f"direct_calls: expected a bool, got {direct_calls!r}")
        if handle is not None and (isinstance(handle, bool) or not isinstance(handle, (int, np.integer))):
            raise ValueError(f"handle: expected None or a cuDSS handle (an int), got {type(handle).__name__}")
        if handle is not None and factor_dtype != "float64":
            raise ValueError(f"handle: expected None with factor_dtype={factor_dtype!r} (its float32 plan would share "
                             "the float64 plan's handle, which cuDSS does not allow)")
        if host_threads is not None and not (isinstance(host_threads, int) and host_threads >= 1):
            raise ValueError(f"host_threads: expected None or an int >= 1, got {host_threads!r}")
        if use_matching is not None and not isinstance(use_matching, bool):
            raise ValueError(f"use_matching: expected None or a bool, got {use_matching!r}")
        if matrix_type not in self.MATRIX_TYPES:
            raise ValueError(f"matrix_type: expected one of {self.MATRIX_TYPES}, got {matrix_type!r}")
        if execution not in self.EXECUTIONS:
            raise ValueError(f"execution: expected one of {self.EXECUTIONS}, got {execution!r}")
        super().__init__(compute_residual)
        self.permutation = permutation
        self.handle = None if handle is None else int(handle)
        self._solver = None
        self._solver32 = None
        self._init_reuse(reuse_factorization, factor_dtype, refine_tol, refine_maxiter, refine_budget)
        self._nva = _import_nvmath()
        self.matrix_type = matrix_type
        self.active_matrix_type = "spd" if matrix_type == "spd_or_general" else matrix_type
        self._check_spd = False  # the next factorization is a plan's first under spd_or_general: check it
        self.reordering = reordering
        self.execution = execution
        self.host_threads = host_threads
        self.use_matching = use_matching
        self.direct_calls = direct_calls
        self.analysis_cache = analysis_cache
        self.deterministic = deterministic
        self.config = config
        if config:
            from nvmath.bindings import cudss

            unknown = sorted(name for name in config if not hasattr(cudss.ConfigParam, name.upper()))
            if unknown:
                known = ", ".join(m.name.lower() for m in cudss.ConfigParam)
                raise ValueError(f"config: unknown cuDSS configuration {unknown} (expected names of "
                                 f"nvmath.bindings.cudss.ConfigParam: {known})")
        self.analysis_cache_hit = None  # the last plan: True (ordering and tree from the cache), False, None (off)
        self._dense = None  # direct calls: (b descriptor, x descriptor) of the planned float64 solver
        self._factored = None  # the pattern the solver's factors belong to (resolve)
        self._quiet = logging.getLogger("warp_meshad.linear.cudss")
        if self._quiet.level == logging.NOTSET:
            self._quiet.setLevel(logging.ERROR)

    @property
    def defers_checks(self) -> bool:
        return not self._policy

    def _free(self) -> None:
        try:
            if self._dense is not None:
                from nvmath.bindings import cudss

                dense, self._dense = self._dense, None
                if self._solver is not None:  # queued direct calls may still read the descriptors
                    wp.synchronize_device(self._csr_device)
                for desc in dense:
                    cudss.matrix_destroy(desc)
            if self._solver is not None:
                self._solver.free()
        finally:
            self._solver = None
            try:
                if self._solver32 is not None:
                    self._solver32.free()
            finally:
                self._solver32 = None

    def __del__(self):
        try:
            self._free()
        except Exception:
            pass

    def invalidate_pattern(self) -> None:
        self._free()
        self._pattern = None
        self._factored = None
        self.forget_factors()

    def _build(self, A, device) -> None:
        """CSR buffers and CuPy views for A's pattern; the cuDSS solvers are planned on first use."""
        self._free()
        self._csr_device = device
        self._csr = _CsrBuffers(A)
        self._csr.update_values(A)
        self._mat = self._views(device)
        self._rhs = self._cp.zeros(self._csr.size, dtype=self._mat.dtype)

    def _direct_solver(self, mat, rhs, device, use_cache: bool = True):
        """A planned ``DirectSolver`` (reordering and symbolic factorization) of ``mat`` with right-hand side ``rhs``."""
        nva = self._nva
        mtype = {
            "general": nva.DirectSolverMatrixType.GENERAL,
            "symmetric": nva.DirectSolverMatrixType.SYMMETRIC,
            "spd": nva.DirectSolverMatrixType.SPD,
        }[self.active_matrix_type]
        options = nva.DirectSolverOptions(sparse_system_type=mtype, logger=self._quiet, handle=self.handle)
        stream = wp.get_stream(device).cuda_stream
        extra = {} if self.execution == "cuda" else {"execution": self.execution}
        solver = nva.DirectSolver(mat, rhs, options=options, stream=stream, **extra)
        cache_file = None
        try:
            if self.reordering is not None:
                solver.plan_config.reordering_algorithm = int(self.reordering)
            if self.host_threads is not None:
                solver.plan_config.host_nthreads = int(self.host_threads)
            from nvmath.bindings import cudss

            if self.deterministic:  # nvmath 1.0 has no plan_config attribute for it: set on the config itself
                param = cudss.ConfigParam.DETERMINISTIC_MODE
                flag = np.ones(1, dtype=cudss.get_config_param_dtype(int(param)))
                cudss.config_set(solver.config_ptr, param, flag.ctypes.data, flag.nbytes)
            for name, value in sorted(self.config.items()):
                param = getattr(cudss.ConfigParam, name.upper())
                arr = np.array([value], dtype=cudss.get_config_param_dtype(int(param)))
                cudss.config_set(solver.config_ptr, param, arr.ctypes.data, arr.nbytes)
            if self.use_matching is not None:  # nvmath 1.0: a matching algorithm, NONE for off
                solver.plan_config.matching_algorithm = (cudss.MatchingAlg.AUTO if self.use_matching
                                                         else cudss.MatchingAlg.NONE)
            if self.permutation is not None:
                perm = self.permutation
                if perm.shape != (mat.shape[0],):
                    raise ValueError(f"permutation: expected {mat.shape[0]} entries (the scalar rows), got {perm.shape[0]}")
                cudss.data_set(solver.handle, solver.data_ptr, cudss.DataParam.USER_PERM, perm.ctypes.data, perm.nbytes)
            elif self.analysis_cache is not None and use_cache:
                cache_file = self.analysis_cache / f"{self._analysis_key(mat)}.npz"
                self.analysis_cache_hit = _apply_cached_analysis(cudss, solver, cache_file, mat.shape[0])
            solver.plan(stream=stream)
            if cache_file is not None and not self.analysis_cache_hit:
                _save_analysis(cudss, solver, cache_file, mat.shape[0])
        except Exception as exc:
            solver.free()
            if cache_file is None or not self.analysis_cache_hit:
                raise
            # cuDSS refused the cached ordering and tree: analyse anew (the entry is rewritten)
            _logger.warning("cudss: the cached analysis %s failed (%s: %s); analysing anew", cache_file,
                            type(exc).__name__, exc)
            self.analysis_cache_hit = False
            solver = self._direct_solver(mat, rhs, device, use_cache=False)
            _save_analysis(cudss, solver, cache_file, mat.shape[0])
        except BaseException:
            solver.free()
            raise
        return solver

    def _analysis_key(self, mat) -> str:
        """What an analysis depends on: the scalar CSR pattern, the value type, the matrix type and the options."""
        import hashlib

        cp = self._cp
        h = hashlib.sha256()
        h.update(repr((mat.shape, str(mat.dtype), self.active_matrix_type, self.reordering, self.use_matching,
                       self.execution, _cudss_version())).encode())
        if self.config:  # (absent when empty: the keys of existing entries stay)
            h.update(repr(sorted((k.lower(), int(v)) for k, v in self.config.items())).encode())
        h.update(cp.asnumpy(mat.indptr).tobytes())
        h.update(cp.asnumpy(mat.indices).tobytes())
        return h.hexdigest()[:32]

    def _direct_descriptors(self):
        """Direct calls: (b descriptor, x descriptor) for the planned float64 solver, made once per plan."""
        if self._dense is None:
            from nvmath.bindings import cudss

            solver = self._solver
            n = self._csr.size
            vt = int(solver.cuda_value_type)
            ptr = int(self._rhs.data.ptr)  # valid until the first call points them at b and x
            bdesc = cudss.matrix_create_dn(n, 1, n, ptr, vt, cudss.Layout.COL_MAJOR)
            try:
                xdesc = cudss.matrix_create_dn(n, 1, n, ptr, vt, cudss.Layout.COL_MAJOR)
            except BaseException:
                cudss.matrix_destroy(bdesc)
                raise
            self._dense = (bdesc, xdesc)
        return self._dense

    def _execute_direct(self, b: wp.array, x: wp.array, factorize: bool) -> None:
        """Direct calls: cuDSS's numeric factorization (``factorize``) or solve of ``A x = b``, queued on Warp's
        stream with ``b`` and ``x`` as the dense operands (``b`` is copied first where it aliases ``x``)."""
        from nvmath.bindings import cudss

        bdesc, xdesc = self._direct_descriptors()
        solver = self._solver
        handle = solver.handle
        bptr = int(b.ptr)
        if bptr == int(x.ptr) or not b.is_contiguous:
            self._rhs[...] = self._flat(self._cp, b)
            bptr = int(self._rhs.data.ptr)
        if not x.is_contiguous:
            raise ValueError("cudss: expected a contiguous x (direct calls write the solution in place)")
        cudss.set_stream(handle, int(wp.get_stream(x.device).cuda_stream))
        cudss.matrix_set_values(bdesc, bptr)
        cudss.matrix_set_values(xdesc, int(x.ptr))
        phase = cudss.Phase.FACTORIZATION if factorize else cudss.Phase.SOLVE
        cudss.execute(handle, phase, solver.config_ptr, solver.data_ptr, solver.a_ptr, xdesc, bdesc)
        if factorize:
            solver.solver_factorized = True  # nvmath's own solve() (refinement) accepts the factors

    @property
    def _direct(self) -> bool:
        return self.direct_calls and self.execution == "cuda"

    def capturable_for(self, A) -> bool:
        """Whether :meth:`solve_deferred` on ``A`` queues only device work that a CUDA graph can hold: direct calls,
        a plan for A's pattern already made, no reuse or float32 policy and no first-factorization check pending
        (those read the host). The device loop then captures the solve in its slot's graph."""
        return (self._direct and not self._policy and self._solver is not None and not self._check_spd
                and self._pattern == _pattern_key(A))

    def _first_cholesky_failed(self, A, b, x) -> bool:
        """Under ``spd_or_general``, after a plan's first Cholesky factorization and solve: whether it failed (cuDSS's
        info, then the residual, read on the host even inside :meth:`solve_deferred`)."""
        if not self._check_spd:
            return False
        self._check_spd = False
        if int(self._solver.factorization_info.info) != 0:
            return True
        residual = _residual_norm(A, b, x, self._work_like(b))
        b_norm = norm(b)
        # a failed Cholesky may give NaN or, with cuDSS's pivot perturbation, a finite wrong answer
        return not (math.isfinite(residual) and residual <= self.SPD_CHECK_RTOL * b_norm)

    @property
    def direction_rtol(self) -> float:
        """:attr:`SPD_CHECK_RTOL` while ``spd_or_general`` factors by Cholesky (a matrix that stopped being positive
        definite can give a finite wrong answer), else 0 (LU's and a chosen type's directions pass when finite)."""
        if self.matrix_type == "spd_or_general" and self.active_matrix_type == "spd":
            return self.SPD_CHECK_RTOL
        return 0.0

    def direction_rejected(self) -> bool:
        return self._to_lu()

    def _to_lu(self) -> bool:
        """Switch ``spd_or_general`` from Cholesky to LU for good (True), or say there is nothing to switch (False)."""
        if self.matrix_type != "spd_or_general" or self.active_matrix_type != "spd":
            return False
        self.active_matrix_type = "general"
        self.invalidate_pattern()
        self._quiet.info("cudss: Cholesky failed (the matrix is not positive definite): LU from now on")
        return True

    def _redone_by_lu(self, A, b, x, failed_ms: float) -> LinearSolveInfo:
        """The solve again with LU after a failed Cholesky, whose time counts as analysis."""
        info = self._plain_solve(A, b, x)
        info.analysis_ms += failed_ms
        return info

    def _plain_solve(self, A, b, x):
        _check_system(A, b, x)
        _require_cuda(A, self.name)
        device = A.device
        stream = wp.get_stream(device).cuda_stream
        dev_ctx, stream_ctx = self._stream(device)
        with dev_ctx, stream_ctx:
            t0 = self._now(device)
            key = _pattern_key(A)
            try:
                if self._pattern != key or self._csr is None:
                    self._build(A, device)
                    self._pattern = _pattern_key(A)  # after nnz_sync() made A.nnz exact
                if self._solver is None:
                    self._solver = self._direct_solver(self._mat, self._rhs, device)
                    self._check_spd = self.matrix_type == "spd_or_general" and self.active_matrix_type == "spd"
                analysis_ms = self._ms_since(t0, device)

                t0 = time.perf_counter()
                self._csr.update_values(A)
                if self._direct:
                    self._execute_direct(b, x, factorize=True)
                else:
                    self._solver.factorize(stream=stream)
                factor_ms = self._ms_since(t0, device)

                t0 = time.perf_counter()
                self._apply_native(b, x)
                solve_ms = self._ms_since(t0, device)
            except ImportError:
                raise
            except Exception as exc:
                self.invalidate_pattern()
                raise LinearSolveError(f"cudss: {type(exc).__name__}: {exc}") from exc
        if self._first_cholesky_failed(A, b, x) and self._to_lu():
            return self._redone_by_lu(A, b, x, analysis_ms + factor_ms + solve_ms)
        residual = self._residual(A, b, x)
        if self.compute_residual and self._deferred is None:
            if not math.isfinite(residual):
                if self._to_lu():
                    return self._redone_by_lu(A, b, x, analysis_ms + factor_ms + solve_ms)
                raise LinearSolveError(f"cudss: residual is {residual} (singular matrix?)")
            # a later Cholesky on a matrix that stopped being positive definite: finite but wrong (the device loop
            # checks the same bound on the device, direction_rtol)
            rtol = self.direction_rtol
            if rtol > 0.0 and residual > rtol * norm(b) and self._to_lu():
                return self._redone_by_lu(A, b, x, analysis_ms + factor_ms + solve_ms)
        self._factored = _pattern_key(A)
        return LinearSolveInfo(self.name, 1, residual, analysis_ms, factor_ms, solve_ms)

    # -- reuse and float32 factors (_ReusedFactors) ----------------------------------------------------------------

    @contextlib.contextmanager
    def _policy_scope(self, A):
        _require_cuda(A, self.name)
        dev_ctx, stream_ctx = self._stream(A.device)
        with dev_ctx, stream_ctx:
            try:
                yield
            except (ImportError, LinearSolveError):
                raise
            except Exception as exc:
                self.invalidate_pattern()
                raise LinearSolveError(f"cudss: {type(exc).__name__}: {exc}") from exc

    def _apply_with(self, solver, rhs, r, z) -> None:
        cp = self._cp
        rhs[...] = self._flat(cp, r).astype(rhs.dtype, copy=False)  # the solver's own buffer: its plan stays valid
        sol = solver.solve(stream=wp.get_stream(r.device).cuda_stream)
        out = self._flat(cp, z)
        out[...] = sol.reshape(-1).astype(out.dtype, copy=False)

    def _apply_native(self, r, z) -> None:
        if self._direct:
            self._execute_direct(r, z, factorize=False)
        else:
            self._apply_with(self._solver, self._rhs, r, z)

    def _factor32(self, A) -> tuple[float, float]:
        import cupyx.scipy.sparse as cpsp

        cp = self._cp
        device = A.device
        t0 = self._now(device)
        key = _pattern_key(A)
        if self._pattern != key or self._csr is None:
            self._build(A, device)
            self._pattern = _pattern_key(A)
        if self._solver32 is None:
            csr = self._csr
            data32 = cp.asarray(csr.data)[: csr.nnz].astype(cp.float32)
            self._mat32 = cpsp.csr_matrix((data32, self._mat.indices, self._mat.indptr), shape=self._mat.shape,
                                          copy=False)  # fmt: skip
            self._rhs32 = cp.zeros(csr.size, dtype=cp.float32)
            self._solver32 = self._direct_solver(self._mat32, self._rhs32, device)
        analysis_ms = self._ms_since(t0, device)
        t0 = time.perf_counter()
        self._csr.update_values(A)
        cp.copyto(self._mat32.data, cp.asarray(self._csr.data)[: self._csr.nnz], casting="same_kind")  # in place
        self._solver32.factorize(stream=wp.get_stream(device).cuda_stream)
        return analysis_ms, self._ms_since(t0, device)

    def _apply32(self, r, z) -> None:
        self._apply_with(self._solver32, self._rhs32, r, z)

    def _plain_resolve(self, A, b, x):
        _check_system(A, b, x)
        if self._solver is None or self._factored != _pattern_key(A):
            return self.solve(A, b, x)
        dev_ctx, stream_ctx = self._stream(A.device)
        with dev_ctx, stream_ctx:
            t0 = time.perf_counter()
            try:
                self._apply_native(b, x)
            except Exception as exc:
                self.invalidate_pattern()
                raise LinearSolveError(f"cudss: {type(exc).__name__}: {exc}") from exc
            solve_ms = self._ms_since(t0, A.device)
        return LinearSolveInfo(self.name, 1, self._residual(A, b, x), 0.0, 0.0, solve_ms)
