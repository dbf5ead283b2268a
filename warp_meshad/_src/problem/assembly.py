"""The launches of a problem's term kernels: energy, gradient, Hessian (atomic, tiled or deterministic),
Hessian-vector product, parameter derivatives, residuals and Jacobian.

An :class:`Assembler` picks each term's kernel (:func:`~warp_meshad._src.codegen.kernel_cache.term_kernel`),
its arguments and its launch; it writes into a :class:`~warp_meshad._src.problem.storage.Storage`. It does not
check arguments (``Problem`` does) and reads nothing back from the device.

Energy and gradient take as many launches as a hand-written kernel: one memset (gradient and energy share one
allocation) and one launch per term, whose kernel sums its block's energies and adds them to the total with one
atomic per thread block (the reduced variant, :attr:`~warp_meshad._src.codegen.contract.KernelVariant.reduced`).
The deterministic mode, and a problem whose element energies are read afterwards (:attr:`Assembler.element_energies`),
write each element's energy to its own slot instead and sum them in a fixed order (two more launches), as the
Hessian modes always do.

A projected Hessian whose element projection is unrolled and split
(:attr:`~warp_meshad._src.codegen.contract.KernelVariant.split`) takes two launches per term: the term's kernel
writes each element's local Hessian to its place of ``Storage.local_hessians``, the projection kernel of the term's
shape projects and scatters them. The first such call loads both modules together (``wp.force_load`` with a worker
each: the compiles of a cold cache run in parallel).

Every term launch is recorded once (``wp.launch(..., record_cmd=True)``) and replayed: only the arguments that
changed since (another ``x``, a grown interaction buffer) are packed again, so a call costs little more on the host
than the launches themselves.
"""

from __future__ import annotations

import dataclasses

import warp as wp

from warp_meshad._src.codegen.energy_errors import raise_energy_error
from warp_meshad._src.codegen.kernel_cache import KernelFacts, TileVariant, projection_kernel, splits, term_kernel
from warp_meshad._src.codegen.warp_compat import loaded_binary, module_hashed
from warp_meshad._src.problem.storage import Storage
from warp_meshad._src.problem.tiled import TileConfig, TilePlan, build_tile_plan, min_blocks

__all__ = ["ASSEMBLY_MODES", "AUTO_MAX_EVALUATIONS", "Assembler", "REDUCED_BLOCK_DIM", "auto_uses_tiles",
           "rounds_default"]  # fmt: skip

ASSEMBLY_MODES = ("auto", "atomic", "tiled")
AUTO_MAX_EVALUATIONS = 2.0  # see auto_uses_tiles()
REDUCED_BLOCK_DIM = 256  # threads (elements) per block of the reduced energy and gradient kernels on CUDA devices


def rounds_default(k_max: int, dtype) -> bool:
    """Whether ``assembly="auto"`` gives the tiled Hessian the conflict-free rounds of the deterministic plan
    when ``deterministic=False``: for float32 elements of at most 6 variables.

    Measured on an H200 at 1000x1000 (float32, ``benchmarks/assembly_choice.py``, 2026-12-01), rounds against the
    plain tiled kernel (shared-memory atomics, global gradient atomics): mass-spring 0.370 vs 0.436 ms, projected
    2.95 vs 3.00 ms; symmetric Dirichlet 0.687 vs 0.786 ms, projected 2.54 vs 3.09 ms. Larger or float64
    elements are not measured, so they keep the plain tiled kernel.
    """
    return dtype == wp.float32 and k_max <= 6


