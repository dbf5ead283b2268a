"""The public :class:`Problem`: F(x) = sum over terms T, over elements j of T: w_T f_T(x_j), and its derivatives.

Every term is one user energy (a ``@wp.func``) over the variables of one element; elements are
rows of an integer array. Energies run unchanged as plain values, gradient duals and
gradient + Hessian duals (see :mod:`warp_meshad._src.codegen.energy_rewrite`); derivatives are scattered into
storage preallocated from the topology (see :mod:`warp_meshad._src.problem.pattern`). ``Problem`` checks
arguments and delegates: terms (:mod:`~warp_meshad._src.problem.terms`), buffers and patterns
(:mod:`~warp_meshad._src.problem.storage`), kernel launches (:mod:`~warp_meshad._src.problem.assembly`).
"""

from __future__ import annotations

import numpy as np
import warp as wp

from warp_meshad._src.codegen.energy_errors import reported_at_the_caller
from warp_meshad._src.codegen.kernel_cache import KernelFacts
from warp_meshad._src.problem.assembly import ASSEMBLY_MODES, Assembler
from warp_meshad._src.problem.interaction import InteractionElements, set_interaction_elements
from warp_meshad._src.problem.parameters import read_values, write_values
from warp_meshad._src.problem.storage import Storage
from warp_meshad._src.problem.terms import Term, make_term
from warp_meshad._src.problem.tiled import TileConfig, TilePlan
from warp_meshad._src.problem.variables import check_variable_array, dtype_name, variable_types

__all__ = ["Problem"]

_PROJECTION_MODES = {"clamp": 0, "abs": 1}


