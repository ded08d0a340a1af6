"""The projections' initialisation of fairseq <= 0.9, which the reference code of Admin (LiyuanLucasLiu/
Transformer-Clinic, ``fairseq/modules/transformer_layer.py`` and ``multihead_attention.py``) and of DLCL
(wangqiangneu/dlcl, ``fairseq/models/dlcl_transformer.py`` and ``fairseq/modules/multihead_attention.py``) was
trained with, where fairseq 0.12's differs:

* FFN: the old ``Linear()`` draws fc1 and fc2 Xavier-uniform, bound sqrt(6 / (fan_in + fan_out)), with zero
  biases; fairseq 0.12 builds a plain ``nn.Linear``, weights and biases U(-1/sqrt(fan_in), 1/sqrt(fan_in)): at
  512/2048, fc1's bound 0.0442 and fc2's 0.0221 against Xavier's 0.0484 for both (fc2 2.2x smaller).
* Attention: the old module holds q, k and v in one (3d, d) ``in_proj_weight``, Xavier-uniform with gain 1, bound
  sqrt(6 / 4d), and zeroes ``in_proj_bias``; fairseq 0.12's three (d, d) projections are Xavier-uniform with gain
  1/sqrt(2), the same bound, but keep PyTorch's default biases U(-1/sqrt(d), 1/sqrt(d)). So only the q, k and v biases
  change. ``out_proj`` is Xavier-uniform with a zero bias in both.

``authors`` applies the old initialisation; ``fairseq`` keeps fairseq 0.12's, which deepnmt used for both recipes
before (the depth study's cells of both record which one they were trained with).
"""

import torch
import torch.nn as nn

from deepnmt_plugin.models.method import all_layers, layer_attentions

LINEAR_INITS = ("authors", "fairseq")


def add_linear_init_flag(parser, arch: str) -> None:
    """``--<recipe>-linear-init``, unset (None) by default: the recipe then reads ``authors``."""
    recipe = arch.removeprefix("transformer_")
    parser.add_argument(f"--{recipe}-linear-init", choices=LINEAR_INITS, default=None,
                        help=f"{arch}: the FFN and attention projections initialised as the authors' code built them "
                             "(fairseq <= 0.9: Xavier-uniform fc1/fc2, zero FFN and q/k/v biases; default) or as "
                             "fairseq 0.12 builds them (fairseq)")


def chosen_linear_init(cfg, recipe: str) -> str:
    """The ``--<recipe>-linear-init`` a config holds; ``authors`` where it holds none."""
    return getattr(cfg, f"{recipe}_linear_init", None) or "authors"


def old_fairseq_ffn_init_(layer: nn.Module) -> None:
    """fc1 and fc2 as fairseq <= 0.9's ``Linear()`` built them: Xavier-uniform (gain 1), zero bias (also the
    statistics T-Fixup's reference code scales)."""
    with torch.no_grad():
        for fc in (layer.fc1, layer.fc2):
            nn.init.xavier_uniform_(fc.weight)
            nn.init.zeros_(fc.bias)


def authors_linear_init_(layer: nn.Module) -> None:
    """One layer's fc1/fc2 Xavier-uniform with zero biases and its attentions' q/k/v biases zeroed."""
    old_fairseq_ffn_init_(layer)
    with torch.no_grad():
        for attention in layer_attentions(layer):
            for projection in (attention.q_proj, attention.k_proj, attention.v_proj):
                if projection.bias is not None:
                    nn.init.zeros_(projection.bias)


def apply_linear_init(model: nn.Module, choice: str) -> None:
    if choice == "authors":
        for stack in (model.encoder, model.decoder):
            for layer in all_layers(stack):
                authors_linear_init_(layer)
