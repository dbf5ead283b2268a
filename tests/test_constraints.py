"""Dirichlet pins: symmetric, identity on pinned diagonals, pinned unknowns get a zero increment."""

import numpy as np
import pytest
import warp as wp
import warp.sparse as wps

from warp_meshad._src.solve.constraints import apply_dirichlet, fixed_mask_from_indices, zero_fixed_rows
from warp_meshad._src.solve.linear import ScipySolver

wp.config.log_level = wp.LOG_WARNING


def _system(n=12, bs=3, seed=0):
    """SPD block system on a ring + chords pattern (diagonal always stored)."""
    rng = np.random.default_rng(seed)
    pairs = {(i, (i + 1) % n) for i in range(n)} | {(i, (i + 3) % n) for i in range(n)}
    rows, cols, blocks = [], [], []
    for i, j in sorted(pairs):
        m = rng.standard_normal((bs, bs))
        k = m @ m.T + 0.1 * np.eye(bs)
        for r, c, s in ((i, i, 1), (j, j, 1), (i, j, -1), (j, i, -1)):
            rows.append(r)
            cols.append(c)
            blocks.append(s * k)
    for i in range(n):
        rows.append(i)
        cols.append(i)
        blocks.append(np.eye(bs))
    block_type = wp.float64 if bs == 1 else wp.types.matrix(shape=(bs, bs), dtype=wp.float64)
    vec_type = wp.float64 if bs == 1 else wp.types.vector(length=bs, dtype=wp.float64)
    vals = np.array(blocks).reshape(-1) if bs == 1 else np.array(blocks)
    A = wps.bsr_from_triplets(
        n, n, wp.array(rows, dtype=int), wp.array(cols, dtype=int), wp.array(vals, dtype=block_type)
    )
    b_np = rng.standard_normal((n, bs)) if bs > 1 else rng.standard_normal(n)
    return A, wp.array(b_np, dtype=vec_type), vec_type


def _dense(A):
    nnz = A.nnz_sync()
    bs = A.block_shape[0]
    vals = A.values.numpy()[:nnz].reshape(nnz, bs, bs)
    import scipy.sparse as sps

    return sps.bsr_matrix((vals, A.columns.numpy()[:nnz], A.offsets.numpy()[: A.nrow + 1]), shape=A.shape).toarray()


@pytest.mark.parametrize("bs", [1, 3])
@pytest.mark.parametrize("mask_dtype", [wp.int32, wp.uint8, wp.bool])
def test_dirichlet_symmetric_identity_and_zero_increment(bs, mask_dtype):
    n = 12
    A, b, vec_type = _system(n=n, bs=bs, seed=bs)
    before = _dense(A)
    pinned = [0, 5, 7]
    mask_np = np.zeros(n, dtype=np.int32)
    mask_np[pinned] = 1
    fixed = wp.array(mask_np.astype(bool) if mask_dtype == wp.bool else mask_np, dtype=mask_dtype)
    apply_dirichlet(A, b, fixed)
    after = _dense(A)

    np.testing.assert_allclose(after, after.T, rtol=0, atol=0)
    dof = np.repeat(mask_np.astype(bool), bs)
    np.testing.assert_array_equal(after[np.ix_(dof, dof)], np.eye(dof.sum()))
    assert not after[np.ix_(dof, ~dof)].any() and not after[np.ix_(~dof, dof)].any()
    np.testing.assert_array_equal(after[np.ix_(~dof, ~dof)], before[np.ix_(~dof, ~dof)])
    b_after = b.numpy().reshape(-1)
    assert not b_after[dof].any()

    x = wp.zeros(n, dtype=vec_type)
    ScipySolver().solve(A, b, x)
    x_np = x.numpy().reshape(-1)
    assert not x_np[dof].any()
    free = np.linalg.solve(before[np.ix_(~dof, ~dof)], b_after[~dof])
    np.testing.assert_allclose(x_np[~dof], free, rtol=1e-10, atol=1e-12)


