"""Generator of forward-mode dual-number modules for Warp.

Warp resolves ``a + b`` on structs by looking up ``add``/``sub``/``mul``/``div`` in the calling
function's globals, and it cannot build structs or overload sets at run time from strings. So the
dual numbers are *generated*: for every (local size k, scalar dtype, mode) a Python source file is
written to a cache folder and imported. One file holds one dual type and every operation on it,
so each operator name is one overload set.

Modes:
    ``"plain"``: no dual type, only the plain-value overloads (floats, vectors, matrices); the
        public :mod:`warp_meshad.kernels.ad` re-exports these.
    ``"grad"``: value + gradient (``v``, ``g: vec_k``).
    ``"hess"``: value + gradient + Hessian (``v``, ``g: vec_k``, ``h: vec_p``, the upper triangle of the
        symmetric k x k Hessian row by row, p = k (k + 1) / 2; ``hessian(a)`` unpacks it).
    ``"packed"``: no dual type and no operator overloads: the plain-number functions on packed k x k Hessians that
        the ``"hess"`` module of the same (k, dtype) uses and re-exports (``unpack``, ``pack``, ``sym_mv``, the
        chain-rule products, the PSD projections). Warp resolves ``a * b`` in a function by trying every ``mul``
        overload in the function's module before its builtin; in a dual module that is about a hundred per
        operator, which made the code generation of the projections (thousands of float operations) take seconds.
        Here each operator resolves to the builtin at once. ``load(k, dtype, "hess")`` loads it first.

Chain rule for a unary ``f``: ``r.v = f(a.v)``, ``r.g = f'(a.v) a.g``,
``r.h = f'(a.v) a.h + f''(a.v) a.g a.g^T``; for a binary ``f(a, b)`` the mixed second
derivative adds ``f_ab (a.g b.g^T + b.g a.g^T)``.

Every generated module also carries the plain-value overloads of each function (generic over
float32/float64), so one namespace serves an energy whatever its argument types are.

Generated files live in ``$WARP_MESHAD_CACHE_PATH`` (default ``~/.cache/warp_meshad``), in a
folder keyed by :data:`GENERATOR_VERSION` and a hash of this file; they are never edited by hand.
"""

from __future__ import annotations

import hashlib
import importlib.util
import itertools
import os
import pathlib
import re
import sys
import threading

__all__ = [
    "GENERATOR_VERSION", "MODES", "UNROLLED_PROJECTION_MAX_K", "cache_dir", "load", "module_name", "packed_index",
    "source",
]

GENERATOR_VERSION = "2"
MODES = ("plain", "grad", "hess", "packed")
UNROLLED_PROJECTION_MAX_K = 12  # Hessian duals of k <= this also get project_psd_unrolled
_PACKAGE = "warp_meshad.kernels._generated"
_lock = threading.RLock()  # a "hess" load loads its "packed" module inside
_loaded: dict[tuple, object] = {}

# unary functions: name -> (value, first derivative, second derivative) in terms of `x` (the value)
# and `y` (the function value), written with `S(...)` for scalar constants.
_UNARY = {
    "sqrt": ("wp.sqrt(x)", "S(0.5) / y", "S(-0.25) / (y * x)"),
    "exp": ("wp.exp(x)", "y", "y"),
    "log": ("wp.log(x)", "S(1.0) / x", "S(-1.0) / (x * x)"),
    "sin": ("wp.sin(x)", "wp.cos(x)", "-y"),
    "cos": ("wp.cos(x)", "-wp.sin(x)", "-y"),
    "tan": ("wp.tan(x)", "S(1.0) + y * y", "S(2.0) * y * (S(1.0) + y * y)"),
    "asin": ("wp.asin(x)", "S(1.0) / wp.sqrt(S(1.0) - x * x)", "x / wp.pow(S(1.0) - x * x, S(1.5))"),
    "acos": ("wp.acos(x)", "S(-1.0) / wp.sqrt(S(1.0) - x * x)", "-x / wp.pow(S(1.0) - x * x, S(1.5))"),
    "atan": ("wp.atan(x)", "S(1.0) / (S(1.0) + x * x)", "S(-2.0) * x / ((S(1.0) + x * x) * (S(1.0) + x * x))"),
    "sinh": ("wp.sinh(x)", "wp.cosh(x)", "y"),
    "cosh": ("wp.cosh(x)", "wp.sinh(x)", "y"),
    "tanh": ("wp.tanh(x)", "S(1.0) - y * y", "S(-2.0) * y * (S(1.0) - y * y)"),
    "abs": ("wp.abs(x)", "wp.sign(x)", "S(0.0)"),
    "sq": ("x * x", "S(2.0) * x", "S(2.0)"),
}
_COMPARE = {"_wm_lt": "<", "_wm_le": "<=", "_wm_gt": ">", "_wm_ge": ">="}
_XYZW = "xyzw"
_SNAMES = {"float32": "f", "float64": "d"}


def cache_dir() -> pathlib.Path:
    """Folder holding the generated files of this generator version.

    Returns:
        ``$WARP_MESHAD_CACHE_PATH/gen-<version>-<hash>`` (default root ``~/.cache/warp_meshad``).
    """
    root = os.environ.get("WARP_MESHAD_CACHE_PATH")
    if not root:
        root = os.path.join(os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "warp_meshad")
    digest = hashlib.sha256(pathlib.Path(__file__).read_bytes()).hexdigest()[:10]
    return pathlib.Path(root) / f"gen-{GENERATOR_VERSION}-{digest}"


def module_name(k: int, dtype: str, mode: str) -> str:
    """Stem of the generated module for one (k, dtype, mode)."""
    if mode == "plain":
        return "duals_plain"
    return f"duals_{mode}_{k}{_SNAMES[dtype]}"


def _dtype_name(dtype) -> str:
    name = getattr(dtype, "__name__", str(dtype))
    if name not in _SNAMES:
        raise ValueError(f"dual numbers support dtype float32 or float64, got {name}")
    return name


