"""warp_meshad.torch: a Problem's energy and gradient as torch autograd Functions.

Checked against torch's own finite differences (gradcheck, gradgradcheck in float64), against the problem's own
eval / eval_with_gradient / hessian_vector_product, for aliasing (inputs handed over without a copy, outputs not
aliasing the problem's reused buffers), and for the boundary's errors. Mass springs on a 4x4 grid (three Warp
modules in float64: energy, gradient, Hessian-vector product; two in float32) and one scalar-variable chain (two).
"""

import subprocess
import sys
from typing import Any

import numpy as np
import pytest
import warp as wp

torch = pytest.importorskip("torch")

import warp_meshad as wm  # noqa: E402
import warp_meshad.torch as wmt  # noqa: E402
from warp_meshad.kernels import ad  # noqa: E402
from warp_meshad.kernels.energies import MassSpringData, mass_spring  # noqa: E402


@wp.func
def _quartic_chain(e: int, a: Any, b: Any):
    """(a - b)^4 / 4 + a b / 2 on scalar variables (Hessian depends on x)."""
    d = a - b
    return 0.25 * ad.sq(d) * ad.sq(d) + 0.5 * a * b


def _springs(device: str, dtype=wp.float64):
    """Mass springs (k = 3, rest 1.1 x the grid's edge lengths) on a 4x4 grid, and a perturbed point (16, 3)."""
    mesh = wm.TriMesh.grid(4, 4)
    data = MassSpringData(dtype)
    data.rest = wp.array(1.1 * mesh.edge_lengths(), dtype=dtype, device=device)
    data.stiffness = dtype(3.0)
    problem = wm.Problem(mesh.vertex_count, variable_dim=3, dtype=dtype, device=device)
    problem.add_term(mesh.edges, mass_spring, data)
    x = mesh.vertices + 0.1 * np.random.default_rng(3).normal(size=mesh.vertices.shape)
    return problem, x


def _tensor(x: np.ndarray, device: str, requires_grad: bool = True):
    return torch.tensor(x, dtype=torch.float64, device=wp.device_to_torch(device), requires_grad=requires_grad)


def test_energy_and_gradient_match_the_problem(device):
    problem, x0 = _springs(device)
    f, g = problem.eval_with_gradient(wp.array(x0, dtype=wp.vec3d, device=device))
    g = g.numpy().copy()
    x = _tensor(x0, device)
    e = wmt.energy(problem, x)
    assert e.shape == () and e.dtype == torch.float64 and e.device == x.device
    np.testing.assert_allclose(e.item(), f, rtol=1e-13)
    assert f > 0 and np.abs(g).max() > 1e-3  # not at rest: the springs are stretched and compressed
    (3.0 * e).backward()
    np.testing.assert_allclose(x.grad.cpu().numpy(), 3.0 * g, rtol=1e-12, atol=1e-14)
    out = wmt.gradient(problem, x.detach())
    assert out.shape == x.shape and out.dtype == x.dtype and out.device == x.device
    np.testing.assert_allclose(out.cpu().numpy(), g, rtol=1e-12, atol=1e-14)


def test_energy_composes_with_torch_terms(device):
    problem, x0 = _springs(device)
    _, g = problem.eval_with_gradient(wp.array(x0, dtype=wp.vec3d, device=device))
    target = np.random.default_rng(8).normal(size=x0.shape)
    x = _tensor(x0, device)
    loss = wmt.energy(problem, x) + 0.5 * (x - _tensor(target, device, requires_grad=False)).square().sum()
    loss.backward()
    np.testing.assert_allclose(x.grad.cpu().numpy(), g.numpy() + x0 - target, rtol=1e-12, atol=1e-14)


def test_gradcheck_and_gradgradcheck(device):
    problem, x0 = _springs(device)
    x = _tensor(x0, device)
    # on a GPU the atomic assembly sums in a varying order: backward repeats to round-off, not bitwise
    tol = dict(eps=1e-6, atol=1e-6, rtol=1e-5, nondet_tol=1e-12)
    assert torch.autograd.gradcheck(lambda y: wmt.energy(problem, y), (x,), **tol)
    assert torch.autograd.gradgradcheck(lambda y: wmt.energy(problem, y), (x,), **tol)
    assert torch.autograd.gradcheck(lambda y: wmt.gradient(problem, y), (x,), **tol)


