"""B2T connection (Takase et al. 2023): Post-LN, and the last sublayer of each layer adds the layer's input;
the authors' code scales each layer's weights by N^-1/2 (encoder) and M^-1/2 (decoder)."""

import torch

from recipe_helpers import SMALL, record, small_model


def test_last_sublayer_adds_the_layer_input(build_model):
    model, _ = small_model(build_model, "b2t")
    seen = record(model)
    for side, count in (("encoder", 2), ("decoder", 3)):
        for index, layer in enumerate(getattr(model, side).layers):
            x0, out = seen["inputs"][side][index], seen["outputs"][side][index][0]
            f = seen["branches"][side][count * index: count * (index + 1)]
            x1 = layer.self_attn_layer_norm(x0 + f[0])  # the first sublayer is plain Post-LN
            if side == "decoder":
                x1 = layer.encoder_attn_layer_norm(x1 + f[1])
            torch.testing.assert_close(out, layer.final_layer_norm(x1 + f[-1] + x0))
    assert model.encoder.layer_norm is None and model.decoder.layer_norm is None


def test_layer_weights_scaled_by_the_inverse_square_root_of_the_depth(build_model):
    def built(arch):
        torch.manual_seed(0)
        return build_model(arch, "--encoder-layers", 4, "--decoder-layers", 9, *SMALL)[0].state_dict()

    b2t, post_ln = built("transformer_b2t_iwslt_de_en"), built("transformer_iwslt_de_en")
    for name, value in b2t.items():
        if ".layers." not in name or "layer_norm" in name or not name.endswith("weight"):
            torch.testing.assert_close(value, post_ln[name], msg=name)  # biases, LayerNorms, embeddings untouched
        else:
            torch.testing.assert_close(value, post_ln[name] * (4 if name.startswith("encoder") else 9) ** -0.5,
                                       msg=name)
