"""The terms of a problem: the :class:`Term` record (every field declared) and :func:`make_term`, which checks
what ``add_term`` / ``add_residual_term`` / ``add_interaction_term`` / ``add_deformation_term`` were given and
builds the record."""

from __future__ import annotations

import numpy as np
import warp as wp

from warp_meshad._src.codegen.contract import deformation_shape, projection_arg_count
from warp_meshad._src.codegen.energy_rewrite import describe_energy
from warp_meshad._src.codegen.kernel_cache import KernelFacts, probe_return_type
from warp_meshad._src.codegen.kernel_source import KernelSpec
from warp_meshad._src.codegen.warp_compat import is_struct_instance, struct_type
from warp_meshad._src.problem.parameters import describe_parameters
from warp_meshad._src.problem.variables import check_elements, dtype_name

__all__ = ["Term", "make_term"]


class Term:
    """One added term: elements, energy, data, where its elements write, and its kernels per mode.

    Attributes:
        index: position in ``Problem.terms``.
        elements_np: (m, valence) int32 numpy elements, the term's own read-only copy (None for an interaction term:
            no host copy).
        elements: (m, valence) int32 device array (an interaction term's buffer of ``capacity`` rows).
        energy: the user's ``@wp.func``; ``info`` its :class:`~warp_meshad._src.codegen.energy_rewrite` description.
        data, data_type: the data struct instance and its type, or None.
        weight: scalar factor of the term.
        spec: the :class:`~warp_meshad._src.codegen.kernel_source.KernelSpec` of its kernels.
        residual: whether the term is vector-valued (``add_residual_term``).
        label: name used in messages and kernel names.
        kernels: kernels built so far (see :func:`~warp_meshad._src.codegen.kernel_cache.term_kernel`).
        slots: (m, valence**2) int32 device array: the Hessian block slot of each element pair.
        base_slots: with interaction terms, a static term's slots in the static pattern (``slots`` are remapped
            from them into the merged pattern, see :mod:`warp_meshad._src.problem.interaction`).
        slot_base: an interaction term's first entry in the merged pattern's slot buffer.
        jslots: (m, residual_dim * valence) int32 device array: Jacobian block slots of a residual term.
        row_start: first residual row of a residual term.
        dynamic: whether it is an interaction term; ``interaction`` then holds its
            :class:`~warp_meshad._src.problem.interaction.InteractionElements`.
        capacity: element rows reserved (an interaction term's buffer; otherwise the element count).
        params: :class:`~warp_meshad._src.problem.parameters.ParameterField` per data field named a parameter.
        rest_inverse: a deformation term's D_m^-1 per element (device array of ``matCC``), else None.
        projection: a deformation term's analytic projection (``@wp.func``, see
            :data:`~warp_meshad._src.codegen.contract.ANALYTIC_PROJECTION`), else None (Jacobi on the F Hessian).
    """

    def __init__(self, index, elements, energy, info, data, weight, spec, residual, label):
        self.index = index
        self.elements_np = elements
        self.elements = None
        self.energy = energy
        self.info = info
        self.data = data
        self.data_type = None if data is None else struct_type(data)
        self.weight = weight
        self.spec = spec
        self.residual = residual
        self.label = label
        self.kernels = {}
        self.slots = None
        self.base_slots = None
        self.slot_base = 0
        self.jslots = None
        self.row_start = 0
        self.dynamic = False
        self.interaction = None
        self.capacity = int(elements.shape[0])
        self.params = []
        self.rest_inverse = None
        self.projection = None

    @property
    def count(self) -> int:
        """Active elements (for an interaction term, the elements set last)."""
        return self.interaction.count if self.dynamic else int(self.elements_np.shape[0])

    @property
    def reserved(self) -> int:
        """Rows reserved in the element buffers: the count, or an interaction term's capacity."""
        return self.capacity if self.dynamic else self.count


