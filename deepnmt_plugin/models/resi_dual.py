"""ResiDual (Xie et al. 2023, "ResiDual: Transformer with Dual Residual Connections"; microsoft/ResiDual,
``resi_dual/resi_dual.py`` and ``resi_dual_layers.py``, a fairseq 0.12 user-dir).

Two streams per stack (Eq. 5-7). The Post-LN stream: every sublayer ``x_i = LN(x_{i-1} + f_i)``, with
f_i the branch output after dropout. The dual stream starts as ``s * x_0`` (the embedding output, after
dropout) and adds ``s * f_i`` of every sublayer, unnormalised. The stack outputs
``alpha * x_L + LN_out(dual)``, LN_out with eps 1e-7; no other final LayerNorm.

Flags, the authors' names and defaults: ``--enc-alpha``/``--dec-alpha`` (alpha, 1.0) and
``--enc-res-input-norm-scale``/``--dec-res-input-norm-scale`` (s, 1.0; their 18-layer OPUS config uses 0.05).
"""

import math
from typing import List, Optional

import torch
import torch.nn as nn
from fairseq.modules import LayerNorm
from torch import Tensor

from deepnmt_plugin.models.method import ArchitectureError, DeepMethod, StackConnection, register_method

FLAGS = {  # dest -> (side, what it sets)
    "enc_alpha": ("encoder", "alpha"), "dec_alpha": ("decoder", "alpha"),
    "enc_res_input_norm_scale": ("encoder", "scale"), "dec_res_input_norm_scale": ("decoder", "scale"),
}


class DualStream(StackConnection):
    """``state[0]`` is the dual stream: ``s * x_0 + s * sum_i f_i``; the stack outputs
    ``alpha * x + LN_out(dual)``."""

    def __init__(self, embed_dim: int, alpha: float, scale: float):
        super().__init__()
        self.alpha, self.scale = alpha, scale
        self.layer_norm = LayerNorm(embed_dim, eps=1e-7)

    def begin(self, x: Tensor, state: List[Tensor]) -> Tensor:
        state.append(self.scale * x)
        return x

    def next_input(self, index: int, x: Tensor, branches: Optional[Tensor], state: List[Tensor]) -> Tensor:
        assert branches is not None  # the layers sum their branches (branch_sum)
        state[0] = torch.add(state[0], branches, alpha=self.scale)  # one operator; its backward skips a scale of 1
        return x

    def output(self, x: Tensor, state: List[Tensor]) -> Tensor:
        return self.alpha * x + self.layer_norm(state[0])

    def extra_repr(self) -> str:
        return f"alpha={self.alpha:g}, scale={self.scale:g}"


@register_method
class ResiDual(DeepMethod):
    name = "resi_dual"
    branch_sum = True
    flag_names = tuple(FLAGS)
    export_refusal = "its output adds a LayerNorm of a second residual stream, which stock fairseq does not compute"

    def __init__(self, encoder_layers: int, decoder_layers: int, **settings: float):
        super().__init__(encoder_layers, decoder_layers)
        self.settings = {dest: settings.get(dest, 1.0) for dest in FLAGS}

    @classmethod
    def add_args(cls, parser) -> None:
        for dest, (side, what) in FLAGS.items():
            parser.add_argument(f"--{dest.replace('_', '-')}", type=float, default=None,
                                help=f"transformer_resi_dual: the {side} stack's {what} "
                                     f"({'alpha * x + LN(dual)' if what == 'alpha' else 'dual = s * (x_0 + sum f)'}), "
                                     "default 1.0")

    @classmethod
    def from_config(cls, cfg) -> "ResiDual":
        settings = {dest: getattr(cfg, dest, None) for dest in FLAGS}
        method = super().from_config(cfg)
        method.settings.update({dest: value for dest, value in settings.items() if value is not None})
        return method

    def check_args(self, args, arch: str) -> None:
        super().check_args(args, arch)
        for dest, value in self.settings.items():
            if not math.isfinite(value):  # the stack's output would be nan or inf from the first step
                raise ArchitectureError(f"--{dest.replace('_', '-')} {value:g}: give a finite number")

    def stack_connection(self, side: str, embed_dim: int, num_layers: int) -> nn.Module:
        prefix = "enc" if side == "encoder" else "dec"
        return DualStream(embed_dim, self.settings[f"{prefix}_alpha"], self.settings[f"{prefix}_res_input_norm_scale"])
