"""Instantiate a user's energy function for one evaluation mode.

A user writes one ``@wp.func`` with ordinary operators; Warp looks up ``add``/``sub``/``mul``/
``div`` for ``+ - * /`` in the *calling function's* globals but always calls builtins for unary
minus, comparisons and indexing. So for each (mode, dual type) the energy's source is rewritten
once:

* float literals -> the problem's scalar type (a bare literal is float32 in Warp);
* ``-a`` -> ``_wm_neg(a)``, ``a < b`` -> ``_wm_lt(a, b)`` (likewise ``<=, >, >=``),
  ``a[i]`` -> ``_wm_index(a, i)``, ``a[i, j]`` -> ``_wm_index2(a, i, j)`` (loads only);
* in dual modes, ``a == b`` -> ``(_wm_le(a, b) and _wm_ge(a, b))`` and ``a != b`` -> its negation: duals compare
  by value, as the plain mode's ``==`` does (NaN equals nothing, and differs from everything);
* the variable arguments are annotated with the concrete plain or dual type;
* ``wp.length(v)``, ``wp.sqrt(a)``, ``wp.determinant(m)``, ... (Warp builtins with an ``ad`` counterpart)
  -> the ``ad`` function, so energies may use either spelling;
* each ``return v`` of the energy itself -> ``return _wm_ret(v)`` (a constant dual in dual modes);
* Warp functions the energy calls that the user wrote are rewritten the same way (recursively);

and compiled into a fresh function whose globals are a copy of the user's module globals with
the operator overloads and the matching ``ad`` namespace injected. The user's module is never
modified.
"""

from __future__ import annotations

import ast
import hashlib
import inspect
import textwrap
import types

import warp as wp

from warp_meshad._src.codegen.contract import ENERGY_NAMES
from warp_meshad._src.codegen.energy_errors import remember
from warp_meshad._src.codegen.warp_compat import register_function

__all__ = ["instantiate", "EnergyInfo", "describe_energy"]

_COMPARE = {ast.Lt: "_wm_lt", ast.LtE: "_wm_le", ast.Gt: "_wm_gt", ast.GtE: "_wm_ge"}
# Warp builtins with an ``ad`` counterpart: ``wp.length(v)`` in an energy becomes ``ad.length(v)``
_WP_TO_AD = {
    name: name
    for name in (
        "length", "length_sq", "normalize", "dot", "cross", "outer", "sqrt", "exp", "log", "sin", "cos", "tan",
        "asin", "acos", "atan", "atan2", "sinh", "cosh", "tanh", "pow", "abs", "min", "max", "where", "select",
        "inverse", "transpose", "trace",
    )
}
_WP_TO_AD["determinant"] = "det"
_cache: dict = {}


