"""Dirichlet pins (fixed variables) on a block-sparse linear system, in place and symmetric.

A pinned variable never moves: in the Newton system ``H d = -g`` its block row and block column are zeroed, its
diagonal block becomes the identity and its right-hand side becomes zero, so the solve gives it a zero increment while
the matrix stays symmetric (and SPD when the free part is), which CG and Cholesky need. Everything runs in Warp
kernels on the matrix's device, with no host round trip.
"""


import numpy as np
import warp as wp
import warp.sparse as wps

from warp_meshad._src.solve.linear import block_row_of

__all__ = ["apply_dirichlet", "fixed_indices", "fixed_mask_from_indices", "zero_fixed_rows"]

_MASK_DTYPES = (wp.int32, wp.uint8, wp.bool)


_matrix_kernels: dict = {}
_vector_kernels: dict = {}


def _matrix_kernel(block_type, mask_type):
    key = (block_type, mask_type)
    if key in _matrix_kernels:
        return _matrix_kernels[key]
    scalar = getattr(block_type, "_wp_scalar_type_", block_type)
    is_scalar = scalar == block_type
    bs = 1 if is_scalar else block_type._shape_[0]

    if is_scalar:

        def _pin_blocks(
            offsets: wp.array(dtype=int),
            columns: wp.array(dtype=int),
            nrow: int,
            fixed: wp.array(dtype=mask_type),
            diagonal: scalar,
            values: wp.array(dtype=block_type),
        ):
            # one thread per stored block: zero it if its row or column is pinned, `diagonal` on a pinned diagonal
            k = wp.tid()
            if k >= offsets[nrow]:
                return
            r = block_row_of(offsets, nrow, k)
            c = columns[k]
            if fixed[r] or fixed[c]:
                if r == c:
                    values[k] = diagonal
                else:
                    values[k] = scalar(0.0)

    else:

        def _pin_blocks(
            offsets: wp.array(dtype=int),
            columns: wp.array(dtype=int),
            nrow: int,
            fixed: wp.array(dtype=mask_type),
            diagonal: scalar,
            values: wp.array(dtype=block_type),
        ):
            # one thread per stored block: zero it if its row or column is pinned, `diagonal` * I on a pinned diagonal
            k = wp.tid()
            if k >= offsets[nrow]:
                return
            r = block_row_of(offsets, nrow, k)
            c = columns[k]
            if fixed[r] or fixed[c]:
                if r == c:
                    values[k] = wp.identity(n=bs, dtype=scalar) * diagonal
                else:
                    values[k] = block_type(scalar(0.0))

    kernel = wp.kernel(_pin_blocks, enable_backward=False, module="unique")
    _matrix_kernels[key] = kernel
    return kernel


def _vector_kernel(vec_type, mask_type):
    key = (vec_type, mask_type)
    if key in _vector_kernels:
        return _vector_kernels[key]
    scalar = getattr(vec_type, "_wp_scalar_type_", vec_type)

    def _zero_rows(fixed: wp.array(dtype=mask_type), b: wp.array(dtype=vec_type)):
        # one thread per variable: zero its entry of b when pinned
        i = wp.tid()
        if fixed[i]:
            b[i] = vec_type(scalar(0.0))

    kernel = wp.kernel(_zero_rows, enable_backward=False, module="unique")
    _vector_kernels[key] = kernel
    return kernel


def _check_mask(fixed, n: int, device) -> None:
    if not isinstance(fixed, wp.array):
        raise TypeError(f"fixed: expected a wp.array mask (int32/uint8/bool), got {type(fixed).__name__}")
    if fixed.dtype not in _MASK_DTYPES:
        names = [t.__name__ for t in _MASK_DTYPES]
        raise TypeError(f"fixed: expected dtype in {names}, got {getattr(fixed.dtype, '__name__', fixed.dtype)}")
    if fixed.ndim != 1 or fixed.shape[0] != n:
        raise ValueError(f"fixed: expected shape ({n},), got {fixed.shape}")
    if fixed.device != device:
        raise ValueError(f"fixed: expected device {device}, got {fixed.device}")


def zero_fixed_rows(b: wp.array, fixed: wp.array) -> wp.array:
    """Zero the entries of ``b`` at pinned variables, in place.

    Args:
        b: block vector, shape ``[n]``, dtype ``vec{k}{f|d}`` or a float scalar.
        fixed: pin mask, shape ``[n]``, dtype int32, uint8 or bool (non-zero = pinned), on b's device.

    Returns:
        ``b``.
    """
    if not isinstance(b, wp.array) or b.ndim != 1:
        raise TypeError(f"b: expected a 1-d wp.array, got {type(b).__name__} of shape {getattr(b, 'shape', None)}")
    _check_mask(fixed, b.shape[0], b.device)
    if b.shape[0] > 0:
        wp.launch(_vector_kernel(b.dtype, fixed.dtype), dim=b.shape[0], inputs=[fixed, b], device=b.device)
    return b


