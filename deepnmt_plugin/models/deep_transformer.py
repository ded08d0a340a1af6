"""The one deepnmt model: fairseq's Transformer whose sublayers follow a deep-training recipe.

``deep_transformer`` subclasses fairseq's ``TransformerModel``; its encoder and decoder build
``DeepTransformerEncoderLayer`` / ``DeepTransformerDecoderLayer``, subclasses of fairseq's layer
bases that keep every submodule name (``self_attn``, ``self_attn_layer_norm``, ``encoder_attn``,
``encoder_attn_layer_norm``, ``fc1``, ``fc2``, ``final_layer_norm``). Their forward is fairseq's, with
each sublayer's residual sum ``x + f`` replaced by a small module of the recipe (``self_attn_residual``,
``encoder_attn_residual``, ``ffn_residual``) and each LayerNorm where the recipe puts it, so the
per-method math lives in ``preln.py``, ``deepnorm.py``, ``tfixup.py`` and ``admin.py``. Everything
is TorchScript-able, as fairseq's own transformer is.
"""

from typing import Dict, Final, List, Optional

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
from fairseq.modules import FairseqDropout
from fairseq.modules.checkpoint_activations import checkpoint_wrapper
from fairseq.modules.transformer_layer import TransformerDecoderLayerBase, TransformerEncoderLayerBase
from torch import Tensor

from deepnmt_plugin.models.admin import OMEGA_UNSET
from deepnmt_plugin.models.method import METHODS, ArchitectureError, method_for, record_recipe_layers


def _wrap_like_fairseq(layer, cfg):
    """Activation checkpointing and FSDP wrapping, exactly as fairseq's ``build_*_layer`` do."""
    if cfg.checkpoint_activations:
        layer = checkpoint_wrapper(layer, offload_to_cpu=cfg.offload_activations)
    return fsdp_wrap(layer, min_num_params=0 if cfg.checkpoint_activations else cfg.min_params_to_wrap)


class RetainableDropout(FairseqDropout):
    """A FairseqDropout that ``--retain-dropout-modules`` reaches by our class name or by the name the same
    module has in stock fairseq (``TransformerEncoder``, ``TransformerEncoderLayer`` or ``...LayerBase``)."""

    def __init__(self, p: float, names: List[str]):
        super().__init__(p, module_name=names[0])
        self.names = names

    def make_generation_fast_(self, name: str, retain_dropout: bool = False,
                              retain_dropout_modules: Optional[List[str]] = None, **kwargs):
        if retain_dropout_modules is not None and any(n in retain_dropout_modules for n in self.names):
            retain_dropout_modules = [self.module_name]  # fairseq matches module_name alone
        super().make_generation_fast_(name, retain_dropout, retain_dropout_modules, **kwargs)


def name_dropout_like_fairseq(module, fairseq_class, dropout_attributes) -> None:
    """Replace fairseq's dropout modules (named after our class only) by RetainableDropout."""
    base = fairseq_class.__name__
    names = [type(module).__name__, base, base[: -len("Base")]]
    for attribute in dropout_attributes:
        setattr(module, attribute, RetainableDropout(getattr(module, attribute).p, names))


class FeedForwardSublayer:
    """The FFN sublayer both layer kinds end with: branch ``dropout(fc2(act_dropout(act(fc1(x)))))``, joined by
    the recipe's residual sum, its LayerNorm where the recipe puts it."""

    def feed_forward_sublayer(self, x: Tensor) -> Tensor:
        residual = x
        if self.pre_norm:
            x = self.final_layer_norm(x)
        x = self.activation_dropout_module(self.activation_fn(self.fc1(x)))
        x = self.ffn_residual(residual, self.dropout_module(self.fc2(x)))
        if self.post_norm:
            x = self.final_layer_norm(x)
        return x


