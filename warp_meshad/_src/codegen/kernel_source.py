"""Generated evaluation kernels: one per (term, mode).

One thread owns one element: it gathers the element's variables, seeds them as duals, calls the
energy, keeps the local gradient and Hessian in registers and scatters them with ``atomic_add``
into the preallocated gradient array and the BSR block slots found when the pattern was built.
The element's energy goes to its own slot of a buffer, or (the reduced variant of the energy and
gradient modes) is summed over the thread block and added to the total with one atomic per block.

Kernel sources are text (the number of element variables is unrolled into separate locals, since
Warp has no local arrays of structs); they are compiled with ``wp.Kernel(source=...)``. What each mode
reads and writes is declared in :mod:`.contract`; here one emitter per mode family writes its text
(:data:`_EMITTERS`) on a :class:`_Kernel`, which holds the lines every mode shares and the scatters of
the variant (float atomics, deterministic contribution buffers, or a tiled patch's rows).
"""

from __future__ import annotations

import hashlib
import re

import warp as wp

from warp_meshad._src.codegen.contract import (
    ANALYTIC_PROJECTION,
    MODES,
    DeformationShape,
    KernelMode,
    KernelVariant,
    mode_of,
    packed_index,
)

__all__ = ["KernelSpec", "deformation_types", "kernel_source", "make_kernel", "make_projection_kernel", "projection_source"]

_XYZW = "xyzw"


class KernelSpec:
    """Everything that shapes a generated kernel's source.

    Args:
        valence: variables per element.
        dim: scalars per variable (1 means scalar variables).
        scalar: ``wp.float32`` or ``wp.float64``.
        has_data: whether the energy takes a data struct.
        residual_dim: 0 for scalar energies; else the number of residual components (1..4).
        param_count: parameter numbers per element (the ``mixed`` mode's duals have ``k + param_count``
            entries: the element's variables, then its parameters).
        deformation: for a term of the deformation-gradient family (``add_deformation_term``), the
            :class:`~.contract.DeformationShape` of its F (the energy takes F; the kernel reads ``rest_inverse``).
    """

    def __init__(self, valence: int, dim: int, scalar, has_data: bool, residual_dim: int = 0, param_count: int = 0,
                 deformation: DeformationShape | None = None):  # fmt: skip
        self.valence = valence
        self.dim = dim
        self.scalar = scalar
        self.has_data = has_data
        self.residual_dim = residual_dim
        self.param_count = param_count
        self.deformation = deformation

    def signature(self) -> tuple:
        sig = (self.valence, self.dim, self.scalar.__name__, self.has_data, self.residual_dim, self.param_count)
        return sig if self.deformation is None else (*sig, "F", self.deformation.cols)

    @property
    def k(self) -> int:
        """Duals per element: the element's variable scalars, or F's entries for a deformation term."""
        return self.valence * self.dim if self.deformation is None else self.deformation.k


def _components(expr: str, rdim: int) -> list[str]:
    if rdim == 1:
        return [expr]
    return [f"{expr}.{_XYZW[c]}" for c in range(rdim)]


