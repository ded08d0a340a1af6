"""Pre-LN (Xiong et al. 2020): LayerNorm inside each branch, a final LayerNorm on both stacks."""

import torch


def test_layer_norm_sits_inside_the_branch(build_model):
    model, _ = build_model("transformer_preln_iwslt_de_en", "--encoder-layers", 3, "--decoder-layers", 2, "--dropout", 0)
    model.eval()
    layer = model.encoder.layers[1]
    seen = {}
    layer.register_forward_pre_hook(lambda mod, inp: seen.__setitem__("in", inp[0]))
    layer.register_forward_hook(lambda mod, inp, out: seen.__setitem__("out", out[0]))  # (output, branch sum)
    layer.self_attn_layer_norm.register_forward_pre_hook(lambda mod, inp: seen.__setitem__("ln_in", inp[0]))
    layer.self_attn_layer_norm.register_forward_hook(lambda mod, inp, out: seen.__setitem__("ln_out", out))
    layer.self_attn.register_forward_pre_hook(lambda mod, args, kwargs: seen.__setitem__("attn_in", kwargs["query"]), with_kwargs=True)
    layer.self_attn.register_forward_hook(lambda mod, inp, out: seen.__setitem__("attn_out", out[0]))
    layer.fc2.register_forward_hook(lambda mod, inp, out: seen.__setitem__("ffn_out", out))
    encoder_out = model.encoder(torch.randint(4, 30, (2, 6)), src_lengths=torch.tensor([6, 6]))

    torch.testing.assert_close(seen["ln_in"], seen["in"])  # LN reads the raw residual stream
    torch.testing.assert_close(seen["attn_in"], seen["ln_out"])  # attention reads LN(x)
    torch.testing.assert_close(seen["out"], seen["in"] + seen["attn_out"] + seen["ffn_out"])  # no LN on the sum

    final = model.encoder.layer_norm
    assert final is not None and model.decoder.layer_norm is not None
    last = {}
    model.encoder.layers[-1].register_forward_hook(lambda mod, inp, out: last.__setitem__("out", out[0]))
    encoder_out = model.encoder(torch.randint(4, 30, (2, 6)), src_lengths=torch.tensor([6, 6]))
    torch.testing.assert_close(encoder_out["encoder_out"][0], final(last["out"]))


def test_arch_sets_pre_ln_on_both_sides(build_model):
    _, args = build_model("transformer_preln_big")
    assert args.encoder_normalize_before and args.decoder_normalize_before
    assert (args.encoder_embed_dim, args.encoder_ffn_embed_dim, args.encoder_attention_heads) == (1024, 4096, 16)