class DeepTransformerEncoderLayer(FeedForwardSublayer, TransformerEncoderLayerBase):
    """Encoder layer: self-attention and FFN sublayers, each joined by the recipe's residual."""

    pre_norm: Final[bool]  # LayerNorm at the branch input (Pre-LN)
    post_norm: Final[bool]  # LayerNorm after the residual sum (Post-LN, DeepNorm, Admin); T-Fixup: neither

    def __init__(self, cfg):
        super().__init__(cfg)
        method = method_for(cfg)
        self.pre_norm, self.post_norm = method.layer_norm == "pre", method.layer_norm == "post"
        if method.layer_norm == "none":
            self.self_attn_layer_norm = self.final_layer_norm = None
        self.self_attn_residual = method.residual("encoder", self.embed_dim)
        self.ffn_residual = method.residual("encoder", self.embed_dim)
        name_dropout_like_fairseq(self, TransformerEncoderLayerBase, ["dropout_module", "activation_dropout_module"])

    def forward(self, x, encoder_padding_mask: Optional[Tensor], attn_mask: Optional[Tensor] = None):
        if attn_mask is not None:  # as fairseq: -1e8, not -inf, so fully masked rows stay finite
            attn_mask = attn_mask.masked_fill(
                attn_mask.to(torch.bool), -1e8 if x.dtype == torch.float32 else -1e4
            )

        residual = x
        if self.pre_norm:
            x = self.self_attn_layer_norm(x)
        x, _ = self.self_attn(
            query=x, key=x, value=x, key_padding_mask=encoder_padding_mask, need_weights=False, attn_mask=attn_mask,
        )
        x = self.self_attn_residual(residual, self.dropout_module(x))
        if self.post_norm:
            x = self.self_attn_layer_norm(x)

        return self.feed_forward_sublayer(x)


class DeepTransformerDecoderLayer(FeedForwardSublayer, TransformerDecoderLayerBase):
    """Decoder layer: self-attention, encoder-attention and FFN sublayers, each with the recipe's residual."""

    pre_norm: Final[bool]
    post_norm: Final[bool]

    def __init__(self, cfg, no_encoder_attn=False):
        super().__init__(cfg, no_encoder_attn=no_encoder_attn)
        method = method_for(cfg)
        self.pre_norm, self.post_norm = method.layer_norm == "pre", method.layer_norm == "post"
        if method.layer_norm == "none":
            self.self_attn_layer_norm = self.final_layer_norm = None
            if self.encoder_attn is not None:
                self.encoder_attn_layer_norm = None
        self.self_attn_residual = method.residual("decoder", self.embed_dim)
        self.encoder_attn_residual = (
            method.residual("decoder", self.embed_dim) if self.encoder_attn is not None else None
        )
        self.ffn_residual = method.residual("decoder", self.embed_dim)
        name_dropout_like_fairseq(self, TransformerDecoderLayerBase, ["dropout_module", "activation_dropout_module"])

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

        residual = x
        if self.pre_norm:
            x = self.self_attn_layer_norm(x)
        y = x
        saved_state = self.self_attn._get_input_buffer(incremental_state)
        if self.cross_self_attention and not (incremental_state is not None and "prev_key" in saved_state):
            # --cross-self-attention (Peitz et al. 2019), as fairseq's layer: attend over source and target
            assert encoder_out is not None
            if self_attn_mask is not None:
                self_attn_mask = torch.cat((x.new_zeros(x.size(0), encoder_out.size(0)), self_attn_mask), dim=1)
            if self_attn_padding_mask is not None:
                source_padding_mask = encoder_padding_mask
                if source_padding_mask is None:
                    source_padding_mask = self_attn_padding_mask.new_zeros(encoder_out.size(1), encoder_out.size(0))
                self_attn_padding_mask = torch.cat((source_padding_mask, self_attn_padding_mask), dim=1)
            y = torch.cat((encoder_out, x), dim=0)
        x, _ = self.self_attn(
            query=x, key=y, value=y, key_padding_mask=self_attn_padding_mask,
            incremental_state=incremental_state, need_weights=False, attn_mask=self_attn_mask,
        )
        x = self.self_attn_residual(residual, self.dropout_module(x))
        if self.post_norm:
            x = self.self_attn_layer_norm(x)

        attn: Optional[Tensor] = None
        if self.encoder_attn is not None and encoder_out is not None:
            residual = x
            if self.pre_norm:
                x = self.encoder_attn_layer_norm(x)
            x, attn = self.encoder_attn(
                query=x, key=encoder_out, value=encoder_out, key_padding_mask=encoder_padding_mask,
                incremental_state=incremental_state, static_kv=True,
                need_weights=need_attn or (not self.training and self.need_attn), need_head_weights=need_head_weights,
            )
            x = self.encoder_attn_residual(residual, self.dropout_module(x))
            if self.post_norm:
                x = self.encoder_attn_layer_norm(x)

        return self.feed_forward_sublayer(x), attn, None


