"""T-Fixup (Huang et al. 2020): no LayerNorm anywhere, depth-scaled init of Sec. 3.3."""

import math

import pytest
import torch

from deepnmt_plugin.models.tfixup import tfixup_decoder_scale, tfixup_embedding_scale, tfixup_encoder_scale


def test_constants():
    assert tfixup_encoder_scale(6) == pytest.approx(0.67 * 6 ** -0.25)
    assert tfixup_encoder_scale(30) == pytest.approx(0.67 / 30 ** 0.25)
    assert tfixup_decoder_scale(6) == pytest.approx(54 ** -0.25)
    assert tfixup_embedding_scale(20) == pytest.approx(180 ** -0.25)
    assert tfixup_encoder_scale(16) == pytest.approx(0.335)  # 0.67 * 16^(-1/4) = 0.67 / 2


def no_layer_norm_anywhere(model):
    return not any(isinstance(m, torch.nn.LayerNorm) or "LayerNorm" in type(m).__name__ for m in model.modules())


def test_layer_norm_removed_and_residual_is_plain_sum(build_model):
    model, _ = build_model("transformer_tfixup_iwslt_de_en", "--encoder-layers", 2, "--decoder-layers", 2, "--dropout", 0)
    assert no_layer_norm_anywhere(model)
    model.eval()
    layer = model.decoder.layers[1]
    seen = {}
    layer.register_forward_pre_hook(lambda mod, inp: seen.__setitem__("in", inp[0]))
    layer.register_forward_hook(lambda mod, inp, out: seen.__setitem__("out", out[0]))
    for name in ("self_attn", "encoder_attn", "fc2"):
        getattr(layer, name).register_forward_hook(
            lambda mod, inp, out, name=name: seen.__setitem__(name, out[0] if isinstance(out, tuple) else out)
        )
    src = torch.randint(4, 30, (2, 6))
    prev = torch.randint(4, 30, (2, 5))
    model(src, torch.tensor([6, 6]), prev)
    # x + self_attn(x) + encoder_attn(...) + ffn(...): the output is the input plus the three branches
    torch.testing.assert_close(seen["out"], seen["in"] + seen["self_attn"] + seen["encoder_attn"] + seen["fc2"])


def xavier_uniform_std(weight):
    fan_out, fan_in = weight.shape
    return math.sqrt(2.0 / (fan_in + fan_out))


@pytest.mark.parametrize("shared", [True, False])
def test_init_statistics(build_model, shared):
    n, m = 12, 6
    flags = ["--encoder-layers", n, "--decoder-layers", m]
    flags += ["--share-all-embeddings"] if shared else ["--share-decoder-input-output-embed"]
    model, _ = build_model("transformer_tfixup", *flags)
    d = model.encoder.embed_tokens.embedding_dim
    enc_emb = model.encoder.embed_tokens.weight[4:]  # rows past the specials, padding row is zero
    assert enc_emb.std().item() == pytest.approx(d ** -0.5 * (9 * n) ** -0.25, rel=0.05)
    dec_emb = model.decoder.embed_tokens.weight[4:]
    expected_dec = (9 * n) ** -0.25 if shared else (9 * m) ** -0.25  # shared table is scaled once
    assert dec_emb.std().item() == pytest.approx(d ** -0.5 * expected_dec, rel=0.05)

    for side, stack, scale in (("encoder", model.encoder, 0.67 * n ** -0.25), ("decoder", model.decoder, (9 * m) ** -0.25)):
        for layer in stack.layers:
            attentions = [layer.self_attn] + ([layer.encoder_attn] if side == "decoder" else [])
            scaled = [layer.fc1, layer.fc2] + [a.v_proj for a in attentions] + [a.out_proj for a in attentions]
            for linear in scaled:
                assert linear.weight.std().item() == pytest.approx(scale * xavier_uniform_std(linear.weight), rel=0.03)
            assert torch.all(layer.fc1.bias == 0) and torch.all(layer.fc2.bias == 0)
            for attention in attentions:  # q/k untouched: fairseq's Xavier-uniform with gain 1/sqrt(2)
                for proj in (attention.q_proj, attention.k_proj):
                    assert proj.weight.std().item() == pytest.approx(xavier_uniform_std(proj.weight) / math.sqrt(2), rel=0.03)


def test_layer_norm_flags_refused(build_model):
    with pytest.raises(SystemExit, match="--layernorm-embedding contradicts --arch transformer_tfixup"):
        build_model("transformer_tfixup", "--layernorm-embedding")
    with pytest.raises(SystemExit, match="--decoder-normalize-before contradicts --arch transformer_tfixup"):
        build_model("transformer_tfixup", "--decoder-normalize-before")


def test_init_reaches_every_layer_under_layerdrop(build_model):
    """In training mode fairseq's LayerDropModuleList yields a random subset of layers; the init walks them all."""
    model, _ = build_model("transformer_tfixup_iwslt_de_en", "--encoder-layers", 6, "--decoder-layers", 6,
                           "--encoder-layerdrop", 0.5, "--decoder-layerdrop", 0.5)
    layers = [*model.eval().encoder.layers, *model.decoder.layers]  # eval: iterating yields every layer
    assert len(layers) == 12
    assert all(torch.all(layer.fc1.bias == 0) and torch.all(layer.fc2.bias == 0) for layer in layers)
