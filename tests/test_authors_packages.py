"""Our layers against the authors' own packages, layer for layer with the same weights (eval mode, no dropout):
torchscale 0.3.0 (Sub-LN, DeepNorm), rezero 0.1.0 (ReZero), admin-torch 0.1.0 (Admin's analytic omega),
x-transformers 2.31.10 (Peri-LN's sandwich-norm block, DyT's norm)."""

import pytest
import torch

from authors_code import torchscale
from deepnmt_plugin.models.admin import admin_analytic_omega
from deepnmt_plugin.models.deepnorm import deepnorm_alpha

DIM, FFN, HEADS = 32, 64, 4


def deep_layers(build_model, method, encoder_layers=3, decoder_layers=2):
    torch.manual_seed(0)
    model, _ = build_model(f"transformer_{method}_iwslt_de_en", "--encoder-layers", encoder_layers,
                           "--decoder-layers", decoder_layers, "--encoder-embed-dim", DIM, "--decoder-embed-dim", DIM,
                           "--encoder-ffn-embed-dim", FFN, "--decoder-ffn-embed-dim", FFN,
                           "--encoder-attention-heads", HEADS, "--decoder-attention-heads", HEADS, "--dropout", 0)
    with torch.no_grad():  # away from the init, so that every parameter's role shows
        for parameter in model.parameters():
            parameter.add_(0.1 * torch.randn_like(parameter))
    return model.eval()


def torchscale_config(encoder_layers, decoder_layers, **kwargs):
    return torchscale().config.EncoderDecoderConfig(
        encoder_embed_dim=DIM, encoder_ffn_embed_dim=FFN, encoder_attention_heads=HEADS, encoder_layers=encoder_layers,
        decoder_embed_dim=DIM, decoder_ffn_embed_dim=FFN, decoder_attention_heads=HEADS, decoder_layers=decoder_layers,
        activation_fn="relu", dropout=0.0, **kwargs)


# torchscale's parameter names -> ours
TORCHSCALE_NAMES = [("ffn.ffn_layernorm.", "fc2.layer_norm."), ("ffn.", ""),
                    ("self_attn.inner_attn_ln.", "self_attn.out_proj.layer_norm.")]


def load_ours_into(theirs, ours):
    state = ours.state_dict()
    mapped = {}
    for name in theirs.state_dict():
        our_name = name
        for their_part, our_part in TORCHSCALE_NAMES:
            our_name = our_name.replace(their_part, our_part)
        mapped[name] = state[our_name]
    theirs.load_state_dict(mapped)
    return theirs.eval()


@pytest.mark.parametrize("method, flags", [("subln", {"subln": True}),
                                           ("deepnorm", {"deepnorm": True, "subln": False})])
def test_torchscale_layers_compute_ours(method, flags, build_model):
    ts = torchscale()
    model = deep_layers(build_model, method)
    config = torchscale_config(3, 2, **flags)
    x, memory = torch.randn(5, 2, DIM), torch.randn(7, 2, DIM)  # T x B x C, as fairseq
    padding = torch.tensor([[False] * 7, [False] * 5 + [True] * 2])
    future = torch.triu(torch.full((5, 5), float("-inf")), 1)
    for index, ours in enumerate(model.encoder.layers):
        theirs = load_ours_into(ts.encoder.EncoderLayer(config, index, is_encoder_decoder=True), ours)
        if method == "deepnorm":
            assert theirs.alpha == pytest.approx(deepnorm_alpha("encoder", 3, 2))
        expected, _ = theirs(memory.transpose(0, 1), padding)  # torchscale's layers are batch-first
        actual, _ = ours(memory, padding)
        torch.testing.assert_close(actual.transpose(0, 1)[~padding], expected[~padding], rtol=1e-5, atol=1e-5)
    for index, ours in enumerate(model.decoder.layers):
        theirs = load_ours_into(ts.decoder.DecoderLayer(config, index, is_encoder_decoder=True), ours)
        if method == "deepnorm":
            assert theirs.alpha == pytest.approx(deepnorm_alpha("decoder", 3, 2))
        expected = theirs(x.transpose(0, 1), memory.transpose(0, 1), padding, self_attn_mask=future)[0]
        actual = ours(x, memory, padding, self_attn_mask=future)[0]
        torch.testing.assert_close(actual.transpose(0, 1), expected, rtol=1e-5, atol=1e-5)


