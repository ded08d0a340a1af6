"""ReZero (Bachlechner et al. 2020, "ReZero is All You Need: Fast Convergence at Large Depth";
majumderb/rezero, ``RZTXEncoderLayer``/``RZTXDecoderLayer``).

Eq. 5: ``x_{i+1} = x_i + alpha_i * F(x_i)``, no LayerNorm anywhere (per layer, final, embedding). One scalar
``alpha`` per layer (``resweight``), initialised to 0 so every layer starts as the identity, shared by the
layer's sublayers; dropout is on the branch, ``x + dropout(alpha * f) = x + alpha * dropout(f)``.
fairseq's initialisation is kept (the package keeps PyTorch's).
"""

import torch
import torch.nn as nn
from torch import Tensor

from deepnmt_plugin.models.method import DeepMethod, Residual, register_method, scaled_residual_sum


class ReZeroResidual(Residual):
    """``x + alpha * f``; the sublayers of one layer hold the same ``alpha`` Parameter (tied, as fairseq ties
    embeddings)."""

    def __init__(self, alpha: nn.Parameter):
        super().__init__()
        self.alpha = alpha

    def forward(self, x: Tensor, f: Tensor, layer_input: Tensor) -> Tensor:
        return scaled_residual_sum(x, f, self.alpha)


@register_method
class ReZero(DeepMethod):
    name = "rezero"
    layer_norm = "none"
    export_refusal = "ReZero has no LayerNorm, and stock fairseq's transformer normalises every sublayer"

    def residuals(self, side: str, embed_dim: int, count: int, layer_number: int):
        alpha = nn.Parameter(torch.zeros(1))
        return [ReZeroResidual(alpha) for _ in range(count)]
