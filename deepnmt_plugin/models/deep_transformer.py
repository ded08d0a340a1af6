"""The one deepnmt model: fairseq's Transformer whose sublayers follow a deep-training recipe.

``deep_transformer`` subclasses fairseq's ``TransformerModel``; its encoder and decoder build
``DeepTransformerEncoderLayer`` / ``DeepTransformerDecoderLayer``, subclasses of fairseq's layer
bases that keep every submodule name (``self_attn``, ``self_attn_layer_norm``, ``encoder_attn``,
``encoder_attn_layer_norm``, ``fc1``, ``fc2``, ``final_layer_norm``). Each sublayer's residual is a
small module from the recipe (``self_attn_residual``, ``encoder_attn_residual``, ``ffn_residual``),
so the per-method math lives in ``preln.py``, ``deepnorm.py``, ``tfixup.py`` and ``admin.py``.
"""

from typing import Dict, List, Optional

import torch
from fairseq.distributed import fsdp_wrap
from fairseq.models import register_model, register_model_architecture
from fairseq.models.transformer import (
    TransformerConfig,
    TransformerDecoderBase,
    TransformerEncoderBase,
    TransformerModel,
    base_architecture,
    transformer_iwslt_de_en,
    transformer_vaswani_wmt_en_de_big,
)
from fairseq.modules.transformer_layer import TransformerDecoderLayerBase, TransformerEncoderLayerBase
from fairseq.modules.checkpoint_activations import checkpoint_wrapper
from torch import Tensor

from deepnmt_plugin.models.method import METHODS, method_for


def _wrap_like_fairseq(layer, cfg):
    """Activation checkpointing and FSDP wrapping, exactly as fairseq's ``build_*_layer`` do."""
    if cfg.checkpoint_activations:
        layer = checkpoint_wrapper(layer, offload_to_cpu=cfg.offload_activations)
    return fsdp_wrap(layer, min_num_params=0 if cfg.checkpoint_activations else cfg.min_params_to_wrap)


class FeedForwardBranch:
    """The FFN branch both layer kinds share: ``dropout(fc2(act_dropout(act(fc1(x)))))``."""

    def feed_forward(self, x: Tensor) -> Tensor:
        x = self.activation_dropout_module(self.activation_fn(self.fc1(x)))
        return self.dropout_module(self.fc2(x))


class DeepTransformerEncoderLayer(FeedForwardBranch, TransformerEncoderLayerBase):
    """Encoder layer: self-attention and FFN sublayers, each joined by the recipe's residual."""

    def __init__(self, cfg):
        super().__init__(cfg)
        method = method_for(cfg)
        if method.layer_norm == "none":
            self.self_attn_layer_norm = self.final_layer_norm = None
        self.self_attn_residual = method.residual("encoder", self.embed_dim)
        self.ffn_residual = method.residual("encoder", self.embed_dim)

    def forward(self, x, encoder_padding_mask: Optional[Tensor], attn_mask: Optional[Tensor] = None):
        if attn_mask is not None:  # as fairseq: -1e8, not -inf, so fully masked rows stay finite
            attn_mask = attn_mask.masked_fill(
                attn_mask.to(torch.bool), -1e8 if x.dtype == torch.float32 else -1e4
            )

        def self_attention(h):
            h, _ = self.self_attn(
                query=h, key=h, value=h, key_padding_mask=encoder_padding_mask,
                need_weights=False, attn_mask=attn_mask,
            )
            return self.dropout_module(h)

        x = self.self_attn_residual(x, self_attention, self.self_attn_layer_norm)
        return self.ffn_residual(x, self.feed_forward, self.final_layer_norm)


