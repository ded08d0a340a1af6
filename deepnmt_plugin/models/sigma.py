"""σReparam (Zhai et al., ICML 2023, "Stabilizing Transformer Training by Preventing Attention Entropy Collapse";
apple/ml-sigma-reparam, ``vision/layers.py``, ``SNLinear`` and ``SpectralNormedWeight``: the PyTorch code its
README says the language-model and translation experiments used).

Every linear weight is used as (Eq. 4) ``W_hat = gamma / sigma(W) * W``: sigma(W) the spectral norm of W, estimated by
one power-iteration step per training forward from the stored right singular vector u (``v = normalize(W u)``,
``u = normalize(W^T v)``, ``sigma = v^T W u``, the gradient flowing through W only), gamma a learnable scalar. At init
W is drawn from a normal truncated at 2 std, std 0.02 x ``--sigma-init-gain`` (the code's ``trunc_normal_`` and
``init_multiplier``), u and sigma come from its SVD, and gamma = sigma(W), so that ``W_hat = W``. The reparameterised
weights are the attention's q/k/v/out and the FFN's fc1/fc2 (every ``nn.Linear`` of a layer; fairseq's output
projection is the shared embedding). u is a buffer saved with the model: an evaluation forward reads it without
updating it, as the code's, so generation uses the estimate training left.

The layout is Post-LN, the paper's translation setting (it trains Post-LN to 100L-100L without warmup; the depth study
runs it without warmup, as Pre-LN and T-Fixup). Quant-noise, which hooks the projections replaced here
(``--quant-noise-pq``) or swaps them for fairseq's own (``--quant-noise-scalar``), is refused.
"""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from deepnmt_plugin.models.method import AdoptedLinear, ArchitectureError, DeepMethod, all_layers, register_method

DEFAULT_INIT_GAIN = 1.0


def spectral_init_(linear: "SigmaReparamLinear", std: float) -> None:
    """The code's ``SNLinear.__init__``: W ~ truncated normal(0, std), u and sigma from W's SVD, gamma = sigma."""
    with torch.no_grad():
        nn.init.trunc_normal_(linear.weight, std=std)  # truncated at +-2, as the code's call (its bounds, not 2 std)
        _, singular_values, right = torch.linalg.svd(linear.weight, full_matrices=False)
        linear.u.copy_(right[0])
        linear.gamma.fill_(singular_values[0].item())


class SigmaReparamLinear(AdoptedLinear):
    """``F.linear(x, gamma / sigma(W) * W, b)``; keeps the projection's parameter names (``weight``, ``bias``) and adds
    ``gamma`` and the buffer ``u``."""

    def __init__(self, linear: nn.Linear):
        super().__init__(linear)
        self.gamma = nn.Parameter(torch.ones(1))
        self.register_buffer("u", F.normalize(torch.ones(linear.in_features), dim=0))  # set by spectral_init_

    def sigma(self) -> Tensor:
        """One power-iteration step from u (stored in a training forward); v^T W u, differentiable in W."""
        with torch.no_grad():
            v = F.normalize(torch.mv(self.weight, self.u), dim=0)
            u = F.normalize(torch.mv(self.weight.t(), v), dim=0)
        # once a step: activation checkpointing runs a training forward twice, first without gradients
        if self.training and torch.is_grad_enabled():
            with torch.no_grad():
                self.u.copy_(u)
        return torch.dot(v, torch.mv(self.weight, u))

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(x, self.weight * (self.gamma / self.sigma()), self.bias)


@register_method
class SigmaReparam(DeepMethod):
    name = "sigma"
    flag_names = ("sigma_init_gain",)
    export_refusal = "σReparam's weights are rescaled by their spectral norm at every step, which stock fairseq does not"

    def __init__(self, encoder_layers: int, decoder_layers: int, init_gain: float = DEFAULT_INIT_GAIN):
        super().__init__(encoder_layers, decoder_layers)
        self.init_gain = init_gain

    @classmethod
    def add_args(cls, parser) -> None:
        parser.add_argument("--sigma-init-gain", type=float, default=None,
                            help=f"transformer_sigma: weights drawn with std 0.02 x this gain (default "
                                 f"{DEFAULT_INIT_GAIN}; the authors use 0.125 for their largest vision models)")

    @classmethod
    def from_config(cls, cfg) -> "SigmaReparam":
        method = super().from_config(cfg)
        gain = getattr(cfg, "sigma_init_gain", None)
        method.init_gain = DEFAULT_INIT_GAIN if gain is None else gain
        return method

    def check_args(self, args, arch: str) -> None:
        super().check_args(args, arch)
        if not 0 < self.init_gain < math.inf:  # also refuses nan
            raise ArchitectureError(f"--sigma-init-gain {self.init_gain:g}: give a positive, finite gain")
        if getattr(args, "quant_noise_pq", 0) > 0:
            raise ArchitectureError(f"--quant-noise-pq is not supported by --arch {arch}: σReparam replaces the "
                                    "projections quant-noise instruments")

    def linear(self, linear: nn.Linear) -> nn.Linear:
        return SigmaReparamLinear(linear)

    def initialize(self, model: nn.Module) -> None:
        for stack in (model.encoder, model.decoder):
            for layer in all_layers(stack):
                for module in layer.modules():
                    if isinstance(module, SigmaReparamLinear):
                        spectral_init_(module, 0.02 * self.init_gain)
                        self.refuse_unresolved_sigma(module)

    def refuse_unresolved_sigma(self, linear: SigmaReparamLinear) -> None:
        """A gain so small that the drawn W's spectral norm is under F.normalize's floor (1e-12) leaves the power
        iteration's estimate wrong (``W_hat != W`` at init), then 0 (nan in the first forward): refused, in one line
        while the model is built, since it depends on the drawn weights."""
        with torch.no_grad():
            estimate = linear.sigma()  # under no_grad: u is not updated
        if not (linear.gamma[0] > 0 and torch.isclose(estimate, linear.gamma[0], rtol=1e-3, atol=0)):  # W = 0: 0 / 0
            raise ArchitectureError(f"--sigma-init-gain {self.init_gain:g}: weights drawn with std "
                                    f"{0.02 * self.init_gain:.3g} have a spectral norm of {linear.gamma.item():.3g}, "
                                    "under what σReparam's power iteration resolves (1e-12); give a larger gain")