def test_sub_ln_gains_match_torchscale_init(build_model):
    """torchscale's Encoder/Decoder scale fc1, fc2, out_proj and v_proj (not cross-attention) by gamma at init:
    the ratio of their weights' spread to an unscaled Linear's is ours."""
    ts = torchscale()
    config = torchscale_config(18, 6, subln=True)
    torch.manual_seed(0)
    encoder = ts.encoder.Encoder(config, is_encoder_decoder=True)
    decoder = ts.decoder.Decoder(config, is_encoder_decoder=True)
    torch.manual_seed(0)
    fresh, _ = build_model("transformer_subln_iwslt_de_en", "--encoder-layers", 18, "--decoder-layers", 6,
                           "--encoder-embed-dim", DIM, "--decoder-embed-dim", DIM, "--encoder-ffn-embed-dim", FFN,
                           "--decoder-ffn-embed-dim", FFN, "--encoder-attention-heads", HEADS,
                           "--decoder-attention-heads", HEADS)

    def spread(stack, name):
        return torch.cat([dict(layer.named_parameters())[name].flatten() for layer in stack.layers]).std().item()

    for theirs, ours in ((encoder, fresh.encoder), (decoder, fresh.decoder)):
        for their_name, our_name in (("ffn.fc1.weight", "fc1.weight"), ("ffn.fc2.weight", "fc2.weight"),
                                     ("self_attn.v_proj.weight", "self_attn.v_proj.weight"),
                                     ("self_attn.out_proj.weight", "self_attn.out_proj.weight"),
                                     ("self_attn.q_proj.weight", "self_attn.q_proj.weight")):
            assert spread(ours, our_name) == pytest.approx(spread(theirs, their_name), rel=0.05), our_name
    for name in ("encoder_attn.v_proj.weight", "encoder_attn.out_proj.weight"):  # not scaled
        assert spread(fresh.decoder, name) == pytest.approx(spread(decoder, name), rel=0.05), name