def auto_uses_tiles(plan: TilePlan | None, element_count: int, sm_count: int) -> bool:
    """Whether ``assembly="auto"`` runs the tiled kernels of ``plan`` on a GPU (else the atomic assembly).

    Not when there is no plan, nor when it has fewer patches than the GPU has multiprocessors (too few to fill it: one
    thread per element is faster, H200, 10x10 grid). Nor, for a plain tiled plan (no rounds), when it evaluates the
    elements more than :data:`AUTO_MAX_EVALUATIONS` times each on average (``sum(plan.evaluations) / element_count``:
    an element is evaluated once per patch owning one of its rows): then the repeated element work and the float64
    shared-memory adds (CAS loops) outweigh the coalesced stores. Measured on an H200 (``benchmarks/assembly_auto.py``,
    ``assemble_hessian``, median ms, atomic vs plain tiled, the plan's evaluations per element in brackets): stable
    Neo-Hookean on ``TetMesh.box(56, 56, 56)`` (998,250 tets, float64): F term (k = 9) 2.09 vs 3.88 [3.03], with its
    analytic projection 2.19 vs 5.83, corner term (k = 12) 3.58 vs 11.40; the F term of the Neo-Hookean membrane on a
    1000 x 1000 grid (float64, k = 9) 2.45 vs 3.52 [2.01]; mass-spring on the same grid 1.77 vs 1.28 [1.67] in
    float64 and 1.34 vs 0.40 [1.67] in float32. A plan with rounds (``deterministic=True``, or float32 elements of at
    most 6 variables: :func:`rounds_default`) is kept: rounds sum without shared-memory atomics (membrane 1.59 ms,
    float32 springs 0.34), and their alternatives (per-element buffers; atomics for small float32 elements) are slower
    where measured.
    """
    if plan is None or plan.patch_count < sm_count:
        return False
    return plan.deterministic or sum(plan.evaluations) <= AUTO_MAX_EVALUATIONS * element_count