class DeepTransformerDecoderLayer(FeedForwardBranch, TransformerDecoderLayerBase):
    """Decoder layer: self-attention, encoder-attention and FFN sublayers, each with the recipe's residual."""

    def __init__(self, cfg, no_encoder_attn=False):
        super().__init__(cfg, no_encoder_attn=no_encoder_attn)
        method = method_for(cfg)
        if method.layer_norm == "none":
            self.self_attn_layer_norm = self.final_layer_norm = None
            if self.encoder_attn is not None:
                self.encoder_attn_layer_norm = None
        self.self_attn_residual = method.residual("decoder", self.embed_dim)
        self.encoder_attn_residual = (
            method.residual("decoder", self.embed_dim) if self.encoder_attn is not None else None
        )
        self.ffn_residual = method.residual("decoder", self.embed_dim)

    def forward(
        self,
        x,
        encoder_out: Optional[Tensor] = None,
        encoder_padding_mask: Optional[Tensor] = None,
        incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]] = None,
        self_attn_mask: Optional[Tensor] = None,
        self_attn_padding_mask: Optional[Tensor] = None,
        need_attn: bool = False,
        need_head_weights: bool = False,
    ):
        need_attn = need_attn or need_head_weights

        def self_attention(h):
            h, _ = self.self_attn(
                query=h, key=h, value=h, key_padding_mask=self_attn_padding_mask,
                incremental_state=incremental_state, need_weights=False, attn_mask=self_attn_mask,
            )
            return self.dropout_module(h)

        x = self.self_attn_residual(x, self_attention, self.self_attn_layer_norm)

        attn: List[Optional[Tensor]] = [None]
        if self.encoder_attn is not None and encoder_out is not None:

            def encoder_attention(h):
                h, attn[0] = self.encoder_attn(
                    query=h, key=encoder_out, value=encoder_out,
                    key_padding_mask=encoder_padding_mask, incremental_state=incremental_state,
                    static_kv=True, need_weights=need_attn or (not self.training and self.need_attn),
                    need_head_weights=need_head_weights,
                )
                return self.dropout_module(h)

            x = self.encoder_attn_residual(x, encoder_attention, self.encoder_attn_layer_norm)

        x = self.ffn_residual(x, self.feed_forward, self.final_layer_norm)
        return x, attn[0], None


class DeepTransformerEncoder(TransformerEncoderBase):
    def build_encoder_layer(self, cfg):
        return _wrap_like_fairseq(DeepTransformerEncoderLayer(cfg), cfg)


class DeepTransformerDecoder(TransformerDecoderBase):
    def build_decoder_layer(self, cfg, no_encoder_attn=False):
        return _wrap_like_fairseq(DeepTransformerDecoderLayer(cfg, no_encoder_attn), cfg)


@register_model("deep_transformer")
class DeepTransformerModel(TransformerModel):
    """fairseq's Transformer with a deep-training recipe chosen by the arch (``args.deep_method``).

    Architectures: ``transformer_{preln,deepnorm,tfixup,admin}`` (base 512-2048-8), ``..._iwslt_de_en``
    (512-1024-4) and ``..._big`` (1024-4096-16); depth via ``--encoder-layers/--decoder-layers``.
    """

    @classmethod
    def build_model(cls, args, task):
        model = super().build_model(args, task)
        method_for(model.cfg).initialize(model)
        return model

    def forward(self, *args, **kwargs):
        if self.training and not getattr(self, "admin_initialized", True):
            raise RuntimeError(
                "transformer_admin trains with --task translation_deep, which sets omega before the "
                "first update; this model's omega is still 1 (plain Post-LN)"
            )
        return super().forward(*args, **kwargs)

    @classmethod
    def build_encoder(cls, cfg, src_dict, embed_tokens):
        return DeepTransformerEncoder(TransformerConfig.from_namespace(cfg), src_dict, embed_tokens)

    @classmethod
    def build_decoder(cls, cfg, tgt_dict, embed_tokens):
        cfg = TransformerConfig.from_namespace(cfg)
        return DeepTransformerDecoder(cfg, tgt_dict, embed_tokens, no_encoder_attn=cfg.no_cross_attention)


SIZES = {
    "": base_architecture,  # 512-2048-8 (transformer / transformer_wmt_en_de)
    "_iwslt_de_en": transformer_iwslt_de_en,  # 512-1024-4
    "_big": transformer_vaswani_wmt_en_de_big,  # 1024-4096-16, dropout 0.3
}


def register_deep_architectures(method_name: str) -> None:
    """Register ``transformer_<method>{,_iwslt_de_en,_big}`` on ``deep_transformer``."""
    method = METHODS[method_name]
    for suffix, size in SIZES.items():
        arch = f"transformer_{method_name}{suffix}"

        def architecture(args, size=size, arch=arch):
            args.deep_method = method_name
            if method.layer_norm == "pre":
                args.encoder_normalize_before = args.decoder_normalize_before = True
            size(args)
            method.check_args(args, arch)

        architecture.__name__ = arch
        register_model_architecture("deep_transformer", arch)(architecture)


for _name in ("preln", "deepnorm", "tfixup", "admin"):
    register_deep_architectures(_name)
