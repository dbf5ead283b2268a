"""The compiled kernels of problem terms: one Warp module per (energy, shape, mode, variant), built on first use.

A term kernel depends on the term (its energy, shape and data type), the mode, and the facts of the problem it
belongs to (:class:`KernelFacts`: scalar dtype, variable type, deterministic storage, PSD projection choice), plus
the tile variant of the tiled Hessian assembly (:class:`TileVariant`). Kernels are cached per term
(``term.kernels``) and across problems (a process-wide table keyed by the energy object), so a second problem over
the same energy reuses the compiled module. Module names digest the energy's source, so Warp's on-disk kernel cache
is reused across processes.

The first call in a process skips what the kernel cache already holds: each term module gets a key from
warp_meshad's own inputs (:mod:`~.module_keys`); where a record of Warp's hashes exists for it and the binary is in
the cache, the kernel is made from its text alone (no energy rewrite, no dual library import, no Warp hashing: the
recorded hash is given to Warp, which then loads the binary as usual). Otherwise the kernel is built in full, Warp
hashes it, and the record is kept for the next process. Should Warp need a record-made kernel's content after all
(its module marked modified, a launch with a block size not recorded, the binary gone), the energy is instantiated
then, before Warp reads it (``warp_compat.complete_before_rehash``). ``WARP_MESHAD_MODULE_RECORDS=0`` turns the
records off.

A term module holds exactly one kernel (:func:`_module`).
"""

from __future__ import annotations

import atexit
import hashlib
import inspect
import os
from dataclasses import dataclass

import warp as wp

from warp_meshad.kernels import _dualgen

from warp_meshad._src.codegen import module_keys
from warp_meshad._src.codegen.contract import UNROLLED_PROJECTION, KernelVariant, capabilities, mode_of
from warp_meshad._src.codegen.energy_errors import raise_energy_error
from warp_meshad._src.codegen.energy_rewrite import instantiate
from warp_meshad._src.codegen.kernel_source import deformation_types, make_kernel, make_projection_kernel
from warp_meshad._src.codegen.module_loads import describe_module
from warp_meshad._src.codegen.warp_compat import (
    complete_before_rehash,
    function_return_types,
    generate_module_code,
    module_hash_record,
    module_hashed,
    seed_module_hash,
    type_code,
)
from warp_meshad._src.problem.variables import dtype_name

__all__ = [
    "SPLIT_PROJECTION_MIN_K", "KernelFacts", "TileVariant", "flush_records", "probe_return_type", "projection_kernel",
    "records_enabled", "split_default", "splits", "term_kernel", "unrolled_default",
]

_KERNELS: dict = {}  # (energy id, variant, shape, data type, projection id) -> (wp.Kernel, energy, projection)
_PROJECTIONS: dict = {}  # (valence, dim, dtype, F shape, deterministic) -> the split projection's wp.Kernel
_MODULE_OWNERS: dict = {}  # Warp module name -> the _KERNELS key it was made for: one kernel per term module
# The records of the warm first call (see the module docstring) are on unless this variable is "0" (or "false",
# "no", "off"): then every term module takes Warp's normal path (energy rewrite, dual import, Warp's hashing).
RECORDS_VARIABLE = "WARP_MESHAD_MODULE_RECORDS"
_PENDING: list = []  # (key, module, record) of modules built in full, whose Warp hashes are not recorded yet


def flush_records() -> None:
    """Record Warp's hashes of the term modules built in full that Warp has loaded since (see :mod:`.module_keys`);
    called before each kernel look-up and at exit."""
    for item in list(_PENDING):
        key, module, record = item
        if not module_hashed(module):  # not loaded yet, or marked modified since: its next launch hashes it
            continue
        warp_record = module_hash_record(module)
        if warp_record is not None:
            module_keys.store(key, {"warp": warp_record, **record})
        _PENDING.remove(item)


atexit.register(flush_records)


def unrolled_default(k: int, cuda: bool) -> bool:
    """Whether the PSD projection of an element of ``k`` variables is unrolled by default (see
    ``Problem.unrolled_projection``): up to k = 12 on CUDA, up to k = 6 on the CPU."""
    return k <= (12 if cuda else 6)


# the split projection by default from this many duals on (CUDA, unrolled projection): there its compile is seconds
# (k = 9: ~1.4 s of a 4.6 s module, k = 12: ~6 s of 14.6 s; NVRTC for sm_90,
# benchmarks/history/2026-12-04_compile_time_and_first_run_cpu.md), below it a fraction of a second that a second
# launch and the local Hessians' round trip would not repay
SPLIT_PROJECTION_MIN_K = 9


