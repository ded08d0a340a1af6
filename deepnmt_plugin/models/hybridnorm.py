"""HybridNorm (Zhuo et al., NeurIPS 2025, "HybridNorm: Towards Stable and Efficient Transformer Training via Hybrid
Normalization"; BryceZhuo/HybridNorm, ``dense_model/olmo/model.py`` ``OLMoSequentialBlock`` with
``dense_model/configs/exps/1.2B-dense-HybriedNorm.yaml``).

The block (the paper's HybridNorm; the config's ``use_query_norm``/``use_key_norm``/``use_value_norm``,
``attn_norm: false``, ``ffn_norm: true``, ``ffn_residual_after_norm: true``):

* attention with QKV normalisation and no input norm: ``y = x + Attn(x)``, where the queries, keys and values are
  each normalised over every head's features after their projection (one norm of the head width per projection,
  shared by the heads, as the code's ``q_norm``/``k_norm``/``v_norm`` of size ``d_model // n_heads``);
* Post-Norm at the FFN: ``z = LN(y)``, ``x_next = z + FFN(z)``: the FFN reads and adds to the normalised stream,
  i.e. the LayerNorm sits after the attention's residual sum ("post") and the FFN has none.

Each stack ends with a final LayerNorm (OLMo's ``ln_f``). ``--hybridnorm-star`` gives HybridNorm*: the first block is
Pre-Norm in both sublayers (the README's ``norm_pos_special_config={0: {'attn_norm': True, 'ffn_residual': False}}``),
its QKV norms kept.

Cross-attention, which the paper (decoder-only) does not have: it normalises its queries, keys (the encoder output)
and values as self-attention does, and the decoder layer keeps one norm, on the stream before the FFN: the
self-attention has none, the cross-attention's residual sum is normalised ("post"), so the FFN reads the normalised
sum of both attentions as the paper's FFN reads ``Norm(Y)``. (HybridNorm*'s first decoder layer: all three Pre-Norm.)
LayerNorm, not the code's RMSNorm; fairseq's initialisation.
"""

from deepnmt_plugin.models.method import DeepMethod, register_method


@register_method
class HybridNorm(DeepMethod):
    name = "hybridnorm"
    layer_norm = "pre"  # the stacks' final LayerNorm (fairseq builds it with the Pre-LN flags)
    qkv_norm = True
    flag_names = ("hybridnorm_star",)
    export_refusal = "HybridNorm normalises attention's queries, keys and values, which stock fairseq does not"

    def __init__(self, encoder_layers: int, decoder_layers: int, star: bool = False, cross_attention: bool = True):
        super().__init__(encoder_layers, decoder_layers)
        self.star, self.cross_attention = star, cross_attention

    @classmethod
    def add_args(cls, parser) -> None:
        parser.add_argument("--hybridnorm-star", action="store_true", default=None,
                            help="transformer_hybridnorm: HybridNorm*, the first layer of each stack Pre-Norm")

    @classmethod
    def from_config(cls, cfg) -> "HybridNorm":
        method = super().from_config(cfg)
        method.star = bool(getattr(cfg, "hybridnorm_star", None))
        method.cross_attention = not getattr(cfg, "no_cross_attention", False)
        return method

    def layer_norm_at(self, side: str, layer_number: int, sublayer: str) -> str:
        if self.star and layer_number == 1:
            return "pre"
        last_attention = "encoder_attn" if side == "decoder" and self.cross_attention else "self_attn"
        return "post" if sublayer == last_attention else "none"
