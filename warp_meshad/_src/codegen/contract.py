"""The code-generation contract: the kernel modes, the dual API the kernel text may call, the kernel-variant key.

Three generators meet here and nowhere else: :mod:`warp_meshad.kernels._dualgen` writes the dual modules,
:mod:`.energy_rewrite` rewrites a user's energy to run on them, and :mod:`.kernel_source` writes the per-element
kernels that seed the duals, call the energy and scatter what it returns. This module states what each side may
rely on:

* :data:`MODES`: one :class:`KernelMode` per kernel mode (which dual module it runs the energy with, which terms
  have it, what it reads and writes, which variants it has);
* :data:`ENERGY_NAMES`: the names a rewritten energy takes from its dual module (operators and the rewrite's
  replacements of unary minus, comparisons and indexing);
* :data:`DUAL_API`: the names of a dual module the kernel text calls (``_D.seed``, ``_D.sym_mv``, ...) and the fields
  it reads (``.v .g .h``), with the :func:`capabilities` a module of one (kind, k) has; :func:`missing_names`
  checks a generated module against them;
* :class:`KernelVariant`: every choice besides the term's shape that gives a kernel different text or compile
  options (the kernel cache's key and the kernel's name suffix);
* :data:`DEFORMATION_SHAPES`: the deformation-gradient family (``Problem.add_deformation_term``): the shapes of F
  per element kind, the order of F's entries among the duals, and which modes the family has
  (:attr:`KernelMode.deformation`); :data:`ANALYTIC_PROJECTION` what a deformation term's closed-form PSD projection
  (``add_deformation_term(projection=...)``) must return and how its kernel calls it (:attr:`KernelVariant.analytic`).
"""

from __future__ import annotations

from dataclasses import dataclass

from warp_meshad.kernels._dualgen import UNROLLED_PROJECTION_MAX_K, packed_index

__all__ = [
    "ANALYTIC_PROJECTION",
    "DEFORMATION_SHAPES",
    "DUAL_API",
    "DUAL_FIELDS",
    "ENERGY_NAMES",
    "KernelMode",
    "KernelVariant",
    "MODES",
    "UNROLLED_PROJECTION",
    "DeformationShape",
    "DualName",
    "capabilities",
    "deformation_shape",
    "missing_names",
    "mode_of",
    "packed_index",
    "projection_arg_count",
]

# ----------------------------------------------------------------------------------------------------------------------
# kernel modes
# ----------------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class KernelMode:
    """What one kernel mode does.

    Attributes:
        name: the mode's name (``"hessian_proj"``).
        dual: the dual module the energy runs with: ``"plain"`` (no duals: the variables are read as they are),
            ``"grad"`` (value + gradient) or ``"hess"`` (value + gradient + packed Hessian); the kernel seeds one
            dual per variable scalar unless ``"plain"``.
        terms: the terms that have the mode: ``"scalar"``, ``"residual"`` or ``"both"``.
        reads: kernel inputs beyond ``elements, x, [data], weight`` that the mode reads.
        writes: what the mode writes (``"energy"``, ``"gradient"``, ``"hessian"``, ``"hv"``, ``"residual"``,
            ``"jacobian"``, ``"theta_gradient"``, ``"mixed"``).
        deterministic: has the deterministic variant (the problem's ``deterministic`` option): gradient and Hessian
            go to the element's own places of contribution buffers (offsets ``offs[1]``, ``offs[2]``), summed in a
            fixed order, instead of float atomics. ``energy`` (whose energies always go to their own slots) and
            ``mixed`` (whose parameter gradient stays atomic) keep their text but get kernels of their own.
        offsets: takes ``offs: wp.vec3i`` (the term's places in the energy and contribution buffers).
        tileable: has the tiled variant (a thread block per patch of block rows, coalesced stores).
        projected: projects each element's Hessian to PSD (reads ``eps``, ``absolute``); has the unrolled variant.
        squares_residual: on a residual term, differentiates the dual of ``1/2 |r|^2`` (as a scalar energy).
        gauss_newton: sums ``J^T r`` and ``J^T J`` over the residual's components (a k x k local Hessian) instead.
        deformation: has the deformation-gradient family (see :class:`DeformationShape`): the energy runs on F's
            entries (k_F duals) and the kernel applies the element's constant dF/dx.
        reducible: has the reduced variant (:attr:`KernelVariant.reduced`): a thread block per ``block_dim``
            consecutive elements sums their energies (a tile reduction) and adds the sum to ``energy_out[0]`` with one
            atomic add, instead of writing each element's energy to its own slot.
    """

    name: str
    dual: str
    terms: str
    reads: tuple[str, ...] = ()
    writes: tuple[str, ...] = ()
    deterministic: bool = False
    offsets: bool = True
    tileable: bool = False
    projected: bool = False
    squares_residual: bool = False
    gauss_newton: bool = False
    deformation: bool = False
    reducible: bool = False

    @property
    def seeds(self) -> bool:
        """Whether the kernel seeds dual variables (every mode but the plain ones)."""
        return self.dual != "plain"

    def packed_hessian(self, unrolled: bool) -> bool:
        """Whether the kernel's local Hessian ``h`` is the dual's packed upper triangle (entry (i, j) at
        ``h[packed_index(i, j, k)]``) rather than a k x k matrix (the Gauss-Newton sum; the loop projection,
        which unpacks the dual's first)."""
        return self.dual == "hess" and (not self.projected or unrolled)


