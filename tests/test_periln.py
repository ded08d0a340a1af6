"""Peri-LN (Kim et al., ICML 2025): ``x + LN_out(f(LN_in(x)))`` on every sublayer, the embedding output normalised,
a final LayerNorm on both stacks. Its block against x-transformers' sandwich norm: tests/test_authors_packages.py."""

import torch

from recipe_helpers import record, small_model


def test_every_branch_is_normalised_at_its_input_and_its_output(build_model):
    """Eq. 3 computed from the layer's own modules: ``x + LN_out(Attn(LN_in(x)))``, then the same for the FFN, and
    nothing on the residual stream."""
    model, args = small_model(build_model, "periln", 3, 2)
    assert args.layernorm_embedding and args.encoder_normalize_before and args.decoder_normalize_before
    seen = record(model)
    for number, layer in enumerate(model.encoder.layers):
        x = seen["inputs"]["encoder"][number]
        with torch.no_grad():
            h = layer.self_attn_layer_norm(x)
            x = x + layer.self_attn_output_norm(layer.self_attn(query=h, key=h, value=h)[0])
            h = layer.final_layer_norm(x)
            x = x + layer.ffn_output_norm(layer.fc2(torch.relu(layer.fc1(h))))
        torch.testing.assert_close(seen["outputs"]["encoder"][number][0], x)


def test_embedding_output_is_normalised_and_the_stacks_end_with_a_layer_norm(build_model):
    model, _ = small_model(build_model, "periln", 2, 2)
    seen = record(model)
    for side in ("encoder", "decoder"):
        stack = getattr(model, side)
        assert stack.layernorm_embedding is not None and stack.layer_norm is not None
    last = seen["outputs"]["encoder"][-1][0]
    torch.testing.assert_close(seen["encoder_out"], model.encoder.layer_norm(last))
