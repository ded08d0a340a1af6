"""DyT (Zhu et al., CVPR 2025): every LayerNorm replaced by ``gamma * tanh(alpha * x) + beta``, Pre-LN placement.
The norm against the authors' formula and x-transformers, and whole stacks against x-transformers:
tests/test_authors_packages.py."""

import pytest
import torch.nn as nn

from deepnmt_plugin.models.dyt import DynamicTanh
from deepnmt_plugin.models.method import ArchitectureError
from recipe_helpers import SMALL


def test_no_layer_norm_is_left_and_alpha_starts_where_the_flags_say(build_model):
    model, args = build_model("transformer_dyt_iwslt_de_en", "--encoder-layers", 2, "--decoder-layers", 2, *SMALL,
                              "--layernorm-embedding", "--dyt-attention-alpha-init", 0.8, "--dyt-alpha-init", 0.2)
    assert not any(isinstance(module, nn.LayerNorm) for module in model.modules())
    assert args.encoder_normalize_before and args.decoder_normalize_before
    alphas = {name: module.alpha.item() for name, module in model.named_modules() if isinstance(module, DynamicTanh)}
    for side in ("encoder", "decoder"):  # the stack's final norm and the embedding's: the "other" alpha
        assert alphas[f"{side}.layer_norm"] == alphas[f"{side}.layernorm_embedding"] == pytest.approx(0.2)
    for name, alpha in alphas.items():
        if ".layers." in name:
            attention = name.endswith(("self_attn_layer_norm", "encoder_attn_layer_norm"))
            assert alpha == pytest.approx(0.8 if attention else 0.2), name
    assert len([name for name in alphas if ".layers." in name]) == 2 * 2 + 2 * 3


def test_default_alpha_is_the_papers_half_everywhere(build_model):
    model, _ = build_model("transformer_dyt_iwslt_de_en", "--encoder-layers", 1, "--decoder-layers", 1)
    norms = [module for module in model.modules() if isinstance(module, DynamicTanh)]
    assert len(norms) == 2 + 3 + 2 and all(norm.alpha.item() == 0.5 for norm in norms)
    assert all((norm.weight == 1).all() and (norm.bias == 0).all() for norm in norms)


@pytest.mark.parametrize("flag", ["--dyt-alpha-init", "--dyt-attention-alpha-init"])
@pytest.mark.parametrize("value", ["0", "-0.5", "nan", "inf"])
def test_alpha_init_must_be_positive_and_finite(flag, value, build_model):
    with pytest.raises(ArchitectureError, match=rf"^deepnmt: error: {flag} {value}: alpha_0 must be positive and finite"):
        build_model("transformer_dyt_iwslt_de_en", flag, value)