def _residual_dim(rtype, dtype):
    if rtype is dtype:
        return 1
    if wp.types.type_is_vector(rtype) and rtype._wp_scalar_type_ is dtype and 2 <= rtype._length_ <= 4:
        return int(rtype._length_)
    return None


def _rest_inverse_array(rest_inverse, count: int, cols: int, dtype, device, what: str):
    """``rest_inverse`` as a device array of ``count`` cols x cols matrices of ``dtype`` (a numpy-like array of shape
    (count, cols, cols) is uploaded; a ``wp.array`` must already be one on ``device``)."""
    mat_t = wp.types.matrix(shape=(cols, cols), dtype=dtype)
    want = f"shape [{count}] of {cols}x{cols} matrices of {dtype_name(dtype)} (one D_m^-1 per element)"
    if isinstance(rest_inverse, wp.array):
        ok = (rest_inverse.ndim == 1 and rest_inverse.shape[0] == count and wp.types.type_is_matrix(rest_inverse.dtype)
              and rest_inverse.dtype._shape_ == (cols, cols) and rest_inverse.dtype._wp_scalar_type_ is dtype)  # fmt: skip
        if not ok:
            raise ValueError(f"{what}(rest_inverse=...) must have {want}; got shape {rest_inverse.shape} of "
                             f"{dtype_name(rest_inverse.dtype)}")  # fmt: skip
        if rest_inverse.device != wp.get_device(device):
            raise ValueError(f"{what}(rest_inverse=...) must be on the problem's device {device}, got {rest_inverse.device}")
        return rest_inverse
    arr = np.asarray(rest_inverse)
    if arr.shape != (count, cols, cols) or not np.issubdtype(arr.dtype, np.number):
        raise ValueError(f"{what}(rest_inverse=...) must have {want}; got a {arr.dtype} array of shape {arr.shape}")
    return wp.array(arr, dtype=mat_t, device=device)


def _check_projection(projection, fs, has_data: bool, weight: float, what: str) -> None:
    """A deformation term's analytic projection: a ``@wp.func`` of the contract's arity, on a term of weight > 0."""
    if fs is None:
        raise ValueError(f"{what}(projection=...): only deformation terms (add_deformation_term) take a projection")
    if not isinstance(projection, wp.Function) or projection.func is None:
        raise TypeError(f"{what}(projection=...) must be a @wp.func, got {type(projection).__name__}")
    want = projection_arg_count(fs, has_data)
    code = projection.func.__code__
    if code.co_argcount != want:
        f_args = "F" if fs.square else ", ".join(f"f{j}" for j in range(fs.cols))
        names = ", ".join(code.co_varnames[: code.co_argcount])
        raise ValueError(
            f"{what}(projection={projection.key}) must take {want} arguments (e, {f_args}"
            f"{', data' if has_data else ''}, eps, absolute) for {fs.describe()}; it takes {code.co_argcount}: "
            f"({names})"
        )
    if not weight > 0.0:
        raise ValueError(f"{what}(weight=...) must be > 0 with projection=... (the projection of weight * Hessian "
                         f"is weight * projection(eps / weight)), got {weight}")  # fmt: skip