def test_dirichlet_without_rhs_and_custom_diagonal():
    A, b, _ = _system(seed=4)
    fixed = fixed_mask_from_indices([2, 2, 9], A.nrow)
    apply_dirichlet(A, None, fixed, diagonal=5.0)
    dense = _dense(A)
    np.testing.assert_array_equal(dense[6:9, 6:9], 5.0 * np.eye(3))
    np.testing.assert_allclose(dense, dense.T, rtol=0, atol=0)


def test_zero_fixed_rows_and_mask_builder():
    mask = fixed_mask_from_indices(np.array([1, 3]), 5)
    assert mask.dtype == wp.int32
    np.testing.assert_array_equal(mask.numpy(), [0, 1, 0, 1, 0])
    v = wp.array(np.ones((5, 2)), dtype=wp.vec2d)
    zero_fixed_rows(v, mask)
    np.testing.assert_array_equal(v.numpy()[:, 0], [1, 0, 1, 0, 1])
    np.testing.assert_array_equal(fixed_mask_from_indices([], 3).numpy(), [0, 0, 0])


def test_validation_messages():
    A, b, _ = _system(n=6)
    with pytest.raises(ValueError, match=r"indices: expected variable indices in \[0, 6\) \(the problem's variable_count\), got min 0, max 6"):
        fixed_mask_from_indices([0, 6], 6)
    with pytest.raises(ValueError, match=r"fixed: expected shape \(6,\), got \(5,\)"):
        apply_dirichlet(A, b, wp.zeros(5, dtype=wp.int32))
    with pytest.raises(TypeError, match="fixed: expected dtype"):
        apply_dirichlet(A, b, wp.zeros(6, dtype=wp.float32))
    with pytest.raises(TypeError, match="b: expected dtype vec3d, got vec3f"):
        apply_dirichlet(A, wp.zeros(6, dtype=wp.vec3f), wp.zeros(6, dtype=wp.int32))


@pytest.mark.gpu
@pytest.mark.cpu  # the reference system is on the CPU whatever the test device
def test_dirichlet_gpu_matches_cpu():
    A, b, _ = _system(seed=7)
    assert A.device.is_cpu
    A_gpu = wps.bsr_from_triplets(
        A.nrow,
        A.ncol,
        wp.array(A.uncompress_rows().numpy()[: A.nnz], dtype=int, device="cuda:0"),
        wp.array(A.columns.numpy()[: A.nnz], dtype=int, device="cuda:0"),
        wp.array(A.values.numpy()[: A.nnz], dtype=A.values.dtype, device="cuda:0"),
    )
    b_gpu = wp.array(b.numpy(), dtype=b.dtype, device="cuda:0")
    fixed = fixed_mask_from_indices([1, 4], A.nrow)
    apply_dirichlet(A, b, fixed)
    apply_dirichlet(A_gpu, b_gpu, fixed_mask_from_indices([1, 4], A.nrow, device="cuda:0"))
    np.testing.assert_array_equal(_dense(A_gpu), _dense(A))
    np.testing.assert_array_equal(b_gpu.numpy(), b.numpy())


@pytest.mark.parametrize("caller", ["NewtonSolver", "implicit_gradient"])
def test_bad_fixed_index_names_the_argument_and_the_function(caller):
    import warp_meshad as wm
    from test_parameters import spring_problem

    mesh = wm.TriMesh.grid(2, 3)
    p = spring_problem(mesh, device="cpu")
    want = rf"{caller}\(fixed=\.\.\.\): expected variable indices in \[0, 6\) \(the problem's variable_count\), got min 0, max 99"
    with pytest.raises(ValueError, match=want):
        if caller == "NewtonSolver":
            wm.NewtonSolver(p, fixed=[0, 99])
        else:
            x = wp.array(mesh.vertices, dtype=wp.vec3d, device="cpu")
            wm.implicit_gradient(p, x, wp.zeros(6, dtype=wp.vec3d, device="cpu"), fixed=[0, 99])
