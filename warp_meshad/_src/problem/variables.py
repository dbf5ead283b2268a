"""The variables of a problem: their Warp types, readable type names, and the checks of arrays against them.

These are the public validation helpers of the problem package: :class:`~warp_meshad.Problem`, the parameter
derivatives, interaction terms and the implicit gradient all check their inputs here, with one wording.
"""

from __future__ import annotations

import numpy as np
import warp as wp

__all__ = ["check_elements", "check_variable_array", "dtype_name", "variable_types"]

_NAMED_VECTORS = {
    (2, wp.float32): wp.vec2f, (3, wp.float32): wp.vec3f, (4, wp.float32): wp.vec4f,
    (2, wp.float64): wp.vec2d, (3, wp.float64): wp.vec3d, (4, wp.float64): wp.vec4d,
}
_NAMED_MATRICES = {
    (2, wp.float32): wp.mat22f, (3, wp.float32): wp.mat33f, (4, wp.float32): wp.mat44f,
    (2, wp.float64): wp.mat22d, (3, wp.float64): wp.mat33d, (4, wp.float64): wp.mat44d,
}


def dtype_name(t) -> str:
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


def variable_types(variable_dim: int, dtype) -> tuple[type, type]:
    """(variable dtype, Hessian block dtype) of variables of ``variable_dim`` scalars of ``dtype``: the scalar
    itself for ``variable_dim == 1``, else ``vec{d}`` and ``mat{d}{d}`` (Warp's named types where they exist)."""
    d = variable_dim
    if d == 1:
        return dtype, dtype
    vec = _NAMED_VECTORS.get((d, dtype)) or wp.types.vector(length=d, dtype=dtype)
    mat = _NAMED_MATRICES.get((d, dtype)) or wp.types.matrix(shape=(d, d), dtype=dtype)
    return vec, mat


def check_variable_array(x, argname: str, fn: str, count: int, variable_type, device) -> None:
    """Check that ``x`` is a wp.array of shape (count,) and dtype ``variable_type`` on ``device``.

    Args:
        x: the argument given.
        argname, fn: the argument's name and the function called, for messages.
        count, variable_type, device: what the problem expects (its ``variable_count``, ``variable_type``, ``device``).

    Raises:
        TypeError: ``x`` is not a wp.array.
        ValueError: naming the expected and the given shape, dtype or device.
    """
    want = f"a wp.array of shape ({count},), dtype {dtype_name(variable_type)}, on device {device}"
    if not isinstance(x, wp.array):
        raise TypeError(f"{fn}({argname}=...) must be {want}; got {type(x).__name__}")
    if x.ndim != 1 or x.shape[0] != count:
        raise ValueError(f"{fn}({argname}=...) must be {want}; got shape {x.shape}")
    if not wp.types.types_equal(x.dtype, variable_type):
        raise ValueError(f"{fn}({argname}=...) must be {want}; got dtype {dtype_name(x.dtype)}")
    if x.device != device:
        raise ValueError(f"{fn}({argname}=...) must be {want}; got device {x.device}")


def check_elements(elements, variable_count: int, what: str) -> np.ndarray:
    """Check an element array of variable indices and return it as a contiguous (m, valence) int32 numpy array.

    Args:
        elements: int array (m, valence) (numpy, list or ``wp.array2d``), every index in [0, variable_count).
        variable_count: number of variables.
        what: the calling function, for messages.

    Raises:
        TypeError, ValueError: naming the expected and the given shape, dtype or first out-of-range index.
    """
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
    bad = np.argwhere((arr < 0) | (arr >= variable_count))
    if bad.size:
        e, a = bad[0]
        raise ValueError(
            f"{what}(elements=...) has {len(bad)} indices out of range [0, {variable_count}): "
            f"first elements[{e}, {a}] = {arr[e, a]}"
        )
    return np.ascontiguousarray(arr, dtype=np.int32)