def load(k: int, dtype, mode: str):
    """Return the generated module for local size ``k``, scalar ``dtype`` and ``mode``.

    Writes the file on first use (atomically) and imports it once per process.

    Args:
        k: number of scalar variables of one element (valence x variable_dim), 1..64.
        dtype: ``wp.float32`` or ``wp.float64`` (ignored for ``mode="plain"``).
        mode: one of ``"plain"``, ``"grad"``, ``"hess"``, ``"packed"``.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if mode == "plain":
        k, dname = 0, "float64"
    else:
        dname = _dtype_name(dtype)
        if not isinstance(k, int) or not 1 <= k <= 64:
            raise ValueError(f"local size k must be an int in 1..64, got {k!r}")
    key = (k, dname, mode)
    with _lock:
        mod = _loaded.get(key)
        if mod is not None:
            return mod
        if mode == "hess":  # its text binds the packed module's functions from sys.modules
            load(k, dtype, "packed")
        folder = cache_dir()
        folder.mkdir(parents=True, exist_ok=True)
        stem = module_name(k, dname, mode)
        path = folder / f"{stem}.py"
        text = source(k, dname, mode)
        if not path.exists() or path.read_text() != text:
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(text)
            os.replace(tmp, path)
        full = f"{_PACKAGE}.{stem}"
        spec = importlib.util.spec_from_file_location(full, path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[full] = mod
        spec.loader.exec_module(mod)
        _loaded[key] = mod
        return mod


# ---------------------------------------------------------------------------------------------
# source generation
# ---------------------------------------------------------------------------------------------


class _Src:
    """Collects generated functions.

    Calls between generated functions are written ``_G.name(...)``, with ``_G`` bound to the module
    itself only at the end of the file: Warp resolves them at code generation, while its
    registration-time reference scan (which binds every call against every overload of the big
    ``add``/``mul``/... sets, ~3 s per module) finds nothing to scan.
    """

    def __init__(self):
        self.parts: list[str] = []
        self.names: set[str] = set()

    def func(self, text: str):
        text = text.strip("\n")
        head = text.split("(", 1)[0]
        self.names.add(head[4:])
        self.parts.append("@wp.func\n" + text + "\n")

    def raw(self, text: str):
        self.parts.append(text.strip("\n") + "\n")

    def text(self) -> str:
        pattern = re.compile(r"(?<![\w.])(" + "|".join(sorted(self.names, key=len, reverse=True)) + r")\(")
        out = []
        for part in self.parts:
            if part.startswith("@wp.func"):
                deco, head, body = part.split("\n", 2)
                part = "\n".join([deco, head, pattern.sub(r"_G.\1(", body)])
            out.append(part)
        out.append("import sys as _sys\n\n_G = _sys.modules[__name__]\n")
        return "\n\n".join(out)


def source(k: int, dtype: str, mode: str) -> str:
    """Python source of one generated module (see :func:`load`)."""
    out = _Src()
    out.raw(
        f'''"""Generated by warp_meshad.kernels._dualgen version {GENERATOR_VERSION}: mode={mode}, k={k}, dtype={dtype}.

Do not edit: regenerated when the generator changes.
"""
from typing import Any

import warp as wp
'''
    )
    if mode == "packed":
        _packed_module(out, k, dtype)
        return out.text()
    _plain(out)
    if mode != "plain":
        _dual(out, k, dtype, mode == "hess")
    return out.text()


def _plain(out: _Src):
    """Plain-value overloads: generic over float32/float64 scalars, vectors and matrices."""
    simple = {
        "length": "wp.length(a)",
        "length_sq": "wp.length_sq(a)",
        "normalize": "wp.normalize(a)",
        "sqrt": "wp.sqrt(a)",
        "exp": "wp.exp(a)",
        "log": "wp.log(a)",
        "sin": "wp.sin(a)",
        "cos": "wp.cos(a)",
        "tan": "wp.tan(a)",
        "asin": "wp.asin(a)",
        "acos": "wp.acos(a)",
        "atan": "wp.atan(a)",
        "sinh": "wp.sinh(a)",
        "cosh": "wp.cosh(a)",
        "tanh": "wp.tanh(a)",
        "abs": "wp.abs(a)",
        "sq": "a * a",
        "det": "wp.determinant(a)",
        "inverse": "wp.inverse(a)",
        "transpose": "wp.transpose(a)",
        "trace": "wp.trace(a)",
        "frobenius_sq": "wp.ddot(a, a)",
        "_wm_neg": "-a",
        "value": "a",
    }
    for name, expr in simple.items():
        out.func(f"def {name}(a: Any):\n    return {expr}")
    binary = {
        "dot": "wp.dot(a, b)",
        "cross": "wp.cross(a, b)",
        "outer": "wp.outer(a, b)",
        "atan2": "wp.atan2(a, b)",
        "pow": "wp.pow(a, b)",
        "min": "wp.min(a, b)",
        "max": "wp.max(a, b)",
        "matmul": "a @ b",
        "mat22_cols": "wp.matrix_from_cols(a, b)",
        "mat22_rows": "wp.matrix_from_rows(a, b)",
        "vec2": "wp.vector(a, b)",
        "_wm_index": "a[b]",
    }
    for name, expr in binary.items():
        out.func(f"def {name}(a: Any, b: Any):\n    return {expr}")
    for op, sym in _COMPARE.items():
        out.func(f"def {op}(a: Any, b: Any):\n    return a {sym} b")
    out.func("def _wm_index2(a: Any, i: Any, j: Any):\n    return a[i, j]")
    out.func("def vec3(a: Any, b: Any, c: Any):\n    return wp.vector(a, b, c)")
    out.func("def vec4(a: Any, b: Any, c: Any, d: Any):\n    return wp.vector(a, b, c, d)")
    out.func("def mat33_cols(a: Any, b: Any, c: Any):\n    return wp.matrix_from_cols(a, b, c)")
    out.func("def mat33_rows(a: Any, b: Any, c: Any):\n    return wp.matrix_from_rows(a, b, c)")
    out.func("def mat22(a: Any, b: Any, c: Any, d: Any):\n    return wp.matrix_from_rows(wp.vector(a, b), wp.vector(c, d))")
    out.func("def where(cond: bool, a: Any, b: Any):\n    return wp.where(cond, a, b)")
    out.func("def select(cond: bool, a: Any, b: Any):\n    return wp.where(cond, b, a)")
    # a Python float literal is float32 during overload resolution: let float64 code mix with it
    ops = {"add": "+", "sub": "-", "mul": "*", "div": "/"}
    for name, sym in ops.items():
        out.func(f"def {name}(a: wp.float64, b: wp.float32):\n    return a {sym} wp.float64(b)")
        out.func(f"def {name}(a: wp.float32, b: wp.float64):\n    return wp.float64(a) {sym} b")
    for op, sym in _COMPARE.items():
        out.func(f"def {op}(a: wp.float64, b: wp.float32):\n    return a {sym} wp.float64(b)")
        out.func(f"def {op}(a: wp.float32, b: wp.float64):\n    return wp.float64(a) {sym} b")
    for t in ("wp.vec2d", "wp.vec3d", "wp.vec4d", "wp.mat22d", "wp.mat33d"):
        out.func(f"def mul(a: {t}, b: wp.float32):\n    return a * wp.float64(b)")
        out.func(f"def mul(a: wp.float32, b: {t}):\n    return wp.float64(a) * b")
        out.func(f"def div(a: {t}, b: wp.float32):\n    return a / wp.float64(b)")
    for fn in ("pow", "atan2", "min", "max"):
        out.func(f"def {fn}(a: wp.float64, b: wp.float32):\n    return {fn}(a, wp.float64(b))")
        out.func(f"def {fn}(a: wp.float32, b: wp.float64):\n    return {fn}(wp.float64(a), b)")


def _dual(out: _Src, k: int, dtype: str, hess: bool):
    """Dual scalar, dual vectors (2, 3, 4) and dual matrices (2x2, 3x3) with all their operations."""
    s = f"wp.{dtype}"
    tag = f"{k}{_SNAMES[dtype]}{'H' if hess else 'G'}"
    D = f"Dual{tag}"
    if hess:  # the packed module's types and functions (_dualgen.load loads it first)
        packed = f"{_PACKAGE}.{module_name(k, dtype, 'packed')}"
        out.raw(
            f"""
