"""What a deep-Transformer recipe is made of, and the Post-LN baseline every recipe departs from.

A recipe (``DeepMethod``) decides three things, each in one named place:

* the residual rule of every sublayer, ``x_i = rule(x_{i-1}, f_i, LN_i)`` (``residual``);
* the initialisation applied once the model is built (``initialize``);
* which layouts it admits (``check_args``): e.g. DeepNorm is Post-LN only.

Post-LN (Vaswani et al. 2017, the stock fairseq ``transformer``) is ``x_i = LN(x_{i-1} + f_i(x_{i-1}))``.
"""

from typing import Callable, Dict, Optional, Type

import torch.nn as nn
from torch import Tensor

Branch = Callable[[Tensor], Tensor]

METHODS: Dict[str, Type["DeepMethod"]] = {}


def register_method(cls):
    METHODS[cls.name] = cls
    return cls


class ArchitectureError(SystemExit):
    """Contradictory model flags: exits with one line, before any data or checkpoint is touched."""

    def __init__(self, message: str):
        super().__init__(f"deepnmt: error: {message}")


class PostNormResidual(nn.Module):
    """Post-LN (Vaswani et al. 2017): ``x_i = LN(x_{i-1} + f_i(x_{i-1}))``."""

    def forward(self, x: Tensor, branch: Branch, layer_norm: nn.Module) -> Tensor:
        return layer_norm(x + branch(x))


@register_method
class DeepMethod:
    """Post-LN; subclasses override what their paper changes."""

    name = "postln"
    #: LayerNorm layout: "post" (after the residual sum), "pre" (inside the branch) or "none".
    layer_norm = "post"

    def __init__(self, encoder_layers: int, decoder_layers: int):
        self.encoder_layers = encoder_layers
        self.decoder_layers = decoder_layers

    def residual(self, side: str, embed_dim: int) -> nn.Module:
        """The residual rule of one sublayer of the ``side`` ("encoder" or "decoder") stack."""
        return PostNormResidual()

    def initialize(self, model: nn.Module) -> None:
        """Re-initialise a freshly built model; Post-LN keeps fairseq's initialisation."""

    @classmethod
    def check_args(cls, args, arch: Optional[str] = None) -> None:
        """Refuse flags that contradict the recipe's layout."""
        arch = arch or getattr(args, "arch", cls.name)
        wants_pre = cls.layer_norm == "pre"
        for side in ("encoder", "decoder"):
            if getattr(args, f"{side}_normalize_before", False) != wants_pre:
                flag = f"--{side}-normalize-before"
                raise ArchitectureError(
                    f"{flag} contradicts --arch {arch}: {cls.name} is "
                    + ("Pre-LN and always sets it" if wants_pre else "a Post-LN layout; drop the flag")
                )
        if cls.layer_norm == "none" and getattr(args, "layernorm_embedding", False):
            raise ArchitectureError(
                f"--layernorm-embedding contradicts --arch {arch}: {cls.name} removes every LayerNorm"
            )


def method_for(cfg) -> DeepMethod:
    """The recipe a model config names (``cfg.deep_method``, set by the arch), sized to its depth."""
    name = getattr(cfg, "deep_method", None) or "postln"
    if name not in METHODS:
        raise ArchitectureError(f"unknown deep method {name!r}; known: {', '.join(sorted(METHODS))}")
    return METHODS[name](cfg.encoder.layers, cfg.decoder.layers)
