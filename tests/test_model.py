"""The one model class: arch registry, sizes, submodule names, forward/backward, flag conflicts."""

import pytest
import torch
from fairseq.models import ARCH_MODEL_REGISTRY
from fairseq.modules.transformer_layer import TransformerDecoderLayerBase, TransformerEncoderLayerBase

METHODS = ["preln", "deepnorm", "tfixup", "admin", "subln", "b2t", "resi_dual", "dlcl", "rezero", "dsinit", "periln",
           "mixln", "lns", "dyt", "hybridnorm", "denseformer", "sigma", "hyper"]
SIZES = {"": (512, 2048, 8), "_iwslt_de_en": (512, 1024, 4), "_big": (1024, 4096, 16)}


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("suffix, size", SIZES.items())
def test_arch_registered_on_one_model_with_fairseq_sizes(method, suffix, size, build_model):
    arch = f"transformer_{method}{suffix}"
    assert ARCH_MODEL_REGISTRY[arch].__name__ == "DeepTransformerModel"
    _, args = build_model(arch, "--encoder-layers", 1, "--decoder-layers", 1)
    assert (args.encoder_embed_dim, args.encoder_ffn_embed_dim, args.encoder_attention_heads) == size
    assert (args.decoder_embed_dim, args.decoder_ffn_embed_dim, args.decoder_attention_heads) == size


@pytest.mark.parametrize("method", METHODS)
def test_layers_subclass_fairseq_and_keep_names(method, build_model):
    model, _ = build_model(f"transformer_{method}_iwslt_de_en", "--encoder-layers", 2, "--decoder-layers", 2)
    encoder_layer, decoder_layer = model.encoder.layers[0], model.decoder.layers[0]
    assert isinstance(encoder_layer, TransformerEncoderLayerBase)
    assert isinstance(decoder_layer, TransformerDecoderLayerBase)
    names = {name for name, _ in model.named_modules()}
    for sub in ("self_attn", "fc1", "fc2"):
        assert f"encoder.layers.0.{sub}" in names and f"decoder.layers.0.{sub}" in names
    assert "decoder.layers.0.encoder_attn" in names
    without = {"tfixup": {"self_attn_layer_norm", "encoder_attn_layer_norm", "final_layer_norm"},
               "rezero": {"self_attn_layer_norm", "encoder_attn_layer_norm", "final_layer_norm"},
               "hybridnorm": {"final_layer_norm"}}.get(method, set())  # HybridNorm: no norm at the FFN's input
    for sub in ("self_attn_layer_norm", "final_layer_norm"):
        assert (f"encoder.layers.0.{sub}" in names) == (sub not in without)
    assert ("decoder.layers.0.encoder_attn_layer_norm" in names) == ("encoder_attn_layer_norm" not in without)


@pytest.mark.parametrize("method", METHODS)
def test_forward_backward_reaches_every_parameter(method, build_model):
    """Every parameter gets a finite gradient: none is unused (DDP would fail on an unused one)."""
    model, _ = build_model(f"transformer_{method}_iwslt_de_en", "--encoder-layers", 4, "--decoder-layers", 4,
                           "--encoder-embed-dim", 64, "--decoder-embed-dim", 64, "--share-all-embeddings")
    if method == "admin":
        model.admin_initialized.fill_(True)  # as translation_deep does before training
    model.train()
    src = torch.randint(4, 30, (3, 9))
    prev = torch.randint(4, 30, (3, 7))
    logits, _ = model(src, torch.tensor([9, 9, 9]), prev)
    assert logits.shape == (3, 7, len(model.decoder.dictionary))
    logits.logsumexp(-1).mean().backward()
    for name, param in model.named_parameters():
        assert param.grad is not None, f"{name} gets no gradient"
        assert torch.isfinite(param.grad).all(), name


@pytest.mark.parametrize("method", METHODS)
def test_incremental_decoding_matches_full_forward(method, build_model):
    """fairseq-generate decodes step by step; it must equal the teacher-forced forward."""
    model, _ = build_model(f"transformer_{method}_iwslt_de_en", "--encoder-layers", 2, "--decoder-layers", 2,
                           "--encoder-embed-dim", 32, "--decoder-embed-dim", 32)
    model.eval()
    src, prev = torch.randint(4, 30, (2, 5)), torch.randint(4, 30, (2, 6))
    encoder_out = model.encoder(src, src_lengths=torch.tensor([5, 5]))
    full, _ = model.decoder(prev, encoder_out=encoder_out)
    state = {}
    steps = [model.decoder(prev[:, : t + 1], encoder_out=encoder_out, incremental_state=state)[0] for t in range(6)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("arch", ["transformer_deepnorm", "transformer_tfixup_iwslt_de_en"])
@pytest.mark.parametrize("flag", ["--encoder-normalize-before", "--decoder-normalize-before"])
def test_pre_ln_flag_contradicts_post_ln_recipes(arch, flag, build_model):
    with pytest.raises(SystemExit) as error:
        build_model(arch, flag)
    assert str(error.value.code).startswith(f"deepnmt: error: {flag} contradicts --arch {arch}")
    assert "\n" not in str(error.value.code)