import sys as _sys

_K = _sys.modules["{packed}"]  # the plain-number functions on packed Hessians
S = _K.S
vecK = _K.vecK
matK = _K.matK
vecP = _K.vecP  # packed upper triangle, row by row
K = {k}
HESSIAN = True
{chr(10).join(f"{name} = _K.{name}" for name in _packed_api(k))}
"""
        )
    else:
        out.raw(
            f"""
S = {s}
vecK = wp.types.vector(length={k}, dtype={s})
matK = wp.types.matrix(shape=({k}, {k}), dtype={s})
vecP = wp.types.vector(length={k * (k + 1) // 2}, dtype={s})  # packed upper triangle, row by row
K = {k}
HESSIAN = {hess}
TOL = {"1.0e-24" if dtype == "float64" else "1.0e-12"}  # Jacobi stops at |offdiag|^2 <= TOL |diag|^2
TINY = {"1.0e-300" if dtype == "float64" else "1.0e-30"}  # floor of a failed Cholesky pivot
"""
        )
    fields = "    v: S\n    g: vecK\n" + ("    h: vecP\n" if hess else "")
    out.raw(
        "\n".join(f"_vec{n} = wp.types.vector(length={n}, dtype=S)" for n in (2, 3, 4))
        + "\n"
        + "\n".join(f"_mat{n}{n} = wp.types.matrix(shape=({n}, {n}), dtype=S)" for n in (2, 3))
    )
    out.raw(f"@wp.struct\nclass {D}:\n{fields}")
    out.raw(f"Dual = {D}")
    vec_names = {}
    for n in (2, 3, 4):
        name = f"DVec{n}_{tag}"
        vec_names[n] = name
        body = "".join(f"    {_XYZW[i]}: {D}\n" for i in range(n))
        out.raw(f"@wp.struct\nclass {name}:\n{body}")
        out.raw(f"DVec{n} = {name}")
    mat_names = {}
    for n in (2, 3):
        name = f"DMat{n}{n}_{tag}"
        mat_names[n] = name
        body = "".join(f"    m{i}{j}: {D}\n" for i in range(n) for j in range(n))
        out.raw(f"@wp.struct\nclass {name}:\n{body}")
        out.raw(f"DMat{n}{n} = {name}")

    def mk(v, g, h):
        return f"{D}({v}, {g}, {h})" if hess else f"{D}({v}, {g})"

    # --- construction and seeding ------------------------------------------------------------
    out.func(f"def const(x: S):\n    return {mk('x', 'vecK()', 'vecP()')}")
    out.func(f"def const(x: {D}):\n    return x")
    out.func(f"def variable(x: S, i: int):\n    g = vecK()\n    g[i] = S(1.0)\n    return {mk('x', 'g', 'vecP()')}")
    out.func(f"def value(a: {D}):\n    return a.v")
    out.func(f"def gradient(a: {D}):\n    return a.g")
    if hess:
        out.func(f"def hessian(a: {D}):\n    return _K.unpack(a.h)")
    for n in (2, 3, 4):
        V, vt = vec_names[n], f"_vec{n}"
        comps = ", ".join(f"variable(x[{i}], offset + {i})" for i in range(n))
        out.func(f"def seed(x: {vt}, offset: int):\n    return {V}({comps})")
        comps = ", ".join(f"const(x[{i}])" for i in range(n))
        out.func(f"def const(x: {vt}):\n    return {V}({comps})")
        out.func(f"def const(x: {V}):\n    return x")
        comps = ", ".join(f"a.{_XYZW[i]}.v" for i in range(n))
        out.func(f"def value(a: {V}):\n    return {vt}({comps})")
    out.func("def seed(x: S, offset: int):\n    return variable(x, offset)")
    for n in (2, 3):
        M, mt = mat_names[n], f"_mat{n}{n}"
        comps = ", ".join(f"const(x[{i}, {j}])" for i in range(n) for j in range(n))
        out.func(f"def const(x: {mt}):\n    return {M}({comps})")
        comps = ", ".join(f"variable(x[{i}, {j}], offset + {i * n + j})" for i in range(n) for j in range(n))
        out.func(f"def seed(x: {mt}, offset: int):\n    return {M}({comps})")  # row-major (parameters)
        out.func(f"def const(x: {M}):\n    return x")
        comps = ", ".join(f"a.m{i}{j}.v" for i in range(n) for j in range(n))
        out.func(f"def value(a: {M}):\n    return {mt}({comps})")

    # --- scalar chain rules ------------------------------------------------------------------------
    h1 = "_K._fma_sym(a.h, f1, a.g, f2)"
    out.func(f"def _chain(a: {D}, f0: S, f1: S, f2: S):\n    return {mk('f0', 'f1 * a.g', h1)}")
    h2 = "fa * a.h + fb * b.h + faa * _K._sym(a.g) + fbb * _K._sym(b.g) + fab * _K._sym2(a.g, b.g)"
    out.func(
        f"def _chain2(a: {D}, b: {D}, f0: S, fa: S, fb: S, faa: S, fbb: S, fab: S):\n"
        f"    return {mk('f0', 'fa * a.g + fb * b.g', h2)}"
    )
    for name, (f0, f1, f2) in _UNARY.items():
        out.func(
            f"def {name}(a: {D}):\n    x = a.v\n    y = {f0}\n    return _chain(a, y, {f1}, {f2})".replace("S(", "S(")
        )

    # scalar operand kinds: D (dual), S (scalar of this dtype), F (float32 literal), I (int literal)
    others = ["S", "I"] + (["F"] if dtype == "float64" else [])
    conv = {"S": "b", "F": "S(b)", "I": "S(b)"}
    tname = {"S": "S", "F": "wp.float32", "I": "int"}
    # add / sub
    out.func(f"def add(a: {D}, b: {D}):\n    return {mk('a.v + b.v', 'a.g + b.g', 'a.h + b.h')}")
    out.func(f"def sub(a: {D}, b: {D}):\n    return {mk('a.v - b.v', 'a.g - b.g', 'a.h - b.h')}")
    out.func(f"def _wm_neg(a: {D}):\n    return {mk('-a.v', '-a.g', '-a.h')}")
    out.func(
        f"def mul(a: {D}, b: {D}):\n"
        f"    return {mk('a.v * b.v', 'a.g * b.v + b.g * a.v', '_K._fma_mul(a.h, b.v, b.h, a.v, a.g, b.g)')}"
    )
    out.func(
        f"def div(a: {D}, b: {D}):\n    ib = S(1.0) / b.v\n    v = a.v * ib\n    g = (a.g - b.g * v) * ib\n"
        + (
            f"    return {mk('v', 'g', '(a.h - b.h * v - _K._sym2(g, b.g)) * ib')}"
            if hess
            else f"    return {mk('v', 'g', '')}"
        )
    )
    for o in others:
        t, c = tname[o], conv[o]
        out.func(f"def add(a: {D}, b: {t}):\n    return {mk(f'a.v + {c}', 'a.g', 'a.h')}")
        out.func(f"def add(b: {t}, a: {D}):\n    return {mk(f'{c} + a.v', 'a.g', 'a.h')}")
        out.func(f"def sub(a: {D}, b: {t}):\n    return {mk(f'a.v - {c}', 'a.g', 'a.h')}")
        out.func(f"def sub(b: {t}, a: {D}):\n    return {mk(f'{c} - a.v', '-a.g', '-a.h')}")
        out.func(f"def mul(a: {D}, b: {t}):\n    s = {c}\n    return {mk('a.v * s', 'a.g * s', 'a.h * s')}")
        out.func(f"def mul(b: {t}, a: {D}):\n    s = {c}\n    return {mk('a.v * s', 'a.g * s', 'a.h * s')}")
        out.func(f"def div(a: {D}, b: {t}):\n    s = S(1.0) / {c}\n    return {mk('a.v * s', 'a.g * s', 'a.h * s')}")
        out.func(
            f"def div(b: {t}, a: {D}):\n    s = {c}\n    x = a.v\n    y = S(1.0) / x\n"
            f"    return _chain(a, s * y, -s * y * y, S(2.0) * s * y * y * y)"
        )
        for op, sym in _COMPARE.items():
            out.func(f"def {op}(a: {D}, b: {t}):\n    return a.v {sym} {c}")
            out.func(f"def {op}(b: {t}, a: {D}):\n    return {c} {sym} a.v")
        # pow with a constant exponent, and a constant base
        out.func(
            f"def pow(a: {D}, b: {t}):\n    p = {c}\n    x = a.v\n"
            f"    return _chain(a, wp.pow(x, p), p * wp.pow(x, p - S(1.0)), p * (p - S(1.0)) * wp.pow(x, p - S(2.0)))"
        )
        out.func(f"def pow(b: {t}, a: {D}):\n    lb = wp.log({c})\n    y = wp.pow({c}, a.v)\n    return _chain(a, y, y * lb, y * lb * lb)")
        for fn, cmp in (("min", "<"), ("max", ">")):
            out.func(f"def {fn}(a: {D}, b: {t}):\n    if a.v {cmp} {c}:\n        return a\n    return const({c})")
            out.func(f"def {fn}(b: {t}, a: {D}):\n    if a.v {cmp} {c}:\n        return a\n    return const({c})")
        out.func(f"def atan2(a: {D}, b: {t}):\n    return atan2(a, const({c}))")
        out.func(f"def atan2(b: {t}, a: {D}):\n    return atan2(const({c}), a)")
        out.func(f"def where(cond: bool, a: {D}, b: {t}):\n    if cond:\n        return a\n    return const({c})")
        out.func(f"def where(cond: bool, b: {t}, a: {D}):\n    if cond:\n        return const({c})\n    return a")
        out.func(f"def select(cond: bool, a: {D}, b: {t}):\n    return where(cond, const({c}), a)")
        out.func(f"def select(cond: bool, b: {t}, a: {D}):\n    return where(cond, a, const({c}))")
    for op, sym in _COMPARE.items():
        out.func(f"def {op}(a: {D}, b: {D}):\n    return a.v {sym} b.v")
    out.func(f"def pow(a: {D}, b: {D}):\n    return exp(mul(b, log(a)))")
    out.func(
        f"def atan2(a: {D}, b: {D}):\n    y = a.v\n    x = b.v\n    d = x * x + y * y\n    d2 = d * d\n"
        f"    return _chain2(a, b, wp.atan2(y, x), x / d, -y / d, S(-2.0) * x * y / d2, S(2.0) * x * y / d2, (y * y - x * x) / d2)"
    )
    for fn, cmp in (("min", "<"), ("max", ">")):
        out.func(f"def {fn}(a: {D}, b: {D}):\n    if a.v {cmp} b.v:\n        return a\n    return b")
    out.func(f"def where(cond: bool, a: {D}, b: {D}):\n    if cond:\n        return a\n    return b")
    out.func(f"def select(cond: bool, a: {D}, b: {D}):\n    return where(cond, b, a)")

    # --- dual vectors -------------------------------------------------------------------------------
    for n in (2, 3, 4):
        V = vec_names[n]
        vt = f"_vec{n}"
        c = _XYZW[:n]

        def build(expr, c=c, V=V):
            return f"{V}(" + ", ".join(expr.format(i=i, c=ch) for i, ch in enumerate(c)) + ")"

        for op in ("add", "sub"):
            out.func(f"def {op}(a: {V}, b: {V}):\n    return {build(op + '(a.{c}, b.{c})')}")
            out.func(f"def {op}(a: {V}, b: {vt}):\n    return {build(op + '(a.{c}, b[{i}])')}")
            out.func(f"def {op}(a: {vt}, b: {V}):\n    return {build(op + '(a[{i}], b.{c})')}")
        out.func(f"def _wm_neg(a: {V}):\n    return {build('_wm_neg(a.{c})')}")
        for t in [D, "S"] + (["wp.float32"] if dtype == "float64" else []):
            out.func(f"def mul(a: {V}, b: {t}):\n    return {build('mul(a.{c}, b)')}")
            out.func(f"def mul(b: {t}, a: {V}):\n    return {build('mul(a.{c}, b)')}")
            out.func(f"def div(a: {V}, b: {t}):\n    return {build('div(a.{c}, b)')}")
        out.func(f"def mul(a: {D}, b: {vt}):\n    return {build('mul(a, b[{i}])')}")
        out.func(f"def mul(b: {vt}, a: {D}):\n    return {build('mul(a, b[{i}])')}")
        for ta, tb, ea, eb in ((V, V, "a.{c}", "b.{c}"), (V, vt, "a.{c}", "b[{i}]"), (vt, V, "a[{i}]", "b.{c}")):
            terms = [f"mul({ea.format(i=i, c=ch)}, {eb.format(i=i, c=ch)})" for i, ch in enumerate(c)]
            expr = terms[0]
            for t_ in terms[1:]:
                expr = f"add({expr}, {t_})"
            out.func(f"def dot(a: {ta}, b: {tb}):\n    return {expr}")
            if n == 3:
                ax, ay, az = (ea.format(i=i, c=ch) for i, ch in enumerate(c))
                bx, by, bz = (eb.format(i=i, c=ch) for i, ch in enumerate(c))
                out.func(
                    f"def cross(a: {ta}, b: {tb}):\n    return {V}(sub(mul({ay}, {bz}), mul({az}, {by})), "
                    f"sub(mul({az}, {bx}), mul({ax}, {bz})), sub(mul({ax}, {by}), mul({ay}, {bx})))"
                )
            if n in (2, 3):
                M = mat_names[n]
                comps = ", ".join(
                    f"mul({ea.format(i=i, c=c[i])}, {eb.format(i=j, c=c[j])})" for i in range(n) for j in range(n)
                )
                out.func(f"def outer(a: {ta}, b: {tb}):\n    return {M}({comps})")
        out.func(f"def length_sq(a: {V}):\n    return dot(a, a)")
        out.func(f"def length(a: {V}):\n    return sqrt(dot(a, a))")
        out.func(f"def normalize(a: {V}):\n    return div(a, length(a))")
        chain = "a.x"
        for i, ch in enumerate(c[1:], start=1):
            chain = f"where(i == {i}, a.{ch}, {chain})"
        out.func(f"def _wm_index(a: {V}, i: int):\n    return {chain}")
        out.func(f"def where(cond: bool, a: {V}, b: {V}):\n    if cond:\n        return a\n    return b")
        out.func(f"def select(cond: bool, a: {V}, b: {V}):\n    return where(cond, b, a)")
        # constructors from any mix of duals and scalars
        names = ["vec2", "vec3", "vec4"][n - 2]
        for kinds in itertools.product((D, "S"), repeat=n):
            if all(kd == "S" for kd in kinds):
                continue
            args = ", ".join(f"a{i}: {kd}" for i, kd in enumerate(kinds))
            comps = ", ".join(f"const(a{i})" for i in range(n))
            out.func(f"def {names}({args}):\n    return {V}({comps})")

    # --- dual matrices ------------------------------------------------------------------------------
    for n in (2, 3):
        M, V = mat_names[n], vec_names[n]
        mt = f"_mat{n}{n}"
        vt = f"_vec{n}"
        idx = [(i, j) for i in range(n) for j in range(n)]

        def mbuild(expr, M=M, idx=idx):
            return f"{M}(" + ", ".join(expr.format(i=i, j=j) for i, j in idx) + ")"

        for op in ("add", "sub"):
            out.func(f"def {op}(a: {M}, b: {M}):\n    return {mbuild(op + '(a.m{i}{j}, b.m{i}{j})')}")
            out.func(f"def {op}(a: {M}, b: {mt}):\n    return {mbuild(op + '(a.m{i}{j}, b[{i}, {j}])')}")
            out.func(f"def {op}(a: {mt}, b: {M}):\n    return {mbuild(op + '(a[{i}, {j}], b.m{i}{j})')}")
        out.func(f"def _wm_neg(a: {M}):\n    return {mbuild('_wm_neg(a.m{i}{j})')}")
        for t in [D, "S"] + (["wp.float32"] if dtype == "float64" else []):
            out.func(f"def mul(a: {M}, b: {t}):\n    return {mbuild('mul(a.m{i}{j}, b)')}")
            out.func(f"def mul(b: {t}, a: {M}):\n    return {mbuild('mul(a.m{i}{j}, b)')}")
            out.func(f"def div(a: {M}, b: {t}):\n    return {mbuild('div(a.m{i}{j}, b)')}")
        # matrix products (dual x dual, dual x plain, plain x dual)
        for ta, tb, ea, eb in (
            (M, M, "a.m{i}{l}", "b.m{l}{j}"),
            (M, mt, "a.m{i}{l}", "b[{l}, {j}]"),
            (mt, M, "a[{i}, {l}]", "b.m{l}{j}"),
        ):
            comps = []
            for i, j in idx:
                terms = [f"mul({ea.format(i=i, l=l)}, {eb.format(l=l, j=j)})" for l in range(n)]
                expr = terms[0]
                for t_ in terms[1:]:
                    expr = f"add({expr}, {t_})"
                comps.append(expr)
            body = f"    return {M}(" + ", ".join(comps) + ")"
            out.func(f"def mul(a: {ta}, b: {tb}):\n{body}")
            out.func(f"def matmul(a: {ta}, b: {tb}):\n    return mul(a, b)")
        # matrix-vector products
        for ta, tb, ea, eb in (
            (M, V, "a.m{i}{l}", "b.{c}"),
            (M, vt, "a.m{i}{l}", "b[{l}]"),
            (mt, V, "a[{i}, {l}]", "b.{c}"),
        ):
            comps = []
            for i in range(n):
                terms = [f"mul({ea.format(i=i, l=l)}, {eb.format(l=l, c=_XYZW[l])})" for l in range(n)]
                expr = terms[0]
                for t_ in terms[1:]:
                    expr = f"add({expr}, {t_})"
                comps.append(expr)
            out.func(f"def mul(a: {ta}, b: {tb}):\n    return {V}(" + ", ".join(comps) + ")")
            out.func(f"def matmul(a: {ta}, b: {tb}):\n    return mul(a, b)")
        out.func(f"def transpose(a: {M}):\n    return {M}(" + ", ".join(f"a.m{j}{i}" for i, j in idx) + ")")
        out.func(f"def trace(a: {M}):\n    return " + _sum([f"a.m{i}{i}" for i in range(n)]))
        out.func(f"def frobenius_sq(a: {M}):\n    return " + _sum([f"mul(a.m{i}{j}, a.m{i}{j})" for i, j in idx]))
        if n == 2:
            out.func(f"def det(a: {M}):\n    return sub(mul(a.m00, a.m11), mul(a.m01, a.m10))")
            out.func(
                f"def inverse(a: {M}):\n    d = det(a)\n"
                f"    return {M}(div(a.m11, d), div(_wm_neg(a.m01), d), div(_wm_neg(a.m10), d), div(a.m00, d))"
            )
        else:
            # cofactors C[i][j]; det = sum_j a0j C0j; inverse = C^T / det
            cof = {}
            for i, j in idx:
                r = [x for x in range(3) if x != i]
                cc = [x for x in range(3) if x != j]
                t = f"sub(mul(a.m{r[0]}{cc[0]}, a.m{r[1]}{cc[1]}), mul(a.m{r[0]}{cc[1]}, a.m{r[1]}{cc[0]}))"
                cof[(i, j)] = t if (i + j) % 2 == 0 else f"_wm_neg({t})"
            out.func(
                f"def det(a: {M}):\n    return " + _sum([f"mul(a.m0{j}, {cof[(0, j)]})" for j in range(3)])
            )
            lines = "".join(f"    c{i}{j} = {cof[(i, j)]}\n" for i, j in idx)
            out.func(
                f"def inverse(a: {M}):\n{lines}    d = add(add(mul(a.m00, c00), mul(a.m01, c01)), mul(a.m02, c02))\n"
                f"    return {M}(" + ", ".join(f"div(c{j}{i}, d)" for i, j in idx) + ")"
            )
        out.func(f"def _wm_index2(a: {M}, i: int, j: int):\n    r = a.m00\n" + "".join(
            f"    if i == {i} and j == {j}:\n        r = a.m{i}{j}\n" for i, j in idx[1:]
        ) + "    return r")
        out.func(f"def where(cond: bool, a: {M}, b: {M}):\n    if cond:\n        return a\n    return b")
        out.func(f"def select(cond: bool, a: {M}, b: {M}):\n    return where(cond, b, a)")
        cols, rows = f"mat{n}{n}_cols", f"mat{n}{n}_rows"
        for kinds in itertools.product((V, vt), repeat=n):
            if all(kd == vt for kd in kinds):
                continue
            args = ", ".join(f"a{i}: {kd}" for i, kd in enumerate(kinds))
            cvs = [f"const(a{i})" for i in range(n)]
            lines = "".join(f"    u{i} = {cvs[i]}\n" for i in range(n))
            out.func(
                f"def {cols}({args}):\n{lines}    return {M}("
                + ", ".join(f"u{j}.{_XYZW[i]}" for i, j in idx) + ")"
            )
            out.func(
                f"def {rows}({args}):\n{lines}    return {M}("
                + ", ".join(f"u{i}.{_XYZW[j]}" for i, j in idx) + ")"
            )
        if n == 2:
            for kinds in itertools.product((D, "S"), repeat=4):
                if all(kd == "S" for kd in kinds):
                    continue
                args = ", ".join(f"a{i}: {kd}" for i, kd in enumerate(kinds))
                out.func(f"def mat22({args}):\n    return {M}(" + ", ".join(f"const(a{i})" for i in range(4)) + ")")


def _packed_api(k: int) -> list[str]:
    """What a ``"hess"`` module re-exports of its packed module (the kernel text calls these as ``_D.<name>``)."""
    names = ["unpack", "pack", "sym_mv", "project_psd"]
    return names + (["project_psd_unrolled"] if k <= UNROLLED_PROJECTION_MAX_K else [])


def _packed_module(out: _Src, k: int, dtype: str):
    """The ``"packed"`` module: types, the packed-Hessian helpers and the PSD projections (plain numbers only)."""
    s = f"wp.{dtype}"
    out.raw(
        f"""
S = {s}
vecK = wp.types.vector(length={k}, dtype={s})
matK = wp.types.matrix(shape=({k}, {k}), dtype={s})
vecP = wp.types.vector(length={k * (k + 1) // 2}, dtype={s})  # packed upper triangle, row by row
K = {k}
TOL = {"1.0e-24" if dtype == "float64" else "1.0e-12"}  # Jacobi stops at |offdiag|^2 <= TOL |diag|^2
TINY = {"1.0e-300" if dtype == "float64" else "1.0e-30"}  # floor of a failed Cholesky pivot
"""
    )
    _packed(out, k)
    _psd(out, dtype)
    if k <= UNROLLED_PROJECTION_MAX_K:
        _psd_unrolled(out, k)


def _sum(terms):
    expr = terms[0]
    for t in terms[1:]:
        expr = f"add({expr}, {t})"
    return expr


def _psd(out: _Src, dtype: str):
    """Per-element projection of a symmetric k x k matrix onto the PSD cone (cyclic Jacobi).

    Early out: when a Cholesky factorization of ``h - eps I`` succeeds, every eigenvalue exceeds
    ``eps`` and ``h`` is its own projection (both modes); most elements of a near-convex energy
    take this path.
    """
    out.func(
        """
def _is_above(h: matK, eps: S, n: int):
    # Cholesky of h - eps I; 1 when it succeeds (h - eps I positive definite)
    l = matK()
    for j in range(n):
        d = h[j, j] - eps
        for q in range(j):
            d -= l[j, q] * l[j, q]
        if d <= S(0.0):
            return 0
        d = wp.sqrt(d)
        l[j, j] = d
        for i in range(j + 1, n):
            t = h[i, j]
            for q in range(j):
                t -= l[i, q] * l[j, q]
            l[i, j] = t / d
    return 1
"""
    )
    out.func(
        """
def project_psd(h: matK, eps: S, absolute: int, n: int):
    # cyclic Jacobi eigen-decomposition a = v diag(w) v^T; n is the (runtime) size, kept dynamic
    # so the loops are not unrolled
    if _is_above(h, eps, n) != 0:
        return h
    a = h
    v = matK()
    for i in range(n):
        v[i, i] = S(1.0)
    for sweep in range(40):
        off = S(0.0)
        scale = S(0.0)
        for p in range(n):
            for q in range(n):
                if p != q:
                    off += a[p, q] * a[p, q]
                else:
                    scale += a[p, q] * a[p, q]
        if off <= S(TOL) * scale or off == S(0.0):
            break
        for p in range(n - 1):
            for q in range(p + 1, n):
                apq = a[p, q]
                if apq != S(0.0):
                    theta = (a[q, q] - a[p, p]) / (S(2.0) * apq)
                    t = S(1.0) / (wp.abs(theta) + wp.sqrt(theta * theta + S(1.0)))
                    if theta < S(0.0):
                        t = -t
                    c = S(1.0) / wp.sqrt(t * t + S(1.0))
                    s = t * c
                    for r in range(n):
                        arp = a[r, p]
                        arq = a[r, q]
                        a[r, p] = c * arp - s * arq
                        a[r, q] = s * arp + c * arq
                    for r in range(n):
                        apr = a[p, r]
                        aqr = a[q, r]
                        a[p, r] = c * apr - s * aqr
                        a[q, r] = s * apr + c * aqr
                    for r in range(n):
                        vrp = v[r, p]
                        vrq = v[r, q]
                        v[r, p] = c * vrp - s * vrq
                        v[r, q] = s * vrp + c * vrq
    res = matK()
    for m in range(n):
        lam = a[m, m]
        if absolute != 0:
            lam = wp.abs(lam)
        lam = wp.max(lam, eps)
        for i in range(n):
            vi = v[i, m] * lam
            for j in range(n):
                res[i, j] += vi * v[j, m]
    return res
"""
    )


def packed_index(i: int, j: int, k: int) -> int:
    """Index of entry (i, j) of a symmetric k x k matrix in its packed upper triangle (row by row): where a
    Hessian dual's ``h`` (and a generated kernel's local Hessian) keeps it."""
    if i > j:
        i, j = j, i
    return i * k - i * (i - 1) // 2 + (j - i)


def _upper_pairs(k: int) -> list[tuple[int, int]]:
    """The (i, j), i <= j, of a k x k upper triangle in packed order (``packed_index(i, j, k)`` is the position)."""
    return [(i, j) for i in range(k) for j in range(i, k)]


def _packed(out: _Src, k: int):
    """Helpers on the packed Hessian (``vecP``: the k (k + 1) / 2 entries of the upper triangle, row by row).

    The dual Hessian is symmetric, so only its upper triangle is stored and updated: 78 instead of 144
    numbers for k = 12, which keeps more of a dual in registers. Every index is a literal.
    """
    pairs = _upper_pairs(k)
    gl = "".join(f"    a{i} = a[{i}]\n" for i in range(k))
    bl = "".join(f"    b{i} = b[{i}]\n" for i in range(k))
    out.func("def _sym(a: vecK):\n" + gl + "    return vecP(" + ", ".join(f"a{i} * a{j}" for i, j in pairs) + ")")
    out.func(
        "def _sym2(a: vecK, b: vecK):\n" + gl + bl
        + "    return vecP(" + ", ".join(f"a{i} * b{j} + a{j} * b{i}" for i, j in pairs) + ")"
    )
    tl = "".join(f"    t{i} = f2 * a[{i}]\n" for i in range(k)) + gl
    out.func(
        "def _fma_sym(h: vecP, f1: S, a: vecK, f2: S):\n" + tl
        + "    return vecP(" + ", ".join(f"f1 * h[{n}] + t{i} * a{j}" for n, (i, j) in enumerate(pairs)) + ")"
    )
    out.func(
        "def _fma_mul(ha: vecP, bv: S, hb: vecP, av: S, a: vecK, b: vecK):\n" + gl + bl
        + "    return vecP(" + ", ".join(
            f"ha[{n}] * bv + hb[{n}] * av + a{i} * b{j} + a{j} * b{i}" for n, (i, j) in enumerate(pairs)
        ) + ")"
    )
    out.func(
        "def unpack(h: vecP):\n    return matK("
        + ", ".join(f"h[{packed_index(i, j, k)}]" for i in range(k) for j in range(k)) + ")"
    )
    out.func("def pack(m: matK):\n    return vecP(" + ", ".join(f"m[{i}, {j}]" for i, j in pairs) + ")")
    vl = "".join(f"    v{i} = v[{i}]\n" for i in range(k))
    rows = ", ".join(" + ".join(f"h[{packed_index(i, j, k)}] * v{j}" for j in range(k)) for i in range(k))
    out.func("def sym_mv(h: vecP, v: vecK):\n" + vl + f"    return vecK({rows})")


def _psd_unrolled(out: _Src, k: int):
    """``project_psd`` on the packed upper triangle with every index a literal (for GPUs): the matrix and the
    eigenvectors are scalar locals, so they can stay in registers instead of local memory.

    Cyclic Jacobi in the odd-even order of parallel Jacobi, with fixed places: a step rotates the disjoint pairs of
    neighbouring places, (0, 1), (2, 3), ... or (1, 2), (3, 4), ..., in turn, and each rotation of places (p, q) also
    swaps their contents (it writes its two results crosswise: a 2 x 2 orthogonal map all the same, at no cost). The
    indices then travel as in an odd-even transposition sort that always swaps: any k consecutive steps meet every
    index pair exactly once, as a cyclic sweep does. Only the two kinds of step are written out (k - 1 rotations); a
    runtime loop repeats them, so the code is about 2 / k of a sweep written out (k = 12: 11 rotations instead of 66)
    and the loop carries the same locals round, with no copies between its iterations.

    A rotation of (p, q) zeroes a_pq, turns a_pp and a_qq into ``a_pp - t a_pq`` and ``a_qq + t a_pq`` (which trade
    places) and rotates the other entries of rows p and q; the eigenvectors' columns go with the places (their rows
    are the matrix's own indices). The convergence test runs every ceil(k / 2) pairs of steps (a sweep or one step
    more). The early out is a Cholesky factorization of ``h - eps I`` (written branch free).
    """
    places = list(range(k))

    def A(i, j):  # the matrix entry of places i and j
        return f"a{min(i, j)}_{max(i, j)}"

    def rotate(x, y, ind):
        """(x, y) <- (s x + c y, c x - s y): one pair of entries rotated and swapped."""
        return [f"{ind}x0 = {x}", f"{ind}x1 = {y}", f"{ind}{x} = s * x0 + c * x1", f"{ind}{y} = c * x0 - s * x1"]

    pairs = _upper_pairs(k)
    lines = ["def project_psd_unrolled(h: vecP, eps: S, absolute: int):"]
    lines += [f"    {A(i, j)} = h[{n}]" for n, (i, j) in enumerate(pairs)]
    # Cholesky of h - eps I (l_ij, i >= j): ok stays 1 while every pivot is positive
    lines += ["    ok = int(1)"]
    for j in range(k):
        d = " - ".join([f"({A(j, j)} - eps)"] + [f"l{j}_{q} * l{j}_{q}" for q in range(j)])
        lines += [
            f"    d = {d}",
            "    if d <= S(0.0):",
            "        ok = 0",
            f"    l{j}_{j} = wp.sqrt(wp.max(d, S(TINY)))",  # a failed pivot leaves the rest finite
            f"    il = S(1.0) / l{j}_{j}",
        ]
        for i in range(j + 1, k):
            t = " - ".join([A(i, j)] + [f"l{i}_{q} * l{j}_{q}" for q in range(j)])
            lines += [f"    l{i}_{j} = ({t}) * il"]
    lines += ["    if ok != 0:", "        return h"]
    for r in range(k):
        for p in places:
            lines += [f"    v{r}_{p} = S({1.0 if p == r else 0.0})"]
    if k > 1:
        test_every = (k + 1) // 2  # pairs of steps
        ind = "        "
        # 30 sweeps at most; Warp never unrolls a while loop
        lines += ["    step = int(0)", f"    while step < {30 * test_every}:"]
        off = " + ".join(f"{A(p, q)} * {A(p, q)}" for p in places for q in places if p < q)
        dia = " + ".join(f"{A(p, p)} * {A(p, p)}" for p in places)
        test = [f"off = {off}", f"dia = {dia}", "if off <= S(TOL) * dia or off == S(0.0):", "    break"]
        if test_every > 1:
            lines += [f"{ind}if step % {test_every} == 0:"] + [f"{ind}    {t}" for t in test]
        else:
            lines += [ind + t for t in test]
        for first in (0, 1):  # the two kinds of step
            for p in range(first, k - 1, 2):
                q = p + 1
                lines += [
                    f"{ind}apq = {A(p, q)}",
                    f"{ind}theta = ({A(q, q)} - {A(p, p)}) / wp.where(apq == S(0.0), S(1.0), S(2.0) * apq)",
                    f"{ind}t = S(1.0) / (wp.abs(theta) + wp.sqrt(theta * theta + S(1.0)))",
                    f"{ind}t = wp.where(theta < S(0.0), -t, t)",
                    f"{ind}t = wp.where(apq == S(0.0), S(0.0), t)",
                    f"{ind}c = S(1.0) / wp.sqrt(t * t + S(1.0))",
                    f"{ind}s = t * c",
                    f"{ind}x0 = {A(p, p)} - t * apq",
                    f"{ind}{A(p, p)} = {A(q, q)} + t * apq",
                    f"{ind}{A(q, q)} = x0",
                    f"{ind}{A(p, q)} = S(0.0)",
                ]
                for r in places:  # the other entries of rows p and q of the matrix
                    if r not in (p, q):
                        lines += rotate(A(r, p), A(r, q), ind)
                for r in range(k):  # columns p and q of the eigenvectors
                    lines += rotate(f"v{r}_{p}", f"v{r}_{q}", ind)
        lines += [f"{ind}step += 1"]
    for p in places:
        lines += [
            f"    lam = {A(p, p)}",
            "    if absolute != 0:",
            "        lam = wp.abs(lam)",
            f"    lam{p} = wp.max(lam, eps)",
        ]
    entries = []
    for i, j in pairs:
        entries.append(" + ".join(f"lam{p} * v{i}_{p} * v{j}_{p}" for p in places))
    lines += ["    return vecP(" + ", ".join(entries) + ")"]
    out.func("\n".join(lines))
