"""DeepNorm (Wang et al. 2022): constants, init statistics and the residual rule LN(alpha*x + f(x))."""

import math

import pytest
import torch

from deepnmt_plugin.models.deepnorm import DeepNormResidual, deepnorm_alpha, deepnorm_beta


@pytest.mark.parametrize(
    "n, m, enc_alpha, enc_beta, dec_alpha, dec_beta",
    [
        # DeepNet Figure 2: encoder 0.81 (N^4 M)^(1/16), 0.87 (N^4 M)^(-1/16); decoder (3M)^(1/4), (12M)^(-1/4)
        (6, 6, 0.81 * 7776 ** (1 / 16), 0.87 * 7776 ** (-1 / 16), 18 ** 0.25, 72 ** -0.25),
        (18, 18, 0.81 * 1889568 ** (1 / 16), 0.87 * 1889568 ** (-1 / 16), 54 ** 0.25, 216 ** -0.25),
        (100, 100, 0.81 * 1e10 ** (1 / 16), 0.87 * 1e10 ** (-1 / 16), 300 ** 0.25, 1200 ** -0.25),
        (60, 12, 0.81 * 155520000 ** (1 / 16), 0.87 * 155520000 ** (-1 / 16), 36 ** 0.25, 144 ** -0.25),
    ],
)
def test_encoder_decoder_constants(n, m, enc_alpha, enc_beta, dec_alpha, dec_beta):
    assert deepnorm_alpha("encoder", n, m) == pytest.approx(enc_alpha, rel=1e-12)
    assert deepnorm_beta("encoder", n, m) == pytest.approx(enc_beta, rel=1e-12)
    assert deepnorm_alpha("decoder", n, m) == pytest.approx(dec_alpha, rel=1e-12)
    assert deepnorm_beta("decoder", n, m) == pytest.approx(dec_beta, rel=1e-12)


def test_constants_of_a_known_depth():
    # 18L-18L by hand: 18^5 = 1889568, ln = 14.451859, /16 -> exp = 2.467587; 54^(1/4) = 2.710806
    assert deepnorm_alpha("encoder", 18, 18) == pytest.approx(1.99875, abs=1e-5)
    assert deepnorm_beta("encoder", 18, 18) == pytest.approx(0.35257, abs=1e-5)
    assert deepnorm_alpha("decoder", 18, 18) == pytest.approx(2.71081, abs=1e-5)
    assert deepnorm_beta("decoder", 18, 18) == pytest.approx(0.26085, abs=1e-5)


@pytest.mark.parametrize("side", ["encoder", "decoder"])
def test_single_stack_constants(side):
    layers = {"encoder": (24, 0), "decoder": (0, 24)}[side]
    assert deepnorm_alpha(side, *layers) == pytest.approx(48 ** 0.25)
    assert deepnorm_beta(side, *layers) == pytest.approx(192 ** -0.25)


def test_model_uses_the_constants(build_model):
    model, _ = build_model("transformer_deepnorm", "--encoder-layers", 12, "--decoder-layers", 6)
    for layer in model.encoder.layers:
        for residual in (layer.self_attn_residual, layer.ffn_residual):
            assert residual.alpha == deepnorm_alpha("encoder", 12, 6)
    for layer in model.decoder.layers:
        for residual in (layer.self_attn_residual, layer.encoder_attn_residual, layer.ffn_residual):
            assert residual.alpha == deepnorm_alpha("decoder", 12, 6)


def xavier_std(weight, gain):
    fan_out, fan_in = weight.shape
    return gain * math.sqrt(2.0 / (fan_in + fan_out))


def test_init_statistics(build_model):
    model, _ = build_model("transformer_deepnorm", "--encoder-layers", 12, "--decoder-layers", 6, "--share-all-embeddings")
    for side, stack in (("encoder", model.encoder), ("decoder", model.decoder)):
        beta = deepnorm_beta(side, 12, 6)
        for layer in stack.layers:
            attentions = [layer.self_attn] + ([layer.encoder_attn] if side == "decoder" else [])
            scaled = [layer.fc1, layer.fc2] + [a.v_proj for a in attentions] + [a.out_proj for a in attentions]
            for linear in scaled:
                assert linear.weight.std().item() == pytest.approx(xavier_std(linear.weight, beta), rel=0.03)
                assert linear.weight.mean().abs().item() < 0.1 * xavier_std(linear.weight, beta)
            for attention in attentions:
                for proj in (attention.q_proj, attention.k_proj):
                    assert proj.weight.std().item() == pytest.approx(xavier_std(proj.weight, 1.0), rel=0.03)


def test_xavier_normal_not_uniform(build_model):
    """Normal init has kurtosis 3; fairseq's default uniform init has 1.8."""
    model, _ = build_model("transformer_deepnorm", "--encoder-layers", 6, "--decoder-layers", 6)
    w = model.encoder.layers[0].fc1.weight.detach().flatten()
    kurtosis = ((w - w.mean()) ** 4).mean() / w.var() ** 2
    assert kurtosis.item() == pytest.approx(3.0, abs=0.15)


def test_residual_rule_measured_with_hooks(build_model):
    """Each LayerNorm sees alpha * (sublayer input) + (branch output), and is applied after the sum."""
    model, _ = build_model("transformer_deepnorm", "--encoder-layers", 3, "--decoder-layers", 2, "--dropout", 0)
    model.eval()
    layer = model.encoder.layers[1]
    seen = {}
    layer.register_forward_pre_hook(lambda mod, inp: seen.__setitem__("layer_in", inp[0]))
    layer.self_attn.register_forward_hook(lambda mod, inp, out: seen.__setitem__("attn_out", out[0]))
    layer.self_attn_layer_norm.register_forward_pre_hook(lambda mod, inp: seen.__setitem__("ln_in", inp[0]))
    layer.self_attn_layer_norm.register_forward_hook(lambda mod, inp, out: seen.__setitem__("ln_out", out))
    layer.fc1.register_forward_pre_hook(lambda mod, inp: seen.__setitem__("ffn_in", inp[0]))
    tokens = torch.randint(4, 30, (2, 7))
    model.encoder(tokens, src_lengths=torch.tensor([7, 7]))
    alpha = deepnorm_alpha("encoder", 3, 2)
    torch.testing.assert_close(seen["ln_in"], alpha * seen["layer_in"] + seen["attn_out"])
    torch.testing.assert_close(seen["ffn_in"], seen["ln_out"])  # Post-LN: the FFN reads the normalised sum


def test_residual_module_formula():
    residual = DeepNormResidual(alpha=2.5)
    x, f = torch.randn(3, 4), torch.randn(3, 4)
    torch.testing.assert_close(residual(x, f, x), 2.5 * x + f)  # the layer's LayerNorm comes after


def test_init_reaches_every_layer_under_layerdrop(build_model):
    """In training mode fairseq's LayerDropModuleList yields a random subset of layers; the init walks them all."""
    model, _ = build_model("transformer_deepnorm_iwslt_de_en", "--encoder-layers", 6, "--decoder-layers", 6,
                           "--encoder-layerdrop", 0.5, "--decoder-layerdrop", 0.5)
    model.eval()  # now iterating the layers yields every one
    for side in ("encoder", "decoder"):
        beta = deepnorm_beta(side, 6, 6)
        for layer in getattr(model, side).layers:
            assert layer.fc1.weight.std().item() == pytest.approx(xavier_std(layer.fc1.weight, beta), rel=0.05)