def split_default(k: int, cuda: bool) -> bool:
    """Whether the PSD projection of an unrolled element of ``k`` duals runs in a kernel of its own by default (see
    ``Problem.split_projection``): on CUDA from :data:`SPLIT_PROJECTION_MIN_K` duals on."""
    return cuda and k >= SPLIT_PROJECTION_MIN_K


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
        split_projection: ``Problem.split_projection``: None picks per element size and device (:func:`split_default`),
            True / False force the unrolled projection into a kernel of its own / into the term's kernel (only where
            the projection is unrolled; see ``contract.KernelVariant.split``).
    """

    dtype: type
    variable_type: type
    variable_dim: int
    deterministic: bool = False
    unrolled_projection: bool | None = None
    cuda: bool = False
    split_projection: bool | None = None

    def unrolled(self, k: int) -> bool:
        """Whether the PSD projection of an element of ``k`` variables is unrolled."""
        if self.unrolled_projection is not None:
            return bool(self.unrolled_projection) and k <= 12
        return unrolled_default(k, self.cuda)

    def split(self, k: int) -> bool:
        """Whether the unrolled PSD projection of an element of ``k`` duals runs in a kernel of its own (where the
        variant can: see ``contract.KernelVariant.split``)."""
        if not self.unrolled(k):
            return False
        if self.split_projection is not None:
            return bool(self.split_projection)
        return split_default(k, self.cuda)


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


def _module(term, mode: str, owner, projection=None, variant: KernelVariant | None = None):
    """The Warp module of one kernel (its ``_KERNELS`` key, ``owner``): named from the energy's source (and the
    analytic projection's, if the kernel calls one), the shape, mode and variant, so Warp's kernel cache is reused
    across processes. A module holds one kernel: a second kernel registered in a module makes Warp hash it again and
    build it with every kernel in it, and one made from a record (:func:`_cached_kernel`) is not made for that; a
    different owner of the same name (a different energy object with the same source: other closure values) gets
    a numbered name of its own."""
    h = hashlib.sha1()
    h.update(inspect.getsource(term.energy.func).encode())
    if projection is not None:
        h.update(inspect.getsource(projection.func).encode())
    h.update(repr((term.spec.signature(), mode, term.data_type.key if term.data_type else "")).encode())
    if variant is not None and variant.tiled:  # what the variant's name suffix does not tell
        h.update(repr((variant.tile_cap, variant.tile_row_cap, variant.tile_store, variant.launch_bounds)).encode())
    base = f"wm_{term.info.name}_{mode}_{h.hexdigest()[:12]}"
    name, i = base, 1
    while _MODULE_OWNERS.setdefault(name, owner) != owner:
        i += 1
        name = f"{base}_{i}"
    module = wp.get_module(name)
    module.options["enable_backward"] = False  # forward-mode only: no adjoints of the energy (faster compiles)
    return module


def _instance(term, mode: str, module, facts: KernelFacts, dual: str | None = None):
    """The energy instantiated for the mode's variable types (plain values or duals), and its namespace.

    ``dual`` overrides the mode's dual module (``KernelVariant.dual``: gradient duals for the analytic projection).
    ``term`` may be an :class:`_EnergyOf` (what this reads of a term)."""
    dual = dual or mode_of(mode).dual  # the dual module the mode runs the energy with (see contract.MODES)
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


def term_kernel(term, mode: str, facts: KernelFacts, tile: TileVariant | None = None,
                reduced: bool = False, split: bool = False) -> wp.Kernel:  # fmt: skip
    """The kernel of one term and mode (built and cached on first use).

    Args:
        term: the problem's :class:`~warp_meshad._src.problem.terms.Term`.
        mode: a kernel mode of :mod:`warp_meshad._src.codegen.kernel_source` (``"energy"``, ``"gradient"``, ...).
        facts: the problem's :class:`KernelFacts`.
        tile: the tiled variant of a Hessian mode, or None for a thread per element with atomics.
        reduced: the variant that sums the energy per thread block (``contract.KernelVariant.reduced``), where the
            mode has it and ``facts`` are not deterministic; else each element's energy goes to its own slot.
        split: the projected mode's term kernel of the split projection (``contract.KernelVariant.split``; where
            :func:`splits` holds), which writes the local Hessians for :func:`projection_kernel`.
    """
    flush_records()
    local = (mode, facts, tile, reduced, split)
    kern = term.kernels.get(local)
    if kern is not None:
        return kern
    k = term.spec.k
    variant = KernelVariant.of(
        mode, tile.rounds if tile else facts.deterministic, facts.unrolled(k), capabilities(mode_of(mode).dual, k),
        *((tile.cap, tile.row_cap, tile.store, tile.launch_bounds) if tile else ()),
        analytic=term.projection is not None, reduced=reduced, split=split,
    )  # fmt: skip
    projection = term.projection if variant.analytic else None
    kernel_key = (id(term.energy), variant, term.spec.signature(), term.data_type.key if term.data_type else "",
                  id(projection))  # fmt: skip
    hit = _KERNELS.get(kernel_key)
    if hit is None:
        module = _module(term, mode + variant.suffix, kernel_key, projection, variant)
        what = [f"term '{term.label}': {mode}", *variant.describe(), facts.dtype.__name__]
        describe_module(module.name, ", ".join(what))
        record_key = _module_key(term, mode, module, facts, variant)
        kern = _cached_kernel(term, mode, facts, variant, module, record_key)
        if kern is None:
            fn, ns = _instance(term, mode, module, facts, variant.dual)
            kern = make_kernel(term.spec, variant, fn, ns, term.data_type, term.label, projection)
            if record_key is not None:  # recorded once Warp has hashed and loaded it (its first launch)
                _PENDING.append((record_key, module, {"kernel": kern.key, "energy": fn.key}))
        hit = (kern, term.energy, projection)
        _KERNELS[kernel_key] = hit  # holding the energy keeps its id from being reused
    term.kernels[local] = hit[0]
    return hit[0]


def splits(term, mode: str, facts: KernelFacts, tiled: bool) -> bool:
    """Whether ``term``'s ``mode`` kernel is the split projection's pair (:func:`term_kernel` with ``split`` and
    :func:`projection_kernel`): the projected mode, untiled, a static term (its element count fixed, so the local
    Hessians have one place each), no analytic projection, the projection unrolled and split by ``facts``."""
    if mode != "hessian_proj" or tiled or term.dynamic or term.projection is not None:
        return False
    k = term.spec.k
    return facts.split(k) and UNROLLED_PROJECTION in capabilities("hess", k)


def projection_kernel(term, facts: KernelFacts) -> wp.Kernel:
    """The split projection's kernel for ``term``'s shape (``kernel_source.projection_source``), built on first use
    and shared by every term and problem of that shape, scalar type and determinism, whatever the energy."""
    spec = term.spec
    key = (spec.valence, spec.dim, facts.dtype.__name__, spec.deformation, bool(facts.deterministic))
    kern = _PROJECTIONS.get(key)
    if kern is None:
        packed = _dualgen.load(spec.k, facts.dtype, "packed")
        fs = spec.deformation
        shape = f"F{fs.dim}x{fs.cols}_" if fs is not None else ""
        name = (f"wm_psd_scatter_{shape}v{spec.valence}d{spec.dim}_{facts.dtype.__name__}"
                f"{'_det' if facts.deterministic else ''}")  # fmt: skip
        module = wp.get_module(name)
        module.options["enable_backward"] = False
        kern = make_projection_kernel(spec, bool(facts.deterministic), packed, module)
        describe_module(module.name, f"PSD projection of {spec.k} x {spec.k} element Hessians ({shape}valence "
                                     f"{spec.valence}, {facts.dtype.__name__}), every energy of that shape")  # fmt: skip
        _PROJECTIONS[key] = kern
    return kern


def probe_return_type(term, facts: KernelFacts, what: str, argname: str):
    """Generate code (no compilation) for a kernel that calls the energy once; read its return type.

    Args:
        term: the term being added (its energy, shape and data type are read).
        facts: the problem's :class:`KernelFacts`.
        what, argname: the adding function and the energy's argument name, for messages.

    Raises:
        ValueError: the energy does not compile for the problem's variable type, or returns not exactly one value.
    """
    kernel_key = (id(term.energy), "probe", term.spec.signature(), term.data_type.key if term.data_type else "")
    hit = _KERNELS.get(kernel_key)
    if hit is not None:
        return hit[0]
    module = _module(term, "probe", kernel_key)
    record_key = _module_key(term, "probe", module, facts)
    rec = module_keys.lookup(record_key)
    known = {type_code(t): t for t in (facts.dtype, wp.float32, wp.float64)}
    if rec is not None and rec.get("return_type") in known:
        rtype = known[rec["return_type"]]
        _KERNELS[kernel_key] = (rtype, term.energy)
        return rtype
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
    if rtype in known.values():
        module_keys.store(record_key, {"return_type": type_code(rtype)})
    _KERNELS[kernel_key] = (rtype, term.energy)
    return rtype


class _RecordedEnergy:
    """Stands for the instantiated energy in a kernel made from a record: its name (the kernel calls it) and module.
    Warp does not resolve it while the module's given hash serves (its binary is in the cache); should Warp need the
    kernel's content after all, :func:`_complete` puts the real energy in its place first."""

    def __init__(self, key: str, module):
        self.key = key
        self.module = module


