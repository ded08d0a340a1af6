"""Sub-LN / MAGNETO (Wang et al. 2022, "Foundation Transformers"; microsoft/torchscale, ``subln=True``).

Layout (Sec. 2.1, Eq. 1-2): Pre-LN, plus one LayerNorm inside each self-attention and FFN branch, before
its last projection: ``x + out_proj(LN(Attn(LN(x))))`` and ``x + fc2(LN(act(fc1(LN(x)))))``, the FFN's
inner LayerNorm of the FFN width. Cross-attention gets no inner LayerNorm (torchscale builds
``inner_attn_ln`` for self-attention only). Final LayerNorm on both stacks, as Pre-LN.

Init (Sec. 2.2, Theorem 4.2 and torchscale ``Encoder``/``Decoder.__init__``): every weight and bias of
``fc1``, ``fc2``, ``out_proj`` and ``v_proj`` multiplied by gamma, N encoder and M decoder layers:

* encoder-decoder, encoder: gamma = sqrt(ln(3M) * ln(2N) / 3)
* encoder-decoder, decoder: gamma = sqrt(ln(3M)), not the decoder's ``encoder_attn``
* one stack only (the other has 0 layers), L layers: gamma = sqrt(ln(2L))

torchscale 0.3.0 never calls its attention's ``reset_parameters``, so q/k/v/out_proj keep PyTorch's
default Linear init (kaiming-uniform, uniform bias) where fairseq uses Xavier; we re-initialise them the
same way before scaling, so the statistics are those of the authors' runs.
"""

import math

import torch
import torch.nn as nn

from deepnmt_plugin.models.method import DeepMethod, all_layers, layer_attentions, register_method


def subln_gamma(side: str, encoder_layers: int, decoder_layers: int) -> float:
    """Init gain gamma of the ``side`` stack (torchscale ``Encoder``/``Decoder``, ``subln=True``)."""
    n, m = encoder_layers, decoder_layers
    if n == 0 or m == 0:
        return math.sqrt(math.log(2 * (n or m)))
    if side == "encoder":
        return math.sqrt(math.log(3 * m) * math.log(2 * n) / 3)
    return math.sqrt(math.log(3 * m))


def subln_init_(layer: nn.Module, gamma: float) -> None:
    """Attention projections at PyTorch's default init (as torchscale leaves them), then gamma on the
    weights and biases of fc1, fc2 and the self-attention's v_proj and out_proj."""
    attentions = layer_attentions(layer)
    with torch.no_grad():
        for attention in attentions:
            for projection in (attention.q_proj, attention.k_proj, attention.v_proj, attention.out_proj):
                nn.Linear.reset_parameters(projection)
        for linear in (layer.fc1, layer.fc2, layer.self_attn.v_proj, layer.self_attn.out_proj):
            linear.weight.mul_(gamma)
            linear.bias.mul_(gamma)


@register_method
class SubLN(DeepMethod):
    name = "subln"
    layer_norm = "pre"
    sub_layer_norm = True
    export_refusal = "Sub-LN's inner LayerNorms (before out_proj and fc2) are not in stock fairseq's transformer"

    def initialize(self, model: nn.Module) -> None:
        for side, stack in (("encoder", model.encoder), ("decoder", model.decoder)):
            gamma = subln_gamma(side, self.encoder_layers, self.decoder_layers)
            for layer in all_layers(stack):
                subln_init_(layer, gamma)