def test_rezero_layers_compute_ours(build_model):
    from rezero.transformer.rztx import RZTXDecoderLayer, RZTXEncoderLayer

    model = deep_layers(build_model, "rezero")
    x, memory = torch.randn(5, 2, DIM), torch.randn(7, 2, DIM)
    future = torch.triu(torch.full((5, 5), float("-inf")), 1)

    def copy_attention(theirs, ours):
        theirs.in_proj_weight.copy_(torch.cat([ours.q_proj.weight, ours.k_proj.weight, ours.v_proj.weight]))
        theirs.in_proj_bias.copy_(torch.cat([ours.q_proj.bias, ours.k_proj.bias, ours.v_proj.bias]))
        theirs.out_proj.weight.copy_(ours.out_proj.weight)
        theirs.out_proj.bias.copy_(ours.out_proj.bias)

    def copy_layer(theirs, ours):
        with torch.no_grad():
            copy_attention(theirs.self_attn, ours.self_attn)
            for their_linear, our_linear in ((theirs.linear1, ours.fc1), (theirs.linear2, ours.fc2)):
                their_linear.weight.copy_(our_linear.weight)
                their_linear.bias.copy_(our_linear.bias)
            theirs.resweight.copy_(ours.self_attn_residual.alpha)
        return theirs.eval()

    for ours in model.encoder.layers:
        theirs = copy_layer(RZTXEncoderLayer(DIM, HEADS, FFN, dropout=0.0), ours)
        torch.testing.assert_close(ours(memory, None)[0], theirs(memory), rtol=1e-5, atol=1e-5)
    for ours in model.decoder.layers:
        theirs = copy_layer(RZTXDecoderLayer(DIM, HEADS, FFN, dropout=0.0), ours)
        with torch.no_grad():
            copy_attention(theirs.multihead_attn, ours.encoder_attn)
        torch.testing.assert_close(ours(x, memory, None, self_attn_mask=future)[0],
                                   theirs(x, memory, tgt_mask=future), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("sublayers", [2, 12, 36, 150, 300])
def test_analytic_admin_omega_is_admin_torch(sublayers):
    import admin_torch

    assert admin_analytic_omega(sublayers) == pytest.approx(admin_torch.calculate_init(sublayers, "O(logn)"), rel=1e-12)


def x_transformers_stack(ours, side, **options):
    """x-transformers' ``Encoder``/``Decoder`` (``AttentionLayers``: ReLU FFN, our heads and widths) holding our
    ``side`` stack's weights: its attention and FFN projections, every norm's parameters, the final norm.
    x-transformers' projections and LayerNorms have no biases; ``biasless`` zeroes ours first."""
    import x_transformers

    layers = list(ours.layers)
    kind = x_transformers.Encoder if side == "encoder" else x_transformers.Decoder
    extra = {} if side == "encoder" else {"cross_attend": True}
    # norm_add_unit_offset: x-transformers stores gamma - 1 by default (gamma 0 at init); we store gamma
    theirs = kind(dim=DIM, depth=len(layers), heads=HEADS, attn_dim_head=DIM // HEADS, ff_mult=FFN // DIM,
                  ff_custom_activation=torch.nn.ReLU(), norm_add_unit_offset=False, **extra, **options)
    sublayers = ["self_attn", "encoder_attn", "ffn"] if side == "decoder" else ["self_attn", "ffn"]
    blocks = iter(theirs.layers)

    def copy_norm(their_norm, our_norm):
        for their_name, our_name in (("gamma", "weight"), ("pre_tanh_scale", "alpha"), ("beta", "bias")):
            if hasattr(their_norm, their_name):
                getattr(their_norm, their_name).copy_(getattr(our_norm, our_name).reshape_as(getattr(their_norm, their_name)))

    with torch.no_grad():
        for layer in layers:
            for sublayer in sublayers:
                norms, block, _ = next(blocks)
                copy_norm(norms[0], getattr(layer, "final_layer_norm" if sublayer == "ffn" else f"{sublayer}_layer_norm"))
                if norms[1] is not None:
                    copy_norm(norms[1], getattr(layer, f"{sublayer}_output_norm"))
                if sublayer == "ffn":
                    their_linears = [m for m in block.modules() if isinstance(m, torch.nn.Linear)]
                    for theirs_linear, our_linear in zip(their_linears, (layer.fc1, layer.fc2)):
                        theirs_linear.weight.copy_(our_linear.weight)
                        theirs_linear.bias.copy_(our_linear.bias)
                else:
                    attention = getattr(layer, sublayer)
                    for their_name, our_name in (("to_q", "q_proj"), ("to_k", "k_proj"), ("to_v", "v_proj"),
                                                 ("to_out", "out_proj")):
                        getattr(block, their_name).weight.copy_(getattr(attention, our_name).weight)
        copy_norm(theirs.final_norm, ours.layer_norm)
    return theirs.eval()


def biasless(model):
    """Zero what x-transformers does not have: the attention projections' biases and the norms' beta."""
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith(".bias") and ("_proj." in name or "norm" in name):
                parameter.zero_()
    return model


@pytest.mark.parametrize("method, options", [("periln", {"sandwich_norm": True}),
                                             ("dyt", {"use_dynamic_tanh": True, "dynamic_tanh_init_alpha": 0.5})])
def test_x_transformers_stacks_compute_ours(method, options, build_model):
    """Peri-LN's block is x-transformers' sandwich norm (a LayerNorm before and after every branch), DyT's Pre-LN
    stack with every norm a DynamicTanh is x-transformers' ``use_dynamic_tanh``: whole stacks, final norm included."""
    model = biasless(deep_layers(build_model, method))
    memory, x = torch.randn(7, 2, DIM), torch.randn(5, 2, DIM)  # T x B x C, as fairseq
    padding = torch.tensor([[False] * 7, [False] * 5 + [True] * 2])
    future = torch.triu(torch.full((5, 5), float("-inf")), 1)

    theirs = x_transformers_stack(model.encoder, "encoder", **options)
    ours = memory
    for layer in model.encoder.layers:
        ours, _ = layer(ours, padding)
    ours = model.encoder.layer_norm(ours)
    expected = theirs(memory.transpose(0, 1), mask=~padding)  # batch-first; their mask keeps what is True
    torch.testing.assert_close(ours.transpose(0, 1)[~padding], expected[~padding], rtol=1e-5, atol=1e-5)

    theirs = x_transformers_stack(model.decoder, "decoder", **options)
    ours = x
    for layer in model.decoder.layers:
        ours = layer(ours, memory, padding, self_attn_mask=future)[0]
    ours = model.decoder.layer_norm(ours)
    expected = theirs(x.transpose(0, 1), context=memory.transpose(0, 1), context_mask=~padding)
    torch.testing.assert_close(ours.transpose(0, 1), expected, rtol=1e-5, atol=1e-5)


def test_dyt_norm_is_the_authors_formula(build_model):
    """Each DyT is ``weight * tanh(alpha * x) + bias`` (jiachenzhu/DyT ``dynamic_tanh.py``, channels last) and
    x-transformers' ``DynamicTanh``, at the init the flags give and away from it."""
    from x_transformers.x_transformers import DynamicTanh

    model, _ = build_model("transformer_dyt_iwslt_de_en", "--encoder-layers", 1, "--decoder-layers", 1,
                           "--dyt-alpha-init", 0.3, "--dyt-attention-alpha-init", 0.7)
    norm = model.decoder.layers[0].encoder_attn_layer_norm
    assert norm.alpha.item() == pytest.approx(0.7)
    theirs = DynamicTanh(norm.weight.numel(), init_alpha=0.7)
    x = 3 * torch.randn(4, 2, norm.weight.numel())
    torch.testing.assert_close(norm(x), theirs(x))
    with torch.no_grad():
        for parameter in (norm.alpha, norm.weight, norm.bias):
            parameter.add_(0.2 * torch.randn_like(parameter))
        theirs.pre_tanh_scale.copy_(norm.alpha[0]), theirs.gamma.copy_(norm.weight), theirs.beta.copy_(norm.bias)
    torch.testing.assert_close(norm(x), theirs(x))
    torch.testing.assert_close(norm(x), norm.weight * torch.tanh(norm.alpha * x) + norm.bias)