class Assembler:
    """Launches the kernels of a problem's terms into its storage.

    Args:
        terms: the problem's term list (shared: terms added later take part).
        storage: the problem's :class:`~warp_meshad._src.problem.storage.Storage`.
        facts: the :class:`~warp_meshad._src.codegen.kernel_cache.KernelFacts` of the problem's kernels.
        block_type: the Hessian's block dtype.
        device: the problem's device.
        mode: the Hessian assembly, one of :data:`ASSEMBLY_MODES` (see ``Problem(assembly=...)``).
        tile_config: the knobs of the tiled assembly.

    Attributes:
        facts, mode, tile_config: as given (the problem's setters replace them).
        element_energies: False (default): energy and gradient launches sum the energy within their kernels (one
            atomic add per thread block; not in deterministic mode). True: every launch also leaves each element's
            energy in ``storage.layout.energy`` (a :class:`~warp_meshad.ProblemBatch` sums them per mesh).
        reduced_block_dim: threads per block of the reduced kernels, or None: :data:`REDUCED_BLOCK_DIM` on CUDA
            devices, 1 on the CPU (whose blocks run one lane; a size > 1 applies there only with
            ``wp.config.enable_cpu_blocks``, which runs the lanes as fibers).
    """

    def __init__(self, terms: list, storage: Storage, facts: KernelFacts, block_type, device, mode: str,
                 tile_config: TileConfig):  # fmt: skip
        self.terms = terms
        self.storage = storage
        self.facts = facts
        self.block_type = block_type
        self.device = device
        self.mode = mode
        self.tile_config = tile_config
        self.element_energies = False
        self.reduced_block_dim = None
        self._tiles = None  # (pattern, config, TilePlan or None)
        self._replays: dict = {}  # (term index, id(kernel)) -> _Replay
        self._loaded: set = set()  # ids of the split projection's kernel pairs loaded together (see _load_together)

    def set_split_projection(self, value) -> None:
        """Set ``Problem.split_projection`` (kernels built later follow it)."""
        self.facts = dataclasses.replace(self.facts, split_projection=value)

    def set_unrolled_projection(self, value) -> None:
        """Set ``Problem.unrolled_projection`` (kernels built later follow it)."""
        self.facts = dataclasses.replace(self.facts, unrolled_projection=value)

    def set_tile_config(self, config: TileConfig) -> None:
        """Use ``config`` from the next Hessian on (a new tile plan, kernels built for it)."""
        if not isinstance(config, TileConfig):
            raise TypeError(f"Problem(tile_config=...) must be a TileConfig, got {type(config).__name__}")
        self.tile_config = config

    # ------------------------------------------------------------------------------------------
    # kernels and their arguments
    # ------------------------------------------------------------------------------------------

    def tile_variant(self, term, mode: str, plan: TilePlan) -> TileVariant:
        """The tiled variant of ``term``'s ``mode`` kernel for ``plan`` under this problem's tile config."""
        cfg = self.tile_config
        mb = min_blocks(term.spec.k, self.facts.dtype, projected=mode == "hessian_proj", config=cfg)
        return TileVariant(plan.cap, plan.row_cap, plan.deterministic, cfg.store, (cfg.block_dim, mb) if mb else None)

    def kernel(self, term, mode: str, plan: TilePlan | None = None, reduced: bool = False,
               split: bool = False) -> wp.Kernel:  # fmt: skip
        """The kernel of ``term`` in ``mode`` (the tiled variant for ``plan`` where given; the reduced one with
        ``reduced``; the split projection's term kernel with ``split``)."""
        tile = self.tile_variant(term, mode, plan) if plan else None
        return term_kernel(term, mode, self.facts, tile, reduced, split)

    @property
    def reduces_energy(self) -> bool:
        """Whether energy and gradient launches take the reduced kernels (see :attr:`element_energies`)."""
        return not (self.facts.deterministic or self.element_energies)

    def reduced_block(self) -> int:
        """Threads per block of the reduced kernels' launches (see :attr:`reduced_block_dim`)."""
        if self.device.is_cuda:
            return self.reduced_block_dim or REDUCED_BLOCK_DIM
        return (self.reduced_block_dim or 1) if wp.config.enable_cpu_blocks else 1

    def inputs(self, term, mode: str, extra: list, reduced: bool = False) -> list:
        """Arguments of a term's kernel: elements, x (``extra[0]``), data, weight, [rest_inverse], ``extra[1:]``,
        then the term's offsets (the element count for the ``reduced`` variant)."""
        inputs = [term.elements, extra[0]]
        if term.data is not None:
            inputs.append(term.data)
        inputs.append(float(term.weight))  # packed as the kernel's scalar type
        if term.rest_inverse is not None:  # a deformation term's D_m^-1 per element
            inputs.append(term.rest_inverse)
        inputs += extra[1:]
        if reduced:
            inputs.append(term.count)
        elif mode not in ("residual", "jacobian"):
            inputs.append(self.storage.layout.offsets[term.index])
        return inputs

    def launch(self, term, mode: str, extra: list, reduced: bool = False, split: bool = False) -> None:
        """One thread per element of ``term``; ``reduced``: the reduced kernel, a thread block per
        :meth:`reduced_block` consecutive elements; ``split``: the split projection's term kernel."""
        if not term.count:
            return
        kern = self.kernel(term, mode, reduced=reduced, split=split)
        inputs = self.inputs(term, mode, extra, reduced)
        if reduced:
            block = self.reduced_block()
            self._run(term, mode, kern, (term.count + block - 1) // block, inputs, block)
        else:
            self._run(term, mode, kern, term.count, inputs)

    def launch_projection(self, term, hloc: wp.array, extra: list, h_out: wp.array) -> None:
        """The split projection's kernel over ``term``'s local Hessians ``hloc`` (``extra``: eps, absolute)."""
        if not term.count:
            return
        inputs = [hloc, *extra]
        if term.rest_inverse is not None:
            inputs.append(term.rest_inverse)
        inputs += [term.slots, h_out, self.storage.layout.offsets[term.index]]
        self._run(term, "hessian_proj", projection_kernel(term, self.facts), term.count, inputs)

    def _load_together(self, terms) -> None:
        """Load the split projection's kernels of ``terms`` (term kernel and projection kernel each) before their
        first launch, on a CUDA device in parallel (``wp.force_load``: a worker per module, so a cold cache compiles
        them side by side; loaded or cached modules return at once). Once per set of kernels."""
        kernels = []
        for t in terms:
            kernels += [self.kernel(t, "hessian_proj", split=True), projection_kernel(t, self.facts)]
        key = tuple(id(k) for k in kernels)
        if key in self._loaded or not self.device.is_cuda:
            return
        modules = list({id(k.module): k.module for k in kernels}.values())
        try:
            wp.force_load(self.device, modules=modules, max_workers=len(modules))
        except Exception as exc:  # a compile error in the energy: reported at the user's line, as a launch does
            raise_energy_error(exc, _does_not_compile(terms[0], "hessian_proj"))
            raise
        self._loaded.add(key)

    def launch_tiled(self, term, mode: str, plan: TilePlan, inputs: list) -> None:
        """One thread block per patch of ``plan``."""
        i = term.index
        kern = self.kernel(term, mode, plan)
        if plan.deterministic:
            inputs = inputs + [plan.entries[i], plan.round_start[i], plan.patch_round_start[i], plan.block_start,
                               plan.row_start, 1 if i else 0]  # fmt: skip
        else:
            inputs = inputs + [plan.entries[i], plan.entry_start[i], plan.block_start, 1 if i else 0]
        self._run(term, mode, kern, plan.patch_count, inputs, self.tile_config.block_dim)

    def _run(self, term, mode: str, kern: wp.Kernel, grid: int, inputs: list, block_dim: int | None = None) -> None:
        """Launch ``kern`` over ``grid`` threads, or ``grid`` blocks of ``block_dim`` (``wp.launch_tiled``), through
        its recorded launch (recorded anew for another kernel, or once Warp marked its module modified)."""
        key = (term.index, id(kern))
        replay = self._replays.get(key)
        try:
            if replay is None or not replay.serves(kern, block_dim):
                replay = self._replays[key] = _Replay(kern, grid, inputs, block_dim, self.device)
            replay.launch(grid, inputs)
        except Exception as exc:  # Warp generates a kernel's code at its first launch: errors at the user's line
            raise_energy_error(exc, _does_not_compile(term, mode))
            raise

    # ------------------------------------------------------------------------------------------
    # the tile plan
    # ------------------------------------------------------------------------------------------

    def rounds_default(self) -> bool:
        """Rounds for the tiled kernels of a non-deterministic problem (``assembly="auto"`` only)."""
        return self.mode == "auto" and rounds_default(max(t.spec.k for t in self.terms), self.facts.dtype)

    def tile_plan(self, mode: str = "hessian") -> TilePlan | None:
        """The patch plan of the tiled assembly of a Hessian ``mode``, or None where the atomic assembly is used
        (the pattern must be built)."""
        if mode not in ("hessian", "hessian_proj"):
            return None
        if self.mode == "atomic" or (self.mode == "auto" and not self.device.is_cuda):
            return None
        if any(t.dynamic for t in self.terms):
            return None
        pattern = self.storage.pattern
        if self._tiles is None or self._tiles[0] is not pattern or self._tiles[1] is not self.tile_config:
            if self.mode == "auto" and len(pattern.offsets) - 1 < self.device.sm_count:
                # a patch holds at least one row: fewer rows than multiprocessors make fewer patches, which
                # auto_uses_tiles refuses; building the plan would only compile and run its kernels for nothing
                self._tiles = (pattern, self.tile_config, None)
                return None
            plan = build_tile_plan(
                pattern.offsets, [t.elements for t in self.terms], self.block_type, self.device,
                rounds=self.facts.deterministic or self.rounds_default(), var_type=self.facts.variable_type,
                config=self.tile_config,
            )  # fmt: skip
            if self.mode == "auto" and not auto_uses_tiles(plan, sum(t.count for t in self.terms), self.device.sm_count):
                plan = None
            self._tiles = (pattern, self.tile_config, plan)
        return self._tiles[2]

    # ------------------------------------------------------------------------------------------
    # evaluations (nothing read back)
    # ------------------------------------------------------------------------------------------

    def energy(self, x) -> None:
        """Element energies, summed into ``storage.energy`` (reduced: a memset of the energy and one launch per
        term)."""
        st = self.storage
        reduced = self.reduces_energy
        lay = st.ensure_layout(self.terms, element_energies=not reduced)
        if reduced:
            st.energy.zero_()
            for t in self.terms:
                self.launch(t, "energy", [x, st.energy], reduced=True)
            return
        for t in self.terms:
            self.launch(t, "energy", [x, lay.energy])
        st.total_energy()

    def gradient(self, x) -> None:
        """Energy and gradient into ``storage.energy`` and ``storage.grad`` (reduced: one memset of both and one
        launch per term)."""
        st = self.storage
        if self.reduces_energy:
            st.ensure_layout(self.terms, element_energies=False)
            st.zero_gradient_and_energy()
            for t in self.terms:
                self.launch(t, "gradient", [x, st.energy, st.grad], reduced=True)
            return
        lay = st.ensure_layout(self.terms)
        st.grad.zero_()
        det = st.ensure_det(self.terms, False) if self.facts.deterministic else None
        g_out = det.grad if det else st.grad
        for t in self.terms:
            self.launch(t, "gradient", [x, lay.energy, g_out])
        st.total_energy()
        if det:
            det.finish(grad=st.grad)

    def hessian(self, x, mode: str, extra=()) -> None:
        """Energy, gradient and the Hessian of ``mode`` (``"hessian"``, ``"hessian_proj"`` with ``extra`` = (eps,
        projection), ``"gauss_newton"``) into ``storage.energy``, ``storage.grad`` and ``storage.hess``."""
        st = self.storage
        st.hessian_pattern(self.terms)
        lay = st.ensure_layout(self.terms)
        st.grad.zero_()
        plan = self.tile_plan(mode)
        if plan is None:  # the tiled kernels store every block of the pattern: nothing to clear
            st.hess.values.zero_()
        det = st.ensure_det(self.terms, True) if self.facts.deterministic and plan is None else None
        g_out, h_out = (det.grad, det.hess) if det else (st.grad, st.hess.values)
        if plan is not None and self.facts.variable_dim > 1 and self.tile_config.store == "number":
            h_out = st.flat_hessian_values()
        split = [t for t in self.terms if splits(t, mode, self.facts, plan is not None)]
        if split:
            self._load_together(split)
        for t in self.terms:
            m = mode if (mode != "gauss_newton" or t.residual) else "hessian"
            ex = list(extra) if m == "hessian_proj" else []
            if t in split:
                hloc = st.local_hessians(t)
                self.launch(t, m, [x, lay.energy, g_out, hloc], split=True)
                self.launch_projection(t, hloc, ex, h_out)
                continue
            extra_m = [x, lay.energy, g_out, *ex, t.slots, h_out]
            if plan is not None:
                self.launch_tiled(t, m, plan, self.inputs(t, m, extra_m))
            else:
                self.launch(t, m, extra_m)
        st.total_energy()
        if det:
            det.finish(grad=st.grad, hess_values=st.hess.values)

    def hessian_vector_product(self, x, v) -> wp.array:
        """H(x) v into ``storage.hv`` (element Hessians applied locally); returns it."""
        st = self.storage
        hv = st.ensure_hv()
        lay = st.ensure_layout(self.terms)
        det = st.ensure_det(self.terms, False) if self.facts.deterministic else None
        hv_out = det.grad if det else hv
        for t in self.terms:
            self.launch(t, "hvp", [x, lay.energy, hv_out, v, hv_out])
        if det:
            det.finish(grad=hv)
        return hv

    def parameter_derivatives(self, x, pd) -> None:
        """Energy, dE/dtheta and the mixed derivative values into ``storage.energy`` and the
        :class:`~warp_meshad._src.problem.parameters.ParameterDerivatives` ``pd``."""
        lay = self.storage.ensure_layout(self.terms)
        pd.theta_grad.zero_()
        for t in self.terms:
            if t.params:
                start, size = pd.segments[t.index]
                vals = pd.values[start : start + size]
                self.launch(t, "mixed", [x, lay.energy, pd.theta_grad, pd.pidx[t.index], vals])
            else:
                self.launch(t, "energy", [x, lay.energy])
        self.storage.total_energy()

    def residuals(self, x, jacobian: bool) -> None:
        """Residuals into ``storage.res`` (and, with ``jacobian``, the Jacobian into ``storage.jac``)."""
        st = self.storage
        st.jacobian_pattern(self.terms)
        if jacobian:
            st.jac.values.zero_()
        for t in self.terms:
            if not t.residual:
                continue
            if jacobian:
                self.launch(t, "jacobian", [x, t.row_start, t.jslots, st.res, st.jac.values])
            else:
                self.launch(t, "residual", [x, t.row_start, st.res])


class _Replay:
    """The recorded launch of one kernel (``wp.launch(..., record_cmd=True)``), launched again with only the arguments
    that changed packed anew: arrays and structs by identity (a struct's fields are read at each launch), Python
    numbers by value.

    Args:
        kernel: the kernel.
        grid: threads (``block_dim`` None: ``wp.launch``), or thread blocks of ``block_dim`` (``wp.launch_tiled``).
        inputs: the kernel's arguments.
        block_dim: threads per block of a tiled launch, or None.
        device: the device.
    """

    def __init__(self, kernel: wp.Kernel, grid: int, inputs: list, block_dim: int | None, device):
        self.kernel = kernel
        self.block_dim = block_dim
        self.cpu_blocks = wp.config.enable_cpu_blocks
        self.tiled = block_dim is not None
        self.grid = grid
        self.inputs = list(inputs)
        if self.tiled:
            self.cmd = wp.launch_tiled(kernel, dim=[grid], inputs=inputs, block_dim=block_dim, device=device,
                                       record_cmd=True)  # fmt: skip
        else:
            self.cmd = wp.launch(kernel, dim=grid, inputs=inputs, device=device, record_cmd=True)

    def serves(self, kernel: wp.Kernel, block_dim: int | None) -> bool:
        """Whether this record launches ``kernel`` with ``block_dim`` as ``wp.launch`` would now: the same kernel and
        block size, the same CPU block setting (``wp.config.enable_cpu_blocks``, which resolves CPU block sizes), its
        module not marked modified by Warp since (``wp.launch`` would rebuild it) and the binary it holds still the
        loaded one."""
        cmd = self.cmd
        return (kernel is self.kernel and block_dim == self.block_dim and self.cpu_blocks == wp.config.enable_cpu_blocks
                and module_hashed(kernel.module)
                and loaded_binary(kernel.module, cmd.device, cmd.block_dim) is cmd.module_exec)  # fmt: skip

    def launch(self, grid: int, inputs: list) -> None:
        """Launch over ``grid`` with ``inputs``."""
        old = self.inputs
        for i, value in enumerate(inputs):
            was = old[i]
            if value is not was and not (type(value) in (int, float) and type(was) is type(value) and value == was):
                self.cmd.set_param_at_index(i, value)
                old[i] = value
        if grid != self.grid:
            self.cmd.set_dim([grid, self.cmd.block_dim] if self.tiled else grid)
            self.grid = grid
        self.cmd.launch()


def _does_not_compile(term, mode: str) -> str:
    return f"term '{term.label}': the energy does not compile for the {mode} kernel (its variables are dual numbers)"