class _Kernel:
    """The text of one kernel being written: its argument and body lines, and how its variant scatters.

    The constructor writes the part every mode shares: the arguments ``elements, x, [data], weight``, the
    element's variables (read, or seeded as duals from ``d * a`` on) and the energy call, whose result is ``r``
    (``rv`` where a residual vector is then squared). The mode's emitter (:data:`_EMITTERS`) adds the rest.
    """

    def __init__(self, spec: KernelSpec, mode: KernelMode, deterministic: bool, unrolled: bool, tiled: bool,
                 tile_store: str, analytic: bool = False, reduced: bool = False, split: bool = False,
                 projection: bool = False):  # fmt: skip
        self.spec, self.mode, self.unrolled, self.tile_store = spec, mode, unrolled, tile_store
        # the term kernel of the split projection writes its local Hessian to ``hloc`` (contract.KernelVariant.split)
        self.split = split and mode.projected and unrolled and not tiled
        self.analytic = analytic  # the deformation family's analytic projection (contract.ANALYTIC_PROJECTION)
        self.plain_f = ""  # F in plain numbers, as the analytic projection takes it (deformation kernels)
        self.n, self.d, self.k = spec.valence, spec.dim, spec.k
        self.res = spec.residual_dim > 0
        self.tiled = tiled and mode.tileable
        # conflict-free rounds: plain shared-memory adds in a fixed order
        self.tiled_det = self.tiled and deterministic
        self.deterministic = deterministic and not self.tiled
        # the energy summed per thread block, one atomic add per block (contract.KernelVariant.reduced)
        self.reduced = reduced and mode.reducible and not deterministic
        # the local Hessian ``h`` is the dual's packed upper triangle, except where it is a k x k matrix: the
        # Gauss-Newton sum and the loop projection (which unpacks the dual's first)
        self.packed = mode.packed_hessian(unrolled)
        n, d = self.n, self.d
        if projection:  # the split projection's kernel (projection_source): reads hloc, calls no energy
            self.args = ["hloc: wp.array2d(dtype=_S)", "eps: _S", "absolute: int"]
            self.body = ["e = wp.tid()"]
            self.rest_columns()
            return
        self.args = ["elements: wp.array2d(dtype=wp.int32)", "x: wp.array(dtype=_VarT)"]
        if spec.has_data:
            self.args.append("data: _DataT")
        self.args.append("weight: _S")
        if self.tiled:
            self.body = ["e = patch_entries[wp.where(q < q_end, q, q_start)]", "valid = q < q_end"]
        elif self.reduced:  # lanes past the last element evaluate element 0 and add nothing
            self.body = ["p, lane = wp.tid()", "q = p * wp.block_dim() + lane", "valid = q < count",
                         "e = wp.where(valid, q, 0)"]  # fmt: skip
        else:
            self.body = ["e = wp.tid()"]
        for a in range(n):
            self.body.append(f"i{a} = elements[e, {a}]")
        self.call_energy()

    def call_energy(self) -> None:
        """The element's variables (read, or seeded as duals from ``d * a`` on) and the energy call."""
        n, d, spec = self.n, self.d, self.spec
        for a in range(n):
            self.body.append(f"x{a} = _D.seed(x[i{a}], {a * d})" if self.mode.seeds else f"x{a} = x[i{a}]")
        xs = ", ".join(f"x{a}" for a in range(n))
        rname = "rv" if self.res and spec.residual_dim > 1 and self.mode.squares_residual else "r"
        call_data = ", data" if spec.has_data else ""
        self.body.append(f"{rname} = _energy(e, {xs}{call_data})")

    def rest_columns(self) -> None:
        """What the Hessian blocks read beyond ``h`` in a kernel that calls no energy: nothing here."""

    def add(self, *lines: str) -> None:
        self.body.extend(lines)

    # -- scatters of the variant (plain: float atomics; deterministic: own slots; tiled: the patch's rows) --------

    def scatter_energy(self, expr: str) -> str:
        # element energies go to their own slots (summed afterwards by a block reduction): a float
        # atomic on one address from every thread serializes the whole launch
        if self.tiled:
            return f"if valid and slots[e, 0] >= pb and slots[e, 0] < pe:\n    energy_out[offs[0] + e] = {expr}"
        if self.reduced:  # summed over the block at the end (text())
            return f"fe = wp.where(valid, {expr}, _S(0.0))"
        return f"energy_out[offs[0] + e] = {expr}"

    def scatter_vec(self, arr: str, a: int, expr: str) -> str:
        n = self.n
        if self.tiled_det and arr == "grad":
            s = f"slots[e, {a * n + a}]"
            return f"wp.tile_scatter_add(gtile, i{a} - rb, {expr}, valid and {s} >= pb and {s} < pe, False)"
        if self.tiled:
            s = f"slots[e, {a * n + a}]"
            return f"if valid and {s} >= pb and {s} < pe:\n    wp.atomic_add({arr}, i{a}, {expr})"
        if self.reduced:
            return f"if valid:\n    wp.atomic_add({arr}, i{a}, {expr})"
        if self.deterministic:
            return f"{arr}[offs[1] + e * {n} + {a}] = {expr}"
        return f"wp.atomic_add({arr}, i{a}, {expr})"

    def scatter_block(self, a: int, b: int, expr: str) -> str:
        n = self.n
        if self.tiled:
            atomic_flag = ", False" if self.tiled_det else ""
            return (
                f"s{a}_{b} = slots[e, {a * n + b}]\n"
                f"wp.tile_scatter_add(tile, s{a}_{b} - pb, {expr}, valid and s{a}_{b} >= pb and s{a}_{b} < pe{atomic_flag})"
            )
        if self.deterministic:
            return f"hvals[offs[2] + e * {n * n} + {a * n + b}] = {expr}"
        return f"wp.atomic_add(hvals, slots[e, {a * n + b}], {expr})"

    # -- local values --------------------------------------------------------------------------------------------

    def block(self, a: int, b: int) -> str:
        """Constructor of the d x d block (a, b) of the local Hessian ``h`` (a scalar when d = 1)."""
        d = self.d
        if d == 1:
            return self.hget(a * d, b * d)
        return "_BlockT(" + ", ".join(self.hget(a * d + i, b * d + j) for i in range(d) for j in range(d)) + ")"

    def vecblock(self, g: str, a: int) -> str:
        """Variable ``a``'s part of the local vector ``g``."""
        d = self.d
        if d == 1:
            return f"{g}[{a * d}]"
        return "_VarT(" + ", ".join(f"{g}[{a * d + i}]" for i in range(d)) + ")"

    def local_v(self) -> None:
        """``vl``: the element's part of ``v`` (the Hessian-vector product's input) as a local k-vector."""
        n, d = self.n, self.d
        if d == 1:
            vals = ", ".join(f"v[i{a}]" for a in range(n))
        else:
            vals = ", ".join(f"va{a}[{i}]" for a in range(n) for i in range(d))
            for a in range(n):
                self.add(f"va{a} = v[i{a}]")
        self.add(f"vl = _VecK({vals})")

    def prepare_blocks(self) -> None:
        """Locals the Hessian blocks (:meth:`block`) read: none here."""

    def hget(self, i: int, j: int) -> str:
        """Entry (i, j) of the local Hessian ``h``."""
        return f"h[{packed_index(i, j, self.k)}]" if self.packed else f"h[{i}, {j}]"

    def text(self, name: str) -> str:
        if self.reduced:  # every lane reaches the block's reduction
            self.args.append("count: int")
            self.add("wp.tile_atomic_add(energy_out, wp.tile_sum(wp.tile(fe)), offset=0, bounds_check=False)")
        elif self.mode.offsets:
            self.args.append("offs: wp.vec3i")
        body = [t for s in self.body for t in s.split("\n")]
        if self.tiled:
            extra, head, tail = _tiled_frame(self.tiled_det, self.d if self.tile_store == "number" else 1)
            self.args += extra
            body = head + ["    " + t for t in body] + tail
        lines = [f"def {name}(" + ", ".join(self.args) + "):"]
        lines += ["    " + s for s in body]
        return "\n".join(lines) + "\n"


