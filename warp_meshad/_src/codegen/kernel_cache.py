"""The compiled kernels of problem terms: one Warp module per (energy, shape, mode, variant), built on first use.

A term kernel depends on the term (its energy, shape and data type), the mode, and the facts of the problem it
belongs to (:class:`KernelFacts`: scalar dtype, variable type, deterministic storage, PSD projection choice), plus
the tile variant of the tiled Hessian assembly (:class:`TileVariant`). Kernels are cached per term
(``term.kernels``) and across problems (a process-wide table keyed by the energy object), so a second problem over
the same energy reuses the compiled module. Module names digest the energy's source, so Warp's on-disk kernel cache
is reused across processes.
"""

from __future__ import annotations

import hashlib
import inspect
from dataclasses import dataclass

import warp as wp

from warp_meshad.kernels import _dualgen

from warp_meshad._src.codegen.contract import KernelVariant, capabilities, mode_of
from warp_meshad._src.codegen.energy_errors import raise_energy_error
from warp_meshad._src.codegen.energy_rewrite import instantiate
from warp_meshad._src.codegen.kernel_source import deformation_types, make_kernel
from warp_meshad._src.codegen.module_loads import describe_module
from warp_meshad._src.codegen.warp_compat import function_return_types, generate_module_code
from warp_meshad._src.problem.variables import dtype_name

__all__ = ["KernelFacts", "TileVariant", "probe_return_type", "term_kernel", "unrolled_default"]

_KERNELS: dict = {}  # (energy id, mode, variant, shape, data type) -> (wp.Kernel, energy), shared by all problems
_MODULE_OWNERS: dict = {}  # Warp module name -> id of the energy it was made for


def unrolled_default(k: int, cuda: bool) -> bool:
    """Whether the PSD projection of an element of ``k`` variables is unrolled by default (see
    ``Problem.unrolled_projection``): up to k = 12 on CUDA, up to k = 6 on the CPU."""
    return k <= (12 if cuda else 6)


@dataclass(frozen=True)
class KernelFacts:
    """What a problem's term kernels depend on beyond the term and the mode.

    Attributes:
        dtype: the scalar type, ``wp.float32`` or ``wp.float64``.
        variable_type: the variable dtype (``dtype`` itself for scalar variables, else ``vec{variable_dim}``).
        variable_dim: scalars per variable (1..4).
        deterministic: contributions go to per-element buffers instead of float atomics (residual and
            Jacobian kernels have no such variant).
        unrolled_projection: ``Problem.unrolled_projection``: None picks per element size and device
            (:func:`unrolled_default`), True / False force the unrolled / loop PSD projection (unrolled up to k = 12).
        cuda: whether the kernels run on a CUDA device (the default projection choice depends on it).
    """

    dtype: type
    variable_type: type
    variable_dim: int
    deterministic: bool = False
    unrolled_projection: bool | None = None
    cuda: bool = False

    def unrolled(self, k: int) -> bool:
        """Whether the PSD projection of an element of ``k`` variables is unrolled."""
        if self.unrolled_projection is not None:
            return bool(self.unrolled_projection) and k <= 12
        return unrolled_default(k, self.cuda)


@dataclass(frozen=True)
class TileVariant:
    """The tiled variant of a Hessian kernel (see :mod:`warp_meshad._src.problem.tiled`).

    Attributes:
        cap: blocks of the shared tile.
        row_cap: rows of the gradient tile of the round-ordered variant (0 otherwise).
        rounds: whether the patch's elements are summed in conflict-free rounds (plain adds, a fixed order).
        store: write-out of the tile's blocks: a thread per number (``"number"``) or per block (``"block"``).
        launch_bounds: (threads per block, thread blocks per SM) given to the CUDA compiler, or None.
    """

    cap: int
    row_cap: int = 0
    rounds: bool = False
    store: str = "number"
    launch_bounds: tuple[int, int] | None = None


def _module(term, mode: str):
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


