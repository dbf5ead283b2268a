"""The objective F(x) = sum over terms T, over elements j of T: w_T f_T(x_j), and its derivatives.

Every term is one user energy (a ``@wp.func``) over the variables of one element; elements are
rows of an integer array. Energies run unchanged as plain values, gradient duals and
gradient + Hessian duals (see :mod:`warp_meshad._src.codegen.energy_rewrite`); derivatives are scattered into
storage preallocated from the topology (see :mod:`warp_meshad._src.problem.pattern`).
"""

from __future__ import annotations

import hashlib
import inspect

import numpy as np
import warp as wp
import warp.sparse as wps

from warp_meshad.kernels import _dualgen

from warp_meshad._src.codegen.energy_rewrite import describe_energy, instantiate
from warp_meshad._src.problem.interaction import InteractionElements, InteractionPattern, check_interaction, set_interaction_elements
from warp_meshad._src.codegen.kernel_source import KernelSpec, make_kernel
from warp_meshad._src.problem.pattern import build_hessian_pattern, build_jacobian_pattern
from warp_meshad._src.problem.pattern_device import build_hessian_pattern_device
from warp_meshad._src.problem.reduce import contribution_lists, gather_sum, ordered_total, partial_count
from warp_meshad._src.problem import tiled as _tiled
from warp_meshad._src.problem.parameters import ParameterDerivatives, describe_parameters, read_values, write_values
from warp_meshad._src.problem.tiled import build_tile_plan

__all__ = ["Problem"]

_PROJECTION_MODES = {"clamp": 0, "abs": 1}
_ASSEMBLY_MODES = ("auto", "atomic", "tiled")
_KERNELS: dict = {}  # (energy id, mode, shape, data type) -> wp.Kernel, shared by all problems
_MODULE_OWNERS: dict = {}  # Warp module name -> id of the energy it was made for
_NAMED_VECTORS = {
    (2, wp.float32): wp.vec2f, (3, wp.float32): wp.vec3f, (4, wp.float32): wp.vec4f,
    (2, wp.float64): wp.vec2d, (3, wp.float64): wp.vec3d, (4, wp.float64): wp.vec4d,
}
_NAMED_MATRICES = {
    (2, wp.float32): wp.mat22f, (3, wp.float32): wp.mat33f, (4, wp.float32): wp.mat44f,
    (2, wp.float64): wp.mat22d, (3, wp.float64): wp.mat33d, (4, wp.float64): wp.mat44d,
}


def _dtype_name(t) -> str:
    """Readable name of a Warp type: vec3d, mat22f, float64, ... (generic vector classes are all 'vec_t')."""
    scalar = getattr(t, "_wp_scalar_type_", None)
    shape = getattr(t, "_shape_", None)
    if scalar in (wp.float32, wp.float64) and shape is not None:
        suffix = "d" if scalar is wp.float64 else "f"
        if wp.types.type_is_vector(t):
            return f"vec{shape[0]}{suffix}"
        if wp.types.type_is_matrix(t):
            return f"mat{shape[0]}{shape[1]}{suffix}"
    return getattr(t, "__name__", None) or str(t)


class _Term:
    """One added term: elements, energy, data, and its kernels per mode (built on first use)."""

    def __init__(self, index, elements, energy, info, data, weight, spec, residual, label):
        self.index = index
        self.elements_np = elements
        self.elements = None
        self.energy = energy
        self.info = info
        self.data = data
        self.data_type = None if data is None else data._cls
        self.weight = weight
        self.spec = spec
        self.residual = residual
        self.label = label
        self.kernels = {}
        self.slots = None
        self.jslots = None
        self.row_start = 0
        self.dynamic = False
        self.interaction = None  # an interaction term's InteractionElements (device buffer, count, version)
        self.capacity = int(elements.shape[0])
        self.params = []  # ParameterField per data field named a parameter (see parameters.py)

    @property
    def count(self) -> int:
        """Active elements (for an interaction term, the elements set last)."""
        return self.interaction.count if self.dynamic else int(self.elements_np.shape[0])

    @property
    def reserved(self) -> int:
        """Rows reserved in the element buffers: the count, or an interaction term's capacity."""
        return self.capacity if self.dynamic else self.count


def unrolled_default(k: int, cuda: bool) -> bool:
    """Whether the PSD projection of an element of ``k`` variables is unrolled by default (see
    ``Problem.unrolled_projection``): up to k = 12 on CUDA, up to k = 6 on the CPU."""
    return k <= (12 if cuda else 6)


