"""Where a problem's evaluations write: preallocated outputs, the Hessian and Jacobian patterns, the per-term
layout of the element buffers, and the contribution buffers of the deterministic mode.

Everything here is built on first use from the terms (:class:`Storage` methods take the term list) and dropped
by :meth:`Storage.reset` when a term is added; the returned gradients, Hessians and products are these buffers.
"""

from __future__ import annotations

import numpy as np
import warp as wp
import warp.sparse as wps

from warp_meshad._src.problem.interaction import InteractionPattern, check_interaction
from warp_meshad._src.problem.parameters import ParameterDerivatives
from warp_meshad._src.problem.pattern import build_hessian_pattern, build_jacobian_pattern
from warp_meshad._src.problem.pattern_device import build_hessian_pattern_device
from warp_meshad._src.problem.reduce import contribution_lists, gather_sum, ordered_total, partial_count

__all__ = ["DeterministicStorage", "Layout", "Storage"]


class Layout:
    """Where each term's elements write: offsets (energy, gradient, Hessian contributions) per term,
    and the buffer of element energies summed by a block reduction."""

    def __init__(self, terms, dtype, device):
        e_off = g_off = h_off = 0
        self.offsets = []
        for t in terms:
            self.offsets.append(wp.vec3i(e_off, g_off, h_off))
            e_off += t.reserved
            g_off += t.reserved * t.spec.valence
            h_off += t.reserved * t.spec.valence * t.spec.valence
        self.dynamic = any(t.dynamic for t in terms)
        self.element_count = e_off
        self.grad_count = g_off
        self.hess_count = h_off
        self.energy = wp.zeros(e_off, dtype=dtype, device=device)
        self.partial = wp.zeros(partial_count(e_off, device), dtype=dtype, device=device)


class DeterministicStorage:
    """Per-element contribution buffers and the fixed-order lists that sum them (deterministic mode)."""

    def __init__(self, layout: Layout, terms, variable_type, variable_count: int, device):
        self.device = device
        self.grad = wp.zeros(layout.grad_count, dtype=variable_type, device=device)
        targets = np.concatenate([t.elements_np.ravel() for t in terms])
        self.g_lists = contribution_lists(targets, variable_count, device)
        self.hess_count = layout.hess_count
        self.hess = None
        self.h_lists = None

    def build_hessian(self, terms, block_type, nnz: int):
        """The Hessian contribution buffer and lists, for a pattern of ``nnz`` blocks (the terms' slots set)."""
        targets = np.concatenate([t.slots.numpy().ravel() for t in terms])
        self.hess = wp.zeros(self.hess_count, dtype=block_type, device=self.device)
        self.h_lists = contribution_lists(targets, nnz, self.device)

    def finish(self, grad=None, hess_values=None):
        """Sum the contributions into ``grad`` (variables) and ``hess_values`` (the BSR values), where given."""
        if grad is not None:
            gather_sum(self.g_lists, self.grad, grad, self.device)
        if hess_values is not None:
            gather_sum(self.h_lists, self.hess, hess_values, self.device)


def _bsr(nrow: int, ncol: int, block_type, pat, device):
    """Zero BSR matrix with the structure of ``pat`` (offsets, columns) on ``device``."""
    A = wps.bsr_zeros(nrow, ncol, block_type, device=device)
    A.offsets = wp.array(pat.offsets, dtype=wp.int32, device=device)
    A.columns = wp.array(pat.columns, dtype=wp.int32, device=device)
    A.values = wp.zeros(pat.nnz, dtype=block_type, device=device)
    A.notify_nnz_changed(pat.nnz)
    return A