class _EnergyOf:
    """What :func:`_instance` reads of a term (its energy, shape, data type and parameter fields), without the
    term's arrays: a record-made kernel's completion keeps it for as long as Warp keeps the module."""

    def __init__(self, term):
        self.energy = term.energy
        self.spec = term.spec
        self.data_type = term.data_type
        self.params = list(term.params)


def _module_key(term, mode: str, module, facts: KernelFacts, variant: KernelVariant | None = None) -> str | None:
    """The :func:`~.module_keys.term_key` of a term module (None: the records are off — see :data:`RECORDS_VARIABLE`
    —, or the energy reads something without a stable description: the term takes Warp's normal path)."""
    if not records_enabled():
        return None
    params = sorted((f.name, f.dual_offset, f.per_element) for f in term.params) if mode == "mixed" else None
    var_t = facts.variable_type
    parts = (
        module_keys.energy_digest(term.energy),
        module_keys.type_digest(term.data_type),
        repr(term.spec.signature()),
        term.label,
        mode,
        repr(variant),
        f"{facts.dtype.__name__}|{type_code(var_t)}|{facts.variable_dim}|{facts.deterministic}|"
        f"{facts.unrolled(term.spec.k)}|{facts.cuda}",
        repr(params),
    )
    if variant is not None and variant.analytic:  # the kernel calls the term's analytic projection too
        parts += (module_keys.energy_digest(term.projection),)
    return module_keys.term_key(module, parts)