class DeepTransformerEncoder(TransformerEncoderBase):
    def __init__(self, cfg, dictionary, embed_tokens):
        super().__init__(cfg, dictionary, embed_tokens)
        name_dropout_like_fairseq(self, TransformerEncoderBase, ["dropout_module"])

    def build_encoder_layer(self, cfg):
        return _wrap_like_fairseq(DeepTransformerEncoderLayer(cfg), cfg)


class DeepTransformerDecoder(TransformerDecoderBase):
    def __init__(self, cfg, dictionary, embed_tokens, no_encoder_attn=False):
        super().__init__(cfg, dictionary, embed_tokens, no_encoder_attn=no_encoder_attn)
        name_dropout_like_fairseq(self, TransformerDecoderBase, ["dropout_module"])

    def build_decoder_layer(self, cfg, no_encoder_attn=False):
        return _wrap_like_fairseq(DeepTransformerDecoderLayer(cfg, no_encoder_attn), cfg)


@register_model("deep_transformer")
class DeepTransformerModel(TransformerModel):
    """fairseq's Transformer with a deep-training recipe chosen by the arch (``args.deep_method``).

    Architectures: ``transformer_{preln,deepnorm,tfixup,admin}`` (base 512-2048-8), ``..._iwslt_de_en``
    (512-1024-4) and ``..._big`` (1024-4096-16); depth via ``--encoder-layers/--decoder-layers``.
    """

    #: Admin: set by ``--task translation_deep``, which sets omega when fairseq-train first asks for batches.
    omega_set_by_task = False

    @classmethod
    def build_model(cls, args, task):
        model = super().build_model(args, task)
        method_for(model.cfg).initialize(model)
        return model

    def forward(
        self,
        src_tokens,
        src_lengths,
        prev_output_tokens,
        return_all_hiddens: bool = True,
        features_only: bool = False,
        alignment_layer: Optional[int] = None,
        alignment_heads: Optional[int] = None,
    ):
        """fairseq's encoder-decoder forward (TorchScript needs its explicit signature); refuses to train an
        Admin model whose omega nothing has set."""
        if not torch.jit.is_scripting():
            if self.training and not getattr(self, "admin_initialized", True):
                raise RuntimeError(OMEGA_UNSET)
        encoder_out = self.encoder(src_tokens, src_lengths=src_lengths, return_all_hiddens=return_all_hiddens)
        return self.decoder(
            prev_output_tokens, encoder_out=encoder_out, features_only=features_only, alignment_layer=alignment_layer,
            alignment_heads=alignment_heads, src_lengths=src_lengths, return_all_hiddens=return_all_hiddens,
        )

    def max_positions(self):
        # fairseq-train asks this when it builds the first training iterator, before any batch is loaded: an
        # Admin model no task will initialise is refused here in one line. Refused at its first step instead,
        # the exit races fairseq's background batch thread and can abort (SIGABRT).
        if self.training and not getattr(self, "admin_initialized", True) and not self.omega_set_by_task:
            raise ArchitectureError(OMEGA_UNSET)
        return super().max_positions()

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
            record_recipe_layers(args)

        architecture.__name__ = arch
        register_model_architecture("deep_transformer", arch)(architecture)


for _name in ("preln", "deepnorm", "tfixup", "admin"):
    register_deep_architectures(_name)