class _Rewriter(ast.NodeTransformer):
    def __init__(self, helper_names, wrap_returns, warp_names=(), equality=False):
        self.helper_names = helper_names
        self.warp_names = set(warp_names)
        self.wrap_returns = wrap_returns
        self.equality = equality  # rewrite == and != (dual modes: Warp's builtins do not take duals)
        self.depth = 0
        self.calls: set[str] = set()
        self.params = None  # see _ParameterReads

    def _param_read(self, node):
        """``data.f[e]`` / ``data.f`` of a parameter field -> ``_wm_seed(..., offset)`` (None where not one)."""
        pr = self.params
        if pr is None:
            return None
        if isinstance(node, ast.Subscript):
            att = node.value
            if not (isinstance(att, ast.Attribute) and isinstance(att.value, ast.Name) and att.value.id == pr.data
                    and att.attr in pr.fields):  # fmt: skip
                return None
            offset, per_element = pr.fields[att.attr]
            if not per_element:
                return None  # a component of a shared field: the Attribute below seeds the whole field
            if not (isinstance(node.slice, ast.Name) and node.slice.id == pr.element):
                pr.fail(node, f"the parameter field '{att.attr}' must be read as {pr.data}.{att.attr}[{pr.element}]")
        elif isinstance(node, ast.Attribute):
            if not (isinstance(node.value, ast.Name) and node.value.id == pr.data and node.attr in pr.fields):
                return None
            offset, per_element = pr.fields[node.attr]
            if per_element:
                pr.fail(node, f"the parameter field '{node.attr}' must be read as {pr.data}.{node.attr}[{pr.element}]")
        else:
            return None
        if not isinstance(node.ctx, ast.Load):
            pr.fail(node, "parameter fields are read only")
        return ast.copy_location(ast.Call(ast.Name("_wm_seed", ast.Load()), [node, ast.Constant(offset)], []), node)

    def visit_Attribute(self, node):
        out = self._param_read(node)
        if out is not None:
            return out
        if self.params is not None and isinstance(node.value, ast.Name) and node.value.id == self.params.data:
            return node  # another field of the data struct
        self.generic_visit(node)
        return node

    def visit_Name(self, node):
        if self.params is not None and node.id == self.params.data and isinstance(node.ctx, ast.Load):
            self.params.fail(node, f"with parameters, the energy must read its data struct '{node.id}' field by field "
                                   f"(a helper function given '{node.id}' would hide the parameter reads)")  # fmt: skip
        return node

    def visit_Constant(self, node):
        # float literals take the problem's scalar type (a bare literal would be float32)
        if isinstance(node.value, float):
            return ast.copy_location(ast.Call(ast.Name("_wm_S", ast.Load()), [node], []), node)
        return node

    def visit_UnaryOp(self, node):
        self.generic_visit(node)
        if isinstance(node.op, ast.USub) and not isinstance(node.operand, ast.Constant):
            return ast.copy_location(ast.Call(ast.Name("_wm_neg", ast.Load()), [node.operand], []), node)
        return node

    def visit_Compare(self, node):
        self.generic_visit(node)
        known = (*_COMPARE, ast.Eq, ast.NotEq) if self.equality else tuple(_COMPARE)
        if not all(isinstance(op, known) for op in node.ops):
            return node
        operands = [node.left, *node.comparators]
        calls = [self._compare(op, operands[i], operands[i + 1]) for i, op in enumerate(node.ops)]
        out = calls[0] if len(calls) == 1 else ast.BoolOp(ast.And(), calls)
        return ast.copy_location(out, node)

    @staticmethod
    def _compare(op, a, b):
        def call(name):
            return ast.Call(ast.Name(name, ast.Load()), [a, b], [])

        if isinstance(op, (ast.Eq, ast.NotEq)):
            equal = ast.BoolOp(ast.And(), [call("_wm_le"), call("_wm_ge")])
            return equal if isinstance(op, ast.Eq) else ast.UnaryOp(ast.Not(), equal)
        return call(_COMPARE[type(op)])

    def visit_Subscript(self, node):
        out = self._param_read(node)
        if out is not None:
            return out
        self.generic_visit(node)
        if not isinstance(node.ctx, ast.Load):
            return node
        index = node.slice
        if isinstance(index, ast.Tuple):
            if len(index.elts) != 2:
                return node
            args = [node.value, *index.elts]
            name = "_wm_index2"
        elif isinstance(index, ast.Slice):
            return node
        else:
            args = [node.value, index]
            name = "_wm_index"
        return ast.copy_location(ast.Call(ast.Name(name, ast.Load()), args, []), node)

    def visit_Return(self, node):
        # every return of the energy itself goes through _wm_ret (a dual constant in dual modes), so
        # `return wp.float64(wp.inf)` beside a dual return has one type
        self.generic_visit(node)
        if self.wrap_returns and node.value is not None:
            node.value = ast.copy_location(ast.Call(ast.Name("_wm_ret", ast.Load()), [node.value], []), node.value)
        return node

    def visit_FunctionDef(self, node):
        if self.depth > 0:  # nested definitions are not Warp code; leave them alone
            return node
        self.depth += 1
        self.generic_visit(node)
        self.depth -= 1
        return node

    def visit_Call(self, node):
        self.generic_visit(node)
        if isinstance(node.func, ast.Name) and node.func.id in self.helper_names:
            self.calls.add(node.func.id)
        f = node.func
        if (
            isinstance(f, ast.Attribute)
            and isinstance(f.value, ast.Name)
            and f.value.id in self.warp_names
            and f.attr in _WP_TO_AD
        ):
            node.func = ast.copy_location(ast.Attribute(ast.Name("_wm_ad", ast.Load()), _WP_TO_AD[f.attr], ast.Load()), f)
        return node


