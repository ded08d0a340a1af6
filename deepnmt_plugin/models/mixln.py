"""Mix-LN (Li, Yin and Liu, ICLR 2025, "Mix-LN: Unleashing the Power of Deeper Layers by Combining Pre-LN and
Post-LN"; pixeli99/MixLN, ``peft_pretraining/modeling_llama.py``, ``norm_type == 'post_pre'``).

Post-LN, ``x_{l+1} = LN(x_l + f(x_l))``, in the first ``floor(alpha * L)`` layers of a stack (the earlier
layers get Post-LN's larger gradients), Pre-LN, ``x_{l+1} = x_l + f(LN(x_l))``, above them, and the Pre-LN final
LayerNorm on the stack's output. The authors' code takes the count as ``POST_NUM`` (``layer_index < POST_NUM``;
3 of 12 layers for LLaMA-71M: alpha = 0.25, the paper's default). ``--mixln-alpha`` sets alpha; the encoder
and the decoder each apply it to their own depth: floor(alpha * N) encoder and floor(alpha * M) decoder layers
are Post-LN (the paper has one stack; an encoder-decoder has two, and each has the gradient profile the rule is
for). fairseq's initialisation is kept.
"""

import math

from deepnmt_plugin.models.method import ArchitectureError, DeepMethod, register_method

DEFAULT_ALPHA = 0.25


def mixln_post_layers(alpha: float, num_layers: int) -> int:
    """How many of a stack's ``num_layers`` layers, from the bottom, are Post-LN: floor(alpha * L), at most L - 1 (alpha
    < 1 leaves the top layer Pre-LN, where the rounding below made an alpha within 1e-9 of 1 all Post-LN)."""
    # 0.3 * 10 is 2.9999999999999996 in floating point
    return min(math.floor(alpha * num_layers + 1e-9), num_layers - 1)


@register_method
class MixLN(DeepMethod):
    name = "mixln"
    layer_norm = "pre"  # the stack's: its upper layers are Pre-LN and it ends with the final LayerNorm
    flag_names = ("mixln_alpha",)
    export_refusal = "Mix-LN mixes Post-LN and Pre-LN layers in a stack, and stock fairseq has one layout a stack"

    def __init__(self, encoder_layers: int, decoder_layers: int, alpha: float = DEFAULT_ALPHA):
        super().__init__(encoder_layers, decoder_layers)
        self.alpha = alpha

    @classmethod
    def add_args(cls, parser) -> None:
        parser.add_argument("--mixln-alpha", type=float, default=None,
                            help=f"transformer_mixln: the fraction of each stack's layers, from the bottom, that are "
                                 f"Post-LN (floor(alpha * layers); default {DEFAULT_ALPHA}, the paper's)")

    @classmethod
    def from_config(cls, cfg) -> "MixLN":
        method = super().from_config(cfg)
        alpha = getattr(cfg, "mixln_alpha", None)
        method.alpha = DEFAULT_ALPHA if alpha is None else alpha
        return method

    def check_args(self, args, arch: str) -> None:
        super().check_args(args, arch)
        if not 0 <= self.alpha < 1:
            raise ArchitectureError(f"--mixln-alpha {self.alpha:g}: give a fraction in [0, 1) (0: every layer Pre-LN; "
                                    "1 would be Post-LN with a final LayerNorm)")

    def layer_norm_at(self, side: str, layer_number: int, sublayer: str) -> str:
        layers = self.encoder_layers if side == "encoder" else self.decoder_layers
        return "post" if layer_number <= mixln_post_layers(self.alpha, layers) else "pre"