_DERIV = ("energy", "gradient")
MODES: dict[str, KernelMode] = {
    m.name: m
    for m in (
        # generates the energy call only (no C++ compiled): add_term reads the energy's return type
        KernelMode("probe", "plain", "both", offsets=False, deformation=True),
        KernelMode("energy", "plain", "both", writes=("energy",), deterministic=True, deformation=True,
                   reducible=True),  # fmt: skip
        KernelMode("gradient", "grad", "both", writes=_DERIV, deterministic=True, squares_residual=True,
                   deformation=True, reducible=True),  # fmt: skip
        KernelMode("hessian", "hess", "both", writes=(*_DERIV, "hessian"), deterministic=True, tileable=True,
                   squares_residual=True, deformation=True),  # fmt: skip
        KernelMode("hessian_proj", "hess", "both", reads=("eps", "absolute"), writes=(*_DERIV, "hessian"),
                   deterministic=True, tileable=True, projected=True, squares_residual=True,
                   deformation=True),  # fmt: skip
        KernelMode("hvp", "hess", "both", reads=("v",), writes=("energy", "hv"), deterministic=True,
                   squares_residual=True, deformation=True),  # fmt: skip
        KernelMode("residual", "plain", "residual", reads=("row_start",), writes=("residual",), offsets=False),
        KernelMode("jacobian", "grad", "residual", reads=("row_start", "jslots"), writes=("residual", "jacobian"),
                   offsets=False),  # fmt: skip
        KernelMode("gauss_newton", "grad", "residual", writes=(*_DERIV, "hessian"), deterministic=True,
                   gauss_newton=True),  # fmt: skip
        # derivatives in the element's parameters: duals over the variables, then the parameters
        KernelMode("mixed", "hess", "scalar", reads=("pidx",), writes=("energy", "theta_gradient", "mixed"),
                   deterministic=True),  # fmt: skip
    )
}

# ----------------------------------------------------------------------------------------------------------------------
# the dual API
# ----------------------------------------------------------------------------------------------------------------------

UNROLLED_PROJECTION = "unrolled_projection"  # capability: project_psd_unrolled (literal indices, for GPUs)


@dataclass(frozen=True)
class DualName:
    """A name of a generated dual module that generated kernel text calls as ``_D.<name>``.

    Attributes:
        name: the module attribute.
        kinds: the dual modules (``_dualgen`` modes) that provide it.
        capability: None when every module of those kinds has it; else the capability (see :func:`capabilities`)
            a module must have for it.
        signature: how the kernel text calls it, for readers.
    """

    name: str
    kinds: tuple[str, ...]
    signature: str
    capability: str | None = None


