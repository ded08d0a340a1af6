"""B2T connection (Takase et al. 2023, "B2T Connection: Serving Stability and Performance in Deep
Transformers"; takase/b2t_connection, ``--residual-bottom-to-top``).

Layout (Eq. 5 / Fig. 1c): Post-LN, and the last sublayer of every layer also adds the layer's input x_0:

* encoder: ``x_1 = LN(x_0 + SA(x_0))``,  ``out = LN(x_1 + FFN(x_1) + x_0)``
* decoder: ``x_1, x_2`` Post-LN self- and cross-attention as usual,  ``out = LN(x_2 + FFN(x_2) + x_0)``

No final LayerNorm, no parameter of its own. Init, as the authors' code (``rescaling_init``, commit
4d80167) and not the paper: every weight of a layer but its LayerNorms' multiplied by N^(-1/2) (encoder)
or M^(-1/2) (decoder) after fairseq's init; biases, LayerNorms and embeddings untouched.
"""

import torch
import torch.nn as nn
from torch import Tensor

from deepnmt_plugin.models.method import DeepMethod, PlainResidual, Residual, all_layers, register_method


class BottomToTopResidual(Residual):
    """The last sublayer's sum ``x + f + x_0``: the layer's input joins it, bypassing the earlier LayerNorms."""

    def forward(self, x: Tensor, f: Tensor, layer_input: Tensor) -> Tensor:
        return x + f + layer_input


def b2t_rescale_(layer: nn.Module, num_layers: int) -> None:
    """``rescaling_init``: every parameter named ``*weight*`` outside the LayerNorms times num_layers^(-1/2)."""
    with torch.no_grad():
        for name, parameter in layer.named_parameters():
            if "weight" in name and "layer_norm" not in name:
                parameter.mul_(num_layers**-0.5)


@register_method
class B2T(DeepMethod):
    name = "b2t"
    export_refusal = "its last sublayer adds the layer's input, which stock fairseq's transformer does not"

    def residuals(self, side: str, embed_dim: int, count: int, layer_number: int):
        return [PlainResidual() for _ in range(count - 1)] + [BottomToTopResidual()]

    def initialize(self, model: nn.Module) -> None:
        for stack, layers in ((model.encoder, self.encoder_layers), (model.decoder, self.decoder_layers)):
            for layer in all_layers(stack):
                b2t_rescale_(layer, layers)
