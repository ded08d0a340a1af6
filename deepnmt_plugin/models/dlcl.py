"""DLCL, dynamic linear combination of layers (Wang et al. ACL 2019, "Learning Deep Transformer Models for
Machine Translation"; wangqiangneu/dlcl, ``fairseq/modules/dlcl.py``, ``DynamicLinearCombination``).

Every layer of a stack reads a learnable weighted sum of the embedding y_0 and all earlier layer outputs
y_1..y_l (Eq. 6): ``x_{l+1} = sum_{k<=l} W[l, k] * G_k(y_k)``, W lower-triangular, initialised to the
average, W[l, k] = 1/(l+1) (the code's ``init_value='avg'``, scalar weights, not normalised).

* pre-norm (default; the paper's best, 30 layers): Pre-LN layers; G_k is a LayerNorm of its own for each
  layer output (G_0, the embedding, the identity), and the stack output is the final LayerNorm of
  ``sum_{k<=L} W[L, k] * G_k(y_k)``;
* post-norm (``--dlcl-post-norm``): Post-LN layers; G_k the identity, and each combination is normalised by
  a LayerNorm of its own, ``x_{l+1} = LN_l(sum_{k<=l} W[l, k] * y_k)`` (the first layer reads W[0, 0] * y_0);
  the stack output is the last combination, no other final LayerNorm.

The weights index layers by position, so LayerDrop and pruning (``--*-layers-to-keep``) are refused. The projections
are initialised as the authors' fairseq built them (``--dlcl-linear-init``, ``legacy_init.py``): Xavier-uniform fc1/fc2
with zero biases, zero q/k/v biases.
"""

from typing import Final, List, Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from deepnmt_plugin.models.layer_history import HistoryConnection, weighted_sum
from deepnmt_plugin.models.legacy_init import add_linear_init_flag, apply_linear_init, chosen_linear_init
from deepnmt_plugin.models.method import ArchitectureError, DeepMethod, register_method


def dlcl_initial_weights(num_layers: int) -> Tensor:
    """W[l, k] = 1/(l+1) for k <= l, 0 above the diagonal; (L+1) x (L+1)."""
    mask = torch.ones(num_layers + 1, num_layers + 1).tril()
    return mask / mask.sum(dim=1, keepdim=True)


def refuse_removing_layers(args, arch: str, recipe: str) -> None:
    """LayerDrop and pruning, refused for a recipe whose weights across layers index them by position."""
    for side in ("encoder", "decoder"):
        if getattr(args, f"{side}_layerdrop", 0) > 0:
            raise ArchitectureError(f"--{side}-layerdrop is not supported by --arch {arch}: {recipe}'s weights "
                                    "index the layers by position, and LayerDrop removes some")
        if getattr(args, f"{side}_layers_to_keep", None):
            raise ArchitectureError(f"{side}_layers_to_keep is not supported by --arch {arch}: every {recipe} "
                                    "layer reads all earlier ones through its trained weights")


class LayerCombination(HistoryConnection):
    """The layer history G_0(y_0), ..., G_l(y_l); each next input is its W-weighted sum.

    The L LayerNorms (one per layer output, or per combination) are held as (L, C) weight and bias tensors,
    so that TorchScript can pick row ``index``."""

    post_norm: Final[bool]

    def __init__(self, embed_dim: int, num_layers: int, post_norm: bool):
        super().__init__()
        self.post_norm = post_norm
        self.weight = nn.Parameter(dlcl_initial_weights(num_layers))
        self.norm_weight = nn.Parameter(torch.ones(num_layers, embed_dim))
        self.norm_bias = nn.Parameter(torch.zeros(num_layers, embed_dim))

    def layer_norm(self, x: Tensor, index: int) -> Tensor:
        if torch.jit.is_scripting():
            weight, bias = self.norm_weight[index], self.norm_bias[index]
        else:
            weight, bias = self.norm_row(index)
        return F.layer_norm(x, x.shape[-1:], weight, bias, 1e-5)

    @torch.jit.unused
    def norm_row(self, index: int) -> Tuple[Tensor, Tensor]:
        return self.norm_rows[0][index], self.norm_rows[1][index]

    def begin(self, x: Tensor, state: List[Tensor]) -> Tensor:
        if torch.jit.is_scripting():
            state.append(x)
            return weighted_sum(self.weight[0], state)
        # the rows split once per pass (kept until the next): their gradients are stacked by one operator, where
        # indexing each row costs a full-size gradient per layer and the sum of them
        self.norm_rows = (self.norm_weight.unbind(0), self.norm_bias.unbind(0))
        self.start_history(self.weight, x)
        return self.combine_row(0)

    def next_input(self, index: int, x: Tensor, branches: Optional[Tensor], state: List[Tensor]) -> Tensor:
        entry = x if self.post_norm else self.layer_norm(x, index)  # G_l: the identity, or the layer's LayerNorm
        if torch.jit.is_scripting():
            state.append(entry)
            combined = weighted_sum(self.weight[index + 1], state)
        else:
            combined = self.record_and_combine(entry, index + 1, True)
        return self.layer_norm(combined, index) if self.post_norm else combined

    def extra_repr(self) -> str:
        return f"layers={self.weight.size(0) - 1}, post_norm={self.post_norm}"


@register_method
class DLCL(DeepMethod):
    name = "dlcl"
    layer_norm = "pre"
    flag_names = ("dlcl_post_norm", "dlcl_linear_init")
    linear_init = "authors"
    export_refusal = "every DLCL layer reads a learned sum of all earlier layers, which stock fairseq does not"

    @classmethod
    def add_args(cls, parser) -> None:
        parser.add_argument("--dlcl-post-norm", action="store_true", default=None,
                            help="transformer_dlcl: the post-norm variant (Post-LN layers, each combination "
                                 "normalised); default the pre-norm one")
        add_linear_init_flag(parser, "transformer_dlcl")

    @classmethod
    def from_config(cls, cfg) -> "DLCL":
        method = super().from_config(cfg)
        if getattr(cfg, "dlcl_post_norm", None):
            method.layer_norm = "post"
        method.linear_init = chosen_linear_init(cfg, "dlcl")
        return method

    def check_args(self, args, arch: str) -> None:
        super().check_args(args, arch)
        refuse_removing_layers(args, arch, "DLCL")

    def initialize(self, model: nn.Module) -> None:
        apply_linear_init(model, self.linear_init)

    def stack_connection(self, side: str, embed_dim: int, num_layers: int) -> nn.Module:
        return LayerCombination(embed_dim, num_layers, post_norm=self.layer_norm == "post")
