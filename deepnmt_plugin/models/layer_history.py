"""A stack's layer history y_0, y_1, ... and its weighted sums ``sum_k W[row, k] * y_k`` (DLCL's Eq. 6, DenseFormer's
DWA), at a constant number of operators per layer in training.

Summed term by term, row l of a stack costs l multiplies and adds forward and about three times that backward: O(L^2)
small operators per stack (1.17x stock's operators per update at 6L-6L, more with depth), and on a GPU each is a
kernel launch. Here the outputs are copied into one preallocated buffer as they are made (one copy per layer), each
row's sum is one matrix-vector product over the buffer's first rows, and the backward accumulates the gradients of
every y_k in one buffer (one outer product per row, ``addr_``) and of W in another (one product per row), handing
each y_k its gradient once all rows that read it are done. Autograd keeps no per-term tensor, and the buffers hold one
copy of the history and one of its gradient: memory stays linear in depth.

The order of the backward is kept by a chain of empty tensors: the record of y_k consumes the record of y_{k-1}, and
row l's sum consumes the record of y_l, so that the record of y_k runs its backward after every row that reads y_k.
The sums equal the term-by-term ones to float rounding (tests/test_layer_history.py); TorchScript, which cannot run an
autograd Function, uses the term-by-term sum (``weighted_sum``).
"""

from typing import List, Optional

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from deepnmt_plugin.models.method import StackConnection


def weighted_sum(weights: Tensor, history: List[Tensor]) -> Tensor:
    """sum_k weights[k] * history[k], accumulated term by term in place (autograd saves no partial sum)."""
    combined = weights[0] * history[0]
    for k in range(1, len(history)):
        combined.add_(weights[k] * history[k])
    return combined


class LayerHistory:
    """One forward pass's history of up to ``rows`` tensors shaped like ``first``, the weights of its sums
    (``weights``: rows x rows, row l read by the sum after y_l), and the backward's gradient buffers."""

    def __init__(self, first: Tensor, weights: Tensor):
        rows = weights.size(0)
        self.shape = first.shape
        self.weights = weights.detach().to(first.dtype)
        self.values = first.new_empty((rows, first.numel()))
        self.value_grads: Optional[Tensor] = None
        self.weight_grads: Optional[Tensor] = None
        self.weight_dtype = weights.dtype

    def gradient_buffers(self, like: Tensor) -> Tensor:
        if self.value_grads is None:
            self.value_grads = like.new_zeros(self.values.shape)
            self.weight_grads = like.new_zeros(self.weights.shape, dtype=self.weight_dtype)
        return self.value_grads

    def value_grad(self, k: int) -> Optional[Tensor]:
        return None if self.value_grads is None else self.value_grads[k].view(self.shape)


class _Begin(torch.autograd.Function):
    """Records y_0; its backward, the last of the history's, hands W and y_0 their gradients."""

    @staticmethod
    def forward(ctx, weights: Tensor, first: Tensor, history: LayerHistory) -> Tensor:
        ctx.set_materialize_grads(False)  # the ordering tensors' gradients stay None: no operator makes them
        ctx.history = history
        history.values[0].copy_(first.reshape(-1))
        return first.new_empty(0)

    @staticmethod
    @once_differentiable
    def backward(ctx, order_grad):
        history = ctx.history
        return history.weight_grads, history.value_grad(0), None


class _Record(torch.autograd.Function):
    """Records y_k after y_{k-1}'s record; its backward runs after every sum that read y_k."""

    @staticmethod
    def forward(ctx, value: Tensor, previous: Tensor, history: LayerHistory, k: int) -> Tensor:
        ctx.set_materialize_grads(False)
        ctx.history, ctx.k = history, k
        history.values[k].copy_(value.reshape(-1))
        return previous.new_empty(0)

    @staticmethod
    @once_differentiable
    def backward(ctx, order_grad):
        return ctx.history.value_grad(ctx.k), None, None, None


class _Sum(torch.autograd.Function):
    """sum_{k<=row} W[row, k] * y_k, one matrix-vector product over the recorded rows."""

    @staticmethod
    def forward(ctx, recorded: Tensor, history: LayerHistory, row: int) -> Tensor:
        ctx.history, ctx.row = history, row
        return torch.mv(history.values[:row + 1].t(), history.weights[row, :row + 1]).view(history.shape)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: Tensor):
        history, row = ctx.history, ctx.row
        grad = grad.reshape(-1)
        history.gradient_buffers(grad)[:row + 1].addr_(history.weights[row, :row + 1], grad)
        torch.mv(history.values[:row + 1], grad, out=history.weight_grads[row, :row + 1])
        return None, None, None


class RecordedHistory:
    """The training path: ``begin`` with W and y_0, ``append`` each y_k, ``combine`` row l once y_l is in."""

    def __init__(self, weights: Tensor, first: Tensor):
        self.history = LayerHistory(first, weights)
        self.last = _Begin.apply(weights, first, self.history)
        self.count = 1

    def append(self, value: Tensor) -> None:
        self.last = _Record.apply(value, self.last, self.history, self.count)
        self.count += 1

    def combine(self, row: int) -> Tensor:
        return _Sum.apply(self.last, self.history, row)


class HistoryConnection(StackConnection):
    """A stack connection whose layers read weighted sums of the layer history (DLCL, DenseFormer). In eager mode
    the history of one forward pass is a ``RecordedHistory``, dropped at ``output``; TorchScript, which cannot run
    it, keeps the history in ``state`` and sums it with ``weighted_sum``."""

    def output(self, x: Tensor, state: List[Tensor]) -> Tensor:
        if not torch.jit.is_scripting():
            self.recorded = None  # the history and its graph belong to the caller's loss from here
        return x

    @torch.jit.unused
    def start_history(self, weights: Tensor, first: Tensor) -> None:
        self.recorded = RecordedHistory(weights, first)

    @torch.jit.unused
    def combine_row(self, row: int) -> Tensor:
        return self.recorded.combine(row)

    @torch.jit.unused
    def record_and_combine(self, entry: Tensor, row: int, combine: bool) -> Tensor:
        """Appends ``entry`` to the history; returns row ``row``'s sum, or ``entry`` where ``combine`` is False."""
        self.recorded.append(entry)
        return self.recorded.combine(row) if combine else entry