class _DeformationKernel(_Kernel):
    """The text of a kernel of the deformation-gradient family (see :class:`~.contract.DeformationShape`).

    The element's variables are read as plain numbers; F's columns ``f{j} = sum_a (x_a - x_0) dinv[a - 1, j]``
    (``dinv = rest_inverse[e]``) are seeded as duals (a square F as one dual matrix, row-major; a 3 x 2 F as two
    dual columns) and the energy is called as ``_energy(e, F, [data])``. The local gradient and Hessian are F's
    (k_F entries); the element's variable blocks apply the chain rule with ``b{a}_{j}`` = dF[., j] / dx_a:
    ``g_a = G_F b_a``, ``H_ab = sum_jm b_a[j] H_F[(., j), (., m)] b_b[m]``, and ``v`` enters the Hessian-vector
    product as dF = sum_a v_a b_a^T.
    """

    def call_energy(self) -> None:
        fs: DeformationShape = self.spec.deformation
        n, c = self.n, fs.cols
        self.args.append("rest_inverse: wp.array(dtype=_DinvT)")
        self.add("dinv = rest_inverse[e]")
        for a in range(n):
            self.add(f"x{a} = x[i{a}]")
        for a in range(1, n):
            self.add(f"e{a} = x{a} - x0")
        for j in range(c):
            self.add(f"f{j} = " + " + ".join(f"e{a} * dinv[{a - 1}, {j}]" for a in range(1, n)))
        cols = [f"f{j}" for j in range(c)]
        self.plain_f = "fm" if fs.square else ", ".join(cols)
        if fs.square:
            self.add("fm = wp.matrix_from_cols(" + ", ".join(cols) + ")")
            args = ["_D.seed(fm, 0)" if self.mode.seeds else "fm"]
        else:
            args = [f"_D.seed(f{j}, {j * fs.dim})" if self.mode.seeds else f"f{j}" for j in range(c)]
        if self.mode.seeds:
            for j in range(c):
                for a in range(1, n):
                    self.add(f"b{a}_{j} = dinv[{a - 1}, {j}]")
                self.add(f"b0_{j} = -(" + " + ".join(f"b{a}_{j}" for a in range(1, n)) + ")")
        call_data = ", data" if self.spec.has_data else ""
        self.add(f"r = _energy(e, {', '.join(args)}{call_data})")

    def rest_columns(self) -> None:
        """``b{a}_{j}`` = dF[., j] / dx_a from the element's rest inverse (the projection kernel's chain rule)."""
        n, c = self.n, self.spec.deformation.cols
        self.args.append("rest_inverse: wp.array(dtype=_DinvT)")
        self.add("dinv = rest_inverse[e]")
        for j in range(c):
            for a in range(1, n):
                self.add(f"b{a}_{j} = dinv[{a - 1}, {j}]")
            self.add(f"b0_{j} = -(" + " + ".join(f"b{a}_{j}" for a in range(1, n)) + ")")

    def vecblock(self, g: str, a: int) -> str:
        """Variable ``a``'s part of ``B^T g`` (``g`` a local k_F-vector: F's gradient, or H_F dF)."""
        fs = self.spec.deformation
        comps = [" + ".join(f"{g}[{fs.entry(i, j)}] * b{a}_{j}" for j in range(fs.cols)) for i in range(fs.dim)]
        return "_VarT(" + ", ".join(comps) + ")"

    def local_v(self) -> None:
        fs = self.spec.deformation
        for a in range(self.n):
            self.add(f"va{a} = v[i{a}]")
        vals = [""] * fs.k
        for i in range(fs.dim):
            for j in range(fs.cols):
                vals[fs.entry(i, j)] = " + ".join(f"va{a}[{i}] * b{a}_{j}" for a in range(self.n))
        self.add("vl = _VecK(" + ", ".join(vals) + ")")

    def prepare_blocks(self) -> None:
        """The blocks ``blk{a}_{b}`` (a <= b) of the element's Hessian.

        For a, b >= 1 from ``t{a}_{i}_{l}_{m} = sum_j b_a[j] H_F[(i, j), (l, m)]``: ``H_ab[i, l] = sum_m t_a[i, l, m]
        b_b[m]``. Vertex 0's blocks then follow from b_0 = -(b_1 + ... + b_{n-1}) with sums of blocks alone:
        ``H_0b = -sum_{a >= 1} H_ab`` and ``H_00 = -sum_{b >= 1} H_0b`` (a third fewer products than applying b_0 as
        the other rows of D_m^-1, and fewer values live at once).
        """
        fs = self.spec.deformation
        d, c, n = fs.dim, fs.cols, self.n
        for a in range(1, n):
            for i in range(d):
                for l in range(d):
                    for m in range(c):
                        terms = [f"{self.hget(fs.entry(i, j), fs.entry(l, m))} * b{a}_{j}" for j in range(c)]
                        self.add(f"t{a}_{i}_{l}_{m} = " + " + ".join(terms))
        for a in range(1, n):
            for b in range(a, n):
                comps = [" + ".join(f"t{a}_{i}_{l}_{m} * b{b}_{m}" for m in range(c)) for i in range(d) for l in range(d)]
                self.add(f"blk{a}_{b} = _BlockT(" + ", ".join(comps) + ")")
        for b in range(1, n):
            self.add(f"blk0_{b} = -(" + " + ".join(self.block(a, b) for a in range(1, n)) + ")")
        self.add("blk0_0 = -(" + " + ".join(f"blk0_{b}" for b in range(1, n)) + ")")

    def block(self, a: int, b: int) -> str:
        return f"blk{a}_{b}" if a <= b else f"wp.transpose(blk{b}_{a})"


