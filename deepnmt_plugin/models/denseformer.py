"""DenseFormer (Pagliardini et al., NeurIPS 2024, "DenseFormer: Enhancing Information Flow in Transformers via
Depth Weighted Averaging"; epfml/DenseFormer, ``denseformer/denseformer.py``, ``DWAModules``).

Pre-LN layers; after layer i (1-based) a depth-weighted average (DWA) of the embedding output X_0 and the
layer outputs X_1..X_i is what the next layer reads, ``Y_i = sum_j alpha[i, j] * X_j``, alpha initialised to the
identity (alpha[i, i] = 1, the rest 0: the code's ``weight.zero_()``, ``weight[0, -1] = 1``), so the model starts as
Pre-LN. The history holds the layers' own outputs, not the averages (the code's accumulators). The last layer's
average goes through the stack's final LayerNorm (``ln_f``).

The code's sparsity options: ``--denseformer-dilation k`` (its ``dilation``): the average after layer i reads only
X_j with j = i mod k (X_0 in the group of multiples of k); ``--denseformer-period p`` (its ``dwa_period``): an
average after every p-th layer only, the others' outputs passed on as they are. Both 1 by default (the paper's
DenseFormer; its 48-layer models use 4x5 as a faster variant). Each stack must keep an average that reads an earlier
output: a period longer than a stack (no average: its weights unused) or a dilation longer than its last averaged layer
(each average a scale of its own layer's output) is refused.

The weights index layers by position, so LayerDrop and pruning are refused, as for DLCL, whose history
(``layer_history``: one matrix-vector product per average, memory linear in depth) computes the averages. fairseq's
initialisation is kept.
"""

from typing import List, Optional

import torch
import torch.nn as nn
from torch import Tensor

from deepnmt_plugin.models.dlcl import refuse_removing_layers
from deepnmt_plugin.models.layer_history import HistoryConnection, weighted_sum
from deepnmt_plugin.models.method import ArchitectureError, DeepMethod, refuse_below_one, register_method


def dwa_mask(num_layers: int, dilation: int) -> Tensor:
    """(L+1) x (L+1): 1 where the average after layer i (row i) reads X_j: j <= i and j = i mod dilation."""
    rows, columns = torch.arange(num_layers + 1).unsqueeze(1), torch.arange(num_layers + 1).unsqueeze(0)
    return ((columns <= rows) & (columns % dilation == rows % dilation)).float()


class DepthWeightedAverage(HistoryConnection):
    """``state`` is the history X_0 (the embedding output), X_1, ..., X_l; after layer l the next input is the
    alpha-weighted sum of its dilation group (row l of ``weight``, masked), on every ``period``-th layer."""

    def __init__(self, num_layers: int, dilation: int, period: int):
        super().__init__()
        self.dilation, self.period = dilation, period
        self.weight = nn.Parameter(torch.eye(num_layers + 1))
        self.register_buffer("mask", dwa_mask(num_layers, dilation), persistent=False)

    def begin(self, x: Tensor, state: List[Tensor]) -> Tensor:
        if torch.jit.is_scripting():
            state.append(x)
        else:
            self.start_history(self.weight * self.mask, x)
        return x

    def next_input(self, index: int, x: Tensor, branches: Optional[Tensor], state: List[Tensor]) -> Tensor:
        row = index + 1
        if torch.jit.is_scripting():
            state.append(x)
            return weighted_sum(self.weight[row] * self.mask[row], state) if row % self.period == 0 else x
        return self.record_and_combine(x, row, row % self.period == 0)

    def extra_repr(self) -> str:
        return f"layers={self.weight.size(0) - 1}, dilation={self.dilation}, period={self.period}"


@register_method
class DenseFormer(DeepMethod):
    name = "denseformer"
    layer_norm = "pre"
    flag_names = ("denseformer_dilation", "denseformer_period")
    export_refusal = "every DenseFormer layer reads a learned average of all earlier ones, which stock fairseq does not"

    def __init__(self, encoder_layers: int, decoder_layers: int, dilation: int = 1, period: int = 1):
        super().__init__(encoder_layers, decoder_layers)
        self.dilation, self.period = dilation, period

    @classmethod
    def add_args(cls, parser) -> None:
        parser.add_argument("--denseformer-dilation", type=int, default=None,
                            help="transformer_denseformer: each average reads every k-th earlier output (default 1)")
        parser.add_argument("--denseformer-period", type=int, default=None,
                            help="transformer_denseformer: an average after every p-th layer only (default 1)")

    @classmethod
    def from_config(cls, cfg) -> "DenseFormer":
        method = super().from_config(cfg)
        method.dilation = getattr(cfg, "denseformer_dilation", None) or 1
        method.period = getattr(cfg, "denseformer_period", None) or 1
        return method

    def check_args(self, args, arch: str) -> None:
        super().check_args(args, arch)
        refuse_below_one(args, self.flag_names)
        refuse_removing_layers(args, arch, "DenseFormer")
        for side, layers in (("encoder", self.encoder_layers), ("decoder", self.decoder_layers)):
            last = layers // self.period * self.period  # the last layer an average follows
            if last == 0:  # the stack would be Pre-LN, its weights never used
                raise ArchitectureError(f"--denseformer-period {self.period}: the {side}'s {layers} layers would hold "
                                        f"no average (one every {self.period} layers); give at most {layers}")
            if self.dilation > last:  # every average would be a scale of its own layer's output
                raise ArchitectureError(f"--denseformer-dilation {self.dilation}: no average of the {side}'s {layers} "
                                        f"layers would read an earlier output (the one after layer i reads layers "
                                        f"i - {self.dilation}, i - {2 * self.dilation}, ...); give at most {last}")

    def stack_connection(self, side: str, embed_dim: int, num_layers: int) -> nn.Module:
        return DepthWeightedAverage(num_layers, self.dilation, self.period)