def _instance(term, mode: str, module, facts: KernelFacts):
    """The energy instantiated for the mode's variable types (plain values or duals), and its namespace."""
    dual = mode_of(mode).dual  # the dual module the mode runs the energy with (see contract.MODES)
    params = None
    if dual == "plain":
        ns = _dualgen.load(0, None, "plain")
        vec_t = facts.variable_type
    else:
        k = term.spec.k
        if mode == "mixed":  # duals over the element's variables, then its parameters
            k += term.spec.param_count
            params = {f.name: (f.dual_offset, f.per_element) for f in term.params}
        ns = _dualgen.load(k, facts.dtype, dual)
        vec_t = ns.Dual if facts.variable_dim == 1 else getattr(ns, f"DVec{facts.variable_dim}", None)
        if vec_t is None:
            raise ValueError(f"dual variables support variable_dim 1..4, got {facts.variable_dim}")
    fs = term.spec.deformation  # a deformation term's energy takes F (see contract.DeformationShape)
    if fs is None:
        var_types = [vec_t] * term.spec.valence
    else:
        var_types = deformation_types(fs, None if dual == "plain" else ns, facts.dtype)
    types = [None] + var_types + ([term.data_type] if term.spec.has_data else [])
    return instantiate(term.energy, ns, types, module, facts.dtype, params), ns


def term_kernel(term, mode: str, facts: KernelFacts, tile: TileVariant | None = None) -> wp.Kernel:
    """The kernel of one term and mode (built and cached on first use).

    Args:
        term: the problem's :class:`~warp_meshad._src.problem.terms.Term`.
        mode: a kernel mode of :mod:`warp_meshad._src.codegen.kernel_source` (``"energy"``, ``"gradient"``, ...).
        facts: the problem's :class:`KernelFacts`.
        tile: the tiled variant of a Hessian mode, or None for a thread per element with atomics.
    """
    local = (mode, facts, tile)
    kern = term.kernels.get(local)
    if kern is not None:
        return kern
    k = term.spec.k
    variant = KernelVariant.of(
        mode, tile.rounds if tile else facts.deterministic, facts.unrolled(k), capabilities(mode_of(mode).dual, k),
        *((tile.cap, tile.row_cap, tile.store, tile.launch_bounds) if tile else ()),
    )  # fmt: skip
    key = (id(term.energy), variant, term.spec.signature(), term.data_type.key if term.data_type else "")
    hit = _KERNELS.get(key)
    if hit is None:
        module = _module(term, mode + variant.suffix)
        what = [f"term '{term.label}': {mode}", *variant.describe(), facts.dtype.__name__]
        describe_module(module.name, ", ".join(what))
        fn, ns = _instance(term, mode, module, facts)
        kern = make_kernel(term.spec, variant, fn, ns, term.data_type, term.label)
        hit = (kern, term.energy)
        _KERNELS[key] = hit  # holding the energy keeps its id from being reused
    term.kernels[local] = hit[0]
    return hit[0]


def probe_return_type(term, facts: KernelFacts, what: str, argname: str):
    """Generate code (no compilation) for a kernel that calls the energy once; read its return type.

    Args:
        term: the term being added (its energy, shape and data type are read).
        facts: the problem's :class:`KernelFacts`.
        what, argname: the adding function and the energy's argument name, for messages.

    Raises:
        ValueError: the energy does not compile for the problem's variable type, or returns not exactly one value.
    """
    key = (id(term.energy), "probe", term.spec.signature(), term.data_type.key if term.data_type else "")
    hit = _KERNELS.get(key)
    if hit is not None:
        return hit[0]
    module = _module(term, "probe")
    try:
        fn, _ = _instance(term, "probe", module, facts)
        make_kernel(term.spec, KernelVariant("probe"), fn, None, term.data_type, term.info.name)
        generate_module_code(module)
    except Exception as exc:  # codegen errors: reported at the user's line (energy_errors)
        context = (f"{what}({argname}={term.info.name}): the {argname} does not compile for variables of type "
                   f"{dtype_name(facts.variable_type)}")  # fmt: skip
        raise_energy_error(exc, context)
        raise ValueError(f"{context}: {exc}") from exc
    ret = function_return_types(fn)
    if not ret:
        raise ValueError(f"{what}({argname}={term.info.name}) returns nothing; it must return a scalar")
    if len(ret) != 1:
        raise ValueError(f"{what}({argname}={term.info.name}) returns {len(ret)} values; it must return one")
    rtype = ret[0]
    _KERNELS[key] = (rtype, term.energy)
    return rtype