# ----------------------------------------------------------------------------------------------------------------------
# the modes' emitters
# ----------------------------------------------------------------------------------------------------------------------


def _emit_probe(kt: _Kernel) -> None:
    """The energy call alone: code generation reads its return type."""


def _emit_energy(kt: _Kernel) -> None:
    """The element's energy (``1/2 |r|^2`` of a residual) into its slot."""
    kt.args.append("energy_out: wp.array(dtype=_S)")
    if kt.res:
        kt.add("f = _S(0.5) * " + ("_D.sq(r)" if kt.spec.residual_dim == 1 else "_D.length_sq(r)"))
    else:
        kt.add("f = r")
    kt.add(kt.scatter_energy("weight * f"))


def _emit_residual(kt: _Kernel) -> None:
    """The element's residual components, times sqrt(weight), into rows ``row_start + e * m + c``."""
    kt.args += ["row_start: int", "res_out: wp.array(dtype=_S)"]
    kt.add("sw = wp.sqrt(weight)")
    rdim = kt.spec.residual_dim
    for c, rc in enumerate(_components("r", rdim)):
        kt.add(f"res_out[row_start + e * {rdim} + {c}] = sw * {rc}")


def _emit_jacobian(kt: _Kernel) -> None:
    """The residual and its 1 x d Jacobian blocks (one per component and variable) at ``jslots``."""
    n, d, rdim = kt.n, kt.d, kt.spec.residual_dim
    kt.args += [
        "row_start: int",
        "jslots: wp.array2d(dtype=wp.int32)",
        "res_out: wp.array(dtype=_S)",
        "jvals: wp.array(dtype=_JBlockT)",
    ]
    kt.add("sw = wp.sqrt(weight)")
    for c, rc in enumerate(_components("r", rdim)):
        kt.add(f"rc{c} = {rc}", f"res_out[row_start + e * {rdim} + {c}] = sw * rc{c}.v", f"g{c} = rc{c}.g")
        for a in range(n):
            if d == 1:
                blk = f"g{c}[{a}] * sw"
            else:
                blk = "wp.matrix_from_rows(_VarT(" + ", ".join(f"g{c}[{a * d + i}]" for i in range(d)) + ")) * sw"
            kt.add(f"wp.atomic_add(jvals, jslots[e, {c * n + a}], {blk})")


def _emit_mixed(kt: _Kernel) -> None:
    """Derivatives in the element's parameters (read by the rewritten energy as duals seeded after the variables):
    dE/dtheta atomically added at the parameters' global indices ``pidx[e]``, and the mixed block d2E/dx dtheta of
    every (variable, parameter) pair to the element's own places of ``mixed``."""
    n, d, k = kt.n, kt.d, kt.k
    p = kt.spec.param_count
    kk = k + p
    kt.args += [
        "energy_out: wp.array(dtype=_S)",
        "theta_grad: wp.array(dtype=_S)",
        "pidx: wp.array2d(dtype=wp.int32)",
        "mixed: wp.array(dtype=_MixT)",
    ]
    kt.add(kt.scatter_energy("weight * r.v"), "g = r.g * weight", "h = r.h * weight")
    for j in range(p):
        kt.add(f"wp.atomic_add(theta_grad, pidx[e, {j}], g[{k + j}])")
    for a in range(n):
        for j in range(p):
            if d == 1:
                val = f"h[{packed_index(a, k + j, kk)}]"
            else:
                val = "wp.matrix_from_cols(_VarT(" + ", ".join(
                    f"h[{packed_index(a * d + i, k + j, kk)}]" for i in range(d)) + "))"  # fmt: skip
            kt.add(f"mixed[e * {n * p} + {a * p + j}] = {val}")