def rounds_default(k_max: int, dtype) -> bool:
    """Whether ``assembly="auto"`` gives the tiled Hessian the conflict-free rounds of the deterministic plan
    when ``deterministic=False``: for float32 elements of at most 6 variables.

    Measured on an H200 at 1000x1000 (float32, ``benchmarks/assembly_choice.py``, 2026-12-01), rounds against the
    plain tiled kernel (shared-memory atomics, global gradient atomics): mass-spring 0.370 vs 0.436 ms, projected
    2.95 vs 3.00 ms; symmetric Dirichlet 0.687 vs 0.786 ms, projected 2.54 vs 3.09 ms. Larger or float64
    elements are not measured, so they keep the plain tiled kernel.
    """
    return dtype == wp.float32 and k_max <= 6


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
            multiprocessors, else atomic (and always atomic on the CPU); for float32 elements of at
            most 6 variables the tiled kernel then sums in the deterministic plan's rounds even when
            ``deterministic=False``, which measured faster (see :func:`rounds_default`), so those
            Hessians come out bitwise identical run to run as well. Interaction terms and
            Gauss-Newton Hessians always use the atomic assembly.

    Variables ``x`` are a ``wp.array`` of shape [variable_count] with dtype ``vec{variable_dim}``
    of ``dtype`` (or ``dtype`` itself when ``variable_dim == 1``), on ``device``.

    Returned gradients, Hessians and products are this problem's preallocated buffers: they stay
    valid until the next evaluation of the same kind (copy them to keep them).
    """

    def __init__(
        self,
        variable_count: int,
        variable_dim: int = 3,
        dtype=wp.float64,
        device=None,
        deterministic: bool = False,
        assembly: str = "auto",
    ):
        if not isinstance(variable_count, (int, np.integer)) or isinstance(variable_count, bool) or variable_count < 1:
            raise ValueError(f"Problem(variable_count=...) must be a positive int, got {variable_count!r}")
        if not isinstance(variable_dim, (int, np.integer)) or not 1 <= variable_dim <= 4:
            raise ValueError(
                f"Problem(variable_dim=...) must be an int in 1..4 (scalar, vec2, vec3 or vec4 variables), got {variable_dim!r}"
            )
        if dtype not in (wp.float32, wp.float64):
            raise ValueError(f"Problem(dtype=...) must be wp.float32 or wp.float64, got {_dtype_name(dtype)}")
        self.variable_count = int(variable_count)
        self.variable_dim = int(variable_dim)
        self.dtype = dtype
        self.device = wp.get_device(device)
        d = self.variable_dim
        self.variable_type = dtype if d == 1 else _NAMED_VECTORS.get((d, dtype)) or wp.types.vector(length=d, dtype=dtype)
        self.block_type = dtype if d == 1 else _NAMED_MATRICES.get((d, dtype)) or wp.types.matrix(shape=(d, d), dtype=dtype)
        self.terms: list[_Term] = []
        self._energy = wp.zeros(1, dtype=dtype, device=self.device)
        self._energy_host = wp.zeros(1, dtype=dtype, device="cpu", pinned=self.device.is_cuda)
        self._grad = wp.zeros(self.variable_count, dtype=self.variable_type, device=self.device)
        self._hv = None
        self._params = None  # ParameterDerivatives (buffers of eval_parameter_derivatives)
        self._hess = None
        self._hflat = None
        self._pattern = None
        self._jac = None
        self._res = None
        self._jpattern = None
        self.deterministic = bool(deterministic)
        if assembly not in _ASSEMBLY_MODES:
            raise ValueError(f"Problem(assembly=...) must be one of {list(_ASSEMBLY_MODES)}, got {assembly!r}")
        self.assembly = assembly
        self._tiles = None  # (pattern, TilePlan or None)
        self._det = None
        self._layout = None
        # per-element PSD projection with literal indices (registers instead of local memory): None picks
        # it on GPUs for k <= 12 and on the CPU for k <= 6 (larger ones take long to compile there); True /
        # False force it (up to k = 12). On an H200 it is faster even where ptxas reports more spill bytes
        # for it (k = 9, 12 in float64, benchmarks/results/kernel_resources.json): spot_pile's derivatives
        # and assembly took 0.86 s per two-iteration step with it and 2.28 s with the loop (Jacobi sweeps
        # indexing local arrays at run time); mass-spring (k = 6, float32) 13.9 instead of 63 ms
        self.unrolled_projection = None

    # ------------------------------------------------------------------------------------------
    # terms
    # ------------------------------------------------------------------------------------------

    def add_term(
        self, elements, energy, data=None, weight: float = 1.0, name: str | None = None, parameters=None
    ) -> int:
        """Add the term ``weight * sum_j energy(j, x[elements[j, 0]], ..., data)``.

        Args:
            elements: int array (m, valence) of variable indices (numpy, list or ``wp.array2d``).
            energy: ``@wp.func`` taking the element index, then ``valence`` variables (each a
                ``vec{variable_dim}``, or a scalar when ``variable_dim == 1``), then ``data`` if
                given; returns a scalar. Written with ordinary operators and ``ad.*``.
            data: a ``@wp.struct`` instance passed to every call, or None.
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
        self._layout = None
        return index

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
        set_interaction_elements(self, self.terms[term], elements)

    def _add(self, elements, energy, data, weight, name, residual, what=None, parameters=None):
        what = what or ("add_residual_term" if residual else "add_term")
        argname = "residual" if residual else "energy"
        info = describe_energy(energy, f"{what}({argname}=...)")
        el = self._check_elements(elements, what)
        valence = el.shape[1]
        expected = 1 + valence + (0 if data is None else 1)
        if len(info.arg_names) != expected:
            has = "with" if data is not None else "without"
            raise ValueError(
                f"{what}({argname}={info.name}): elements have valence {valence}, so the {argname} must take "
                f"{expected} arguments (element index, {valence} variables{', data' if data is not None else ''}) "
                f"when called {has} data; it takes {len(info.arg_names)}: ({', '.join(info.arg_names)})"
            )
        if data is not None and not isinstance(data, wp._src.codegen.StructInstance):
            raise TypeError(f"{what}(data=...) must be an instance of a @wp.struct, got {type(data).__name__}")
        try:
            weight = float(weight)
        except (TypeError, ValueError):
            raise TypeError(f"{what}(weight=...) must be a real number, got {weight!r}") from None
        if not np.isfinite(weight) or (residual and weight < 0.0):
            raise ValueError(f"{what}(weight=...) must be finite{' and >= 0' if residual else ''}, got {weight}")
        spec = KernelSpec(valence, self.variable_dim, self.dtype, data is not None)
        label = name or info.name
        term = _Term(len(self.terms), el, energy, info, data, weight, spec, residual, label)
        rtype = self._probe_return_type(term, what, argname)
        if residual:
            rdim = self._residual_dim(rtype)
            if rdim is None:
                raise ValueError(
                    f"{what}(residual={info.name}) must return a scalar or a vector of 2-4 {_dtype_name(self.dtype)}"
                    f" (build it with ad.vec2/ad.vec3/ad.vec4); it returns {_dtype_name(rtype)}"
                )
            spec.residual_dim = rdim
        elif rtype is not self.dtype:
            raise ValueError(
                f"{what}(energy={info.name}) must return a scalar of dtype {_dtype_name(self.dtype)}; "
                f"it returns {_dtype_name(rtype)}"
            )
        if spec.k > 64:
            raise ValueError(f"{what}: valence {valence} x variable_dim {self.variable_dim} = {spec.k} exceeds 64 variables")
        if parameters is not None:
            term.params = describe_parameters(term, parameters, self.dtype, self.parameter_count, spec.k, what)
            spec.param_count = sum(f.size for f in term.params)
            if spec.k + spec.param_count > 64:
                raise ValueError(
                    f"{what}(parameters=...): {spec.k} variables + {spec.param_count} parameter numbers per element "
                    f"exceed the 64 dual entries of the mixed derivatives"
                )
        term.elements = wp.array(el, dtype=wp.int32, device=self.device)
        self.terms.append(term)
        self._params = None
        self._pattern = None
        self._jpattern = None
        self._det = None
        self._layout = None
        return term.index

    def _residual_dim(self, rtype):
        if rtype is self.dtype:
            return 1
        if wp.types.type_is_vector(rtype) and rtype._wp_scalar_type_ is self.dtype and 2 <= rtype._length_ <= 4:
            return int(rtype._length_)
        return None

    def _check_elements(self, elements, what):
        if isinstance(elements, wp.array):
            elements = elements.numpy()
        arr = np.asarray(elements)
        if arr.dtype == object or arr.ndim != 2:
            raise ValueError(
                f"{what}(elements=...) must be an integer array of shape (m, valence); got shape {arr.shape}"
                + (" (a 1-D array: use elements[:, None] for one variable per element)" if arr.ndim == 1 else "")
            )
        if not np.issubdtype(arr.dtype, np.integer):
            raise TypeError(f"{what}(elements=...) must have an integer dtype, got {arr.dtype}")
        if arr.shape[0] == 0 or arr.shape[1] == 0:
            raise ValueError(f"{what}(elements=...) is empty: shape {arr.shape}")
        bad = np.argwhere((arr < 0) | (arr >= self.variable_count))
        if bad.size:
            e, a = bad[0]
            raise ValueError(
                f"{what}(elements=...) has {len(bad)} indices out of range [0, {self.variable_count}): "
                f"first elements[{e}, {a}] = {arr[e, a]}"
            )
        return np.ascontiguousarray(arr, dtype=np.int32)

    # ------------------------------------------------------------------------------------------
    # kernels
    # ------------------------------------------------------------------------------------------

    def _module(self, term: _Term, mode: str):
        """The Warp module of one (energy, shape, mode): named from the energy's source so Warp's
        kernel cache is reused across processes; a different energy object with the same source
        (other closure values) gets a numbered name of its own."""
        h = hashlib.sha1()
        h.update(inspect.getsource(term.energy.func).encode())
        h.update(repr((term.spec.signature(), mode, term.data_type.key if term.data_type else "")).encode())
        base = f"wm_{term.info.name}_{mode}_{h.hexdigest()[:12]}"
        name, i = base, 1
        while _MODULE_OWNERS.setdefault(name, id(term.energy)) != id(term.energy):
            i += 1
            name = f"{base}_{i}"
        module = wp.get_module(name)
        module.options["enable_backward"] = False  # forward-mode only: no adjoints of the energy (faster compiles)
        return module

    def _instance(self, term: _Term, mode: str, module):
        plain = mode in ("probe", "energy", "residual")
        params = None
        if plain:
            ns = _dualgen.load(0, None, "plain")
            vt = self.variable_type
            vec_t = vt
        else:
            dual_mode = "grad" if mode in ("gradient", "jacobian", "gauss_newton") else "hess"
            k = term.spec.k
            if mode == "mixed":  # duals over the element's variables, then its parameters
                k += term.spec.param_count
                params = {f.name: (f.dual_offset, f.per_element) for f in term.params}
            ns = _dualgen.load(k, self.dtype, dual_mode)
            vec_t = ns.Dual if self.variable_dim == 1 else getattr(ns, f"DVec{self.variable_dim}", None)
            if vec_t is None:
                raise ValueError(f"dual variables support variable_dim 1..4, got {self.variable_dim}")
        types = [None] + [vec_t] * term.spec.valence + ([term.data_type] if term.spec.has_data else [])
        return instantiate(term.energy, ns, types, module, self.dtype, params), ns

    def _kernel(self, term: _Term, mode: str, tile_cap: int = 0, row_cap: int = 0, rounds: bool = False):
        # the tiled kernels also depend on the knobs of tiled.py (set by benchmarks/tile_sweep.py), which
        # _launch_hessian reads too: a kernel built under other knobs is not reused. A tiled kernel sums in
        # rounds exactly when its plan has them (``rounds``), deterministic or not.
        knobs = (_tiled.TILE_STORE, _tiled.TILE_MIN_BLOCKS, _tiled.TILE_BLOCK_DIM) if tile_cap else ()
        kern = term.kernels.get((mode, tile_cap, row_cap, knobs, rounds))
        if kern is None:
            det = rounds if tile_cap else self.deterministic and mode not in ("residual", "jacobian")
            unrolled = mode == "hessian_proj" and self._unrolled(term.spec.k)
            tiling = {}
            if tile_cap:
                mb = _tiled.min_blocks(term.spec.k, self.dtype, projected=mode == "hessian_proj")
                tiling = dict(tile_store=_tiled.TILE_STORE, tile_launch_bounds=(_tiled.TILE_BLOCK_DIM, mb) if mb else None)
            key = (
                id(term.energy), mode, det, unrolled, tile_cap, row_cap, tuple(tiling.values()), term.spec.signature(),
                term.data_type.key if term.data_type else "",
            )  # fmt: skip
            hit = _KERNELS.get(key)
            if hit is None:
                suffix = ("_det" if det else "") + ("_unrolled" if unrolled else "") + ("_tiled" if tile_cap else "")
                module = self._module(term, mode + suffix)
                from warp_meshad._src.codegen.module_loads import describe_module

                extras = [w for w, on in (("deterministic", det), ("unrolled", unrolled), ("tiled", tile_cap)) if on]
                describe_module(module.name, ", ".join([f"term '{term.label}': {mode}", *extras, self.dtype.__name__]))
                fn, ns = self._instance(term, mode, module)
                kern = make_kernel(
                    term.spec, mode, fn, ns, term.data_type, term.label, det, unrolled, tile_cap, row_cap, **tiling
                )
                hit = (kern, term.energy)
                _KERNELS[key] = hit  # holding the energy keeps its id from being reused
            kern = hit[0]
            term.kernels[(mode, tile_cap, row_cap, knobs, rounds)] = kern
        return kern

    def _unrolled(self, k: int) -> bool:
        if self.unrolled_projection is not None:
            return bool(self.unrolled_projection) and k <= 12
        return unrolled_default(k, self.device.is_cuda)

    def _probe_return_type(self, term: _Term, what: str, argname: str):
        """Generate code (no compilation) for a kernel that calls the energy once; read its return type."""
        key = (id(term.energy), "probe", term.spec.signature(), term.data_type.key if term.data_type else "")
        hit = _KERNELS.get(key)
        if hit is not None:
            return hit[0]
        module = self._module(term, "probe")
        try:
            fn, _ = self._instance(term, "probe", module)
            make_kernel(term.spec, "probe", fn, None, term.data_type, term.info.name)
            wp._src.context.ModuleBuilder(module, module.options)
        except Exception as exc:  # codegen errors carry the user's line
            raise ValueError(
                f"{what}({argname}={term.info.name}): the {argname} does not compile for variables of type "
                f"{_dtype_name(self.variable_type)}: {exc}"
            ) from exc
        ret = getattr(fn.adj, "return_var", None)
        if not ret:
            raise ValueError(f"{what}({argname}={term.info.name}) returns nothing; it must return a scalar")
        if len(ret) != 1:
            raise ValueError(f"{what}({argname}={term.info.name}) returns {len(ret)} values; it must return one")
        rtype = wp._src.codegen.strip_reference(ret[0].type)
        _KERNELS[key] = (rtype, term.energy)
        return rtype

    # ------------------------------------------------------------------------------------------
    # storage
    # ------------------------------------------------------------------------------------------

    def _ensure_pattern(self):
        if self._pattern is None:
            if not self.terms:
                raise RuntimeError("the problem has no terms: call add_term first")
            static = [t for t in self.terms if not t.dynamic]  # interaction terms: merged on the device
            if self.device.is_cuda:  # radix sort on the device: seconds instead of minutes for millions of elements
                pat = build_hessian_pattern_device(self.variable_count, [t.elements for t in static], self.device)
            else:
                pat = build_hessian_pattern(self.variable_count, [t.elements_np for t in static])
            for t, s in zip(static, pat.slots):
                t.slots = wp.array(s, dtype=wp.int32, device=self.device)
            if len(static) < len(self.terms):
                self._pattern = InteractionPattern(self, pat)
            else:
                n = self.variable_count
                self._hess = self._bsr(n, n, self.block_type, pat)
                self._pattern = pat
        if isinstance(self._pattern, InteractionPattern):
            self._hess = self._pattern.update()  # merges new interaction blocks (device) when elements changed

    def _bsr(self, nrow: int, ncol: int, block_type, pat):
        """Zero BSR matrix with the structure of ``pat`` (offsets, columns) on this problem's device."""
        A = wps.bsr_zeros(nrow, ncol, block_type, device=self.device)
        A.offsets = wp.array(pat.offsets, dtype=wp.int32, device=self.device)
        A.columns = wp.array(pat.columns, dtype=wp.int32, device=self.device)
        A.values = wp.zeros(pat.nnz, dtype=block_type, device=self.device)
        A.notify_nnz_changed(pat.nnz)
        return A

    def _ensure_jacobian_pattern(self):
        if self._jpattern is not None:
            return
        res = [t for t in self.terms if t.residual]
        if not res:
            raise RuntimeError("the problem has no residual terms: call add_residual_term first")
        pat = build_jacobian_pattern(self.variable_count, [(t.elements_np, t.spec.residual_dim) for t in res])
        for t, s, start in zip(res, pat.slots, pat.row_starts):
            t.jslots = wp.array(s, dtype=wp.int32, device=self.device)
            t.row_start = int(start)
        d = self.variable_dim
        jblock = self.dtype if d == 1 else wp.types.matrix(shape=(1, d), dtype=self.dtype)
        self._jac = self._bsr(pat.row_count, self.variable_count, jblock, pat)
        self._res = wp.zeros(pat.row_count, dtype=self.dtype, device=self.device)
        self._jpattern = pat

    @property
    def hessian_block_count(self) -> int:
        """Number of stored d x d blocks of the Hessian (builds the pattern if needed)."""
        self._ensure_pattern()
        return self._pattern.nnz

    def _check_vector(self, x, argname: str, fn: str):
        n, vt = self.variable_count, self.variable_type
        want = f"a wp.array of shape ({n},), dtype {_dtype_name(vt)}, on device {self.device}"
        if not isinstance(x, wp.array):
            raise TypeError(f"{fn}({argname}=...) must be {want}; got {type(x).__name__}")
        if x.ndim != 1 or x.shape[0] != n:
            raise ValueError(f"{fn}({argname}=...) must be {want}; got shape {x.shape}")
        if not wp.types.types_equal(x.dtype, vt):
            raise ValueError(f"{fn}({argname}=...) must be {want}; got dtype {_dtype_name(x.dtype)}")
        if x.device != self.device:
            raise ValueError(f"{fn}({argname}=...) must be {want}; got device {x.device}")

    def _inputs(self, term: _Term, mode: str, extra: list) -> list:
        """Arguments of a term's kernel: elements, x (``extra[0]``), data, weight, ``extra[1:]``, offsets."""
        inputs = [term.elements, extra[0]]
        if term.data is not None:
            inputs.append(term.data)
        inputs.append(self.dtype(term.weight))
        inputs += extra[1:]
        if mode not in ("residual", "jacobian"):
            inputs.append(self._layout.offsets[term.index])
        return inputs

    def _launch(self, term: _Term, mode: str, extra: list):
        if term.count:
            wp.launch(self._kernel(term, mode), dim=term.count, inputs=self._inputs(term, mode, extra), device=self.device)

    def _ensure_layout(self):
        """Per-term offsets into the element buffers, and the element-energy buffer."""
        if self._layout is None:
            if not self.terms:
                raise RuntimeError("the problem has no terms: call add_term first")
            self._layout = _Layout(self)
        if self._layout.dynamic:
            self._layout.energy.zero_()  # slots beyond an interaction term's current count must read 0
            check_interaction(self, synced=False)  # bad elements raise once their device check is back
        return self._layout

    def _total_energy(self):
        lay = self._layout
        ordered_total(lay.energy, lay.element_count, lay.partial, self._energy, self.device)

    def _ensure_det(self, hessian: bool):
        """Contribution buffers and fixed-order lists of the deterministic mode."""
        if self._det is None:
            self._det = _DeterministicStorage(self)
        if hessian and self._det.h_lists is None:
            self._ensure_pattern()
            self._det.build_hessian(self)
        return self._det

    def _read_energy(self) -> float:
        wp.copy(self._energy_host, self._energy)
        if self.device.is_cuda:
            wp.synchronize_device(self.device)
        if self._layout is not None and self._layout.dynamic:
            check_interaction(self, synced=True)  # the device checks of interaction elements are back now
        return float(self._energy_host.numpy()[0])

    # ------------------------------------------------------------------------------------------
    # evaluation
    # ------------------------------------------------------------------------------------------

    def eval(self, x) -> float:
        """Energy F(x) (plain values, no derivatives). An element may return +inf (invalid state)."""
        self._check_vector(x, "x", "eval")
        lay = self._ensure_layout()
        for t in self.terms:
            self._launch(t, "energy", [x, lay.energy])
        self._total_energy()
        return self._read_energy()

    def eval_with_gradient(self, x):
        """Energy and gradient.

        Returns:
            (f, g): f a float, g a wp.array [variable_count] of the variable dtype (preallocated).
        """
        self._launch_gradient(x, "eval_with_gradient")
        return self._read_energy(), self._grad

    def _tile_plan(self, mode: str):
        """The patch plan of the tiled assembly, or None where the atomic assembly is used."""
        if mode not in ("hessian", "hessian_proj"):
            return None
        if self.assembly == "atomic" or (self.assembly == "auto" and not self.device.is_cuda):
            return None
        if any(t.dynamic for t in self.terms):
            return None
        if self._tiles is None or self._tiles[0] is not self._pattern:
            plan = build_tile_plan(
                self._pattern.offsets, [t.elements for t in self.terms], self.block_type, self.device,
                rounds=self.deterministic or self._rounds_default(), var_type=self.variable_type,
                block_dim=_tiled.TILE_BLOCK_DIM,
            )  # fmt: skip
            if self.assembly == "auto" and plan is not None and plan.patch_count < self.device.sm_count:
                plan = None  # too few patches to fill the GPU: one thread per element is faster (H200, 10x10 grid)
            self._tiles = (self._pattern, plan)
        return self._tiles[1]

    def _rounds_default(self) -> bool:
        """Rounds for the tiled kernels of a non-deterministic problem (``assembly="auto"`` only)."""
        return self.assembly == "auto" and rounds_default(max(t.spec.k for t in self.terms), self.dtype)

    def _launch_tiled(self, term: _Term, mode: str, plan, i: int, inputs: list):
        kern = self._kernel(term, mode, plan.cap, plan.row_cap, rounds=plan.deterministic)
        if plan.deterministic:
            inputs = inputs + [plan.entries[i], plan.round_start[i], plan.patch_round_start[i], plan.block_start,
                               plan.row_start, 1 if i else 0]  # fmt: skip
        else:
            inputs = inputs + [plan.entries[i], plan.entry_start[i], plan.block_start, 1 if i else 0]
        wp.launch_tiled(kern, dim=[plan.patch_count], inputs=inputs, block_dim=_tiled.TILE_BLOCK_DIM, device=self.device)

    def _launch_hessian(self, x, fn, mode, extra=()):
        self._check_vector(x, "x", fn)
        self._ensure_pattern()
        lay = self._ensure_layout()
        self._grad.zero_()
        plan = self._tile_plan(mode)
        if plan is None:  # the tiled kernels store every block of the pattern: nothing to clear
            self._hess.values.zero_()
        det = self._ensure_det(True) if self.deterministic and plan is None else None
        g_out, h_out = (det.grad, det.hess) if det else (self._grad, self._hess.values)
        if plan is not None and self.variable_dim > 1 and _tiled.TILE_STORE == "number":
            h_out = self._flat_values()
        for i, t in enumerate(self.terms):
            m = mode if (mode != "gauss_newton" or t.residual) else "hessian"
            ex = list(extra) if m == "hessian_proj" else []
            extra_m = [x, lay.energy, g_out, *ex, t.slots, h_out]
            if plan is not None:
                self._launch_tiled(t, m, plan, i, self._inputs(t, m, extra_m))
            else:
                self._launch(t, m, extra_m)
        self._total_energy()
        if det:
            det.finish(self, grad=self._grad, hess=True)

    def _flat_values(self):
        """The Hessian's BSR values as one flat array of numbers (a view; the tiled kernels' output)."""
        vals = self._hess.values
        if self._hflat is None or self._hflat[0] is not vals:
            self._hflat = (vals, vals.view(self.dtype).flatten())
        return self._hflat[1]

    def _eval_hessian(self, x, fn, mode, extra=()):
        self._launch_hessian(x, fn, mode, extra)
        return self._read_energy(), self._grad, self._hess

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
        return self._energy, self._grad, self._hess

    def assemble_gradient(self, x):
        """Launch energy and gradient evaluation without waiting (see :meth:`assemble_hessian`).

        Returns:
            (energy, g): energy a device array of shape [1], g as in :meth:`eval_with_gradient`.
        """
        return self._launch_gradient(x, "assemble_gradient")

    def _launch_gradient(self, x, fn):
        self._check_vector(x, "x", fn)
        lay = self._ensure_layout()
        self._grad.zero_()
        g_out = self._ensure_det(False).grad if self.deterministic else self._grad
        for t in self.terms:
            self._launch(t, "gradient", [x, lay.energy, g_out])
        self._total_energy()
        if self.deterministic:
            self._det.finish(self, grad=self._grad)
        return self._energy, self._grad

    def eval_with_hessian(self, x):
        """Energy, gradient and sparse Hessian.

        Returns:
            (f, g, H): H a ``warp.sparse.BsrMatrix`` (n x n blocks of d x d), pattern fixed by the terms.
        """
        return self._eval_hessian(x, "eval_with_hessian", "hessian")

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

    def eval_gauss_newton(self, x):
        """Energy, gradient and Gauss-Newton Hessian: residual terms give sum w J_j^T J_j (assembled
        per element into the Hessian pattern, no sparse product); scalar terms their exact Hessian."""
        return self._eval_hessian(x, "eval_gauss_newton", "gauss_newton")

    def hessian_vector_product(self, x, v):
        """Matrix-free H(x) v: element Hessians applied locally, nothing assembled.

        Returns:
            wp.array [variable_count] (preallocated).
        """
        self._check_vector(x, "x", "hessian_vector_product")
        self._check_vector(v, "v", "hessian_vector_product")
        if self._hv is None:
            self._hv = wp.zeros(self.variable_count, dtype=self.variable_type, device=self.device)
        self._hv.zero_()
        lay = self._ensure_layout()
        hv_out = self._ensure_det(False).grad if self.deterministic else self._hv
        for t in self.terms:
            self._launch(t, "hvp", [x, lay.energy, hv_out, v, hv_out])
        if self.deterministic:
            self._det.finish(self, grad=self._hv)
        return self._hv

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
        lay = self._ensure_layout()
        if self._params is None:
            self._params = ParameterDerivatives(self)
        pd = self._params
        pd.theta_grad.zero_()
        for t in self.terms:
            if t.params:
                start, size = pd.segments[t.index]
                vals = pd.values[start : start + size]
                self._launch(t, "mixed", [x, lay.energy, pd.theta_grad, pd.pidx[t.index], vals])
            else:
                self._launch(t, "energy", [x, lay.energy])
        self._total_energy()
        f = self._read_energy()
        return f, pd.theta_grad, pd.assemble()

    def eval_residuals(self, x):
        """Stacked weighted residuals sqrt(w) r_j of all residual terms, wp.array [row_count]."""
        self._check_vector(x, "x", "eval_residuals")
        self._ensure_jacobian_pattern()
        for t in self.terms:
            if t.residual:
                self._launch(t, "residual", [x, t.row_start, self._res])
        return self._res

    def eval_residuals_with_jacobian(self, x):
        """Residuals and their sparse Jacobian.

        Returns:
            (r, J): r a wp.array [row_count]; J a ``warp.sparse.BsrMatrix`` with row_count rows of
            1 x variable_dim blocks (scalar blocks when variable_dim == 1).
        """
        self._check_vector(x, "x", "eval_residuals_with_jacobian")
        self._ensure_jacobian_pattern()
        self._jac.values.zero_()
        for t in self.terms:
            if t.residual:
                self._launch(t, "jacobian", [x, t.row_start, t.jslots, self._res, self._jac.values])
        return self._res, self._jac


