"""T-Fixup (Huang et al. 2020, "Improving Transformer Optimization Through Better Initialization").

No LayerNorm anywhere (per layer, final, embedding): every sublayer is ``x_i = x_{i-1} + f_i(x_{i-1})``
and the depth-scaled initialisation of Sec. 3.3 replaces warmup. N encoder, M decoder layers:

* input embeddings ~ N(0, d^-1/2) (std), then scaled by (9N)^(-1/4) (encoder); the decoder's by
  (9M)^(-1/4) unless it is the encoder's own table (``--share-all-embeddings``);
* decoder: ``v_proj``, ``out_proj`` (self- and encoder-attention), ``fc1``, ``fc2`` scaled by (9M)^(-1/4);
* encoder: ``v_proj``, ``out_proj``, ``fc1``, ``fc2`` scaled by 0.67 N^(-1/4); q/k untouched.

"Scaled" applies to Xavier-uniform (gain 1) weights, as in the reference code (layer6ai-labs/T-Fixup):
its fairseq 0.9 built ``fc1``/``fc2`` Xavier-uniform with zero bias and multiplied ``v_proj`` by sqrt(2)
to undo fairseq's gain 1/sqrt(2); we re-initialise those weights with gain 1 for the same statistics.
"""

import torch
import torch.nn as nn

from deepnmt_plugin.models.legacy_init import old_fairseq_ffn_init_
from deepnmt_plugin.models.method import DeepMethod, all_layers, layer_attentions, register_method


def tfixup_encoder_scale(encoder_layers: int) -> float:
    """Encoder weight scale 0.67 N^(-1/4) (T-Fixup Sec. 3.3)."""
    return 0.67 * encoder_layers**-0.25


def tfixup_decoder_scale(decoder_layers: int) -> float:
    """Decoder weight scale (9M)^(-1/4) (T-Fixup Sec. 3.3)."""
    return (9 * decoder_layers) ** -0.25


def tfixup_embedding_scale(num_layers: int) -> float:
    """Input embedding scale (9L)^(-1/4) of an L-layer stack (T-Fixup Sec. 3.3)."""
    return (9 * num_layers) ** -0.25


def tfixup_init_(layer: nn.Module, scale: float) -> None:
    """Xavier-uniform (gain 1, zero FFN bias) then ``scale`` on v_proj, out_proj, fc1 and fc2."""
    attentions = layer_attentions(layer)
    old_fairseq_ffn_init_(layer)
    with torch.no_grad():
        for attention in attentions:
            nn.init.xavier_uniform_(attention.v_proj.weight)
        for linear in [layer.fc1, layer.fc2] + [a.v_proj for a in attentions] + [a.out_proj for a in attentions]:
            linear.weight.mul_(scale)


@register_method
class TFixup(DeepMethod):
    name = "tfixup"
    layer_norm = "none"  # the residual sum stays x + f
    export_refusal = "T-Fixup has no LayerNorm, and stock fairseq's transformer normalises every sublayer"

    def initialize(self, model: nn.Module) -> None:
        encoder, decoder = model.encoder, model.decoder
        with torch.no_grad():
            encoder.embed_tokens.weight.mul_(tfixup_embedding_scale(self.encoder_layers))
            if decoder.embed_tokens is not encoder.embed_tokens:
                decoder.embed_tokens.weight.mul_(tfixup_embedding_scale(self.decoder_layers))
        for layer in all_layers(encoder):
            tfixup_init_(layer, tfixup_encoder_scale(self.encoder_layers))
        for layer in all_layers(decoder):
            tfixup_init_(layer, tfixup_decoder_scale(self.decoder_layers))
