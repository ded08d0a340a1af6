"""DeepNorm (Wang et al. 2022, "DeepNet: Scaling Transformers to 1,000 Layers").

Residual (Sec. 3.1): ``x_{l+1} = LN(alpha * x_l + G_l(x_l, theta_l))``: a Post-LN layout whose
residual sum is ``alpha * x + G(x)`` (``DeepNormResidual``).
Init (Figure 2 pseudocode): ``xavier_normal_(w, gain=beta)`` for ``fc1``, ``fc2``, ``v_proj`` and
``out_proj``; ``xavier_normal_(w, gain=1)`` for ``q_proj`` and ``k_proj``.
Constants (Table 1 / Figure 2), N encoder and M decoder layers:

* encoder-decoder, encoder:  alpha = 0.81 (N^4 M)^(1/16),  beta = 0.87 (N^4 M)^(-1/16)
* encoder-decoder, decoder:  alpha = (3M)^(1/4),           beta = (12M)^(-1/4)
* encoder-only or decoder-only (the other side has 0 layers), L layers:
  alpha = (2L)^(1/4),  beta = (8L)^(-1/4)

fairseq leaves ``fc1``/``fc2`` at PyTorch's default Linear init and q/k/v at Xavier-uniform with
gain 1/sqrt(2), so every listed weight is re-initialised explicitly. Biases keep fairseq's init, as
in the paper's pseudocode (torchscale instead divides biases too; torchscale issue #16).
"""

import torch
import torch.nn as nn
from torch import Tensor

from deepnmt_plugin.models.method import DeepMethod, Residual, all_layers, layer_attentions, register_method


def deepnorm_alpha(side: str, encoder_layers: int, decoder_layers: int) -> float:
    """Residual scale alpha of the ``side`` stack (DeepNet Figure 2)."""
    n, m = encoder_layers, decoder_layers
    if n == 0 or m == 0:
        return (2 * (n or m)) ** 0.25
    if side == "encoder":
        return 0.81 * (n**4 * m) ** (1 / 16)
    return (3 * m) ** 0.25


def deepnorm_beta(side: str, encoder_layers: int, decoder_layers: int) -> float:
    """Initialisation gain beta of the ``side`` stack (DeepNet Figure 2)."""
    n, m = encoder_layers, decoder_layers
    if n == 0 or m == 0:
        return (8 * (n or m)) ** -0.25
    if side == "encoder":
        return 0.87 * (n**4 * m) ** (-1 / 16)
    return (12 * m) ** -0.25


class DeepNormResidual(Residual):
    """``alpha * x_l + G(x_l)``, the sum the layer then normalises: ``x_{l+1} = LN(alpha * x_l + G(x_l))``."""

    def __init__(self, alpha: float):
        super().__init__()
        self.alpha = alpha

    def forward(self, x: Tensor, f: Tensor, layer_input: Tensor) -> Tensor:
        # G(x) + alpha * x in one kernel, as many as stock x + G(x): on a GPU small steps are launch-bound
        return torch.add(f, x, alpha=self.alpha)

    def extra_repr(self) -> str:
        return f"alpha={self.alpha:.6g}"


def deepnorm_init_(layer: nn.Module, beta: float) -> None:
    """DeepNet Figure 2: Xavier-normal, gain beta on the value path and FFN, gain 1 on q/k."""
    attentions = layer_attentions(layer)
    for linear in [layer.fc1, layer.fc2] + [a.v_proj for a in attentions] + [a.out_proj for a in attentions]:
        nn.init.xavier_normal_(linear.weight, gain=beta)
    for attention in attentions:
        nn.init.xavier_normal_(attention.q_proj.weight, gain=1.0)
        nn.init.xavier_normal_(attention.k_proj.weight, gain=1.0)


@register_method
class DeepNorm(DeepMethod):
    name = "deepnorm"

    def residual(self, side: str, embed_dim: int) -> nn.Module:
        return DeepNormResidual(deepnorm_alpha(side, self.encoder_layers, self.decoder_layers))

    def initialize(self, model: nn.Module) -> None:
        for side, stack in (("encoder", model.encoder), ("decoder", model.decoder)):
            beta = deepnorm_beta(side, self.encoder_layers, self.decoder_layers)
            for layer in all_layers(stack):
                deepnorm_init_(layer, beta)
