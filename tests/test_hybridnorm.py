"""HybridNorm (Zhuo et al., NeurIPS 2025; BryceZhuo/HybridNorm ``dense_model/olmo/model.py``): attention with its
queries, keys and values normalised per head and no input norm, then Post-Norm at the FFN (``z = LN(x + Attn(x))``,
``z + FFN(z)``); HybridNorm* makes the first layer Pre-Norm. The block is recomputed here from the authors' code."""

import pytest
import torch
import torch.nn.functional as F

from deepnmt_plugin.models.method import ArchitectureError
from deepnmt_plugin.models.deep_transformer import HeadNormalizedLinear
from recipe_helpers import record, small_model

HEADS = 2  # recipe_helpers.SMALL


def authors_attention(attention, query, memory, causal=False):
    """OLMoSequentialBlock.attention: project, split heads, normalise q, k, v over each head's features, SDPA (scale
    1/sqrt(head dim)), merge, output projection. T x B x C in, as fairseq."""
    def heads(projection, x):
        y = F.linear(x, projection.weight, projection.bias)
        y = y.view(x.size(0), x.size(1), HEADS, -1)
        return projection.norm(y).permute(1, 2, 0, 3)  # B x H x T x D

    q, k, v = heads(attention.q_proj, query), heads(attention.k_proj, memory), heads(attention.v_proj, memory)
    out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    out = out.permute(2, 0, 1, 3).reshape(query.size(0), query.size(1), -1)
    return attention.out_proj(out)


def ffn(layer, x):
    return layer.fc2(torch.relu(layer.fc1(x)))


@pytest.mark.parametrize("star", [False, True])
def test_layers_compute_the_authors_block(star, build_model):
    model, _ = small_model(build_model, "hybridnorm", 3, 2, *(["--hybridnorm-star"] if star else []))
    seen = record(model)
    with torch.no_grad():
        for number, layer in enumerate(model.encoder.layers, 1):
            x = seen["inputs"]["encoder"][number - 1]
            if star and number == 1:  # Pre-Norm: x + Attn(LN(x)), then x + FFN(LN(x))
                h = layer.self_attn_layer_norm(x)
                x = x + authors_attention(layer.self_attn, h, h)
                x = x + ffn(layer, layer.final_layer_norm(x))
            else:
                z = layer.self_attn_layer_norm(x + authors_attention(layer.self_attn, x, x))
                x = z + ffn(layer, z)
            torch.testing.assert_close(seen["outputs"]["encoder"][number - 1][0], x)
        memory = seen["encoder_out"]
        for number, layer in enumerate(model.decoder.layers, 1):
            x = seen["inputs"]["decoder"][number - 1]
            if star and number == 1:
                h = layer.self_attn_layer_norm(x)
                x = x + authors_attention(layer.self_attn, h, h, causal=True)
                x = x + authors_attention(layer.encoder_attn, layer.encoder_attn_layer_norm(x), memory)
                x = x + ffn(layer, layer.final_layer_norm(x))
            else:  # the one norm sits on the sum of both attentions, before the FFN
                y = x + authors_attention(layer.self_attn, x, x, causal=True)
                z = layer.encoder_attn_layer_norm(y + authors_attention(layer.encoder_attn, y, memory))
                x = z + ffn(layer, z)
            torch.testing.assert_close(seen["outputs"]["decoder"][number - 1][0], x)
    assert model.encoder.layer_norm is not None and model.decoder.layer_norm is not None


def test_norms_sit_where_the_recipe_puts_them(build_model):
    model, _ = small_model(build_model, "hybridnorm", 2, 2)
    for side, normed in (("encoder", {"self_attn"}), ("decoder", {"encoder_attn"})):
        for layer in getattr(model, side).layers:
            attentions = ["self_attn", "encoder_attn"] if side == "decoder" else ["self_attn"]
            for sublayer in attentions:
                assert (getattr(layer, f"{sublayer}_layer_norm") is not None) == (sublayer in normed)
                for projection in ("q_proj", "k_proj", "v_proj"):  # one norm of the head width each
                    linear = getattr(getattr(layer, sublayer), projection)
                    assert isinstance(linear, HeadNormalizedLinear) and linear.norm.weight.shape == (16,)
            assert layer.final_layer_norm is None and not layer.ffn_pre_norm and not layer.ffn_post_norm
    names = {name for name, _ in model.named_parameters()}
    assert "encoder.layers.0.self_attn.q_proj.weight" in names  # fairseq's names kept
    assert "encoder.layers.0.self_attn.q_proj.norm.weight" in names


def test_without_cross_attention_the_decoder_normalises_after_self_attention(build_model):
    model, _ = small_model(build_model, "hybridnorm", 1, 2, "--no-cross-attention")
    for layer in model.decoder.layers:
        assert layer.self_attn_post_norm and layer.self_attn_layer_norm is not None and layer.encoder_attn is None


def test_quant_noise_is_refused_in_one_line(build_model):
    with pytest.raises(ArchitectureError, match="^deepnmt: error: --quant-noise-pq is not supported by hybridnorm: its "
                                                "q/k/v norms replace the projections quant-noise instruments$"):
        build_model("transformer_hybridnorm_iwslt_de_en", "--quant-noise-pq", 0.1)
