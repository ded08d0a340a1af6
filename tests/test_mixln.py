"""Mix-LN (Li, Yin and Liu, ICLR 2025; pixeli99/MixLN, ``norm_type == 'post_pre'``): Post-LN in the first
floor(alpha * L) layers of each stack, Pre-LN above, a final LayerNorm on both stacks."""

import pytest
import torch
from fairseq.models.transformer import TransformerConfig
from fairseq.modules.transformer_layer import TransformerDecoderLayerBase, TransformerEncoderLayerBase

from deepnmt_plugin.models.method import ArchitectureError
from deepnmt_plugin.models.mixln import mixln_post_layers
from recipe_helpers import SMALL, record, small_model


@pytest.mark.parametrize("alpha, layers, post", [(0.25, 12, 3), (0.25, 3, 0), (0.25, 4, 1), (0.5, 6, 3),
                                                 (0.3, 10, 3), (0, 50, 0), (0.25, 100, 25)])
def test_post_ln_layers_are_floor_of_alpha_times_depth(alpha, layers, post):
    assert mixln_post_layers(alpha, layers) == post


def layouts(stack):
    layouts = [{"post" if getattr(layer, f"{sublayer}_post_norm") else "pre" if getattr(layer, f"{sublayer}_pre_norm")
                else "none" for sublayer in ("self_attn", "ffn")} for layer in stack.layers]
    assert all(len(layout) == 1 for layout in layouts)  # one layout a layer
    return [layout.pop() for layout in layouts]


def test_each_stack_applies_alpha_to_its_own_depth(build_model):
    model, args = build_model("transformer_mixln_iwslt_de_en", "--encoder-layers", 12, "--decoder-layers", 3, *SMALL)
    assert layouts(model.encoder) == ["post"] * 3 + ["pre"] * 9  # the authors' LLaMA-71M: POST_NUM=3 of 12
    assert layouts(model.decoder) == ["pre"] * 3
    assert model.encoder.layer_norm is not None and model.decoder.layer_norm is not None
    assert args.encoder_normalize_before and args.decoder_normalize_before and args.mixln_alpha is None
    model, _ = build_model("transformer_mixln_iwslt_de_en", "--encoder-layers", 4, "--decoder-layers", 4,
                           "--mixln-alpha", 0.5, *SMALL)
    assert layouts(model.encoder) == layouts(model.decoder) == ["post", "post", "pre", "pre"]


def test_each_layer_computes_fairseqs_post_ln_or_pre_ln_layer(build_model):
    """The authors' rule computed independently: every layer equals fairseq's own layer of its layout (normalize_before
    off below the switch, on above), with the same weights; and the stacks end with their final LayerNorm."""
    model, args = small_model(build_model, "mixln", 4, 2, "--mixln-alpha", 0.5)
    seen = record(model)
    for side, base in (("encoder", TransformerEncoderLayerBase), ("decoder", TransformerDecoderLayerBase)):
        for number, layer in enumerate(getattr(model, side).layers, 1):
            args.encoder_normalize_before = args.decoder_normalize_before = number > (2 if side == "encoder" else 1)
            fairseq_layer = base(TransformerConfig.from_namespace(args))
            state = {k: v for k, v in layer.state_dict().items() if "_residual" not in k}
            fairseq_layer.load_state_dict(state)
            fairseq_layer.eval()
            x = seen["inputs"][side][number - 1]
            with torch.no_grad():
                if side == "encoder":
                    expected = fairseq_layer(x, None)
                else:
                    future = model.decoder.buffered_future_mask(x)
                    expected = fairseq_layer(x, seen["encoder_out"], None, self_attn_mask=future)[0]
            torch.testing.assert_close(seen["outputs"][side][number - 1][0], expected)
    encoder_last = seen["outputs"]["encoder"][-1][0]
    torch.testing.assert_close(seen["encoder_out"], model.encoder.layer_norm(encoder_last))


@pytest.mark.parametrize("alpha", ["1", "1.5", "-0.25", "nan"])
def test_alpha_outside_zero_one_is_refused_in_one_line(alpha, build_model):
    with pytest.raises(ArchitectureError, match=rf"^deepnmt: error: --mixln-alpha {alpha}: give a fraction in \[0, 1\)"):
        build_model("transformer_mixln_iwslt_de_en", "--mixln-alpha", alpha)


def test_alpha_is_refused_on_another_arch(build_model):
    with pytest.raises(ArchitectureError, match="--mixln-alpha is a flag of transformer_mixln; --arch transformer_preln"):
        build_model("transformer_preln_iwslt_de_en", "--mixln-alpha", 0.5)
