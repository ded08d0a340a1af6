"""Pre-LN (Xiong et al. 2020, "On Layer Normalization in the Transformer Architecture").

Eq. (Pre-LN, Table 1 right): ``x_i = x_{i-1} + f_i(LN(x_{i-1}))``, plus a final LayerNorm on the
encoder and decoder outputs (fairseq builds it when ``normalize_before`` is set). The gradient at
initialisation is well behaved (Theorem 1), so the recipe trains without learning-rate warmup.
"""

import torch.nn as nn
from torch import Tensor

from deepnmt_plugin.models.method import Branch, DeepMethod, register_method


class PreNormResidual(nn.Module):
    """``x_i = x_{i-1} + f_i(LN(x_{i-1}))``."""

    def forward(self, x: Tensor, branch: Branch, layer_norm: nn.Module) -> Tensor:
        return x + branch(layer_norm(x))


@register_method
class PreLN(DeepMethod):
    name = "preln"
    layer_norm = "pre"

    def residual(self, side: str, embed_dim: int) -> nn.Module:
        return PreNormResidual()
