"""Recipes that replace the attention projections (Sub-LN, σReparam, HybridNorm) run self-attention on one
``scaled_dot_product_attention`` (DeepLayer.self_attention), as stock does, not on fairseq's unfused path: the same
outputs and gradients as that path, with padded sources and the decoder's causal mask."""

import pytest
import torch

from deepnmt_plugin.bench.throughput import OperatorCounter
from deepnmt_plugin.models import deep_transformer

SMALL = ["--encoder-layers", 2, "--decoder-layers", 2, "--encoder-embed-dim", 16, "--decoder-embed-dim", 16,
         "--encoder-ffn-embed-dim", 32, "--decoder-ffn-embed-dim", 32, "--encoder-attention-heads", 2,
         "--decoder-attention-heads", 2, "--dropout", 0, "--share-all-embeddings"]


def fairseqs_path(layer, query, key, key_padding_mask, attn_mask, incremental_state):
    x, _ = layer.self_attn(query=query, key=key, value=key, key_padding_mask=key_padding_mask,
                           incremental_state=incremental_state, need_weights=False, attn_mask=attn_mask)
    return x


def loss_and_grads(model):
    source = torch.tensor([[5, 6, 7, 8, 2], [1, 1, 9, 10, 2]])  # the second sentence left-padded, as fairseq does
    target = torch.tensor([[2, 5, 6, 7], [2, 9, 10, 1]])  # and a padded target
    model.zero_grad()
    logits, _ = model(source, torch.tensor([5, 3]), target)
    loss = (logits.float().log_softmax(-1) * torch.linspace(0, 1, logits.size(-1))).sum()
    loss.backward()
    return logits.detach(), {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("arch", ["transformer_subln", "transformer_sigma", "transformer_hybridnorm"])
def test_the_fused_self_attention_equals_fairseqs_unfused_path(build_model, arch, monkeypatch):
    torch.manual_seed(0)
    model, _ = build_model(arch, *SMALL)
    model.train()
    assert all(layer.self_attn.skip_embed_dim_check for layer in [*model.encoder.layers, *model.decoder.layers])
    with OperatorCounter() as counter:
        fused, fused_grads = loss_and_grads(model)
    with monkeypatch.context() as patch:
        patch.setattr(deep_transformer.DeepLayer, "self_attention", fairseqs_path)
        with OperatorCounter() as unfused_counter:
            unfused, unfused_grads = loss_and_grads(model)
    torch.testing.assert_close(fused, unfused, rtol=1e-5, atol=1e-5)
    assert fused_grads.keys() == unfused_grads.keys()
    for name, grad in fused_grads.items():
        torch.testing.assert_close(grad, unfused_grads[name], rtol=1e-4, atol=1e-5, msg=lambda text: f"{name}: {text}")
    assert counter.count < unfused_counter.count