def _emit_derivatives(kt: _Kernel) -> None:
    """Energy, gradient and Hessian (or Hessian-vector product) of the element: the local ``g`` and ``h`` from
    the dual (or the Gauss-Newton sum over the residual's components), then scattered."""
    m = kt.mode
    kt.args += ["energy_out: wp.array(dtype=_S)", "grad: wp.array(dtype=_VarT)"]
    if m.gauss_newton:
        _local_gauss_newton(kt)
    else:
        _local_dual(kt)
    if "hv" in m.writes:
        _scatter_hvp(kt)
    else:
        for a in range(kt.n):
            kt.add(kt.scatter_vec("grad", a, kt.vecblock("g", a)))
    if "hessian" in m.writes and not kt.split:
        _scatter_hessian(kt)


def _local_gauss_newton(kt: _Kernel) -> None:
    """``f = 1/2 |r|^2``, ``g = J^T r``, ``h = J^T J`` (a k x k matrix) summed over the residual's components."""
    kt.add("f = _S(0.0)", "g = _VecK()", "h = _MatK()")
    for c, rc in enumerate(_components("r", kt.spec.residual_dim)):
        kt.add(
            f"rc{c} = {rc}",
            f"f = f + rc{c}.v * rc{c}.v",
            f"gc{c} = rc{c}.g",
            f"g = g + gc{c} * rc{c}.v",
            f"h = h + wp.outer(gc{c}, gc{c})",
        )
    kt.add(kt.scatter_energy("_S(0.5) * weight * f"), "g = g * weight", "h = h * weight")


