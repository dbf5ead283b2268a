"""What the two CuPy-based GPU back-ends (``"cupy"``, ``"cudss"``) share: :class:`_GpuCsrSolver`, zero-copy CuPy
views of the CSR buffers on Warp's stream; the lazy CuPy import with its install hint (``_import_cupy``); the CUDA
device check (``_require_cuda``); and ``_bind_thread``, which makes a device current in the calling thread for
``cuda.core`` (nvmath-python).

Not here: either back-end (``spsolve.py``, ``cudss.py``). CuPy is imported when a solver is made, not with this module.
"""

from __future__ import annotations

import threading
import warnings

import warp as wp

from warp_meshad._src.solve.linear.base import LinearSolver

__all__ = []

_CUPY_INSTALL = 'pip install "warp-meshad[cudss]" (or: pip install cupy-cuda13x)'


def _import_cupy():
    try:
        import cupy
        import cupyx.scipy.sparse
        import cupyx.scipy.sparse.linalg  # noqa: F401
    except ImportError as exc:
        raise ImportError(f"the 'cupy' linear back-end needs CuPy: {_CUPY_INSTALL}") from exc
    return cupy


def _require_cuda(A, name: str) -> None:
    if not A.device.is_cuda:
        raise ValueError(f"the {name!r} linear back-end runs on a CUDA device, got a matrix on {A.device}")


_bound = threading.local()  # per thread: the CUDA device ordinals made current for cuda.core (nvmath) there


def _bind_thread(device) -> None:
    """Make ``device``'s primary CUDA context current in the calling thread for cuda.core (nvmath-python).

    A back-end may be called from any thread: PyTorch runs a backward (``warp_meshad.torch.minimize``) on its own
    autograd thread, Ray runs tasks on worker threads, a user may use a thread pool. nvmath-python (cuDSS) goes
    through ``cuda.core``, which refuses a device that was not ``set_current()`` in the calling thread ("Device 0 is
    not yet initialized"). Warp names its context at each call and CuPy's ``Device`` context sets it, so they need
    nothing more; all three share the device's primary context. Done once per thread and device.
    """
    done = getattr(_bound, "ordinals", None)
    if done is None:
        done = _bound.ordinals = set()
    if device.ordinal in done:
        return
    try:
        from cuda.core import Device  # cuda-core >= 0.4
    except ImportError:
        try:
            from cuda.core.experimental import Device
        except ImportError:  # no cuda.core (CuPy only): CuPy's own context handling suffices
            Device = None
    if Device is not None:
        Device(device.ordinal).set_current()
    done.add(device.ordinal)


class _GpuCsrSolver(LinearSolver):
    """Common part of the CuPy and cuDSS back-ends: zero-copy CuPy views of our CSR buffers on Warp's stream."""

    defers_checks = True

    def __init__(self, compute_residual: bool = True):
        super().__init__(compute_residual)
        self._cp = _import_cupy()
        self._csr = None

    def _stream(self, device):
        """CuPy's device and stream contexts for Warp's stream of ``device``, with that device's context made
        current in the calling thread (see :func:`_bind_thread`)."""
        _bind_thread(device)
        cp = self._cp
        stream = wp.get_stream(device)
        with warnings.catch_warnings():  # CuPy 14 deprecates ExternalStream for Stream.from_external (not in CuPy 13)
            warnings.simplefilter("ignore", DeprecationWarning)
            return cp.cuda.Device(device.ordinal), cp.cuda.ExternalStream(stream.cuda_stream, device.ordinal)

    def _views(self, device):
        cp = self._cp
        import cupyx.scipy.sparse as cpsp

        csr = self._csr
        n = csr.size
        data = cp.asarray(csr.data)[: csr.nnz]
        indices = cp.asarray(csr.indices)[: csr.nnz]
        indptr = cp.asarray(csr.indptr)
        return cpsp.csr_matrix((data, indices, indptr), shape=(n, n), copy=False)

    @staticmethod
    def _flat(cp, arr: wp.array):
        return cp.asarray(arr).reshape(-1)