def apply_dirichlet(A: wps.BsrMatrix, b: wp.array | None, fixed: wp.array, diagonal: float = 1.0) -> None:
    """Pin whole variables of the block system ``A x = b`` in place, keeping ``A`` symmetric.

    For every pinned variable ``i``: the stored blocks of block row ``i`` and block column ``i`` are zeroed, the
    diagonal block ``(i, i)`` becomes ``diagonal * I`` and ``b[i]`` becomes zero. The solution then has ``x[i] = 0``
    and the other unknowns solve the system restricted to the free variables. The diagonal block of each pinned
    variable must be stored in the pattern (Hessian patterns always store the diagonal).

    Args:
        A: square BSR matrix, ``n x n`` blocks of ``k x k`` (or 1x1 scalars), float32/float64; modified in place.
        b: right-hand side, shape ``[n]``, dtype ``vec{k}`` of A's scalar type (scalar for 1x1 blocks), or None.
        fixed: pin mask, shape ``[n]``, dtype int32, uint8 or bool (non-zero = pinned), on A's device.
        diagonal: value put on the diagonal of pinned rows (1.0; use a value of the order of the matrix's diagonal to
            keep iterative solvers well conditioned).
    """
    if not isinstance(A, wps.BsrMatrix):
        raise TypeError(f"A: expected a warp.sparse.BsrMatrix, got {type(A).__name__}")
    rows, cols = A.block_shape
    if rows != cols or A.nrow != A.ncol:
        raise ValueError(f"A: expected a square matrix of square blocks, got {A.nrow}x{A.ncol} blocks of {A.block_shape}")
    if getattr(A, "row_counts", None) is not None:
        raise ValueError("A: expected a compact BsrMatrix (row_counts None), got a padded one")
    _check_mask(fixed, A.nrow, A.device)
    if b is not None:
        if not isinstance(b, wp.array) or b.shape != (A.nrow,):
            raise ValueError(f"b: expected a wp.array of shape ({A.nrow},), got {getattr(b, 'shape', type(b).__name__)}")
        expected = A.scalar_type if rows == 1 else wp.types.vector(length=rows, dtype=A.scalar_type)
        if not wp.types.types_equal(b.dtype, expected):
            raise TypeError(f"b: expected dtype {wp.types.type_repr(expected)}, got {wp.types.type_repr(b.dtype)}")
        if b.device != A.device:
            raise ValueError(f"b: expected device {A.device}, got {b.device}")
    if A.nnz > 0 and A.nrow > 0:
        kernel = _matrix_kernel(A.values.dtype, fixed.dtype)
        wp.launch(
            kernel,
            dim=A.nnz,
            inputs=[A.offsets, A.columns, A.nrow, fixed, A.scalar_type(diagonal), A.values],
            device=A.device,
        )
    if b is not None:
        zero_fixed_rows(b, fixed)


def fixed_indices(fixed) -> np.ndarray | None:
    """The sorted unique indices of a ``fixed=`` argument (sequence, numpy or wp.array of ints), or None for None or
    no index."""
    if fixed is None:
        return None
    idx = np.unique(np.asarray(fixed.numpy() if isinstance(fixed, wp.array) else fixed, dtype=np.int64).reshape(-1))
    return idx if idx.size else None


def fixed_mask_from_indices(indices, variable_count: int, device=None, what: str = "indices") -> wp.array:
    """Build a pin mask from variable indices.

    Args:
        indices: indices of the pinned variables: a sequence, numpy array or wp.array of ints in
            ``[0, variable_count)``; duplicates are allowed; may be empty.
        variable_count: number of variables ``n``.
        device: device of the mask (default ``wp.get_device()``).
        what: how error messages name the indices (the caller's argument, e.g. ``"NewtonSolver(fixed=...)"``).

    Returns:
        wp.array of shape ``[variable_count]``, dtype int32: 1 at pinned variables, 0 elsewhere.
    """
    if isinstance(indices, wp.array):
        idx = indices.numpy()
    else:
        idx = np.asarray(indices if indices is not None else [])
    idx = idx.reshape(-1)
    if idx.size and not np.issubdtype(idx.dtype, np.integer):
        raise TypeError(f"{what}: expected integers, got dtype {idx.dtype}")
    variable_count = int(variable_count)
    if variable_count < 0:
        raise ValueError(f"variable_count: expected >= 0, got {variable_count}")
    if idx.size and (idx.min() < 0 or idx.max() >= variable_count):
        raise ValueError(
            f"{what}: expected variable indices in [0, {variable_count}) (the problem's variable_count), got min "
            f"{int(idx.min())}, max {int(idx.max())}"
        )
    mask = np.zeros(variable_count, dtype=np.int32)
    mask[idx.astype(np.int64)] = 1
    return wp.array(mask, dtype=wp.int32, device=device)