def test_double_backward_is_the_problems_hessian_vector_product(device):
    problem, x0 = _springs(device)
    v0 = np.random.default_rng(4).normal(size=x0.shape)
    hv = problem.hessian_vector_product(
        wp.array(x0, dtype=wp.vec3d, device=device), wp.array(v0, dtype=wp.vec3d, device=device)
    ).numpy().copy()
    x = _tensor(x0, device)
    (g,) = torch.autograd.grad(wmt.energy(problem, x), x, create_graph=True)
    (h,) = torch.autograd.grad(g, x, grad_outputs=_tensor(v0, device, requires_grad=False))
    np.testing.assert_allclose(h.cpu().numpy(), hv, rtol=1e-12, atol=1e-12)
    # a third derivative: it says so rather than dropping the term
    (g,) = torch.autograd.grad(wmt.energy(problem, x), x, create_graph=True)
    (h,) = torch.autograd.grad(g.sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="third derivatives of the energy"):
        h.sum().backward()


def test_scalar_variables(device):
    el = np.array([[0, 1], [1, 2], [2, 3], [3, 4], [4, 0], [0, 2]])
    problem = wm.Problem(5, variable_dim=1, dtype=wp.float64, device=device)
    problem.add_term(el, _quartic_chain)
    x0 = np.random.default_rng(5).normal(size=5)
    a, b = x0[el[:, 0]], x0[el[:, 1]]
    x = _tensor(x0, device)
    e = wmt.energy(problem, x)
    np.testing.assert_allclose(e.item(), np.sum(0.25 * (a - b) ** 4 + 0.5 * a * b), rtol=1e-13)
    e.backward()
    _, g = problem.eval_with_gradient(wp.array(x0, dtype=wp.float64, device=device))
    assert x.grad.shape == (5,)
    np.testing.assert_allclose(x.grad.cpu().numpy(), g.numpy(), rtol=1e-12, atol=1e-14)
    assert torch.autograd.gradcheck(lambda y: wmt.energy(problem, y), (x,), eps=1e-6, atol=1e-6, rtol=1e-5)


class _Spy:
    """Records the wp.arrays a problem method is called with, and calls it."""

    def __init__(self, method):
        self.method, self.calls = method, []

    def __call__(self, *arrays):
        self.calls.append(arrays)
        return self.method(*arrays)


def test_inputs_are_handed_over_without_a_copy(device, monkeypatch):
    problem, x0 = _springs(device)
    spies = {name: _Spy(getattr(problem, name)) for name in ("eval", "eval_with_gradient", "hessian_vector_product")}
    for name, spy in spies.items():
        monkeypatch.setattr(problem, name, spy)
    x = _tensor(x0, device)
    e = wmt.energy(problem, x)
    assert x.grad is None  # wrapping x did not attach a gradient of Warp's own
    e.backward()
    v = _tensor(np.ones_like(x0), device, requires_grad=False)
    torch.autograd.grad(wmt.gradient(problem, x), x, grad_outputs=v)
    [(xe,)] = spies["eval"].calls
    [(xg,), (xg2,)] = spies["eval_with_gradient"].calls
    [(xh, vh)] = spies["hessian_vector_product"].calls
    for a in (xe, xg, xg2, xh):
        assert a.ptr == x.data_ptr() and a.dtype == wp.vec3d and a.shape == (16,)
    assert vh.ptr == v.data_ptr()