def records_enabled() -> bool:
    """Whether term modules use their records (on unless ``WARP_MESHAD_MODULE_RECORDS`` is "0", "false", "no" or
    "off"; read at each kernel build)."""
    return os.environ.get(RECORDS_VARIABLE, "1").strip().lower() not in ("0", "false", "no", "off")


def _cached_kernel(term, mode: str, facts: KernelFacts, variant: KernelVariant, module, key: str | None):
    """The kernel of a term module made from its record (see the module docstring), or None on a miss: no record,
    no device to check, the module not fresh, the binary not in the cache, or the kernel's name not the recorded
    one. The module is left to complete itself (:func:`_complete`) should Warp need its content after all."""
    rec = module_keys.lookup(key)
    device = getattr(term.elements, "device", None)
    if rec is None or device is None or "warp" not in rec:
        return None
    if not seed_module_hash(module, rec["warp"], device):
        return None
    kern = make_kernel(term.spec, variant, _RecordedEnergy(rec["energy"], module), None, term.data_type, term.label,
                       term.projection if variant.analytic else None)  # fmt: skip
    if kern.key != rec["kernel"] or not seed_module_hash(module, rec["warp"], device, [kern]):
        raise RuntimeError(  # the record was written for this key from the same generators: a bug, not a miss
            f"kernel cache record {key} does not match module {module.name} (kernel {kern.key}); delete the "
            f"folder warp_meshad_keys in Warp's kernel cache ({wp.config.kernel_cache_dir})")
    energy = _EnergyOf(term)
    complete_before_rehash(module, lambda: _complete(kern, energy, mode, module, facts, variant, rec["energy"]))
    return kern


def _complete(kern, energy: _EnergyOf, mode: str, module, facts: KernelFacts, variant: KernelVariant, name: str):
    """Give a kernel made from a record what the full path gives it: the energy instantiated in its module, and the
    dual namespace (Warp is about to hash or generate the module: see ``warp_compat.complete_before_rehash``)."""
    fn, ns = _instance(energy, mode, module, facts, variant.dual)
    if fn.key != name:
        raise RuntimeError(  # the kernel's name digests the energy's: a bug, not a miss
            f"the energy of kernel {kern.key} (module {module.name}) is {fn.key}, its record says {name}; delete the "
            f"folder warp_meshad_keys in Warp's kernel cache ({wp.config.kernel_cache_dir})")
    scope = kern.func.__globals__  # the kernel text's namespace (kernel_source.make_kernel)
    scope["_energy"], scope["_D"] = fn, ns