def make_term(
    index: int, elements, energy, data, weight, name, residual: bool, what: str, facts: KernelFacts,
    variable_count: int, device, parameters=None, parameter_offset: int = 0, rest_inverse=None, projection=None,
) -> Term:  # fmt: skip
    """Check a term's arguments and build its record (its elements uploaded to ``device``).

    Args:
        index: the term's position in the problem.
        elements, energy, data, weight, name, parameters: as given to ``add_term`` (``energy`` is the residual
            function of a residual term).
        residual: whether it is a residual term.
        what: the calling function, for messages.
        facts: the problem's kernel facts (dtype, variable type and dim; the energy is probed for them).
        variable_count: number of variables (the range of element indices).
        device: where the elements go.
        parameter_offset: theta offset of the term's first parameter (the problem's parameter count so far).
        rest_inverse: for a deformation term (``add_deformation_term``), D_m^-1 per element; its energy takes F.
        projection: a deformation term's analytic projection, or None.

    Raises:
        TypeError, ValueError: on a bad argument, naming it, before any launch.
    """
    dtype = facts.dtype
    argname = "residual" if residual else "energy"
    info = describe_energy(energy, f"{what}({argname}=...)")
    # the term's own frozen copy: the device elements (f, g) and the Hessian pattern (built later) come from it, so a
    # caller that changes its array afterwards changes neither
    el = np.array(check_elements(elements, variable_count, what), dtype=np.int32, order="C", copy=True)
    el.flags.writeable = False
    valence = el.shape[1]
    fs = None if rest_inverse is None else deformation_shape(valence, facts.variable_dim, what)
    nvars = valence if fs is None else (1 if fs.square else fs.cols)
    expected = 1 + nvars + (0 if data is None else 1)
    if len(info.arg_names) != expected:
        has = "with" if data is not None else "without"
        what_vars = f"{valence} variables" if fs is None else fs.describe()
        raise ValueError(
            f"{what}({argname}={info.name}): elements have valence {valence}, so the {argname} must take "
            f"{expected} arguments (element index, {what_vars}{', data' if data is not None else ''}) "
            f"when called {has} data; it takes {len(info.arg_names)}: ({', '.join(info.arg_names)})"
        )
    if data is not None and not is_struct_instance(data):
        raise TypeError(f"{what}(data=...) must be an instance of a @wp.struct, got {type(data).__name__}")
    try:
        weight = float(weight)
    except (TypeError, ValueError):
        raise TypeError(f"{what}(weight=...) must be a real number, got {weight!r}") from None
    if not np.isfinite(weight) or (residual and weight < 0.0):
        raise ValueError(f"{what}(weight=...) must be finite{' and >= 0' if residual else ''}, got {weight}")
    spec = KernelSpec(valence, facts.variable_dim, dtype, data is not None, deformation=fs)
    term = Term(index, el, energy, info, data, weight, spec, residual, name or info.name)
    if fs is not None:
        term.rest_inverse = _rest_inverse_array(rest_inverse, el.shape[0], fs.cols, dtype, device, what)
    if projection is not None:
        _check_projection(projection, fs, data is not None, weight, what)
        term.projection = projection
    rtype = probe_return_type(term, facts, what, argname)
    if residual:
        rdim = _residual_dim(rtype, dtype)
        if rdim is None:
            raise ValueError(
                f"{what}(residual={info.name}) must return a scalar or a vector of 2-4 {dtype_name(dtype)}"
                f" (build it with ad.vec2/ad.vec3/ad.vec4); it returns {dtype_name(rtype)}"
            )
        spec.residual_dim = rdim
    elif rtype is not dtype:
        raise ValueError(
            f"{what}(energy={info.name}) must return a scalar of dtype {dtype_name(dtype)}; "
            f"it returns {dtype_name(rtype)}"
        )
    if spec.k > 64:
        raise ValueError(f"{what}: valence {valence} x variable_dim {facts.variable_dim} = {spec.k} exceeds 64 variables")
    if parameters is not None and fs is not None:
        raise ValueError(f"{what}(parameters=...): deformation terms have no parameter derivatives yet; use add_term")
    if parameters is not None:
        term.params = describe_parameters(term, parameters, dtype, parameter_offset, spec.k, what)
        spec.param_count = sum(f.size for f in term.params)
        if spec.k + spec.param_count > 64:
            raise ValueError(
                f"{what}(parameters=...): {spec.k} variables + {spec.param_count} parameter numbers per element "
                f"exceed the 64 dual entries of the mixed derivatives"
            )
    term.elements = wp.array(el, dtype=wp.int32, device=device)
    return term
