"""Generated evaluation kernels: one per (term, mode).

One thread owns one element: it gathers the element's variables, seeds them as duals, calls the
energy, keeps the local gradient and Hessian in registers and scatters them with ``atomic_add``
into the preallocated gradient array and the BSR block slots found when the pattern was built.

Kernel sources are text (the number of element variables is unrolled into separate locals, since
Warp has no local arrays of structs); they are compiled with ``wp.Kernel(source=...)``.
"""

from __future__ import annotations

import hashlib
import re

import warp as wp

from warp_meshad.kernels._dualgen import _pi

__all__ = ["KernelSpec", "make_kernel", "MODES"]

MODES = ("probe", "energy", "gradient", "hessian", "hessian_proj", "hvp", "residual", "jacobian", "gauss_newton", "mixed")
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
    """

    def __init__(self, valence: int, dim: int, scalar, has_data: bool, residual_dim: int = 0, param_count: int = 0):
        self.valence = valence
        self.dim = dim
        self.scalar = scalar
        self.has_data = has_data
        self.residual_dim = residual_dim
        self.param_count = param_count

    def signature(self) -> tuple:
        return (self.valence, self.dim, self.scalar.__name__, self.has_data, self.residual_dim, self.param_count)

    @property
    def k(self) -> int:
        return self.valence * self.dim


def _components(expr: str, rdim: int) -> list[str]:
    if rdim == 1:
        return [expr]
    return [f"{expr}.{_XYZW[c]}" for c in range(rdim)]


def kernel_source(
    spec: KernelSpec,
    mode: str,
    name: str,
    deterministic: bool = False,
    unrolled: bool = False,
    tiled: bool = False,
    tile_store: str = "number",
) -> str:
    """Source text of the kernel ``name`` for ``mode`` (see :data:`MODES`).

    Element energies are always written to their own slots of a buffer (offset ``offs[0]`` of the
    term), summed afterwards. With ``deterministic``, nothing is accumulated with float atomics: each
    element also writes its gradient and Hessian blocks to its own places of contribution buffers
    (offsets ``offs[1]``, ``offs[2]``), summed later in a fixed order.

    With ``tiled`` (modes ``hessian`` and ``hessian_proj``; launched with ``wp.launch_tiled``, one
    thread block per patch of consecutive block rows, see :mod:`warp_meshad._src.problem.tiled`), a block
    evaluates every element touching its rows (``patch_entries``), adds the blocks that fall in its
    rows into a shared-memory tile of ``_CAP`` blocks and then writes the patch's contiguous range
    of BSR values out with coalesced stores (``accumulate`` adds to what is there instead; ``tile_store``
    ``"number"``: a thread per number of a flat view of the values, ``"block"``: a thread per block). An
    element shared by several patches is evaluated once per patch; each patch keeps only its rows,
    so no global float atomics touch the Hessian. The element's energy is kept by the patch owning
    its first variable's row, gradient entries by the patch owning their row.
    """
    n, d, k = spec.valence, spec.dim, spec.k
    res = spec.residual_dim > 0
    tiled = tiled and mode in ("hessian", "hessian_proj")
    tiled_det = tiled and deterministic  # conflict-free rounds: plain shared-memory adds in a fixed order
    deterministic = deterministic and not tiled
    args = ["elements: wp.array2d(dtype=wp.int32)", "x: wp.array(dtype=_VarT)"]
    if spec.has_data:
        args.append("data: _DataT")
    args.append("weight: _S")
    call_data = ", data" if spec.has_data else ""
    body = ["e = wp.tid()"]
    if tiled:
        body = [
            "e = patch_entries[wp.where(q < q_end, q, q_start)]",
            "valid = q < q_end",
        ]
    atomic_flag = ", False" if tiled_det else ""
    for a in range(n):
        body.append(f"i{a} = elements[e, {a}]")
    if mode in ("probe", "energy", "residual"):
        for a in range(n):
            body.append(f"x{a} = x[i{a}]")
    else:
        for a in range(n):
            body.append(f"x{a} = _D.seed(x[i{a}], {a * d})")
    xs = ", ".join(f"x{a}" for a in range(n))
    rname = "rv" if (res and spec.residual_dim > 1 and mode not in ("probe", "residual", "jacobian", "gauss_newton", "energy")) else "r"
    body.append(f"{rname} = _energy(e, {xs}{call_data})")

    def scatter_energy(expr):
        # element energies go to their own slots (summed afterwards by a block reduction): a float
        # atomic on one address from every thread serializes the whole launch
        if tiled:
            return f"if valid and slots[e, 0] >= pb and slots[e, 0] < pe:\n    energy_out[offs[0] + e] = {expr}"
        return f"energy_out[offs[0] + e] = {expr}"

    def scatter_vec(arr, a, expr):
        if tiled_det and arr == "grad":
            s = f"slots[e, {a * n + a}]"
            return f"wp.tile_scatter_add(gtile, i{a} - rb, {expr}, valid and {s} >= pb and {s} < pe, False)"
        if tiled:
            s = f"slots[e, {a * n + a}]"
            return f"if valid and {s} >= pb and {s} < pe:\n    wp.atomic_add({arr}, i{a}, {expr})"
        if deterministic:
            return f"{arr}[offs[1] + e * {n} + {a}] = {expr}"
        return f"wp.atomic_add({arr}, i{a}, {expr})"

    def scatter_block(a, b, expr):
        if tiled:
            return (
                f"s{a}_{b} = slots[e, {a * n + b}]\n"
                f"wp.tile_scatter_add(tile, s{a}_{b} - pb, {expr}, valid and s{a}_{b} >= pb and s{a}_{b} < pe{atomic_flag})"
            )
        if deterministic:
            return f"hvals[offs[2] + e * {n * n} + {a * n + b}] = {expr}"
        return f"wp.atomic_add(hvals, slots[e, {a * n + b}], {expr})"

    def block(expr_of):
        """Constructor of a d x d block (or scalar) from h-index expressions."""
        if d == 1:
            return expr_of(0, 0)
        vals = ", ".join(expr_of(i, j) for i in range(d) for j in range(d))
        return f"_BlockT({vals})"

    def vecblock(g, a):
        if d == 1:
            return f"{g}[{a * d}]"
        return "_VarT(" + ", ".join(f"{g}[{a * d + i}]" for i in range(d)) + ")"

    # the local Hessian ``h`` is the dual's packed upper triangle, except where it is a k x k matrix: the
    # Gauss-Newton sum and the loop projection (which unpacks the dual's first)
    packed = mode in ("hessian", "hvp") or (mode == "hessian_proj" and unrolled)

    def hget(i, j):
        """Entry (i, j) of the local Hessian ``h``."""
        return f"h[{_pi(i, j, k)}]" if packed else f"h[{i}, {j}]"

    if mode == "probe":
        pass
    elif mode == "energy":
        args.append("energy_out: wp.array(dtype=_S)")
        if res:
            body.append("f = _S(0.5) * " + ("_D.sq(r)" if spec.residual_dim == 1 else "_D.length_sq(r)"))
        else:
            body.append("f = r")
        body.append(scatter_energy("weight * f"))
    elif mode == "residual":
        args += ["row_start: int", "res_out: wp.array(dtype=_S)"]
        body.append("sw = wp.sqrt(weight)")
        for c, rc in enumerate(_components("r", spec.residual_dim)):
            body.append(f"res_out[row_start + e * {spec.residual_dim} + {c}] = sw * {rc}")
    elif mode == "jacobian":
        args += [
            "row_start: int",
            "jslots: wp.array2d(dtype=wp.int32)",
            "res_out: wp.array(dtype=_S)",
            "jvals: wp.array(dtype=_JBlockT)",
        ]
        body.append("sw = wp.sqrt(weight)")
        for c, rc in enumerate(_components("r", spec.residual_dim)):
            body.append(f"rc{c} = {rc}")
            body.append(f"res_out[row_start + e * {spec.residual_dim} + {c}] = sw * rc{c}.v")
            body.append(f"g{c} = rc{c}.g")
            for a in range(n):
                if d == 1:
                    blk = f"g{c}[{a}] * sw"
                else:
                    blk = "wp.matrix_from_rows(_VarT(" + ", ".join(f"g{c}[{a * d + i}]" for i in range(d)) + ")) * sw"
                body.append(f"wp.atomic_add(jvals, jslots[e, {c * n + a}], {blk})")
    elif mode == "mixed":
        # derivatives in the element's parameters (read by the rewritten energy as duals seeded after the
        # variables): dE/dtheta atomically added at the parameters' global indices ``pidx[e]``, and the mixed
        # block d2E/dx dtheta of every (variable, parameter) pair to the element's own places of ``mixed``
        p = spec.param_count
        kk = k + p
        args += [
            "energy_out: wp.array(dtype=_S)",
            "theta_grad: wp.array(dtype=_S)",
            "pidx: wp.array2d(dtype=wp.int32)",
            "mixed: wp.array(dtype=_MixT)",
        ]
        body.append(scatter_energy("weight * r.v"))
        body.append("g = r.g * weight")
        body.append("h = r.h * weight")
        for j in range(p):
            body.append(f"wp.atomic_add(theta_grad, pidx[e, {j}], g[{k + j}])")
        for a in range(n):
            for j in range(p):
                if d == 1:
                    val = f"h[{_pi(a, k + j, kk)}]"
                else:
                    val = "wp.matrix_from_cols(_VarT(" + ", ".join(f"h[{_pi(a * d + i, k + j, kk)}]" for i in range(d)) + "))"
                body.append(f"mixed[e * {n * p} + {a * p + j}] = {val}")
    else:
        args.append("energy_out: wp.array(dtype=_S)")
        args.append("grad: wp.array(dtype=_VarT)")
        if mode == "gauss_newton":
            body.append("f = _S(0.0)")
            body.append("g = _VecK()")
            body.append("h = _MatK()")
            for c, rc in enumerate(_components("r", spec.residual_dim)):
                body.append(f"rc{c} = {rc}")
                body.append(f"f = f + rc{c}.v * rc{c}.v")
                body.append(f"gc{c} = rc{c}.g")
                body.append(f"g = g + gc{c} * rc{c}.v")
                body.append(f"h = h + wp.outer(gc{c}, gc{c})")
            body.append(scatter_energy("_S(0.5) * weight * f"))
            body.append("g = g * weight")
            body.append("h = h * weight")
        else:
            if res:
                body.append(
                    "r = _D.mul(_D.sq(r), _S(0.5))" if spec.residual_dim == 1 else "r = _D.mul(_D.length_sq(rv), _S(0.5))"
                )
            body.append(scatter_energy("weight * r.v"))
            body.append("g = r.g * weight")
            if mode in ("hessian", "hvp"):
                body.append("h = r.h * weight")
            elif mode == "hessian_proj":
                args += ["eps: _S", "absolute: int"]
                if unrolled:  # literal indices: registers instead of local memory (GPU)
                    body.append("h = _D.project_psd_unrolled(r.h * weight, eps, absolute)")
                else:
                    body.append(f"h = _D.project_psd(_D.unpack(r.h * weight), eps, absolute, {k})")
        if mode == "hvp":
            args += ["v: wp.array(dtype=_VarT)", "hv_out: wp.array(dtype=_VarT)"]
            if d == 1:
                vals = ", ".join(f"v[i{a}]" for a in range(n))
            else:
                vals = ", ".join(f"va{a}[{i}]" for a in range(n) for i in range(d))
                for a in range(n):
                    body.append(f"va{a} = v[i{a}]")
            body.append(f"vl = _VecK({vals})")
            body.append("hvl = _D.sym_mv(h, vl)")
            for a in range(n):
                body.append(scatter_vec("hv_out", a, vecblock("hvl", a)))
        else:
            for a in range(n):
                body.append(scatter_vec("grad", a, vecblock("g", a)))
        if mode in ("hessian", "hessian_proj", "gauss_newton"):
            # tiled, blocks of several numbers: the patch's values are written out one number per thread
            # (a flat view of the BSR values), so a warp's stores are contiguous
            hv_t = "_S" if tiled and d > 1 and tile_store == "number" else "_BlockT"
            args += ["slots: wp.array2d(dtype=wp.int32)", f"hvals: wp.array(dtype={hv_t})"]
            for a in range(n):
                for b in range(n):
                    blk = block(lambda i, j, a=a, b=b: hget(a * d + i, b * d + j))
                    body.append(scatter_block(a, b, blk))
    if mode not in ("probe", "residual", "jacobian"):
        args.append("offs: wp.vec3i")
    if tiled:
        extra, head, tail = _tiled_frame(tiled_det, d if tile_store == "number" else 1)
        args += extra
        loop = [t for s in body for t in s.split("\n")]
        body = head + ["    " + t for t in loop] + tail
    else:
        body = [t for s in body for t in s.split("\n")]
    lines = [f"def {name}(" + ", ".join(args) + "):"]
    lines += ["    " + s for s in body]
    return "\n".join(lines) + "\n"


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


def make_kernel(
    spec: KernelSpec,
    mode: str,
    energy_fn,
    ns,
    data_type,
    label: str,
    deterministic: bool = False,
    unrolled: bool = False,
    tile_cap: int = 0,
    tile_row_cap: int = 0,
    tile_store: str = "number",
    tile_launch_bounds: tuple[int, int] | None = None,
):
    """Compile-ready ``wp.Kernel`` for one term and mode.

    Args:
        spec: shape of the term.
        mode: one of :data:`MODES`.
        energy_fn: concrete Warp function instance of the user's energy for this mode.
        ns: generated namespace (dual module for derivative modes).
        data_type: the user's data struct type, or None.
        label: readable prefix for the kernel name (the energy's name).
        tile_cap: > 0 gives the tiled variant (see :func:`kernel_source`) with a shared tile of
            this many blocks.
        tile_row_cap: rows of the gradient tile of the deterministic tiled variant (its patches'
            most rows; default ``tile_cap``).
        tile_store: how the tiled variant writes its tile out (see :func:`kernel_source`).
        tile_launch_bounds: (threads per block, thread blocks per SM) of the tiled variant, given to
            the CUDA compiler (``__launch_bounds__``: registers are capped to fit, possibly spilling).
    """
    s = spec.scalar
    d, k = spec.dim, spec.k
    var_t = s if d == 1 else wp.types.vector(length=d, dtype=s)
    block_t = s if d == 1 else wp.types.matrix(shape=(d, d), dtype=s)
    jblock_t = s if d == 1 else wp.types.matrix(shape=(1, d), dtype=s)
    scope = {
        "wp": wp,
        "_S": s,
        "_VarT": var_t,
        "_BlockT": block_t,
        "_JBlockT": jblock_t,
        "_MixT": s if d == 1 else wp.types.matrix(shape=(d, 1), dtype=s),
        "_VecK": wp.types.vector(length=k, dtype=s),
        "_MatK": wp.types.matrix(shape=(k, k), dtype=s),
        "_D": ns,
        "_DataT": data_type,
        "_energy": energy_fn,
        "_CAP": int(tile_cap),
        "_RCAP": int(tile_row_cap or tile_cap),
    }
    unrolled = unrolled and mode == "hessian_proj" and hasattr(ns, "project_psd_unrolled")
    tiled = tile_cap > 0
    tmp = kernel_source(spec, mode, "kernel", deterministic, unrolled, tiled, tile_store) + f"# cap {tile_cap}" + (f" rows {tile_row_cap}" if tile_row_cap else "")
    digest = hashlib.sha1((tmp + energy_fn.key).encode()).hexdigest()[:10]
    label = re.sub(r"\W", "_", label)  # a user-given term name may hold any character
    suffix = ("_det" if deterministic else "") + ("_unrolled" if unrolled else "") + ("_tiled" if tiled else "")
    name = f"wm_{label}_{mode}{suffix}_{digest}"
    src = kernel_source(spec, mode, name, deterministic, unrolled, tiled, tile_store)
    code = compile(src, f"<warp_meshad kernel {name}>", "exec", dont_inherit=True)
    exec(code, scope)
    pyfn = scope[name]
    module = energy_fn.module
    opts = {"enable_backward": False}
    if tiled and tile_launch_bounds:
        opts["launch_bounds"] = tuple(int(b) for b in tile_launch_bounds)
    return wp.Kernel(func=pyfn, key=name, module=module, options=opts, source=src)