def _local_dual(kt: _Kernel) -> None:
    """``g`` and ``h`` from the energy's dual (of ``1/2 |r|^2`` for a residual), projected to PSD if the mode is."""
    m = kt.mode
    if kt.res:
        square = "_D.sq(r)" if kt.spec.residual_dim == 1 else "_D.length_sq(rv)"
        kt.add(f"r = _D.mul({square}, _S(0.5))")
    kt.add(kt.scatter_energy("weight * r.v"), "g = r.g * weight")
    if kt.split:  # projected and scattered by the shape's projection kernel (projection_source)
        kt.args.append("hloc: wp.array2d(dtype=_S)")
        kt.add("hh = r.h * weight")  # one row of hloc per entry: a warp's stores to a row are contiguous
        kt.add(*(f"hloc[{i}, e] = hh[{i}]" for i in range(kt.k * (kt.k + 1) // 2)))
    elif m.projected:
        kt.args += ["eps: _S", "absolute: int"]
        if kt.analytic:  # closed form on plain F (gradient duals: r has no Hessian), contract.ANALYTIC_PROJECTION
            call_data = ", data" if kt.spec.has_data else ""
            kt.add(f"h = {ANALYTIC_PROJECTION}(e, {kt.plain_f}{call_data}, eps / weight, absolute) * weight")
        elif kt.unrolled:  # literal indices: registers instead of local memory (GPU)
            kt.add("h = _D.project_psd_unrolled(r.h * weight, eps, absolute)")
        else:
            kt.add(f"h = _D.project_psd(_D.unpack(r.h * weight), eps, absolute, {kt.k})")
    elif m.dual == "hess":
        kt.add("h = r.h * weight")


def _scatter_hvp(kt: _Kernel) -> None:
    """``h v`` of the element's variables' part of ``v``, scattered to ``hv_out``."""
    kt.args += ["v: wp.array(dtype=_VarT)", "hv_out: wp.array(dtype=_VarT)"]
    kt.local_v()
    kt.add("hvl = _D.sym_mv(h, vl)")
    for a in range(kt.n):
        kt.add(kt.scatter_vec("hv_out", a, kt.vecblock("hvl", a)))


def _scatter_hessian(kt: _Kernel) -> None:
    """The element's n x n blocks of ``h`` into the Hessian's values (``slots[e, a * n + b]``)."""
    # tiled, blocks of several numbers: the patch's values are written out one number per thread
    # (a flat view of the BSR values), so a warp's stores are contiguous
    hv_t = "_S" if kt.tiled and kt.d > 1 and kt.tile_store == "number" else "_BlockT"
    kt.args += ["slots: wp.array2d(dtype=wp.int32)", f"hvals: wp.array(dtype={hv_t})"]
    kt.prepare_blocks()
    for a in range(kt.n):
        for b in range(kt.n):
            kt.add(kt.scatter_block(a, b, kt.block(a, b)))


_EMITTERS = {
    "probe": _emit_probe,
    "energy": _emit_energy,
    "residual": _emit_residual,
    "jacobian": _emit_jacobian,
    "mixed": _emit_mixed,
    "gradient": _emit_derivatives,
    "hessian": _emit_derivatives,
    "hessian_proj": _emit_derivatives,
    "hvp": _emit_derivatives,
    "gauss_newton": _emit_derivatives,
}


def kernel_source(
    spec: KernelSpec,
    mode: str,
    name: str,
    deterministic: bool = False,
    unrolled: bool = False,
    tiled: bool = False,
    tile_store: str = "number",
    analytic: bool = False,
    reduced: bool = False,
    split: bool = False,
) -> str:
    """Source text of the kernel ``name`` for ``mode`` (a key of :data:`~.contract.MODES`).

    Element energies are written to their own slots of a buffer (offset ``offs[0]`` of the term),
    summed afterwards. With ``deterministic``, nothing is accumulated with float atomics: each
    element also writes its gradient and Hessian blocks to its own places of contribution buffers
    (offsets ``offs[1]``, ``offs[2]``), summed later in a fixed order.

    With ``reduced`` (modes ``energy`` and ``gradient``, not ``deterministic``; launched with
    ``wp.launch_tiled``), thread ``lane`` of block ``p`` owns element ``p * block_dim + lane`` of
    ``count``; the block's energies are summed by a tile reduction and added to ``energy_out[0]`` with
    one atomic add (``energy_out`` must hold 0, or the other terms' energies, before the launch), the
    gradient is added atomically as above. The kernel takes ``count: int`` instead of ``offs``.

    With ``tiled`` (modes ``hessian`` and ``hessian_proj``; launched with ``wp.launch_tiled``, one
    thread block per patch of consecutive block rows, see :mod:`warp_meshad._src.problem.tiled`), a block
    evaluates every element touching its rows (``patch_entries``), adds the blocks that fall in its
    rows into a shared-memory tile of ``_CAP`` blocks and then writes the patch's contiguous range
    of BSR values out with coalesced stores (``accumulate`` adds to what is there instead; ``tile_store``
    ``"number"``: a thread per number of a flat view of the values, ``"block"``: a thread per block). An
    element shared by several patches is evaluated once per patch; each patch keeps only its rows,
    so no global float atomics touch the Hessian. The element's energy is kept by the patch owning
    its first variable's row, gradient entries by the patch owning their row.

    With ``analytic`` (mode ``hessian_proj`` of a deformation term), the energy runs on gradient duals and the local
    Hessian is the term's analytic projection (``_projection``, see :data:`~.contract.ANALYTIC_PROJECTION`).

    With ``split`` (mode ``hessian_proj``, ``unrolled``, not ``tiled``), the kernel writes the element's weighted local
    Hessian (the dual's packed upper triangle, entry i to ``hloc[i, e]``) and scatters no Hessian block; the kernel of
    :func:`projection_source` projects and scatters it.
    """
    m = mode_of(mode)
    if spec.deformation is not None and not m.deformation:
        raise ValueError(f"deformation-gradient terms have the kernel modes "
                         f"{[n for n, f in MODES.items() if f.deformation]}, got mode {mode!r}")  # fmt: skip
    if analytic and (spec.deformation is None or not m.projected or unrolled):
        raise ValueError(f"the analytic projection is a variant of the projected modes of deformation terms, "
                         f"not unrolled; got mode {mode!r}, unrolled={unrolled}, deformation term: "
                         f"{spec.deformation is not None}")  # fmt: skip
    kt = (_DeformationKernel if spec.deformation is not None else _Kernel)(spec, m, deterministic, unrolled, tiled,
                                                                            tile_store, analytic, reduced, split)  # fmt: skip
    _EMITTERS[mode](kt)
    return kt.text(name)


def projection_source(spec: KernelSpec, name: str, deterministic: bool = False) -> str:
    """Source text of the projection kernel of the split variant (:attr:`~.contract.KernelVariant.split`).

    One thread per element: ``h = _D.project_psd_unrolled(hloc[:, e], eps, absolute)`` (``_D`` the packed module of
    k = ``spec.k``; ``hloc`` holds entry i of element e's packed Hessian at ``hloc[i, e]``), then the element's n x n blocks into the Hessian's values as the term kernel would scatter them
    (float atomics at ``slots[e, a * n + b]``, or with ``deterministic`` the element's own places from ``offs[2]``),
    a deformation term's through the chain rule with its ``rest_inverse``. The text depends on the term's shape and
    scalar type only (``spec.has_data``, ``residual_dim`` and ``param_count`` do not enter it), so one kernel serves
    every energy of that shape. Arguments: ``hloc, eps, absolute, [rest_inverse], slots, hvals, offs``.
    """
    m = mode_of("hessian_proj")
    kt = (_DeformationKernel if spec.deformation is not None else _Kernel)(spec, m, deterministic, True, False, "number",
                                                                            projection=True)  # fmt: skip
    entries = ", ".join(f"hloc[{i}, e]" for i in range(spec.k * (spec.k + 1) // 2))
    kt.add(f"h = _D.project_psd_unrolled(_VecP({entries}), eps, absolute)")
    _scatter_hessian(kt)
    return kt.text(name)


def _tiled_frame(deterministic: bool, d: int = 1) -> tuple[list[str], list[str], list[str]]:
    """Extra arguments, head and tail of a tiled kernel: the head opens the loop over the patch's
    elements (its body is the element code, indented once more); the tail writes the tile out.

    With ``d x d`` blocks (d > 1), ``hvals`` is a flat view of the BSR values and thread ``i`` of a
    round writes number ``i`` of the patch's range, picked from its block with literal indices (a
    runtime index into a matrix would put it in local memory). One number per thread keeps each
    warp's stores on consecutive addresses; a whole block per thread strides them by the block's
    size (0.50 vs 0.16 ms to store the 252 MB Hessian of a 1000x1000 mass-spring grid, H200).

    Plain: rounds of ``bd`` consecutive entries of the patch (threads adding to the same tile entry
    use shared-memory atomics). Deterministic: the plan's rounds, in which no two threads add to the
    same tile entry (a round holds at most the launch's block_dim entries on a GPU; the CPU runs one
    lane, hence the inner loop), and the gradient summed in a second tile.
    """
    extra = ["patch_entries: wp.array(dtype=wp.int32)"]
    head = ["p, lane = wp.tid()", "tile = wp.tile_zeros(shape=(_CAP,), dtype=_BlockT, storage='shared')"]
    if deterministic:
        extra += [
            "round_start: wp.array(dtype=wp.int32)",
            "patch_round_start: wp.array(dtype=wp.int32)",
            "patch_block_start: wp.array(dtype=wp.int32)",
            "patch_row_start: wp.array(dtype=wp.int32)",
        ]
        head += [
            "bd = wp.block_dim()",
            "gtile = wp.tile_zeros(shape=(_RCAP,), dtype=_VarT, storage='shared')",
            "rb = patch_row_start[p]",
            "re = patch_row_start[p + 1]",
            "pb = patch_block_start[p]",
            "pe = patch_block_start[p + 1]",
            "for rnd in range(patch_round_start[p], patch_round_start[p + 1]):",
            "  q_start = round_start[rnd]",
            "  q_end = round_start[rnd + 1]",
            "  for sub in range((q_end - q_start + bd - 1) // bd):",
            "    q = q_start + sub * bd + lane",
        ]
    else:
        extra += ["patch_entry_start: wp.array(dtype=wp.int32)", "patch_block_start: wp.array(dtype=wp.int32)"]
        head += [
            "bd = wp.block_dim()",
            "q_start = patch_entry_start[p]",
            "q_end = patch_entry_start[p + 1]",
            "pb = patch_block_start[p]",
            "pe = patch_block_start[p + 1]",
            "for rnd in range((q_end - q_start + bd - 1) // bd):",
            "    q = q_start + rnd * bd + lane",
        ]
    extra.append("accumulate: int")

    def write_out(out, local, lo, hi):
        return [
            "i = lane",
            f"while i < {hi} - {lo}:",
            "    if accumulate != 0:",
            f"        {out}[{lo} + i] = {out}[{lo} + i] + {local}[i]",
            "    else:",
            f"        {out}[{lo} + i] = {local}[i]",
            "    i += bd",
        ]

    if d == 1:
        tail = write_out("hvals", "tile", "pb", "pe")
    else:
        dd = d * d
        tail = [
            "i = lane",
            f"while i < (pe - pb) * {dd}:",
            f"    j = i // {dd}",
            f"    c = i - j * {dd}",
            "    m = tile[j]",
            "    v = m[0, 0]",
        ]
        tail += [f"    v = wp.where(c == {c}, m[{c // d}, {c % d}], v)" for c in range(1, dd)]
        tail += [
            f"    o = pb * {dd} + i",
            "    if accumulate != 0:",
            "        hvals[o] = hvals[o] + v",
            "    else:",
            "        hvals[o] = v",
            "    i += bd",
        ]
    if deterministic:
        tail += write_out("grad", "gtile", "rb", "re")
    return extra, head, tail


def deformation_types(fs: DeformationShape, ns, scalar) -> list:
    """The types of the F arguments a deformation term's energy is instantiated with.

    Args:
        fs: the term's F shape.
        ns: the dual module of the mode, or None for plain numbers.
        scalar: the problem's scalar type.

    Returns:
        ``[matNN]`` (``ns.DMatNN``) for a square F; ``[vec3, vec3]`` (``ns.DVec3`` twice) for its columns when 3 x 2.
    """
    if fs.square:
        return [wp.types.matrix(shape=(fs.dim, fs.dim), dtype=scalar) if ns is None else getattr(ns, f"DMat{fs.dim}{fs.dim}")]
    col = wp.types.vector(length=fs.dim, dtype=scalar) if ns is None else getattr(ns, f"DVec{fs.dim}")
    return [col] * fs.cols


def make_kernel(spec: KernelSpec, variant: KernelVariant, energy_fn, ns, data_type, label: str, projection=None):
    """Compile-ready ``wp.Kernel`` for one term and kernel variant.

    Args:
        spec: shape of the term.
        variant: the mode and variant (:class:`~.contract.KernelVariant`; ``tile_cap > 0`` gives the tiled
            variant of :func:`kernel_source` with a shared tile of that many blocks, ``launch_bounds`` are given
            to the CUDA compiler: ``__launch_bounds__``, registers capped to fit, possibly spilling).
        energy_fn: concrete Warp function instance of the user's energy for this mode.
        ns: generated namespace (dual module for derivative modes).
        data_type: the user's data struct type, or None.
        label: readable prefix for the kernel name (the energy's name).
        projection: the ``@wp.func`` of a deformation term's analytic projection (``variant.analytic``), else None.
    """
    s = spec.scalar
    d, k = spec.dim, spec.k
    var_t = s if d == 1 else wp.types.vector(length=d, dtype=s)
    block_t = s if d == 1 else wp.types.matrix(shape=(d, d), dtype=s)
    jblock_t = s if d == 1 else wp.types.matrix(shape=(1, d), dtype=s)
    v = variant
    scope = {
        "wp": wp,
        "_S": s,
        "_VarT": var_t,
        "_BlockT": block_t,
        "_JBlockT": jblock_t,
        "_MixT": s if d == 1 else wp.types.matrix(shape=(d, 1), dtype=s),
        "_VecK": wp.types.vector(length=k, dtype=s),
        "_VecP": wp.types.vector(length=k * (k + 1) // 2, dtype=s),
        "_MatK": wp.types.matrix(shape=(k, k), dtype=s),
        "_D": ns,
        "_DataT": data_type,
        "_energy": energy_fn,
        "_CAP": v.tile_cap,
        "_RCAP": v.tile_row_cap or v.tile_cap,
    }
    if v.analytic:
        if projection is None:
            raise ValueError("make_kernel: the analytic variant needs the term's projection function")
        scope[ANALYTIC_PROJECTION] = projection
    if spec.deformation is not None:
        c = spec.deformation.cols
        scope["_DinvT"] = wp.types.matrix(shape=(c, c), dtype=s)

    def source(name):
        return kernel_source(spec, v.mode, name, v.deterministic, v.unrolled, v.tiled, v.tile_store, v.analytic,
                             v.reduced, v.split)

    tmp = source("kernel") + f"# cap {v.tile_cap}" + (f" rows {v.tile_row_cap}" if v.tile_row_cap else "")
    if v.analytic:  # two projections of one energy: two kernels
        tmp += f"# projection {projection.key} {projection.func.__module__}"
    digest = hashlib.sha1((tmp + energy_fn.key).encode()).hexdigest()[:10]
    label = re.sub(r"\W", "_", label)  # a user-given term name may hold any character
    name = f"wm_{label}_{v.mode}{v.suffix}_{digest}"
    src = source(name)
    code = compile(src, f"<warp_meshad kernel {name}>", "exec", dont_inherit=True)
    exec(code, scope)
    pyfn = scope[name]
    module = energy_fn.module
    opts = {"enable_backward": False}
    if v.launch_bounds:
        opts["launch_bounds"] = v.launch_bounds
    return wp.Kernel(func=pyfn, key=name, module=module, options=opts, source=src)


def make_projection_kernel(spec: KernelSpec, deterministic: bool, packed, module) -> wp.Kernel:
    """Compile-ready ``wp.Kernel`` of :func:`projection_source` in ``module``.

    Args:
        spec: the term's shape (only valence, dim, scalar and deformation are read).
        deterministic: the deterministic problem's variant (the element's own places instead of atomics).
        packed: the ``"packed"`` module of k = ``spec.k`` (``_dualgen.load(k, scalar, "packed")``).
        module: the Warp module it goes to (one kernel per module).
    """
    s, d, k = spec.scalar, spec.dim, spec.k
    scope = {
        "wp": wp,
        "_S": s,
        "_BlockT": s if d == 1 else wp.types.matrix(shape=(d, d), dtype=s),
        "_VecP": wp.types.vector(length=k * (k + 1) // 2, dtype=s),
        "_D": packed,
    }
    if spec.deformation is not None:
        c = spec.deformation.cols
        scope["_DinvT"] = wp.types.matrix(shape=(c, c), dtype=s)
    digest = hashlib.sha1(projection_source(spec, "kernel", deterministic).encode()).hexdigest()[:10]
    name = f"wm_psd_scatter_{digest}"
    src = projection_source(spec, name, deterministic)
    exec(compile(src, f"<warp_meshad kernel {name}>", "exec", dont_inherit=True), scope)
    return wp.Kernel(func=scope[name], key=name, module=module, options={"enable_backward": False}, source=src)