def _function_source(fn) -> tuple[ast.FunctionDef, str]:
    try:
        src = textwrap.dedent(inspect.getsource(fn))
    except (OSError, TypeError) as exc:
        raise ValueError(f"cannot read the source of energy {fn.__name__!r}: define it in a file") from exc
    tree = ast.parse(src)
    fdef = tree.body[0]
    if not isinstance(fdef, ast.FunctionDef):
        raise ValueError(f"energy {fn.__name__!r} must be a function defined with def")
    fdef.decorator_list = []
    return fdef, src


def _scope(fn) -> dict:
    scope = dict(fn.__globals__)
    if fn.__closure__:
        for name, cell in zip(fn.__code__.co_freevars, fn.__closure__):
            try:
                scope[name] = cell.cell_contents
            except ValueError:
                pass
    return scope


def _is_user_function(obj) -> bool:
    if not isinstance(obj, wp.Function) or obj.func is None:
        return False
    mod = getattr(obj.func, "__module__", "") or ""
    return not (mod.startswith("warp.") or mod == "warp" or mod.startswith("warp_meshad.kernels._generated"))


def _namespace_globals(scope: dict, ns, scalar) -> dict:
    """Copy of a user's scope with operators and the ``ad`` namespace bound to ``ns``."""
    from warp_meshad.kernels import ad as public_ad

    out = dict(scope)
    out["_wm_S"] = getattr(ns, "S", None) or scalar
    out["_wm_ret"] = getattr(ns, "const", None) or ns.value
    out["_wm_ad"] = ns
    for name in ENERGY_NAMES:
        out[name] = getattr(ns, name)
    plain = public_ad._plain
    for name, val in scope.items():
        if val is public_ad:
            out[name] = ns
        elif isinstance(val, wp.Function) and getattr(plain, getattr(val, "key", ""), None) is val:
            out[name] = getattr(ns, val.key)
    return out


def _helper(fn_obj: wp.Function, ns, module, stack, scalar):
    """Rewritten copy of a user helper function called from an energy (kept generic)."""
    key = (id(fn_obj), id(ns), module.name, scalar.__name__)
    hit = _cache.get(key)
    if hit is not None:
        return hit
    if fn_obj in stack:
        raise ValueError(f"recursive Warp function {fn_obj.key!r} is not supported in energies")
    fdef, _ = _function_source(fn_obj.func)
    scope = _scope(fn_obj.func)
    return _compile(fdef, scope, ns, module, fn_obj.func, None, stack + [fn_obj], key, scalar)


class _ParameterReads:
    """The parameter fields of a ``mixed``-mode instance: where each is seeded among the duals."""

    def __init__(self, fdef, orig, fields: dict):
        names = [a.arg for a in fdef.args.args]
        self.element, self.data = names[0], names[-1]
        self.fields = fields  # name -> (first dual entry, per element)
        self.where = (inspect.getsourcefile(orig) or "<energy>", orig.__code__.co_firstlineno, orig.__name__)

    def fail(self, node, why: str):
        file, first, name = self.where
        line = first + getattr(node, "lineno", 1) - 1
        raise ValueError(f"{file}:{line}: energy {name!r}: {why}")