DUAL_API: dict[str, DualName] = {
    d.name: d
    for d in (
        DualName("seed", ("grad", "hess"), "seed(x: S | vecN | matNN, offset: int) -> Dual | DVecN | DMatNN"),
        DualName("sq", ("plain", "grad", "hess"), "sq(r) -> r * r"),
        DualName("length_sq", ("plain", "grad", "hess"), "length_sq(r: vecN | DVecN) -> |r|^2"),
        DualName("mul", ("plain", "grad", "hess"), "mul(a, b) -> a * b"),
        DualName("unpack", ("hess",), "unpack(h: vecP) -> matK"),
        DualName("sym_mv", ("hess",), "sym_mv(h: vecP, v: vecK) -> vecK"),
        DualName("project_psd", ("hess",), "project_psd(h: matK, eps: S, absolute: int, n: int) -> matK"),
        # also called on the packed module itself, by the split projection's kernel (kernel_source.projection_source)
        DualName("project_psd_unrolled", ("hess", "packed"),
                 "project_psd_unrolled(h: vecP, eps: S, absolute: int) -> vecP", UNROLLED_PROJECTION),  # fmt: skip
    )
}
# names the rewritten energy takes from its namespace (plain or dual module), bound in its globals under the same
# names: the operators Warp looks up for ``+ - * /``, and what the rewrite turns unary minus, comparisons and
# indexing into (see energy_rewrite)
ENERGY_NAMES = ("add", "sub", "mul", "div", "_wm_neg", "_wm_lt", "_wm_le", "_wm_gt", "_wm_ge", "_wm_index",
                "_wm_index2")  # fmt: skip
# fields of the dual scalar (``Dual``) the kernel text reads
DUAL_FIELDS: dict[str, tuple[str, ...]] = {"plain": (), "grad": ("v", "g"), "hess": ("v", "g", "h")}


def capabilities(kind: str, k: int) -> frozenset[str]:
    """The optional parts of the dual module of one kind and local size.

    Args:
        kind: ``"plain"``, ``"grad"`` or ``"hess"``.
        k: the dual's local size (0 for ``"plain"``).

    Returns:
        The capability names it has: :data:`UNROLLED_PROJECTION` for Hessian duals of k <= 12.
    """
    caps = set()
    if kind == "hess" and k <= UNROLLED_PROJECTION_MAX_K:
        caps.add(UNROLLED_PROJECTION)
    return frozenset(caps)


def missing_names(ns, kind: str, k: int) -> list[str]:
    """The names of :data:`ENERGY_NAMES`, :data:`DUAL_API` and the dual scalar's fields a generated module lacks.

    Args:
        ns: a module returned by ``_dualgen.load(k, dtype, kind)``.
        kind: its kind (``"plain"``, ``"grad"``, ``"hess"``).
        k: its local size.

    Returns:
        ``"name"`` or ``"Dual.field"`` for each missing one (empty: the module keeps the contract).
    """
    caps = capabilities(kind, k)
    missing = [name for name in ENERGY_NAMES if not hasattr(ns, name)]
    missing += [
        d.name for d in DUAL_API.values()
        if kind in d.kinds and (d.capability is None or d.capability in caps) and not hasattr(ns, d.name)
    ]  # fmt: skip
    fields = DUAL_FIELDS[kind]
    if fields:
        have = getattr(getattr(ns, "Dual", None), "vars", {})
        missing += [f"Dual.{f}" for f in fields if f not in have]
    return missing


# ----------------------------------------------------------------------------------------------------------------------
# the deformation-gradient family
# ----------------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DeformationShape:
    """The deformation gradient F = D_s D_m^-1 of one element kind (``Problem.add_deformation_term``).

    D_s = [x_1 - x_0, ..., x_{n-1} - x_0] holds the element's edge vectors (``dim`` x ``cols``), D_m^-1 is the
    element's ``cols`` x ``cols`` rest inverse, so dF[i, j] / dx_a[l] = delta_il b_a[j] with b_a row a - 1 of D_m^-1
    (a >= 1) and b_0 = -(b_1 + ... + b_{n-1}). The kernel computes F in plain numbers, seeds its ``k`` entries as
    duals, calls the energy psi(e, F, data) and applies g_x = B^T g_F, H_x = B^T H_F B.

    Attributes:
        valence: variables per element (4: tet, 3: triangle).
        dim: scalars per variable (the problem's variable_dim): F's rows.
        cols: F's columns (valence - 1).
    """

    valence: int
    dim: int
    cols: int

    @property
    def k(self) -> int:
        """Duals per element: F's entries."""
        return self.dim * self.cols

    @property
    def square(self) -> bool:
        """Whether the energy takes F as one (dual) matrix; else (3 x 2) as its two (dual) column vectors."""
        return self.dim == self.cols

    def entry(self, i: int, j: int) -> int:
        """Position of F[i, j] among the duals: row-major for a square F (the dual matrix's ``seed``), column
        after column for a 3 x 2 F (its columns seeded as dual vectors)."""
        return i * self.cols + j if self.square else j * self.dim + i

    def describe(self) -> str:
        """The shape and how the energy receives it, for messages (``"F 3x2 (two vec3 columns)"``)."""
        how = "one matrix" if self.square else f"{self.cols} vec{self.dim} columns"
        return f"F {self.dim}x{self.cols} ({how})"


