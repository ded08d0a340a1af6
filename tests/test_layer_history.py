"""The recorded layer history (models/layer_history.py) against the term-by-term sums it replaces in DLCL and
DenseFormer: equal outputs and gradients, a constant number of operators per layer, nothing kept after the stack."""

import pytest
import torch

from deepnmt_plugin.bench.throughput import OperatorCounter
from deepnmt_plugin.models.denseformer import DepthWeightedAverage
from deepnmt_plugin.models.dlcl import LayerCombination


def connection(kind: str, layers: int) -> torch.nn.Module:
    torch.manual_seed(0)
    if kind == "denseformer_dilated":
        module = DepthWeightedAverage(layers, dilation=2, period=2)
    elif kind == "denseformer":
        module = DepthWeightedAverage(layers, dilation=1, period=1)
    else:
        module = LayerCombination(8, layers, post_norm=kind == "dlcl_post")
    with torch.no_grad():  # trained-looking weights, not the initial average or identity
        module.weight.add_(0.1 * torch.randn_like(module.weight))
        for name, parameter in module.named_parameters():
            if name.startswith("norm_"):
                parameter.add_(0.1 * torch.randn_like(parameter))
    return module


def run_stack(module: torch.nn.Module, layers: int, term_by_term: bool, monkeypatch):
    """A stack of tanh(Linear) layers joined by ``module``; the loss's gradients of the weights, the layers' and
    the input, as the stack's forward calls the connection (begin, next_input per layer, output)."""
    with monkeypatch.context() as patch:
        if term_by_term:  # the TorchScript path: the history in ``state``, summed term by term
            patch.setattr(torch.jit, "is_scripting", lambda: True)
        torch.manual_seed(1)
        linears = [torch.nn.Linear(8, 8) for _ in range(layers)]
        first = torch.randn(5, 3, 8, requires_grad=True)
        state = []
        x = module.begin(first, state)
        for index, linear in enumerate(linears):
            x = module.next_input(index, torch.tanh(linear(x)), None, state)
        x = module.output(x, state)
        loss = (x * torch.linspace(-1, 1, x.numel()).view_as(x)).sum()
        parameters = [first, *module.parameters(), *(p for linear in linears for p in linear.parameters())]
        return x.detach(), torch.autograd.grad(loss, parameters, allow_unused=True)  # one layer, period 2: no average


@pytest.mark.parametrize("kind", ["dlcl_pre", "dlcl_post", "denseformer", "denseformer_dilated"])
@pytest.mark.parametrize("layers", [1, 6, 50])
def test_the_recorded_history_equals_the_term_by_term_sum(kind, layers, monkeypatch):
    module = connection(kind, layers)
    reference, reference_grads = run_stack(module, layers, True, monkeypatch)
    output, grads = run_stack(module, layers, False, monkeypatch)
    torch.testing.assert_close(output, reference, rtol=1e-5, atol=1e-6)
    for grad, reference_grad in zip(grads, reference_grads, strict=True):
        if reference_grad is None:
            assert grad is None
        else:
            torch.testing.assert_close(grad, reference_grad, rtol=1e-4, atol=1e-6)


def operators(kind: str, layers: int, term_by_term: bool, monkeypatch) -> int:
    module = connection(kind, layers)
    with OperatorCounter() as counter:
        run_stack(module, layers, term_by_term, monkeypatch)
    return counter.count


@pytest.mark.parametrize("kind", ["dlcl_pre", "denseformer"])
def test_each_layer_adds_the_same_operators_where_term_by_term_adds_more_with_depth(kind, monkeypatch):
    """Linear in depth: each further 4 layers cost what the previous 4 did; term by term, each costs more."""
    recorded = [operators(kind, layers, False, monkeypatch) for layers in (4, 8, 12)]
    assert recorded[2] - recorded[1] == recorded[1] - recorded[0]
    term_by_term = [operators(kind, layers, True, monkeypatch) for layers in (4, 8, 12)]
    assert term_by_term[2] - term_by_term[1] > term_by_term[1] - term_by_term[0]
    assert recorded[2] < term_by_term[2]


def test_the_connection_keeps_no_history_after_the_stack(monkeypatch):
    """The history and its graph go with the loss: the module holds neither once the stack has run."""
    module = connection("dlcl_pre", 3)
    run_stack(module, 3, False, monkeypatch)
    assert module.recorded is None