def _compile(fdef, scope, ns, module, orig, arg_types, stack, cache_key, scalar, params=None):
    helpers = {n for n, v in scope.items() if _is_user_function(v)}
    warp_names = [n for n, v in scope.items() if v is wp]
    rw = _Rewriter(helpers, wrap_returns=arg_types is not None, warp_names=warp_names, equality=hasattr(ns, "Dual"))
    if params:
        rw.params = _ParameterReads(fdef, orig, params)
    fdef = rw.visit(fdef)
    glb = _namespace_globals(scope, ns, scalar)
    if params:
        glb["_wm_seed"] = ns.seed
    for name in rw.calls:
        glb[name] = _helper(scope[name], ns, module, stack, scalar)
    if arg_types is not None:
        for arg, t in zip(fdef.args.args, arg_types):
            if t is not None:
                glb[f"_wm_T_{arg.arg}"] = t
                arg.annotation = ast.Name(f"_wm_T_{arg.arg}", ast.Load())
    # the name's digest comes from the source text, not ast.dump (whose fields change between Python versions,
    # e.g. FunctionDef.type_params in 3.12): the kernel-cache hash then matches across Python versions
    digest = hashlib.sha1(ast.unparse(fdef).encode() + module.name.encode()).hexdigest()[:10]
    fdef.name = f"{orig.__name__}_{digest}"
    tree = ast.fix_missing_locations(ast.Module([fdef], []))
    src = ast.unparse(tree)
    filename = inspect.getsourcefile(orig) or "<energy>"
    code = compile(tree, filename, "exec", dont_inherit=True)
    exec(code, glb)
    pyfn = glb[fdef.name]
    pyfn.__module__ = module.name
    fn = register_function(pyfn, fdef.name, module, src)
    first = orig.__code__.co_firstlineno
    remember(fdef.name, filename, orig.__name__, first, _line_map(fdef, src, first))
    _cache[cache_key] = fn
    return fn


def _line_map(fdef: ast.FunctionDef, src: str, first: int) -> dict[int, int]:
    """Line of each statement in the rewritten text ``src`` (which Warp parses, 1-based) -> its line in the user's
    file. ``fdef`` is the rewritten tree, its lines counted from the user's function's first line ``first``."""
    def statements(tree):
        return [n for n in ast.walk(tree) if isinstance(n, ast.stmt)]

    ours, users = statements(ast.parse(src).body[0]), statements(fdef)
    if len(ours) != len(users):
        return {}
    return {a.lineno: first + b.lineno - 1 for a, b in zip(ours, users)}


class EnergyInfo:
    """Signature facts of a user energy: argument count and whether it takes a data struct."""

    def __init__(self, name: str, arg_names: list[str]):
        self.name = name
        self.arg_names = arg_names


def describe_energy(energy, argument: str = "energy") -> EnergyInfo:
    """Check that ``energy`` is a Warp function and return its argument names.

    Raises:
        TypeError: when ``energy`` is not a ``@wp.func``.
    """
    if not isinstance(energy, wp.Function) or energy.func is None:
        raise TypeError(
            f"{argument} must be a function decorated with @wp.func, got {type(energy).__name__} {energy!r}"
        )
    spec = inspect.getfullargspec(energy.func)
    return EnergyInfo(energy.func.__name__, list(spec.args))


def instantiate(energy: wp.Function, ns, arg_types: list, module, scalar=wp.float64, params: dict | None = None) -> wp.Function:
    """Concrete copy of ``energy`` for one evaluation mode.

    Args:
        energy: the user's ``@wp.func``.
        ns: generated namespace module (plain or dual) from :mod:`warp_meshad.kernels._dualgen`.
        arg_types: one entry per energy argument: a type to annotate with, or None to keep the
            user's annotation.
        module: Warp module the instance (and any rewritten helpers) is registered in.
        scalar: the problem's scalar type: float literals in the energy are converted to it.
        params: parameter fields of the data struct (the ``mixed`` mode): name -> (first dual entry, per element).
            The energy's reads ``data.f[e]`` (per element) and ``data.f`` (shared) of these fields become duals
            seeded from that entry on; any other use of a parameter field, or of the data struct as a whole, is
            an error naming the energy's file and line.

    Returns:
        The Warp function to call from a generated kernel.
    """
    key = (id(energy), id(ns), tuple(id(t) for t in arg_types), module.name, scalar.__name__, repr(params))
    hit = _cache.get(key)
    if hit is not None:
        return hit
    fdef, _ = _function_source(energy.func)
    scope = _scope(energy.func)
    return _compile(fdef, scope, ns, module, energy.func, arg_types, [energy], key, scalar, params)
