"""Sub-LN / MAGNETO (Wang et al. 2022): Pre-LN plus a LayerNorm before out_proj (self-attention) and fc2;
gamma on fc1, fc2, v_proj and out_proj. Equality with torchscale's layers: test_authors_packages.py."""

import math

import pytest
import torch

from deepnmt_plugin.models.subln import subln_gamma
from recipe_helpers import SMALL, small_model


@pytest.mark.parametrize("n, m, encoder, decoder", [(6, 6, 1.547, 1.700), (18, 18, 2.183, 1.997)])
def test_gamma_constants(n, m, encoder, decoder):  # REFERENCES' worked examples of torchscale's formulas
    assert subln_gamma("encoder", n, m) == pytest.approx(encoder, abs=1e-3)
    assert subln_gamma("decoder", n, m) == pytest.approx(decoder, abs=1e-3)
    assert subln_gamma("encoder", 12, 0) == pytest.approx(math.sqrt(math.log(24)))  # one stack only


def test_inner_layer_norms_sit_on_self_attention_and_ffn_only(build_model):
    model, args = small_model(build_model, "subln")
    assert args.encoder_normalize_before and args.decoder_normalize_before
    assert model.encoder.layer_norm is not None and model.decoder.layer_norm is not None
    for layer in [*model.encoder.layers, *model.decoder.layers]:
        assert layer.self_attn.out_proj.layer_norm.normalized_shape == (32,)
        assert layer.fc2.layer_norm.normalized_shape == (64,)  # the FFN width
    assert all(not hasattr(layer.encoder_attn.out_proj, "layer_norm") for layer in model.decoder.layers)


def test_gamma_scales_weights_and_biases_of_the_four_projections(build_model):
    torch.manual_seed(0)
    model, _ = build_model("transformer_subln_iwslt_de_en", "--encoder-layers", 18, "--decoder-layers", 18, *SMALL)
    for stack, side in ((model.encoder, "encoder"), (model.decoder, "decoder")):
        gamma = subln_gamma(side, 18, 18)
        weights = torch.cat([layer.fc1.weight.flatten() for layer in stack.layers])
        # PyTorch's default Linear init, U(+-1/sqrt(fan_in)), times gamma
        assert weights.abs().max().item() == pytest.approx(gamma / math.sqrt(32), rel=0.01)
        biases = torch.cat([layer.self_attn.out_proj.bias for layer in stack.layers])
        assert biases.abs().max().item() == pytest.approx(gamma / math.sqrt(32), rel=0.05)
        queries = torch.cat([layer.self_attn.q_proj.weight.flatten() for layer in stack.layers])
        assert queries.abs().max().item() == pytest.approx(1 / math.sqrt(32), rel=0.01)  # q and k unscaled


def test_quant_noise_is_refused_in_one_line(build_model):
    with pytest.raises(SystemExit) as error:
        build_model("transformer_subln_iwslt_de_en", "--quant-noise-pq", 0.1)
    assert str(error.value.code).startswith("deepnmt: error: --quant-noise-pq is not supported by subln")
