"""DyT (Zhu, Chen, He, LeCun and Liu, CVPR 2025, "Transformers without Normalization"; jiachenzhu/DyT,
``dynamic_tanh.py``).

Eq. 1: every LayerNorm replaced by ``DyT(x) = gamma * tanh(alpha * x) + beta``: alpha one learnable scalar per
norm, initialised to alpha_0; gamma and beta per channel, initialised to 1 and 0, as a LayerNorm's affine. The
placement stays Pre-LN's (the paper's models are Pre-LN): each sublayer's input norm, the final norm of each stack
and, with ``--layernorm-embedding``, the embedding's.

alpha_0: 0.5 is the paper's default, for every non-LLM model (``--dyt-alpha-init``); for LLMs the authors
tune it, larger for the norms before attention than for the others, and smaller the wider the model (LLaMA 7B:
0.8 before attention, 0.2 elsewhere; 70B: 0.2 and 0.05; ``other_tasks/LLaMA``), depth mattering little.
``--dyt-attention-alpha-init`` gives the norms before self- and cross-attention their own alpha_0 (default: the
same). fairseq's initialisation is kept.
"""

import torch
import torch.nn as nn
from torch import Tensor

from deepnmt_plugin.models.method import ArchitectureError, DeepMethod, register_method

DEFAULT_ALPHA_INIT = 0.5
FLOAT32 = torch.finfo(torch.float32)
ATTENTION_ROLES = ("self_attn", "encoder_attn")


class DynamicTanh(nn.Module):
    """``gamma * tanh(alpha * x) + beta`` over the last dimension; ``weight`` is gamma and ``bias`` beta, named as a
    LayerNorm's affine."""

    def __init__(self, dim: int, alpha_init: float):
        super().__init__()
        self.alpha = nn.Parameter(torch.full((1,), float(alpha_init)))
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim))

    def forward(self, x: Tensor) -> Tensor:
        return torch.tanh(self.alpha * x) * self.weight + self.bias

    def extra_repr(self) -> str:
        return f"{self.weight.numel()}"


@register_method
class DyT(DeepMethod):
    name = "dyt"
    layer_norm = "pre"
    flag_names = ("dyt_alpha_init", "dyt_attention_alpha_init")
    export_refusal = "DyT replaces every LayerNorm by tanh, and stock fairseq's transformer normalises"

    def __init__(self, encoder_layers: int, decoder_layers: int, alpha_init: float = DEFAULT_ALPHA_INIT,
                 attention_alpha_init: float = DEFAULT_ALPHA_INIT):
        super().__init__(encoder_layers, decoder_layers)
        self.alpha_init, self.attention_alpha_init = alpha_init, attention_alpha_init

    @classmethod
    def add_args(cls, parser) -> None:
        parser.add_argument("--dyt-alpha-init", type=float, default=None,
                            help=f"transformer_dyt: alpha_0 of every DyT (default {DEFAULT_ALPHA_INIT}, the paper's)")
        parser.add_argument("--dyt-attention-alpha-init", type=float, default=None,
                            help="transformer_dyt: alpha_0 of the DyTs before self- and cross-attention "
                                 "(default: --dyt-alpha-init; the paper raises it for LLMs)")

    @classmethod
    def from_config(cls, cfg) -> "DyT":
        method = super().from_config(cfg)
        alpha = getattr(cfg, "dyt_alpha_init", None)
        method.alpha_init = DEFAULT_ALPHA_INIT if alpha is None else alpha
        attention_alpha = getattr(cfg, "dyt_attention_alpha_init", None)
        method.attention_alpha_init = method.alpha_init if attention_alpha is None else attention_alpha
        return method

    def check_args(self, args, arch: str) -> None:
        super().check_args(args, arch)
        for flag, value in (("--dyt-alpha-init", self.alpha_init),
                            ("--dyt-attention-alpha-init", self.attention_alpha_init)):
            # alpha is a float32 parameter: a value that rounds to 0 or overflows there is refused too; also nan
            if not FLOAT32.tiny <= value <= FLOAT32.max:
                raise ArchitectureError(f"{flag} {value:g}: alpha_0 must be positive and finite, as a float32 "
                                        f"({FLOAT32.tiny:.3g} to {FLOAT32.max:.3g}; tanh(0 * x) is 0 for every input, "
                                        "tanh(inf * 0) is nan)")

    def norm(self, role, dim, layer_number, export):
        return DynamicTanh(dim, self.attention_alpha_init if role in ATTENTION_ROLES else self.alpha_init)
