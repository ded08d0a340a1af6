"""DS-Init (Zhang, Titov and Sennrich 2019, "Improving Deep Transformer with Depth-Scaled Initialization
and Merged Attention"; bzhangGo/zero, TensorFlow, ``deep_transformer_init``).

Post-LN; the weights of layer l (1-based, counted per stack) are drawn from Xavier's uniform distribution
with its bound scaled down by depth (Eq. 7): ``W ~ U(-gamma * alpha / sqrt(l), gamma * alpha / sqrt(l))``,
``gamma = sqrt(6 / (fan_in + fan_out))``, alpha = 1. ``--dsinit-bound``:

* ``paper`` (default): the bound times l^(-1/2), Eq. 7;
* ``code``: the bound times l^(-1/4): the code passes l^(-1/2) as the *variance* scale of
  ``tf.variance_scaling_initializer(mode="fan_avg", distribution="uniform")``, whose bound is its square
  root. The README's published BLEU (``deep_transformer_init=True``) was trained with this one, and with
  merged attention, which deepnmt does not implement.

Scaled: every weight of a layer's attentions (q, k, v, out) and FFN (fc1, fc2); the code fuses q/k/v of
self-attention into one d x 3d matrix, whose fan differs from our three d x d ones. Not scaled: biases
(fairseq's init kept; the code zeroes them), LayerNorms, embeddings.
"""

import torch
import torch.nn as nn

from deepnmt_plugin.models.method import DeepMethod, all_layers, layer_attentions, register_method

BOUND_EXPONENTS = {"paper": -0.5, "code": -0.25}


def dsinit_scale(layer_number: int, bound: str = "paper") -> float:
    """The factor on layer ``layer_number``'s (1-based) Xavier bound: l^(-1/2) (paper) or l^(-1/4) (code)."""
    return layer_number ** BOUND_EXPONENTS[bound]


def dsinit_init_(layer: nn.Module, scale: float) -> None:
    attentions = layer_attentions(layer)
    linears = [layer.fc1, layer.fc2] + [p for a in attentions for p in (a.q_proj, a.k_proj, a.v_proj, a.out_proj)]
    with torch.no_grad():
        for linear in linears:
            nn.init.xavier_uniform_(linear.weight, gain=scale)


@register_method
class DSInit(DeepMethod):
    name = "dsinit"
    flag_names = ("dsinit_bound",)

    def __init__(self, encoder_layers: int, decoder_layers: int, bound: str = "paper"):
        super().__init__(encoder_layers, decoder_layers)
        self.bound = bound

    @classmethod
    def add_args(cls, parser) -> None:
        parser.add_argument("--dsinit-bound", choices=tuple(BOUND_EXPONENTS), default=None,
                            help="transformer_dsinit: layer l's Xavier bound times l^-1/2 (paper, default) or "
                                 "l^-1/4 (the authors' TensorFlow code)")

    @classmethod
    def from_config(cls, cfg) -> "DSInit":
        method = super().from_config(cfg)
        method.bound = getattr(cfg, "dsinit_bound", None) or "paper"
        return method

    def initialize(self, model: nn.Module) -> None:
        for stack in (model.encoder, model.decoder):
            for number, layer in enumerate(all_layers(stack), 1):
                dsinit_init_(layer, dsinit_scale(number, self.bound))
