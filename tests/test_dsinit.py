"""DS-Init (Zhang et al. 2019): layer l's weights drawn U(+-sqrt(6/(fan_in+fan_out)) * l^-1/2) (paper, default)
or with the bound times l^-1/4 (the authors' TensorFlow code, --dsinit-bound code)."""

import math

import pytest
import torch

from deepnmt_plugin.models.dsinit import dsinit_scale
from recipe_helpers import SMALL


def test_scales():
    assert dsinit_scale(4) == 0.5 and dsinit_scale(16, "code") == 0.5 and dsinit_scale(1) == 1.0


@pytest.mark.parametrize("bound, exponent", [(None, -0.5), ("paper", -0.5), ("code", -0.25)])
def test_layer_l_weights_fill_the_scaled_xavier_bound(bound, exponent, build_model):
    torch.manual_seed(0)
    model, _ = build_model("transformer_dsinit_iwslt_de_en", "--encoder-layers", 6, "--decoder-layers", 4, *SMALL,
                           *(["--dsinit-bound", bound] if bound else []))
    xavier = {"fc1": math.sqrt(6 / (32 + 64)), "fc2": math.sqrt(6 / (64 + 32)), "self_attn.v_proj": math.sqrt(6 / 64),
              "self_attn.q_proj": math.sqrt(6 / 64)}
    for stack in (model.encoder, model.decoder):
        for number, layer in enumerate(stack.layers, 1):
            modules = dict(layer.named_modules())
            for name, limit in xavier.items():
                weight = modules[name].weight
                bound_value = limit * number**exponent
                assert weight.abs().max().item() <= bound_value
                assert weight.abs().max().item() == pytest.approx(bound_value, rel=0.02)
                assert weight.std().item() == pytest.approx(bound_value / math.sqrt(3), rel=0.15)
