"""LayerNorm Scaling (Sun et al. 2025, "The Curse of Depth in Large Language Models"; lmsdss/LayerNorm-Scaling,
``peft_pretraining/modeling_llama.py``, ``norm_type == 'LNS'``).

Pre-LN, with the output of each sublayer's LayerNorm in layer l (1-based, counted per stack) scaled by 1/sqrt(l)
: ``x + f(LN(x) / sqrt(l))``, so the variance a Pre-LN stack adds with depth grows polynomially rather than
exponentially. The authors' code multiplies both sublayer norms of layer ``layer_index + 1``; the final LayerNorm and
the embeddings are not scaled. Cross-attention's LayerNorm (no decoder-only model has one) is scaled as its layer's
others. fairseq's initialisation is kept.

``deepnmt-export`` writes the model as stock Pre-LN: ``LN(x) * s`` is a LayerNorm whose weight and bias are
multiplied by s.
"""

import math

import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from deepnmt_plugin.models.method import DeepMethod, register_method

SCALED_ROLES = ("self_attn", "encoder_attn", "ffn")


def lns_scale(layer_number: int) -> float:
    """The factor on layer ``layer_number``'s (1-based) LayerNorm outputs: 1/sqrt(l)."""
    return 1 / math.sqrt(layer_number)


class ScaledLayerNorm(nn.LayerNorm):
    """``LN(x) * scale``; the parameters are the LayerNorm's own (``weight``, ``bias``), the scale a constant saved
    with the model's config (its layer number), not a parameter."""

    def __init__(self, dim: int, scale: float):
        super().__init__(dim)
        self.scale = scale

    def forward(self, x: Tensor) -> Tensor:
        return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps) * self.scale

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, scale={self.scale:.6g}"


@register_method
class LayerNormScaling(DeepMethod):
    name = "lns"
    layer_norm = "pre"

    def norm(self, role, dim, layer_number, export):
        if role in SCALED_ROLES:
            return ScaledLayerNorm(dim, lns_scale(layer_number))
        return super().norm(role, dim, layer_number, export)