# (valence, variable_dim) -> shape of F: tets in 3D, triangles in 3D (membranes, shells), flat triangles
DEFORMATION_SHAPES: dict[tuple[int, int], DeformationShape] = {
    (4, 3): DeformationShape(4, 3, 3),
    (3, 3): DeformationShape(3, 3, 2),
    (3, 2): DeformationShape(3, 2, 2),
}


def deformation_shape(valence: int, dim: int, what: str = "add_deformation_term") -> DeformationShape:
    """The :class:`DeformationShape` of elements of ``valence`` variables of ``dim`` scalars.

    Raises:
        ValueError: naming the supported (valence, variable_dim) pairs and what came.
    """
    shape = DEFORMATION_SHAPES.get((int(valence), int(dim)))
    if shape is None:
        have = ", ".join(f"valence {v} with variable_dim {d} ({s.describe()})" for (v, d), s in DEFORMATION_SHAPES.items())
        raise ValueError(f"{what}: deformation gradients exist for {have}; got valence {valence} with variable_dim {dim}")
    return shape


# the name the kernel text calls a deformation term's analytic projection by
ANALYTIC_PROJECTION = "_projection"
"""What a deformation term's analytic projection is (``Problem.add_deformation_term(..., projection=proj)``).

For a term whose energy is ``psi(e, F, [data])`` (F as its :class:`DeformationShape` gives it):

* ``proj`` is a ``@wp.func`` taking the energy's arguments with F in plain numbers of the problem's scalar type S
  (a ``matNN``; a 3 x 2 F as its two ``vec3`` columns), then ``eps: S`` and ``absolute: int``:
  ``proj(e, F, [data], eps, absolute)``. It returns the PSD projection of psi's Hessian in F's entries, a
  k_F x k_F matrix of S (``wp.types.matrix((k_F, k_F), S)``) whose rows and columns are F's entries in the order of
  :meth:`DeformationShape.entry` (row-major for a square F): each eigenvalue lambda of d2psi/dF2 replaced by
  max(lambda, eps), or by max(|lambda|, eps) where ``absolute != 0`` — what the dual module's ``project_psd`` does
  to an element's Hessian, so the two agree to round-off (and to the Jacobi iteration's tolerance).
* The term's ``hessian_proj`` kernels (:attr:`KernelVariant.analytic`; every other variant choice applies) run the
  energy on gradient duals (value and gradient only, ``k_F`` of them) and take the local Hessian
  ``h = weight * _projection(e, F, [data], eps / weight, absolute)`` (the projection of ``weight * d2psi/dF2`` with
  ``eps``: the term's weight must be > 0), as a k_F x k_F matrix (not packed); the chain rule to the element's
  variable blocks is the family's. The other modes (``hessian``, ``hvp``, ...) never call it.
"""


def projection_arg_count(fs: DeformationShape, has_data: bool) -> int:
    """The arguments of a deformation term's analytic projection (:data:`ANALYTIC_PROJECTION`): the element index,
    F (one matrix, or its columns), the data if the term has some, ``eps`` and ``absolute``."""
    return 1 + (1 if fs.square else fs.cols) + int(has_data) + 2