class _Layout:
    """Where each term's elements write: offsets (energy, gradient, Hessian contributions) per term,
    and the buffer of element energies summed by a block reduction."""

    def __init__(self, problem: Problem):
        e_off = g_off = h_off = 0
        self.offsets = []
        for t in problem.terms:
            self.offsets.append(wp.vec3i(e_off, g_off, h_off))
            e_off += t.reserved
            g_off += t.reserved * t.spec.valence
            h_off += t.reserved * t.spec.valence * t.spec.valence
        self.dynamic = any(t.dynamic for t in problem.terms)
        self.element_count = e_off
        self.grad_count = g_off
        self.hess_count = h_off
        dev = problem.device
        self.energy = wp.zeros(e_off, dtype=problem.dtype, device=dev)
        self.partial = wp.zeros(partial_count(e_off, dev), dtype=problem.dtype, device=dev)


class _DeterministicStorage:
    """Per-element contribution buffers and the fixed-order lists that sum them (deterministic mode)."""

    def __init__(self, problem: Problem):
        dev = problem.device
        lay = problem._ensure_layout()
        self.grad = wp.zeros(lay.grad_count, dtype=problem.variable_type, device=dev)
        targets = np.concatenate([t.elements_np.ravel() for t in problem.terms])
        self.g_lists = contribution_lists(targets, problem.variable_count, dev)
        self.hess_count = lay.hess_count
        self.hess = None
        self.h_lists = None

    def build_hessian(self, problem: Problem):
        targets = np.concatenate([t.slots.numpy().ravel() for t in problem.terms])
        self.hess = wp.zeros(self.hess_count, dtype=problem.block_type, device=problem.device)
        self.h_lists = contribution_lists(targets, problem._pattern.nnz, problem.device)

    def finish(self, problem: Problem, grad=None, hess=False):
        dev = problem.device
        if grad is not None:
            gather_sum(self.g_lists, self.grad, grad, dev)
        if hess:
            gather_sum(self.h_lists, self.hess, problem._hess.values, dev)
