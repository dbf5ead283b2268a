"""Derivatives in a term's parameters: the parameter fields, their layout in theta, and the mixed-derivative buffers.

A term's data struct fields may be named parameters when the term is added
(``problem.add_term(..., data=d, parameters=("rest", "k"))``). The parameters of all terms form one vector
theta (term by term in the order they were added, field by field in the order named):

* a per-element field, a ``wp.array`` of m (number of elements) scalars, vectors or matrices read by the
  energy as ``data.f[e]``: m * size numbers, element-major (element e's at ``offset + e * size``);
* a shared field, a scalar, vector or matrix member of the struct read as ``data.f``: size numbers.

``Problem.eval_parameter_derivatives(x)`` gives dE/dtheta and the sparse mixed matrix d2E/dx dtheta. The
``mixed`` kernels read the parameters as dual numbers seeded after the element's variables (the energy's
source is rewritten so, see :mod:`warp_meshad._src.codegen.energy_rewrite`): the element's dual Hessian over
(variables, parameters) holds both in its last columns; nothing is differenced. Gradients through a
minimization use them: :func:`warp_meshad._src.solve.implicit.implicit_gradient`.
"""

from __future__ import annotations

import numpy as np
import warp as wp
import warp.sparse as wps

__all__ = ["ParameterField", "ParameterDerivatives", "describe_parameters", "read_values", "write_values"]

_SEEDABLE = "a scalar, a vector of 2-4 or a 2x2 / 3x3 matrix"


class ParameterField:
    """One data field named as a parameter of a term.

    Attributes:
        term: index of the term.
        name: the field's name in the data struct.
        per_element: True for a per-element array (read as ``data.name[e]``), False for a shared field.
        shape: shape of one value: () scalar, (n,) vector, (r, c) matrix.
        size: numbers per value (product of ``shape``).
        offset: first index of the field in theta.
        count: numbers of the field in theta (``m * size`` per element, ``size`` shared).
        dual_offset: first dual entry of the field in the ``mixed`` kernel (after the element's k variables).
    """

    def __init__(self, term, name, per_element, shape, offset, element_count, dual_offset, value_type):
        self.term = term
        self.name = name
        self.per_element = per_element
        self.shape = shape
        self.size = int(np.prod(shape)) if shape else 1
        self.offset = offset
        self.count = element_count * self.size if per_element else self.size
        self.dual_offset = dual_offset
        self.value_type = value_type

    @property
    def slice(self) -> slice:
        return slice(self.offset, self.offset + self.count)

    def __repr__(self) -> str:
        kind = "per element" if self.per_element else "shared"
        return f"ParameterField(term={self.term}, name={self.name!r}, {kind}, shape={self.shape}, theta[{self.offset}:{self.offset + self.count}])"


def _value_shape(t, scalar):
    """Shape of one parameter value of Warp type ``t`` whose scalar is ``scalar``, or None if not seedable."""
    if t is scalar:
        return ()
    if wp.types.type_is_vector(t) and t._wp_scalar_type_ is scalar and t._length_ in (2, 3, 4):
        return (int(t._length_),)
    if wp.types.type_is_matrix(t) and t._wp_scalar_type_ is scalar and tuple(t._shape_) in ((2, 2), (3, 3)):
        return tuple(int(s) for s in t._shape_)
    return None


def describe_parameters(term, names, scalar, first_offset: int, k: int, what: str) -> list[ParameterField]:
    """Check a term's parameter names against its data struct and lay them out in theta.

    Args:
        term: the problem's term (its ``data``, ``data_type`` and element count are read).
        names: field names (a string or a sequence of strings).
        scalar: the problem's scalar type (every parameter's scalar).
        first_offset: theta offset of the term's first parameter.
        k: the element's variable count (dual entries before the parameters).
        what: the calling function, for messages.

    Raises:
        TypeError, ValueError: naming the field and what was expected.
    """
    if isinstance(names, str):
        names = (names,)
    names = list(names)
    if term.data is None:
        raise ValueError(f"{what}(parameters={names}): parameters are fields of the data struct; no data was given")
    if len(set(names)) != len(names):
        raise ValueError(f"{what}(parameters={names}): a field is named twice")
    fields, offset, dual = [], first_offset, k
    struct = term.data_type
    m = term.count
    for name in names:
        if not isinstance(name, str) or name not in struct.vars:
            raise ValueError(
                f"{what}(parameters=...): {name!r} is not a field of {struct.key}; its fields are {sorted(struct.vars)}"
            )
        t = struct.vars[name].type
        if wp.types.is_array(t):
            arr = getattr(term.data, name)
            shape = _value_shape(t.dtype, scalar)
            if shape is None or arr is None or arr.ndim != 1 or arr.shape[0] != m:
                got = "None" if arr is None else f"shape {arr.shape}, dtype {wp.types.type_repr(t.dtype)}"
                raise ValueError(
                    f"{what}(parameters=...): per-element field {name!r} must be a 1-d array of {m} values (one per "
                    f"element), each {_SEEDABLE} of {scalar.__name__}; got {got}"
                )
            f = ParameterField(term.index, name, True, shape, offset, m, dual, t.dtype)
        else:
            shape = _value_shape(t, scalar)
            if shape is None:
                raise ValueError(
                    f"{what}(parameters=...): field {name!r} must be a per-element array or {_SEEDABLE} of "
                    f"{scalar.__name__}; it is {wp.types.type_repr(t)}"
                )
            f = ParameterField(term.index, name, False, shape, offset, m, dual, t)
        fields.append(f)
        offset += f.count
        dual += f.size
    return fields