def test_outputs_do_not_alias_the_problems_buffers(device):
    """The problem's gradient and product buffers are overwritten by its next evaluation; outputs stay put."""
    problem, x0 = _springs(device)
    x = _tensor(x0, device)
    g1 = wmt.gradient(problem, x)
    kept = g1.detach().clone()
    (h1,) = torch.autograd.grad(g1, x, grad_outputs=torch.ones_like(x))
    kept_h = h1.clone()
    x0_wp = wp.array(x0, dtype=wp.vec3d, device=device)
    buffers = {problem.eval_with_gradient(x0_wp)[1].ptr, problem.hessian_vector_product(x0_wp, x0_wp).ptr}
    assert g1.data_ptr() not in buffers and h1.data_ptr() not in buffers
    wmt.gradient(problem, 2.0 * x.detach())  # overwrites the problem's buffers
    torch.autograd.grad(wmt.gradient(problem, x), x, grad_outputs=2.0 * torch.ones_like(x))
    torch.testing.assert_close(g1.detach(), kept, rtol=0, atol=0)
    torch.testing.assert_close(h1, kept_h, rtol=0, atol=0)


_BAD_INPUTS = {  # case: (make the tensor on a torch device, error, message)
    "not a tensor": (lambda d: np.zeros((16, 3)), TypeError, r"must be a torch.Tensor of shape \(16, 3\).*got ndarray"),
    "flat": (lambda d: torch.zeros(48, dtype=torch.float64, device=d), ValueError, r"got shape \(48,\)"),
    "too few": (lambda d: torch.zeros(15, 3, dtype=torch.float64, device=d), ValueError, r"got shape \(15, 3\)"),
    "dim 2": (lambda d: torch.zeros(16, 2, dtype=torch.float64, device=d), ValueError, r"got shape \(16, 2\)"),
    "float32": (lambda d: torch.zeros(16, 3, device=d), TypeError, r"float64.*got dtype torch.float32"),
    "int": (lambda d: torch.zeros(16, 3, dtype=torch.int64, device=d), TypeError, r"got dtype torch.int64"),
    "meta": (lambda d: torch.zeros(16, 3, dtype=torch.float64, device="meta"), ValueError, r"device .*got device meta"),
    "transposed": (
        lambda d: torch.zeros(3, 16, dtype=torch.float64, device=d).t(),
        ValueError,
        r"got strides \(1, 16\) \(not contiguous: pass .contiguous\(\)",
    ),
    "every other row": (
        lambda d: torch.zeros(32, 3, dtype=torch.float64, device=d)[::2],
        ValueError,
        r"got strides \(6, 1\) \(not contiguous",
    ),
}


@pytest.mark.parametrize("case", list(_BAD_INPUTS))
@pytest.mark.parametrize("fn", ["energy", "gradient"])
def test_bad_inputs_raise_with_what_was_expected(device, fn, case):
    problem, _ = _springs(device)
    make, error, message = _BAD_INPUTS[case]
    with pytest.raises(error, match=message):
        getattr(wmt, fn)(problem, make(wp.device_to_torch(device)))


@pytest.mark.parametrize("fn", ["energy", "gradient"])
def test_a_problem_is_required(fn):
    with pytest.raises(TypeError, match=rf"{fn}\(problem=...\) must be a warp_meshad.Problem; got str"):
        getattr(wmt, fn)("springs", torch.zeros(16, 3, dtype=torch.float64))


def test_float32_problem_takes_float32_tensors(device):
    problem, x0 = _springs(device, dtype=wp.float32)
    with pytest.raises(TypeError, match=r"float32.*got dtype torch.float64 \(convert with \.to\(torch.float32\)\)"):
        wmt.energy(problem, _tensor(x0, device))
    x = _tensor(x0, device).detach().to(torch.float32).requires_grad_()
    e = wmt.energy(problem, x)
    e.backward()
    f, g = problem.eval_with_gradient(wp.array(x0, dtype=wp.vec3f, device=device))
    assert e.dtype == torch.float32 and x.grad.dtype == torch.float32
    np.testing.assert_allclose(e.item(), f, rtol=1e-6)
    np.testing.assert_allclose(x.grad.cpu().numpy(), g.numpy(), rtol=1e-6, atol=1e-6)