class Storage:
    """A problem's outputs and the structures that say where element contributions go.

    Attributes:
        energy: device array [1] of the scalar dtype (the summed energy); ``grad``: [variable_count] variables.
            Both are views of one allocation (the gradient's numbers, then the energy), so
            :meth:`zero_gradient_and_energy` clears them with one memset.
        hess: the Hessian ``BsrMatrix`` (after :meth:`hessian_pattern`); ``pattern`` its
            :class:`~warp_meshad._src.problem.pattern.HessianPattern` or, with interaction terms,
            :class:`~warp_meshad._src.problem.interaction.InteractionPattern`.
        jac, res, jpattern: the residual Jacobian, the residuals and their pattern (after :meth:`jacobian_pattern`).
        layout: the :class:`Layout` (after :meth:`ensure_layout`); ``det``: the :class:`DeterministicStorage`.
    """

    def __init__(self, variable_count: int, variable_dim: int, variable_type, block_type, dtype, device):
        self.variable_count = variable_count
        self.variable_dim = variable_dim
        self.variable_type = variable_type
        self.block_type = block_type
        self.dtype = dtype
        self.device = device
        numbers = variable_count * variable_dim
        self._grad_energy = wp.zeros(numbers + 1, dtype=dtype, device=device)
        flat = self._grad_energy[:numbers]
        self.grad = flat if variable_dim == 1 else flat.reshape((variable_count, variable_dim)).view(variable_type)
        self.energy = self._grad_energy[numbers:]
        self._energy_host = wp.zeros(1, dtype=dtype, device="cpu", pinned=device.is_cuda)
        self.hv = None
        self.hess = None
        self._hflat = None
        self.pattern = None
        self.jac = None
        self.res = None
        self.jpattern = None
        self.layout = None
        self.det = None
        self.params = None
        self._hloc: dict = {}  # term index -> its elements' local Hessians (the split projection)

    def reset(self):
        """Forget everything built from the terms (a term was added)."""
        self.params = self.pattern = self.jpattern = self.det = self.layout = None
        self._hloc = {}

    def local_hessians(self, term) -> wp.array:
        """The buffer of ``term``'s element Hessians for the split projection (``contract.KernelVariant.split``):
        ``wp.array2d [k (k + 1) / 2, count]`` of the problem's dtype, entry i of element e's packed upper triangle at
        ``[i, e]`` (k the term's duals), made on first use and kept."""
        k = term.spec.k
        shape = (k * (k + 1) // 2, term.count)
        buf = self._hloc.get(term.index)
        if buf is None or buf.shape != shape:
            buf = self._hloc[term.index] = wp.empty(shape, dtype=self.dtype, device=self.device)
        return buf

    def drop_layout(self):
        """Rebuild the layout on next use (an interaction term's capacity grew)."""
        self.layout = None

    def ensure_layout(self, terms, element_energies: bool = True) -> Layout:
        """Per-term offsets into the element buffers, and the element-energy buffer.

        Args:
            element_energies: whether the next launches write element energies to the buffer (then, with an
                interaction term, the buffer is zeroed: slots beyond its current count must read 0).
        """
        if self.layout is None:
            if not terms:
                raise RuntimeError("the problem has no terms: call add_term first")
            self.layout = Layout(terms, self.dtype, self.device)
        if self.layout.dynamic:
            if element_energies:
                self.layout.energy.zero_()
            check_interaction(terms, self.pattern, synced=False)  # bad elements raise once their device check is back
        return self.layout

    def hessian_pattern(self, terms):
        """Build the Hessian pattern and matrix on first use (and merge new interaction blocks); the pattern."""
        if self.pattern is None:
            if not terms:
                raise RuntimeError("the problem has no terms: call add_term first")
            static = [t for t in terms if not t.dynamic]  # interaction terms: merged on the device
            if self.device.is_cuda:  # radix sort on the device: seconds instead of minutes for millions of elements
                pat = build_hessian_pattern_device(self.variable_count, [t.elements for t in static], self.device)
            else:
                pat = build_hessian_pattern(self.variable_count, [t.elements_np for t in static])
            for t, s in zip(static, pat.slots):
                t.slots = wp.array(s, dtype=wp.int32, device=self.device)
            if len(static) < len(terms):
                self.pattern = InteractionPattern(terms, pat, self.variable_count, self.block_type, self.device)
            else:
                n = self.variable_count
                self.hess = _bsr(n, n, self.block_type, pat, self.device)
                self.pattern = pat
        if isinstance(self.pattern, InteractionPattern):
            self.hess = self.pattern.update()  # merges new interaction blocks (device) when elements changed
        return self.pattern

    def jacobian_pattern(self, terms):
        """Build the residual rows, the Jacobian pattern and matrix on first use."""
        if self.jpattern is not None:
            return self.jpattern
        res = [t for t in terms if t.residual]
        if not res:
            raise RuntimeError("the problem has no residual terms: call add_residual_term first")
        pat = build_jacobian_pattern(self.variable_count, [(t.elements_np, t.spec.residual_dim) for t in res])
        for t, s, start in zip(res, pat.slots, pat.row_starts):
            t.jslots = wp.array(s, dtype=wp.int32, device=self.device)
            t.row_start = int(start)
        d = self.variable_dim
        jblock = self.dtype if d == 1 else wp.types.matrix(shape=(1, d), dtype=self.dtype)
        self.jac = _bsr(pat.row_count, self.variable_count, jblock, pat, self.device)
        self.res = wp.zeros(pat.row_count, dtype=self.dtype, device=self.device)
        self.jpattern = pat
        return pat

    def ensure_det(self, terms, hessian: bool) -> DeterministicStorage:
        """Contribution buffers and fixed-order lists of the deterministic mode."""
        if self.det is None:
            lay = self.ensure_layout(terms)
            self.det = DeterministicStorage(lay, terms, self.variable_type, self.variable_count, self.device)
        if hessian and self.det.h_lists is None:
            self.hessian_pattern(terms)
            self.det.build_hessian(terms, self.block_type, self.pattern.nnz)
        return self.det

    def ensure_hv(self):
        """The output of Hessian-vector products, zeroed."""
        if self.hv is None:
            self.hv = wp.zeros(self.variable_count, dtype=self.variable_type, device=self.device)
        self.hv.zero_()
        return self.hv

    def parameter_derivatives(self, terms, parameter_count: int) -> ParameterDerivatives:
        """Buffers of the mixed derivatives (built on first use)."""
        if self.params is None:
            self.params = ParameterDerivatives(
                terms, self.variable_count, parameter_count, self.variable_dim, self.dtype, self.device
            )
        return self.params

    def flat_hessian_values(self):
        """The Hessian's BSR values as one flat array of numbers (a view; the tiled kernels' output)."""
        vals = self.hess.values
        if self._hflat is None or self._hflat[0] is not vals:
            self._hflat = (vals, vals.view(self.dtype).flatten())
        return self._hflat[1]

    def zero_gradient_and_energy(self):
        """Set :attr:`grad` and :attr:`energy` to 0 (one memset: they share one allocation)."""
        self._grad_energy.zero_()

    def total_energy(self):
        """Sum the element energies into :attr:`energy` in a fixed order (on the device)."""
        lay = self.layout
        ordered_total(lay.energy, lay.element_count, lay.partial, self.energy, self.device)

    def read_energy(self, terms) -> float:
        """Wait for the device and read :attr:`energy` (interaction elements' device checks raise here)."""
        wp.copy(self._energy_host, self.energy)
        if self.device.is_cuda:
            wp.synchronize_device(self.device)
        if self.layout is not None and self.layout.dynamic:
            check_interaction(terms, self.pattern, synced=True)  # the device checks of interaction elements are back now
        return float(self._energy_host.numpy()[0])
