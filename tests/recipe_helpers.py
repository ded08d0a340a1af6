"""Small models of one recipe, and a forward pass that records what its sublayers saw, for the recipe tests."""

import torch

SMALL = ["--encoder-embed-dim", 32, "--decoder-embed-dim", 32, "--encoder-ffn-embed-dim", 64,
         "--decoder-ffn-embed-dim", 64, "--encoder-attention-heads", 2, "--decoder-attention-heads", 2, "--dropout", 0]


def small_model(build_model, method, encoder_layers=3, decoder_layers=2, *flags, perturb=True):
    """An eval-mode model with every parameter moved off its init (so scalars at 0 or 1 show their role)."""
    torch.manual_seed(0)
    model, args = build_model(f"transformer_{method}_iwslt_de_en", "--encoder-layers", encoder_layers,
                              "--decoder-layers", decoder_layers, *SMALL, *flags)
    if perturb:
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.add_(0.1 * torch.randn_like(parameter))
    return model.eval(), args


def record(model, src_length=6, tgt_length=5):
    """Run the model once on fixed random tokens; returns a dict: ``inputs`` {stack: [each layer's input]},
    ``outputs`` {stack: [each layer's (output, branch sum)]}, ``branches`` {stack: [f_i of every sublayer]},
    ``embedded`` {stack: its embedding output, T x B x C}, ``encoder_out``, ``features`` (decoder, B x T x C)."""
    inputs, outputs, branches = {"encoder": [], "decoder": []}, {"encoder": [], "decoder": []}, {"encoder": [], "decoder": []}
    handles = []
    for side in ("encoder", "decoder"):
        for layer in getattr(model, side).layers:
            handles.append(layer.register_forward_pre_hook(lambda m, a, side=side: inputs[side].append(a[0])))
            handles.append(layer.register_forward_hook(lambda m, a, out, side=side: outputs[side].append(out)))
            for residual in ("self_attn_residual", "encoder_attn_residual", "ffn_residual"):
                module = getattr(layer, residual, None)
                if module is not None:
                    handles.append(module.register_forward_pre_hook(
                        lambda m, a, side=side: branches[side].append(a[1])))
    torch.manual_seed(1)
    src, prev = torch.randint(4, 30, (2, src_length)), torch.randint(4, 30, (2, tgt_length))
    with torch.no_grad():
        encoder_out = model.encoder(src, src_lengths=torch.tensor([src_length] * 2))
        features, _ = model.decoder(prev, encoder_out=encoder_out, features_only=True)
    for handle in handles:
        handle.remove()
    embedded = {"encoder": embedding_output(model, "encoder", src), "decoder": embedding_output(model, "decoder", prev)}
    return {"inputs": inputs, "outputs": outputs, "branches": branches, "embedded": embedded,
            "encoder_out": encoder_out["encoder_out"][0], "features": features}


def embedding_output(model, side, tokens):
    """What a stack's first layer would read without a stack connection: fairseq's embedding output, T x B x C."""
    stack = getattr(model, side)
    if side == "encoder":
        x, _ = stack.forward_embedding(tokens)
        return x.transpose(0, 1)
    x = stack.embed_scale * stack.embed_tokens(tokens) + stack.embed_positions(tokens)
    return stack.dropout_module(x).transpose(0, 1)