# ----------------------------------------------------------------------------------------------------------------------
# the kernel-variant key
# ----------------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class KernelVariant:
    """Everything besides the term's shape that changes a kernel's text or compile options.

    Build it with :meth:`of`, which drops the choices a mode does not have, so equal variants mean equal kernels.

    Attributes:
        mode: a key of :data:`MODES`.
        deterministic: no float atomics (untiled: contribution buffers; tiled: the plan's conflict-free rounds).
        unrolled: the projection with literal indices (projected modes of duals with that capability).
        tile_cap: > 0 for the tiled variant: blocks of its shared tile.
        tile_row_cap: rows of the deterministic tiled variant's gradient tile (0: ``tile_cap``).
        tile_store: how the tiled variant writes its tile out (``"number"`` or ``"block"``).
        launch_bounds: (threads per block, blocks per SM) given to the CUDA compiler for the tiled variant.
        analytic: the projected mode of a deformation term with an analytic projection (see
            :data:`ANALYTIC_PROJECTION`): the energy on gradient duals, the local Hessian from the projection (never
            unrolled: there is no Jacobi iteration).
        split: the projected mode's PSD projection in a kernel of its own (unrolled, untiled, not analytic): the term's
            kernel writes the element's weighted local Hessian (its packed upper triangle, ``hloc[:, e]``) instead of
            projecting and scattering it; the projection kernel of the term's shape (``kernel_source.
            projection_source``: one per shape and scalar type, shared by every energy) projects and scatters it. The
            two modules compile in parallel, and the projection's compile is paid once per shape, not per energy.
        reduced: the energy summed within the kernel (modes with :attr:`KernelMode.reducible`, not deterministic):
            launched with ``wp.launch_tiled``, thread ``lane`` of block ``p`` owns element ``p * block_dim + lane``
            (the kernel takes the element ``count``; lanes past it compute nothing into the outputs), the block's
            energies are summed by a tile reduction and added to ``energy_out[0]`` with one atomic add per block. The
            kernel takes ``count: int`` instead of ``offs``.
    """

    mode: str
    deterministic: bool = False
    unrolled: bool = False
    tile_cap: int = 0
    tile_row_cap: int = 0
    tile_store: str = "number"
    launch_bounds: tuple[int, int] | None = None
    analytic: bool = False
    reduced: bool = False
    split: bool = False

    @classmethod
    def of(
        cls,
        mode: str,
        deterministic: bool = False,
        unrolled: bool = False,
        caps: frozenset[str] = frozenset(),
        tile_cap: int = 0,
        tile_row_cap: int = 0,
        tile_store: str = "number",
        launch_bounds: tuple[int, int] | None = None,
        analytic: bool = False,
        reduced: bool = False,
        split: bool = False,
    ) -> KernelVariant:
        """The variant of ``mode`` asked for, less what the mode (or the dual module's ``caps``) does not have.

        Raises:
            ValueError: for an unknown mode, or a tiled variant of a mode without one.
        """
        m = mode_of(mode)
        if tile_cap and not m.tileable:
            raise ValueError(f"the tiled variant exists for modes {[n for n, f in MODES.items() if f.tileable]}, "
                             f"got mode {mode!r}")  # fmt: skip
        tiled = tile_cap > 0
        analytic = bool(analytic) and m.projected and m.deformation
        unrolled = bool(unrolled) and m.projected and UNROLLED_PROJECTION in caps and not analytic
        return cls(
            mode,
            deterministic=bool(deterministic) and m.deterministic,
            unrolled=unrolled,
            tile_cap=int(tile_cap),
            tile_row_cap=int(tile_row_cap) if tiled else 0,
            tile_store=tile_store if tiled else "number",
            launch_bounds=tuple(int(b) for b in launch_bounds) if tiled and launch_bounds else None,
            analytic=analytic,
            reduced=bool(reduced) and m.reducible and not deterministic,
            split=bool(split) and unrolled and not tiled,
        )

    @property
    def tiled(self) -> bool:
        return self.tile_cap > 0

    @property
    def dual(self) -> str:
        """The dual module the energy runs with: the mode's (:attr:`KernelMode.dual`), ``"grad"`` for the analytic
        projection's variant (its Hessian comes from the projection)."""
        return "grad" if self.analytic else mode_of(self.mode).dual

    @property
    def suffix(self) -> str:
        """The part of the kernel and module names that tells the variant (``"_det_unrolled_tiled"``)."""
        return ("_det" if self.deterministic else "") + ("_unrolled" if self.unrolled else "") + (
            "_tiled" if self.tiled else "") + ("_analytic" if self.analytic else "") + (
            "_reduced" if self.reduced else "") + ("_split" if self.split else "")  # fmt: skip

    def describe(self) -> list[str]:
        """The variant's choices in words, for messages (``["deterministic", "tiled"]``)."""
        return [w for w, on in (("deterministic", self.deterministic), ("unrolled", self.unrolled),
                                ("tiled", self.tiled), ("analytic projection", self.analytic),
                                ("energy reduced per block", self.reduced),
                                ("projection in its own kernel", self.split)) if on]  # fmt: skip


def mode_of(mode: str) -> KernelMode:
    """The :class:`KernelMode` named ``mode``.

    Raises:
        ValueError: naming the modes when ``mode`` is not one.
    """
    m = MODES.get(mode)
    if m is None:
        raise ValueError(f"kernel mode must be one of {list(MODES)}, got {mode!r}")
    return m