@pytest.mark.gpu
def test_tensor_on_another_device_raises():
    cpu_problem, x0 = _springs("cpu")
    with pytest.raises(ValueError, match=r"on the problem's device cpu.*got device cuda:0"):
        wmt.energy(cpu_problem, torch.tensor(x0, dtype=torch.float64, device="cuda:0"))
    cuda_problem, _ = _springs("cuda:0")
    with pytest.raises(ValueError, match=r"on the problem's device cuda:0.*got device cpu"):
        wmt.gradient(cuda_problem, torch.tensor(x0, dtype=torch.float64))


def test_importing_warp_meshad_does_not_import_torch():
    code = "import sys, warp_meshad; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
    assert sorted(wmt.__all__) == ["energy", "gradient", "minimize"]


def test_minimize_is_differentiable_in_the_parameters(device):
    """x*(theta) of a hanging cloth (springs: per-edge rest lengths and a shared stiffness): torch's gradcheck of
    the implicit-differentiation backward against central differences of whole solves."""
    from test_parameters import hanging_cloth

    mesh, X, p, top = hanging_cloth(3)
    theta = torch.tensor(p.get_parameters(), dtype=torch.float64, requires_grad=True)
    assert str(p.device) == device
    x0 = torch.tensor(X, dtype=torch.float64, device=device)
    solver = wm.NewtonSolver(p, linear_solver="scipy", fixed=top)
    weights = torch.tensor(np.random.default_rng(0).normal(size=X.shape), device=device)

    def loss(t):
        return (wmt.minimize(p, t, x0, solver=solver) * weights).sum()

    x_star = wmt.minimize(p, theta, x0, solver=solver)
    np.testing.assert_allclose(x_star[top].detach().cpu().numpy(), X[top])  # the pins held
    assert torch.autograd.gradcheck(loss, (theta,), eps=1e-4, atol=1e-6, rtol=1e-4)
    with pytest.raises(ValueError, match=r"1-d torch.Tensor of problem.parameter_count = %d" % p.parameter_count):
        wmt.minimize(p, theta[:-1], x0, solver=solver)
    with pytest.raises(RuntimeError, match="without converging"):
        wmt.minimize(p, theta, x0, solver=solver, max_iterations=1)


def test_minimize_refuses_a_problem_without_parameters_before_solving(device, monkeypatch):
    problem, x = _springs(device)
    assert problem.parameter_count == 0
    solver = wm.NewtonSolver(problem, linear_solver="scipy")
    monkeypatch.setattr(solver, "solve", lambda *a, **k: pytest.fail("minimize ran the forward solve"))
    with pytest.raises(ValueError, match=r"minimize\(problem=\.\.\.\) needs a problem whose terms have parameters"):
        wmt.minimize(problem, torch.zeros(0, dtype=torch.float64), _tensor(x, device, False), solver=solver)


@pytest.mark.gpu
def test_minimize_backward_with_cudss_runs_on_torchs_autograd_thread():
    """torch runs a backward on its own thread, where cuDSS (nvmath / cuda.core) found no current device: the
    backward with the cudss back-end gives the gradient of the SciPy back-end."""
    pytest.importorskip("nvmath", reason="the cudss back-end needs nvmath-python (pip install warp-meshad[cudss])")
    from test_parameters import hanging_cloth

    with wp.ScopedDevice("cuda:0"):
        mesh, X, p, top = hanging_cloth(3)
    x0 = torch.tensor(X, dtype=torch.float64, device="cuda:0")
    weights = torch.tensor(np.random.default_rng(0).normal(size=X.shape), device="cuda:0")
    grads = {}
    for name in ("cudss", "scipy"):
        theta = torch.tensor(p.get_parameters(), dtype=torch.float64, requires_grad=True)
        solver = wm.NewtonSolver(p, linear_solver=name, fixed=top)
        (wmt.minimize(p, theta, x0, solver=solver) * weights).sum().backward()
        grads[name] = theta.grad.numpy()
    assert np.abs(grads["scipy"]).max() > 1e-6
    np.testing.assert_allclose(grads["cudss"], grads["scipy"], rtol=1e-7, atol=1e-10)