class Problem:
    """A sum of local energy terms over mesh elements, differentiated to second order.

    Args:
        variable_count: number of variables n (vertices, faces, ...).
        variable_dim: scalars per variable (1 gives scalar variables; 2, 3, 4 give vectors).
        dtype: ``wp.float32`` or ``wp.float64``.
        device: Warp device ("cpu", "cuda:0", ...); default: Warp's default device.
        deterministic: when True, no float atomics are used: every element writes its contributions
            to its own buffer slots and each target adds them in a fixed order, so results are
            bitwise identical run to run (the Jacobian of residual terms is exempt only where one
            element repeats a variable). With the tiled assembly (see ``assembly``), a patch's
            elements are ordered into rounds in which no two add to the same shared-memory entry, so
            Hessian and gradient are summed with plain adds in a fixed order; otherwise the
            contributions go to buffers (one block per element pair) summed in a fixed order.
        assembly: how Hessians are assembled. ``"atomic"``: a thread per element adds its blocks
            into their slots with ``atomic_add``. ``"tiled"``: a thread block per patch of
            consecutive rows accumulates the patch's blocks in shared memory and writes them out
            coalesced (see :mod:`warp_meshad._src.problem.tiled`; number variables in a spatially coherent
            order, e.g. :func:`warp_meshad.locality_order`, so patches share few elements).
            ``"auto"``: tiled on CUDA devices when there are at least as many patches as
            multiprocessors and, unless the plan sums in rounds (below), the patches evaluate the
            elements at most twice each on average (tets in a box: 3 times, where atomic measured 1.9x
            faster; see
            :func:`~warp_meshad._src.problem.assembly.auto_uses_tiles`), else atomic (and always
            atomic on the CPU); for float32 elements of at most 6 variables the tiled kernel then
            sums in the deterministic plan's rounds even when ``deterministic=False``, which measured
            faster (see
            :func:`~warp_meshad._src.problem.assembly.rounds_default`), so those
            Hessians come out bitwise identical run to run as well. Interaction terms and
            Gauss-Newton Hessians always use the atomic assembly.
        tile_config: the knobs of the tiled assembly (threads per block, shared memory per tile, write-out,
            register cap), a :class:`~warp_meshad.TileConfig`; default: its defaults.

    Variables ``x`` are a ``wp.array`` of shape [variable_count] with dtype ``vec{variable_dim}``
    of ``dtype`` (or ``dtype`` itself when ``variable_dim == 1``), on ``device``. The evaluations do not check
    that ``x`` is finite (a check would cost a reduction per call): NaN or inf in ``x`` comes out as NaN energies,
    gradients and Hessian blocks. The solvers check their start point (``solve(x, check_finite=True)``).

    Returned gradients, Hessians and products are this problem's preallocated buffers: they stay
    valid until the next evaluation of the same kind (copy them to keep them).

    Energy and gradient take one memset (gradient and energy share one allocation) and one kernel launch per term:
    each kernel sums the energies of a thread block's elements and adds the sum to the energy with one atomic add
    per block, so on a GPU the energy's rounding may differ run to run (unless ``deterministic=True``, which sums
    element energies in a fixed order with two more launches). Hessian evaluations sum the element energies in a
    fixed order.
    """

    def __init__(
        self,
        variable_count: int,
        variable_dim: int = 3,
        dtype=wp.float64,
        device=None,
        deterministic: bool = False,
        assembly: str = "auto",
        tile_config: TileConfig | None = None,
    ):
        if not isinstance(variable_count, (int, np.integer)) or isinstance(variable_count, bool) or variable_count < 1:
            raise ValueError(f"Problem(variable_count=...) must be a positive int, got {variable_count!r}")
        if not isinstance(variable_dim, (int, np.integer)) or not 1 <= variable_dim <= 4:
            raise ValueError(
                f"Problem(variable_dim=...) must be an int in 1..4 (scalar, vec2, vec3 or vec4 variables), got {variable_dim!r}"
            )
        if dtype not in (wp.float32, wp.float64):
            raise ValueError(f"Problem(dtype=...) must be wp.float32 or wp.float64, got {dtype_name(dtype)}")
        if assembly not in ASSEMBLY_MODES:
            raise ValueError(f"Problem(assembly=...) must be one of {list(ASSEMBLY_MODES)}, got {assembly!r}")
        self.variable_count = int(variable_count)
        self.variable_dim = int(variable_dim)
        self.dtype = dtype
        self.device = wp.get_device(device)
        self.variable_type, self.block_type = variable_types(self.variable_dim, dtype)
        self.deterministic = bool(deterministic)
        self.terms: list[Term] = []
        self._storage = Storage(self.variable_count, self.variable_dim, self.variable_type, self.block_type, dtype,
                                self.device)  # fmt: skip
        facts = KernelFacts(dtype, self.variable_type, self.variable_dim, self.deterministic, None, self.device.is_cuda)
        self._assembler = Assembler(self.terms, self._storage, facts, self.block_type, self.device, assembly,
                                    TileConfig())  # fmt: skip
        if tile_config is not None:
            self._assembler.set_tile_config(tile_config)

    # ------------------------------------------------------------------------------------------
    # settings
    # ------------------------------------------------------------------------------------------

    @property
    def assembly(self) -> str:
        """How Hessians are assembled: ``"auto"``, ``"atomic"`` or ``"tiled"`` (see the class docstring)."""
        return self._assembler.mode

    @assembly.setter
    def assembly(self, value: str) -> None:
        if value not in ASSEMBLY_MODES:
            raise ValueError(f"Problem.assembly must be one of {list(ASSEMBLY_MODES)}, got {value!r}")
        self._assembler.mode = value

    @property
    def unrolled_projection(self) -> bool | None:
        """Per-element PSD projection with literal indices (registers instead of local memory).

        None (default) picks it on GPUs for k <= 12 and on the CPU for k <= 6 (larger ones take long to compile
        there); True / False force it (up to k = 12). On an H200 it is faster even where ptxas reports more spill
        bytes for it (k = 9, 12 in float64, benchmarks/results/kernel_resources.json): spot_pile's derivatives and
        assembly took 0.86 s per two-iteration step with it and 2.28 s with the loop (Jacobi sweeps indexing local
        arrays at run time); mass-spring (k = 6, float32) 13.9 instead of 63 ms.
        """
        return self._assembler.facts.unrolled_projection

    @unrolled_projection.setter
    def unrolled_projection(self, value: bool | None) -> None:
        if value is not None and not isinstance(value, bool):
            raise ValueError(f"Problem.unrolled_projection must be None, True or False, got {value!r}")
        self._assembler.set_unrolled_projection(value)

    @property
    def split_projection(self) -> bool | None:
        """Whether the unrolled PSD projection of a projected Hessian runs in a kernel of its own.

        Split, a term's kernel writes each element's local Hessian (k (k + 1) / 2 numbers) to a buffer and a
        projection kernel of the term's shape (one per element kind and scalar type, shared by every energy)
        projects and scatters it: the two compile in parallel on a cold kernel cache, and a second energy of the same
        shape compiles only its own part. None (default) splits on GPUs from k = 9 duals on (tets, triangles in 3D,
        deformation terms), where the projection is seconds of each module's compile; True / False force it where the
        projection is unrolled (:attr:`unrolled_projection`) and the assembly untiled; interaction terms and analytic
        projections are never split. Results equal the unsplit kernel's up to the compiler's contraction of the
        weight multiply into the projection (bitwise on the CPU in the tests).
        """
        return self._assembler.facts.split_projection

    @split_projection.setter
    def split_projection(self, value: bool | None) -> None:
        if value is not None and not isinstance(value, bool):
            raise ValueError(f"Problem.split_projection must be None, True or False, got {value!r}")
        self._assembler.set_split_projection(value)

    @property
    def tile_config(self) -> TileConfig:
        """The knobs of the tiled assembly; setting it takes effect at the next Hessian (new plan and kernels)."""
        return self._assembler.tile_config

    @tile_config.setter
    def tile_config(self, value: TileConfig) -> None:
        self._assembler.set_tile_config(value)

    @property
    def kernel_facts(self) -> KernelFacts:
        """What this problem's term kernels depend on beyond the term and the mode (dtype, variable type,
        deterministic, projection choice, device kind)."""
        return self._assembler.facts

    @property
    def tile_plan(self) -> TilePlan | None:
        """The patch plan of the tiled Hessian assembly (built with the pattern on first use), or None where
        the atomic assembly is used."""
        self._storage.hessian_pattern(self.terms)
        return self._assembler.tile_plan("hessian")

    @property
    def hessian_block_count(self) -> int:
        """Number of stored d x d blocks of the Hessian (builds the pattern if needed)."""
        return self._storage.hessian_pattern(self.terms).nnz

    # ------------------------------------------------------------------------------------------
    # terms
    # ------------------------------------------------------------------------------------------

    @reported_at_the_caller
    def add_term(
        self, elements, energy, data=None, weight: float = 1.0, name: str | None = None, parameters=None
    ) -> int:
        """Add the term ``weight * sum_j energy(j, x[elements[j, 0]], ..., data)``.

        Args:
            elements: int array (m, valence) of variable indices (numpy, list or ``wp.array2d``). The term keeps its
                own read-only copy, so changing the array afterwards changes neither the term nor the Hessian
                pattern built from it.
            energy: ``@wp.func`` taking the element index, then ``valence`` variables (each a
                ``vec{variable_dim}``, or a scalar when ``variable_dim == 1``), then ``data`` if
                given; returns a scalar. Written with ordinary operators and ``ad.*``.
            data: a ``@wp.struct`` instance passed to every call, or None. It is kept by reference and read at every
                evaluation (energy, gradient and Hessian alike): changing its fields or array contents between
                evaluations changes the energy (as :meth:`set_parameters` does); it never enters the pattern.
            weight: scalar factor of the term.
            name: label used in messages and kernel names (default: the energy's name).
            parameters: names of data fields that are parameters theta (see :meth:`eval_parameter_derivatives`
                and :func:`warp_meshad.implicit_gradient`): per-element arrays of m values read as
                ``data.f[e]``, or shared scalar / vector / matrix fields read as ``data.f``.

        Returns:
            The index of the term.

        Raises:
            TypeError, ValueError: on a bad argument, naming it, before any launch.
        """
        return self._add(elements, energy, data, weight, name, residual=False, parameters=parameters)

    @reported_at_the_caller
    def add_deformation_term(
        self, elements, energy, rest_inverse, data=None, weight: float = 1.0, name: str | None = None,
        projection=None,
    ) -> int:  # fmt: skip
        """Add an energy of the deformation gradient: ``weight * sum_j energy(j, F_j, data)``.

        F_j = D_s D_m^-1 with D_s = [x_1 - x_0, ..., x_{n-1} - x_0] the element's current edge vectors and D_m^-1
        its rest inverse. The toolkit computes F in plain numbers, differentiates ``energy`` in F's entries only
        (9 duals for a tet instead of 12, 6 for a triangle in 3D, 4 for a flat one) and applies the element's
        constant dF/dx itself (g_x = B^T g_F, H_x = B^T H_F B). ``eval_with_hessian_proj`` projects the k_F x k_F
        Hessian of F to PSD (which makes B^T H_F B PSD): cheaper than projecting the element's Hessian in x, and
        not the same matrix where H_F is indefinite. Results otherwise equal :meth:`add_term` with the same energy
        written over the corners, to round-off.

        The shape of F follows from the elements' valence and the problem's ``variable_dim``:

        - tets (valence 4, variable_dim 3): F is 3 x 3, ``energy(e, F, data)`` with F a ``wp.mat33`` (a dual 3x3
          matrix in the derivative kernels: index it ``F[i, j]``, use ``ad.det``, ``ad.frobenius_sq``, ``*``, ...);
        - flat triangles (valence 3, variable_dim 2): F is 2 x 2, ``energy(e, F, data)``, F a ``wp.mat22``;
        - triangles in 3D (valence 3, variable_dim 3): F is 3 x 2, given as its two columns:
          ``energy(e, f0, f1, data)`` with f0, f1 ``vec3`` (the dual numbers have no 3x2 matrix).

        The energy returns the element's energy, i.e. the energy density times the element's rest measure (volume
        or area) that it reads from ``data`` itself, as the built-in F-energies (``stable_neo_hookean_F``, ...) do.

        Args:
            elements: int array (m, valence) of variable indices (tets: ``TetMesh.tets``; triangles: faces); the
                term keeps its own read-only copy, as :meth:`add_term` does.
            energy: ``@wp.func`` taking the element index, F (as above), then ``data`` if given; returns a scalar.
            rest_inverse: D_m^-1 per element: a ``wp.array`` of shape [m] of ``mat33`` (tets) or ``mat22``
                (triangles) of the problem's dtype on its device (read at every evaluation, like ``data``), or a
                numpy array (m, c, c) (uploaded: a copy). From
                ``TetMesh.rest_matrix_inverses()`` / ``TriMesh.face_rest_frame_inverses()``.
            data, weight, name: as in :meth:`add_term` (no ``parameters``: deformation terms have no parameter
                derivatives yet).
            projection: None (the projected modes project the F Hessian with a Jacobi eigen-decomposition), or the
                energy's closed-form projection, a ``@wp.func`` ``proj(e, F, [data], eps, absolute)`` returning the
                PSD-projected k_F x k_F Hessian of the energy in F's entries (row-major), e.g.
                ``stable_neo_hookean_F_hessian_proj``; the projected modes then run the energy for its value and
                gradient only and take the Hessian from it (contract: ``codegen.contract.ANALYTIC_PROJECTION``).
                Needs weight > 0.

        Returns:
            The index of the term. It takes part in every evaluation (energy, gradient, Hessian, projected
            Hessian, Hessian-vector product, Gauss-Newton as its exact Hessian; deterministic and tiled assembly);
            ``eval_parameter_derivatives`` and residuals do not apply.

        Raises:
            TypeError, ValueError: on a bad argument (an element kind without a deformation gradient, an energy
                taking the wrong arguments, a ``rest_inverse`` of the wrong shape or dtype), naming it, before any
                launch.
        """
        return self._add(elements, energy, data, weight, name, residual=False, what="add_deformation_term",
                         rest_inverse=rest_inverse, projection=projection)  # fmt: skip

    @reported_at_the_caller
    def add_residual_term(self, elements, residual, data=None, weight: float = 1.0, name: str | None = None) -> int:
        """Add a vector-valued term: residuals r_j in R^c (c = 1..4) per element.

        The term contributes ``weight / 2 * |r_j|^2`` to the energy (so Newton and Gauss-Newton
        see a least-squares objective) and ``sqrt(weight) * r_j`` rows to
        :meth:`eval_residuals_with_jacobian`.

        Args:
            elements: int array (m, valence) of variable indices.
            residual: ``@wp.func`` like an energy, returning a scalar or a ``vec2/3/4`` (built with
                ``ad.vec2/vec3/vec4`` so it works on duals).
            data, weight, name: as in :meth:`add_term`; weight must be >= 0.
        """
        return self._add(elements, residual, data, weight, name, residual=True)

    @reported_at_the_caller
    def add_interaction_term(
        self, energy, valence: int, data=None, weight: float = 1.0, capacity: int = 1024, name: str | None = None
    ) -> int:
        """Add a term whose elements change at run time (contact pairs, ...).

        The term starts with no elements; :meth:`set_interaction_elements` replaces them. It takes part
        in every evaluation mode like any other term (Hessian-vector products included); each element's
        energy is accumulated, never overwritten. When more elements arrive than ``capacity``, the
        buffers grow (doubling): no element is ever dropped. The Hessian pattern of the other terms is
        built once; after new elements are set, the next Hessian evaluation merges their blocks into it
        on the device (see :mod:`warp_meshad._src.problem.interaction`): the matrix it returns is a new one whose
        pattern is the union of all terms' element pairs, and whose host-side ``nnz`` is exact once the
        evaluation has read the energy back (``assemble_hessian`` leaves an upper bound: ``H.nnz_sync()``).
        The elements have no host copy (``terms[k].elements_np`` is None).

        Args:
            energy: ``@wp.func`` as in :meth:`add_term`, over ``valence`` variables.
            valence: variables per element (e.g. 4 for point-triangle and edge-edge pairs).
            data, weight, name: as in :meth:`add_term`.
            capacity: elements reserved up front.

        Returns:
            The index of the term (pass it to :meth:`set_interaction_elements`).
        """
        if self.deterministic:
            raise NotImplementedError("add_interaction_term: interaction terms do not support deterministic=True yet")
        if not isinstance(valence, (int, np.integer)) or valence < 1:
            raise ValueError(f"add_interaction_term(valence=...) must be a positive int, got {valence!r}")
        if not isinstance(capacity, (int, np.integer)) or capacity < 1:
            raise ValueError(f"add_interaction_term(capacity=...) must be a positive int, got {capacity!r}")
        probe = np.zeros((1, int(valence)), dtype=np.int32)
        index = self._add(probe, energy, data, weight, name, residual=False, what="add_interaction_term")
        term = self.terms[index]
        term.dynamic = True
        term.capacity = int(capacity)
        term.interaction = InteractionElements(self.device, int(valence), term.capacity)
        term.elements_np = None
        term.elements = term.interaction.buffer
        self._storage.drop_layout()
        return index

    @reported_at_the_caller
    def set_interaction_elements(self, term: int, elements) -> None:
        """Replace the elements of an interaction term.

        Args:
            term: index returned by :meth:`add_interaction_term`.
            elements: int array (k, valence) of variable indices (k may be 0). A ``wp.array2d`` of int32
                on the problem's device is copied and range-checked on the device, with no host round
                trip; an index out of range then raises ``ValueError`` here on the CPU, and on a GPU at
                the latest in the next ``eval*`` (every evaluation raises until valid elements are set).
                Anything else (numpy, lists, other dtypes or devices) is checked on the host and
                uploaded once.
        """
        if not isinstance(term, (int, np.integer)) or not 0 <= term < len(self.terms) or not self.terms[term].dynamic:
            raise ValueError(f"set_interaction_elements(term=...) must be the index of an interaction term, got {term!r}")
        if set_interaction_elements(self.terms[term], elements, self.variable_count):
            self._storage.drop_layout()  # the element-energy buffer is sized from the capacity

    def _add(self, elements, energy, data, weight, name, residual, what=None, parameters=None, rest_inverse=None,
             projection=None):  # fmt: skip
        what = what or ("add_residual_term" if residual else "add_term")
        if what == "add_deformation_term" and rest_inverse is None:
            raise ValueError("add_deformation_term(rest_inverse=...): expected D_m^-1 per element, got None")
        term = make_term(
            len(self.terms), elements, energy, data, weight, name, residual, what, self.kernel_facts,
            self.variable_count, self.device, parameters, self.parameter_count, rest_inverse, projection,
        )  # fmt: skip
        self.terms.append(term)
        self._storage.reset()
        return term.index

    def _check_vector(self, x, argname: str, fn: str):
        check_variable_array(x, argname, fn, self.variable_count, self.variable_type, self.device)

    def _read_energy(self) -> float:
        return self._storage.read_energy(self.terms)

    # ------------------------------------------------------------------------------------------
    # evaluation
    # ------------------------------------------------------------------------------------------

    @reported_at_the_caller
    def eval(self, x) -> float:
        """Energy F(x) (plain values, no derivatives): the launches of :meth:`assemble_energy`, then the energy read
        back (waits for the device). An element may return +inf (invalid state)."""
        self._check_vector(x, "x", "eval")
        self._assembler.energy(x)
        return self._read_energy()

    @reported_at_the_caller
    def eval_with_gradient(self, x):
        """Energy and gradient: the launches of :meth:`assemble_gradient`, then the energy read back (waits for
        the device).

        Returns:
            (f, g): f a float, g a wp.array [variable_count] of the variable dtype (preallocated).
        """
        self._launch_gradient(x, "eval_with_gradient")
        return self._read_energy(), self._storage.grad

    def _launch_hessian(self, x, fn, mode, extra=()):
        self._check_vector(x, "x", fn)
        self._assembler.hessian(x, mode, extra)

    def _eval_hessian(self, x, fn, mode, extra=()):
        self._launch_hessian(x, fn, mode, extra)
        return self._read_energy(), self._storage.grad, self._storage.hess

    @reported_at_the_caller
    def assemble_hessian(self, x, projection: str | None = None, eps: float = 1e-9):
        """Launch energy, gradient and Hessian assembly without waiting for the device.

        The asynchronous form of :meth:`eval_with_hessian` (and of :meth:`eval_with_hessian_proj` with
        ``projection="clamp"|"abs"``): nothing is read back, so the launches can be captured in a
        CUDA graph (``wp.ScopedCapture``) once the kernels are loaded (call it once before capturing).

        Returns:
            (energy, g, H): energy a device array of shape [1]; g and H as in :meth:`eval_with_hessian`.
        """
        if projection is None:
            self._launch_hessian(x, "assemble_hessian", "hessian")
        else:
            if projection not in _PROJECTION_MODES:
                raise ValueError(
                    f"assemble_hessian(projection=...) must be None or one of {sorted(_PROJECTION_MODES)}, got {projection!r}"
                )
            extra = (self.dtype(eps), _PROJECTION_MODES[projection])
            self._launch_hessian(x, "assemble_hessian", "hessian_proj", extra)
        return self._storage.energy, self._storage.grad, self._storage.hess

    @reported_at_the_caller
    def assemble_energy(self, x):
        """Launch the energy evaluation without waiting (the asynchronous form of :meth:`eval`; see
        :meth:`assemble_hessian`): a memset of the energy and one launch per term, nothing read back.

        Returns:
            energy: a device array of shape [1] (+inf where an element returned +inf).
        """
        self._check_vector(x, "x", "assemble_energy")
        self._assembler.energy(x)
        return self._storage.energy

    @reported_at_the_caller
    def assemble_gradient(self, x):
        """Launch energy and gradient evaluation without waiting (see :meth:`assemble_hessian`): one memset of
        gradient and energy and one launch per term (see the class docstring), nothing read back, so the calls can
        be captured in a CUDA graph.

        Returns:
            (energy, g): energy a device array of shape [1], g as in :meth:`eval_with_gradient`.
        """
        return self._launch_gradient(x, "assemble_gradient")

    def _launch_gradient(self, x, fn):
        self._check_vector(x, "x", fn)
        self._assembler.gradient(x)
        return self._storage.energy, self._storage.grad

    @reported_at_the_caller
    def eval_with_hessian(self, x):
        """Energy, gradient and sparse Hessian.

        Returns:
            (f, g, H): H a ``warp.sparse.BsrMatrix`` (n x n blocks of d x d), pattern fixed by the terms.
        """
        return self._eval_hessian(x, "eval_with_hessian", "hessian")

    @reported_at_the_caller
    def eval_with_hessian_proj(self, x, mode: str = "clamp", eps: float = 1e-9):
        """Like :meth:`eval_with_hessian`, with every element Hessian projected to PSD first.

        Args:
            mode: ``"clamp"`` replaces eigenvalues below ``eps`` by ``eps`` (TinyAD); ``"abs"`` takes
                absolute values, then clamps at ``eps``.
            eps: smallest eigenvalue kept.
        """
        if mode not in _PROJECTION_MODES:
            raise ValueError(f"eval_with_hessian_proj(mode=...) must be one of {sorted(_PROJECTION_MODES)}, got {mode!r}")
        extra = (self.dtype(eps), _PROJECTION_MODES[mode])
        return self._eval_hessian(x, "eval_with_hessian_proj", "hessian_proj", extra)

    @reported_at_the_caller
    def eval_gauss_newton(self, x):
        """Energy, gradient and Gauss-Newton Hessian: residual terms give sum w J_j^T J_j (assembled
        per element into the Hessian pattern, no sparse product); scalar terms their exact Hessian."""
        return self._eval_hessian(x, "eval_gauss_newton", "gauss_newton")

    @reported_at_the_caller
    def hessian_vector_product(self, x, v):
        """Matrix-free H(x) v: element Hessians applied locally, nothing assembled.

        Returns:
            wp.array [variable_count] (preallocated).
        """
        self._check_vector(x, "x", "hessian_vector_product")
        self._check_vector(v, "v", "hessian_vector_product")
        return self._assembler.hessian_vector_product(x, v)

    # ------------------------------------------------------------------------------------------
    # parameters (add_term(..., parameters=...)); see warp_meshad/_src/problem/parameters.py
    # ------------------------------------------------------------------------------------------

    @property
    def parameter_fields(self) -> list:
        """Every term's :class:`~warp_meshad._src.problem.parameters.ParameterField`, in theta order."""
        return [f for t in self.terms for f in t.params]

    @property
    def parameter_count(self) -> int:
        """Length of the parameter vector theta (0 without parameters)."""
        return sum(f.count for f in self.parameter_fields)

    def parameter_slice(self, term: int, name: str) -> slice:
        """Where field ``name`` of term ``term`` lies in theta."""
        for f in self.parameter_fields:
            if f.term == term and f.name == name:
                return f.slice
        have = [(f.term, f.name) for f in self.parameter_fields]
        raise KeyError(f"parameter_slice: term {term} has no parameter {name!r}; the parameters are {have}")

    def get_parameters(self) -> np.ndarray:
        """theta read from the terms' data (float64 numpy array of :attr:`parameter_count`)."""
        fields = self.parameter_fields
        if not fields:
            return np.zeros(0)
        return np.concatenate([read_values(self.terms[f.term], f) for f in fields])

    def set_parameters(self, theta) -> None:
        """Write theta (array of :attr:`parameter_count` numbers) into the terms' data fields."""
        theta = np.asarray(theta, dtype=np.float64).reshape(-1)
        if theta.shape[0] != self.parameter_count:
            raise ValueError(f"set_parameters(theta): expected {self.parameter_count} numbers, got {theta.shape[0]}")
        for f in self.parameter_fields:
            write_values(self.terms[f.term], f, theta[f.slice])

    @reported_at_the_caller
    def eval_parameter_derivatives(self, x):
        """Energy, dE/dtheta and the mixed second derivatives d2E/dx dtheta at ``x``.

        Returns:
            (f, dE_dtheta, M): f a float; dE_dtheta a wp.array [parameter_count] of the scalar dtype
            (preallocated); M a ``warp.sparse.BsrMatrix`` of variable_count x parameter_count blocks of
            variable_dim x 1 (scalars for variable_dim 1): ``M[i, j] = d2E / dx_i dtheta_j``.
        """
        fn = "eval_parameter_derivatives"
        self._check_vector(x, "x", fn)
        if not self.parameter_fields:
            raise ValueError(f"{fn}: no term has parameters (add_term(..., parameters=[...]))")
        pd = self._storage.parameter_derivatives(self.terms, self.parameter_count)
        self._assembler.parameter_derivatives(x, pd)
        f = self._read_energy()
        return f, pd.theta_grad, pd.assemble()

    @reported_at_the_caller
    def eval_residuals(self, x):
        """Stacked weighted residuals sqrt(w) r_j of all residual terms, wp.array [row_count]."""
        self._check_vector(x, "x", "eval_residuals")
        self._assembler.residuals(x, jacobian=False)
        return self._storage.res

    @reported_at_the_caller
    def eval_residuals_with_jacobian(self, x):
        """Residuals and their sparse Jacobian.

        Returns:
            (r, J): r a wp.array [row_count]; J a ``warp.sparse.BsrMatrix`` with row_count rows of
            1 x variable_dim blocks (scalar blocks when variable_dim == 1).
        """
        self._check_vector(x, "x", "eval_residuals_with_jacobian")
        self._assembler.residuals(x, jacobian=True)
        return self._storage.res, self._storage.jac