def parameter_indices(fields: list[ParameterField], m: int) -> np.ndarray:
    """(m, p) int32: the theta index of each of an element's p parameter numbers (the dual order)."""
    cols = []
    e = np.arange(m, dtype=np.int64)[:, None]
    for f in fields:
        c = np.arange(f.size, dtype=np.int64)[None, :]
        cols.append(f.offset + e * f.size + c if f.per_element else np.broadcast_to(f.offset + c, (m, f.size)))
    return np.ascontiguousarray(np.concatenate(cols, axis=1), dtype=np.int32)


def read_values(term, f: ParameterField) -> np.ndarray:
    """The field's current numbers in theta order (float64)."""
    v = getattr(term.data, f.name)
    if f.per_element:
        return v.numpy().astype(np.float64).reshape(-1)
    return np.asarray(v, dtype=np.float64).reshape(-1)


def write_values(term, f: ParameterField, values: np.ndarray) -> None:
    """Write the field's numbers (theta order) into the term's data."""
    if f.per_element:
        arr = getattr(term.data, f.name)
        np_scalar = wp.dtype_to_numpy(getattr(f.value_type, "_wp_scalar_type_", f.value_type))
        arr.assign(np.ascontiguousarray(values.reshape((arr.shape[0], *f.shape)), dtype=np_scalar))
    elif f.shape == ():
        setattr(term.data, f.name, f.value_type(float(values[0])))
    else:
        setattr(term.data, f.name, f.value_type(*[float(v) for v in values]))


class ParameterDerivatives:
    """Buffers of the mixed derivatives of all parameter terms (built on first use).

    Args:
        terms: the problem's terms (those with ``params`` take part).
        variable_count, parameter_count: rows and columns of the mixed matrix.
        variable_dim, dtype: the variables' scalars per variable and scalar type.
        device: where the buffers live.
    """

    def __init__(self, terms, variable_count: int, parameter_count: int, variable_dim: int, dtype, device):
        dev = device
        d = variable_dim
        self.theta_grad = wp.zeros(parameter_count, dtype=dtype, device=dev)
        self.block_type = dtype if d == 1 else wp.types.matrix(shape=(d, 1), dtype=dtype)
        rows, cols, self.segments, self.pidx = [], [], {}, {}
        start = 0
        for t in terms:
            if not t.params:
                continue
            pidx = parameter_indices(t.params, t.count)
            self.pidx[t.index] = wp.array(pidx, dtype=wp.int32, device=dev)
            m, v, p = t.count, t.spec.valence, pidx.shape[1]
            rows.append(np.repeat(t.elements_np.astype(np.int32), p, axis=1).reshape(-1))  # (e, a, j): a-major
            cols.append(np.tile(pidx, (1, v)).reshape(-1))
            self.segments[t.index] = (start, m * v * p)
            start += m * v * p
        self.rows = wp.array(np.concatenate(rows), dtype=wp.int32, device=dev)
        self.cols = wp.array(np.concatenate(cols), dtype=wp.int32, device=dev)
        self.values = wp.zeros(start, dtype=self.block_type, device=dev)
        self.matrix = wps.bsr_zeros(variable_count, parameter_count, self.block_type, device=dev)

    def assemble(self):
        wps.bsr_set_from_triplets(self.matrix, self.rows, self.cols, self.values, prune_numerical_zeros=False)
        return self.matrix
