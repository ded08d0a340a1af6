"""LayerNorm Scaling (Sun et al. 2025; lmsdss/LayerNorm-Scaling, ``norm_type == 'LNS'``): Pre-LN with the output of
each sublayer LayerNorm of layer l multiplied by 1/sqrt(l)."""

import math

import pytest
import torch
import torch.nn.functional as F

from deepnmt_plugin.models.lns import lns_scale
from recipe_helpers import SMALL, record, small_model


def test_scale_is_one_over_the_square_root_of_the_layer_number():
    assert [lns_scale(l) for l in (1, 4, 9, 100)] == pytest.approx([1, 0.5, 1 / 3, 0.1])


def test_every_sublayer_norm_of_layer_l_is_its_layer_norm_over_sqrt_l(build_model):
    model, _ = small_model(build_model, "lns", 4, 3)
    for side, sublayer_norms in (("encoder", ["self_attn_layer_norm", "final_layer_norm"]),
                                 ("decoder", ["self_attn_layer_norm", "encoder_attn_layer_norm", "final_layer_norm"])):
        for number, layer in enumerate(getattr(model, side).layers, 1):
            for name in sublayer_norms:
                norm = getattr(layer, name)
                x = torch.randn(5, 2, norm.weight.numel())
                expected = F.layer_norm(x, norm.weight.shape, norm.weight, norm.bias) / math.sqrt(number)
                torch.testing.assert_close(norm(x), expected)
        final = getattr(model, side).layer_norm  # the stack's final LayerNorm is not scaled
        x = torch.randn(5, 2, final.weight.numel())
        torch.testing.assert_close(final(x), F.layer_norm(x, final.weight.shape, final.weight, final.bias))


def test_lns_computes_pre_ln_with_each_layers_norm_affine_scaled(build_model):
    """The authors' formula computed independently: a Pre-LN model with the same weights, each sublayer LayerNorm's
    weight and bias of layer l divided by sqrt(l), gives the same encoder and decoder outputs."""
    lns, _ = small_model(build_model, "lns", 4, 3)
    torch.manual_seed(0)
    preln, _ = build_model("transformer_preln_iwslt_de_en", "--encoder-layers", 4, "--decoder-layers", 3, *SMALL)
    state = {}
    for name, value in lns.state_dict().items():
        parts = name.split(".")
        if parts[1] == "layers" and "layer_norm" in parts[3]:
            value = value / math.sqrt(int(parts[2]) + 1)
        state[name] = value
    preln.load_state_dict(state)
    ours, expected = record(lns), record(preln.eval())
    torch.testing.assert_close(ours["encoder_out"], expected["encoder_out"])
    torch.testing.assert_close(ours["features"], expected["features"])


def test_a_pruned_model_keeps_the_scales_of_the_layers_it_kept(build_model):
    """As fairseq-generate's ``--model-overrides "{'encoder_layers_to_keep': '1,3', ...}"`` builds it (the pruned
    outputs against the full model's layers: tests/test_fairseq_parity.py)."""
    from fairseq import tasks

    _, args = build_model("transformer_lns_iwslt_de_en", "--encoder-layers", 4, "--decoder-layers", 3, *SMALL)
    args.encoder_layers_to_keep, args.decoder_layers_to_keep = "1,3", "2"
    model = tasks.setup_task(args).build_model(args)
    scales = [layer.self_attn_layer_norm.scale for layer in model.encoder.layers]
    assert scales == pytest.approx([lns_scale(2), lns_scale(4)])
    assert [layer.final_layer_norm.scale for layer in model.decoder.layers] == pytest.approx([lns_scale(3)])
