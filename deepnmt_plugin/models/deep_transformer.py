"""The one deepnmt model: fairseq's Transformer whose sublayers follow a deep-training recipe.

``deep_transformer`` subclasses fairseq's ``TransformerModel``; its encoder and decoder build
``DeepTransformerEncoderLayer`` / ``DeepTransformerDecoderLayer``, subclasses of fairseq's layer
bases that keep every submodule name (``self_attn``, ``self_attn_layer_norm``, ``encoder_attn``,
``encoder_attn_layer_norm``, ``fc1``, ``fc2``, ``final_layer_norm``). Their forward is fairseq's, with
each sublayer's residual sum ``x + f`` replaced by a small module of the recipe (``self_attn_residual``,
``encoder_attn_residual``, ``ffn_residual``) and each LayerNorm where the recipe puts it, so the
per-method math lives in one file per recipe (``preln.py``, ``deepnorm.py``, ...). The encoder's and
decoder's layer loops are fairseq's, with the recipe's stack connection called before, between and after
the layers (DLCL, ResiDual). Everything is TorchScript-able, as fairseq's own transformer is.
"""

from typing import Dict, Final, List, Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F
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
from fairseq.modules import FairseqDropout, LayerNorm
from fairseq.modules.checkpoint_activations import checkpoint_wrapper
from fairseq.modules.transformer_layer import TransformerDecoderLayerBase, TransformerEncoderLayerBase
from torch import Tensor

from deepnmt_plugin.models.admin import OMEGA_UNSET
from deepnmt_plugin.models.method import (METHODS, AdoptedLinear, ArchitectureError, all_layers, check_depth,
                                          check_layers_to_keep, method_for, record_recipe_layers,
                                          trained_layer_numbers)


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


class NormalizedInputLinear(nn.Linear):
    """``linear(LN(x))``: the projection of a branch whose input the recipe normalises (``sub_layer_norm``).
    Keeps the projection's own parameter names (``out_proj.weight``, ``fc2.bias``); the LayerNorm is its child."""

    def __init__(self, linear: nn.Linear):
        super().__init__(linear.in_features, linear.out_features, bias=linear.bias is not None)
        self.weight, self.bias = linear.weight, linear.bias
        self.layer_norm = LayerNorm(linear.in_features)

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(self.layer_norm(x), self.weight, self.bias)


class HeadNormalizedLinear(AdoptedLinear):
    """``norm(linear(x))`` with the norm over each head's features (HybridNorm's q/k/v norms): the projection keeps its
    own parameter names (``q_proj.weight``), the norm is its child, shared by the heads."""

    def __init__(self, linear: nn.Linear, norm: nn.Module, head_dim: int):
        super().__init__(linear)
        self.norm, self.head_dim = norm, head_dim

    def forward(self, x: Tensor) -> Tensor:
        y = F.linear(x, self.weight, self.bias)
        heads = y.unflatten(-1, (-1, self.head_dim))
        return self.norm(heads).flatten(-2)


class DeepLayer:
    """What both layer kinds share: the recipe applied to the fairseq layer once it is built (``place``), the FFN
    sublayer ``dropout(fc2(act_dropout(act(fc1(x)))))`` joined by the recipe's residual sum, and the branch sum."""

    def normalize_projection_inputs(self, method) -> None:
        """Sub-LN's inner LayerNorms, while the layer is built: a new Linear draws from the random stream, and the
        draws keep their order (each layer's, then the next layer's) only here."""
        if method.sub_layer_norm:
            if self.quant_noise > 0:  # fairseq's quant-noise hooks sit on the projections replaced here
                raise ArchitectureError(f"--quant-noise-pq is not supported by {method.name}: its inner LayerNorms "
                                        "replace the projections quant-noise instruments")
            self.self_attn.out_proj = NormalizedInputLinear(self.self_attn.out_proj)
            self.self_attn._set_skip_embed_dim_check()  # torch's fused attention would skip our out_proj's forward
            self.fc2 = NormalizedInputLinear(self.fc2)

    def place(self, method, side: str, layer_number: int, export: bool) -> None:
        """Make this built fairseq layer the ``layer_number``-th (1-based, in the trained stack) of the recipe's
        ``side`` stack: each sublayer's LayerNorm layout and module, its branch-output norm, its attention's q/k/v
        norms, its residual sum. Called by the stack in layer order, as fairseq builds its layers without telling them
        their place; builds nothing that draws from the random stream."""
        self.branch_sum = method.branch_sum
        self.fc1, self.fc2 = method.linear(self.fc1), method.linear(self.fc2)
        for attention in (self.self_attn, getattr(self, "encoder_attn", None)):
            for projection in ("q_proj", "k_proj", "v_proj", "out_proj") if attention is not None else ():
                linear = getattr(attention, projection)
                replaced = method.linear(linear)
                if replaced is not linear:
                    setattr(attention, projection, replaced)
                    attention._set_skip_embed_dim_check()  # torch's fused attention would read the raw weight
        sublayers = ["self_attn", "encoder_attn", "ffn"] if getattr(self, "encoder_attn", None) is not None \
            else ["self_attn", "ffn"]
        if hasattr(self, "encoder_attn"):  # a decoder layer's flags, also where --no-cross-attention builds none
            self.encoder_attn_pre_norm = self.encoder_attn_post_norm = False
        for sublayer in sublayers:
            layout = method.layer_norm_at(side, layer_number, sublayer)
            setattr(self, f"{sublayer}_pre_norm", layout == "pre")
            setattr(self, f"{sublayer}_post_norm", layout == "post")
            name = "final_layer_norm" if sublayer == "ffn" else f"{sublayer}_layer_norm"  # fairseq's names
            dim = self.embed_dim
            setattr(self, name, None if layout == "none" else method.norm(sublayer, dim, layer_number, export))
            setattr(self, f"{sublayer}_output_norm", method.norm(f"{sublayer}_output", dim, layer_number, export)
                    if method.branch_output_norm else None)
            if method.qkv_norm and sublayer != "ffn":
                if self.quant_noise > 0:  # fairseq's quant-noise hooks sit on the projections replaced here
                    raise ArchitectureError(f"--quant-noise-pq is not supported by {method.name}: its q/k/v norms "
                                            "replace the projections quant-noise instruments")
                attention = getattr(self, sublayer)
                head_dim = attention.head_dim
                for projection in ("q_proj", "k_proj", "v_proj"):
                    norm = method.norm(f"{sublayer}_{projection[0]}", head_dim, layer_number, export)
                    setattr(attention, projection, HeadNormalizedLinear(getattr(attention, projection), norm, head_dim))
                attention._set_skip_embed_dim_check()  # torch's fused attention would skip the projections' forward
        residuals = method.residuals(side, self.embed_dim, len(sublayers), layer_number)
        # registered in forward order: Admin's profile files list omega sublayer by sublayer
        self.self_attn_residual = residuals[0]
        self.encoder_attn_residual = residuals[1] if len(sublayers) == 3 else None
        self.ffn_residual = residuals[-1]

    def add_branch(self, branches: Optional[Tensor], f: Tensor) -> Optional[Tensor]:
        if not self.branch_sum:
            return None
        return f if branches is None else branches + f

    @torch.jit.unused
    def self_attention(self, query: Tensor, key: Tensor, key_padding_mask: Optional[Tensor],
                       attn_mask: Optional[Tensor], incremental_state) -> Tensor:
        """The self-attention sublayer's branch. fairseq runs torch's fused attention only where the projections
        are plain weights; where the recipe replaced them (Sub-LN's inner LayerNorm before ``out_proj``, σReparam's
        reparameterised weights, HybridNorm's q/k/v norms) it takes its unfused path (a matmul, a softmax, a matmul,
        each with its own backward). Here those run the projections as modules around one
        ``scaled_dot_product_attention`` instead, as stock does; everything else (incremental decoding, bias_kv,
        zero attention, ONNX tracing) is left to fairseq."""
        attention = self.self_attn
        if not attention.skip_embed_dim_check or incremental_state is not None or attention.onnx_trace \
                or attention.bias_k is not None or attention.add_zero_attn:
            x, _ = attention(query=query, key=key, value=key, key_padding_mask=key_padding_mask,
                             incremental_state=incremental_state, need_weights=False, attn_mask=attn_mask)
            return x
        length, batch, embed_dim = query.size()

        def heads(x: Tensor) -> Tensor:  # T x B x C -> B x H x T x head_dim
            return x.view(x.size(0), batch, attention.num_heads, -1).permute(1, 2, 0, 3)

        mask = attn_mask
        if key_padding_mask is not None:  # fairseq's -inf on padded keys, added to the attention mask as torch does
            padding = torch.zeros(key_padding_mask.shape, dtype=query.dtype, device=query.device)
            padding = padding.masked_fill_(key_padding_mask.bool(), float("-inf")).view(batch, 1, 1, -1)
            mask = padding if mask is None else mask + padding
        apply_dropout = attention.training or attention.dropout_module.apply_during_inference
        x = F.scaled_dot_product_attention(
            heads(attention.q_proj(query)), heads(attention.k_proj(key)), heads(attention.v_proj(key)),
            attn_mask=mask, dropout_p=attention.dropout_module.p if apply_dropout else 0.0)
        return attention.out_proj(x.permute(2, 0, 1, 3).reshape(length, batch, embed_dim))

    def feed_forward_sublayer(self, x: Tensor, layer_input: Tensor) -> Tuple[Tensor, Tensor]:
        residual = x
        x = self.ffn_residual.branch_input(x)
        if self.ffn_pre_norm:
            x = self.final_layer_norm(x)
        x = self.fc2(self.activation_dropout_module(self.activation_fn(self.fc1(x))))
        if self.ffn_output_norm is not None:
            x = self.ffn_output_norm(x)
        f = self.dropout_module(x)
        x = self.ffn_residual(residual, f, layer_input)
        if self.ffn_post_norm:
            x = self.final_layer_norm(x)
        return x, f


class DeepTransformerEncoderLayer(DeepLayer, TransformerEncoderLayerBase):
    """Encoder layer: self-attention and FFN sublayers, each joined by the recipe's residual. Returns its output
    and, where the recipe keeps it (``branch_sum``), the sum of its branch outputs."""

    # each sublayer's LayerNorm at its branch input (Pre-LN) or after its residual sum (Post-LN, DeepNorm, Admin);
    # T-Fixup: neither
    self_attn_pre_norm: Final[bool]
    self_attn_post_norm: Final[bool]
    ffn_pre_norm: Final[bool]
    ffn_post_norm: Final[bool]
    branch_sum: Final[bool]

    def __init__(self, cfg):
        super().__init__(cfg)
        self.normalize_projection_inputs(method_for(cfg))
        name_dropout_like_fairseq(self, TransformerEncoderLayerBase, ["dropout_module", "activation_dropout_module"])

    def forward(self, x, encoder_padding_mask: Optional[Tensor], attn_mask: Optional[Tensor] = None):
        if attn_mask is not None:  # as fairseq: -1e8, not -inf, so fully masked rows stay finite
            attn_mask = attn_mask.masked_fill(
                attn_mask.to(torch.bool), -1e8 if x.dtype == torch.float32 else -1e4
            )

        layer_input = residual = x
        x = self.self_attn_residual.branch_input(x)
        if self.self_attn_pre_norm:
            x = self.self_attn_layer_norm(x)
        if torch.jit.is_scripting():
            x, _ = self.self_attn(
                query=x, key=x, value=x, key_padding_mask=encoder_padding_mask, need_weights=False, attn_mask=attn_mask,
            )
        else:
            x = self.self_attention(x, x, encoder_padding_mask, attn_mask, None)
        if self.self_attn_output_norm is not None:
            x = self.self_attn_output_norm(x)
        f = self.dropout_module(x)
        x = self.self_attn_residual(residual, f, layer_input)
        if self.self_attn_post_norm:
            x = self.self_attn_layer_norm(x)
        branches = self.add_branch(None, f)

        x, f = self.feed_forward_sublayer(x, layer_input)
        return x, self.add_branch(branches, f)


class DeepTransformerDecoderLayer(DeepLayer, TransformerDecoderLayerBase):
    """Decoder layer: self-attention, encoder-attention and FFN sublayers, each with the recipe's residual.
    Returns (output, attention, the sum of its branch outputs where the recipe keeps it)."""

    self_attn_pre_norm: Final[bool]
    self_attn_post_norm: Final[bool]
    encoder_attn_pre_norm: Final[bool]
    encoder_attn_post_norm: Final[bool]
    ffn_pre_norm: Final[bool]
    ffn_post_norm: Final[bool]
    branch_sum: Final[bool]

    def __init__(self, cfg, no_encoder_attn=False):
        super().__init__(cfg, no_encoder_attn=no_encoder_attn)
        self.normalize_projection_inputs(method_for(cfg))
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

        layer_input = residual = x
        x = self.self_attn_residual.branch_input(x)
        if self.self_attn_pre_norm:
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
        if torch.jit.is_scripting():
            x, _ = self.self_attn(
                query=x, key=y, value=y, key_padding_mask=self_attn_padding_mask,
                incremental_state=incremental_state, need_weights=False, attn_mask=self_attn_mask,
            )
        else:
            x = self.self_attention(x, y, self_attn_padding_mask, self_attn_mask, incremental_state)
        if self.self_attn_output_norm is not None:
            x = self.self_attn_output_norm(x)
        f = self.dropout_module(x)
        x = self.self_attn_residual(residual, f, layer_input)
        if self.self_attn_post_norm:
            x = self.self_attn_layer_norm(x)
        branches = self.add_branch(None, f)

        attn: Optional[Tensor] = None
        if self.encoder_attn is not None and encoder_out is not None:
            residual = x
            x = self.encoder_attn_residual.branch_input(x)
            if self.encoder_attn_pre_norm:
                x = self.encoder_attn_layer_norm(x)
            x, attn = self.encoder_attn(
                query=x, key=encoder_out, value=encoder_out, key_padding_mask=encoder_padding_mask,
                incremental_state=incremental_state, static_kv=True,
                need_weights=need_attn or (not self.training and self.need_attn), need_head_weights=need_head_weights,
            )
            if self.encoder_attn_output_norm is not None:
                x = self.encoder_attn_output_norm(x)
            f = self.dropout_module(x)
            x = self.encoder_attn_residual(residual, f, layer_input)
            if self.encoder_attn_post_norm:
                x = self.encoder_attn_layer_norm(x)
            branches = self.add_branch(branches, f)

        x, f = self.feed_forward_sublayer(x, layer_input)
        return x, attn, self.add_branch(branches, f)


def contiguous_time_major(x: Tensor) -> Tensor:
    """B x T x C -> T x B x C, laid out as T x B x C. The residual stream keeps the strides of the tensor it starts
    from (``x + f`` follows ``x``): fairseq's transposed view made every linear that reads the stream itself (T-Fixup,
    ReZero, DyT: no LayerNorm copies it first) copy it before its matmul, in every layer, forward and backward."""
    return x.transpose(0, 1).contiguous()


def place_layers(stack: nn.Module, method, side: str, cfg) -> None:
    """Apply the recipe to a stack fairseq has just built: each layer in its place, then the stack's own norms (the
    final one, fairseq's where the layout is "pre", and the embedding's, with ``--layernorm-embedding``)."""
    embed_dim = getattr(cfg, side).embed_dim
    for layer, number in zip(all_layers(stack), trained_layer_numbers(cfg, side)):
        layer.place(method, side, number, cfg.export)
    for name, role in (("layer_norm", "final"), ("layernorm_embedding", "embedding")):
        if getattr(stack, name) is not None:
            setattr(stack, name, method.norm(role, embed_dim, None, cfg.export))


class DeepTransformerEncoder(TransformerEncoderBase):
    """fairseq's encoder, its layers joined by the recipe's stack connection (``connection``)."""

    def __init__(self, cfg, dictionary, embed_tokens):
        super().__init__(cfg, dictionary, embed_tokens)
        name_dropout_like_fairseq(self, TransformerEncoderBase, ["dropout_module"])
        method = method_for(cfg)
        place_layers(self, method, "encoder", cfg)
        self.connection = method.stack_connection("encoder", cfg.encoder.embed_dim, method.encoder_layers)

    def build_encoder_layer(self, cfg):
        return _wrap_like_fairseq(DeepTransformerEncoderLayer(cfg), cfg)

    def forward_scriptable(
        self,
        src_tokens,
        src_lengths: Optional[Tensor] = None,
        return_all_hiddens: bool = False,
        token_embeddings: Optional[Tensor] = None,
    ):
        """fairseq's ``TransformerEncoderBase.forward_scriptable``; each layer reads ``connection.next_input``."""
        encoder_padding_mask = src_tokens.eq(self.padding_idx)
        has_pads = torch.tensor(src_tokens.device.type == "xla") or encoder_padding_mask.any()
        if torch.jit.is_scripting():  # TorchScript does not handle a bool tensor here, as in fairseq
            has_pads = torch.tensor(1) if has_pads else torch.tensor(0)

        x, encoder_embedding = self.forward_embedding(src_tokens, token_embeddings)
        x = x * (1 - encoder_padding_mask.unsqueeze(-1).type_as(x) * has_pads.type_as(x))
        x = contiguous_time_major(x)

        encoder_states = []
        if return_all_hiddens:
            encoder_states.append(x)
        state: List[Tensor] = []
        x = self.connection.begin(x, state)
        for index, layer in enumerate(self.layers):
            x, branches = layer(x, encoder_padding_mask=encoder_padding_mask if has_pads else None)
            x = self.connection.next_input(index, x, branches, state)
            if return_all_hiddens and not torch.jit.is_scripting():
                encoder_states.append(x)
        x = self.connection.output(x, state)
        if self.layer_norm is not None:
            x = self.layer_norm(x)

        src_lengths = src_tokens.ne(self.padding_idx).sum(dim=1, dtype=torch.int32).reshape(-1, 1).contiguous()
        return {
            "encoder_out": [x],  # T x B x C
            "encoder_padding_mask": [encoder_padding_mask],  # B x T
            "encoder_embedding": [encoder_embedding],  # B x T x C
            "encoder_states": encoder_states,  # List[T x B x C]
            "fc_results": [],
            "src_tokens": [],
            "src_lengths": [src_lengths],
        }


class DeepTransformerDecoder(TransformerDecoderBase):
    """fairseq's decoder, its layers joined by the recipe's stack connection (``connection``)."""

    def __init__(self, cfg, dictionary, embed_tokens, no_encoder_attn=False):
        super().__init__(cfg, dictionary, embed_tokens, no_encoder_attn=no_encoder_attn)
        name_dropout_like_fairseq(self, TransformerDecoderBase, ["dropout_module"])
        method = method_for(cfg)
        place_layers(self, method, "decoder", cfg)
        self.connection = method.stack_connection("decoder", cfg.decoder.embed_dim, method.decoder_layers)

    def build_decoder_layer(self, cfg, no_encoder_attn=False):
        return _wrap_like_fairseq(DeepTransformerDecoderLayer(cfg, no_encoder_attn), cfg)

    def extract_features_scriptable(
        self,
        prev_output_tokens,
        encoder_out: Optional[Dict[str, List[Tensor]]],
        incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]] = None,
        full_context_alignment: bool = False,
        alignment_layer: Optional[int] = None,
        alignment_heads: Optional[int] = None,
    ):
        """fairseq's ``TransformerDecoderBase.extract_features_scriptable``; each layer reads
        ``connection.next_input``."""
        if alignment_layer is None:
            alignment_layer = self.num_layers - 1

        enc: Optional[Tensor] = None
        padding_mask: Optional[Tensor] = None
        if encoder_out is not None and len(encoder_out["encoder_out"]) > 0:
            enc = encoder_out["encoder_out"][0]
        if encoder_out is not None and len(encoder_out["encoder_padding_mask"]) > 0:
            padding_mask = encoder_out["encoder_padding_mask"][0]

        positions = None
        if self.embed_positions is not None:
            positions = self.embed_positions(prev_output_tokens, incremental_state=incremental_state)
        if incremental_state is not None:
            prev_output_tokens = prev_output_tokens[:, -1:]
            if positions is not None:
                positions = positions[:, -1:]

        prev_output_tokens = prev_output_tokens.contiguous()  # TorchScript and dynamically quantised embeddings
        x = self.embed_scale * self.embed_tokens(prev_output_tokens)
        if self.quant_noise is not None:
            x = self.quant_noise(x)
        if self.project_in_dim is not None:
            x = self.project_in_dim(x)
        if positions is not None:
            x += positions
        if self.layernorm_embedding is not None:
            x = self.layernorm_embedding(x)
        x = self.dropout_module(x)
        x = contiguous_time_major(x)

        self_attn_padding_mask: Optional[Tensor] = None
        if self.cross_self_attention or prev_output_tokens.eq(self.padding_idx).any():
            self_attn_padding_mask = prev_output_tokens.eq(self.padding_idx)

        attn: Optional[Tensor] = None
        inner_states: List[Optional[Tensor]] = [x]
        state: List[Tensor] = []
        x = self.connection.begin(x, state)
        for index, layer in enumerate(self.layers):
            if incremental_state is None and not full_context_alignment:
                self_attn_mask = self.buffered_future_mask(x)
            else:
                self_attn_mask = None
            x, layer_attn, branches = layer(
                x, enc, padding_mask, incremental_state, self_attn_mask=self_attn_mask,
                self_attn_padding_mask=self_attn_padding_mask,
                need_attn=bool((index == alignment_layer)), need_head_weights=bool((index == alignment_layer)),
            )
            x = self.connection.next_input(index, x, branches, state)
            inner_states.append(x)
            if layer_attn is not None and index == alignment_layer:
                attn = layer_attn.float().to(x)

        if attn is not None:
            if alignment_heads is not None:
                attn = attn[:alignment_heads]
            attn = attn.mean(dim=0)  # average probabilities over heads

        x = self.connection.output(x, state)
        if self.layer_norm is not None:
            x = self.layer_norm(x)
        x = x.transpose(0, 1)  # T x B x C -> B x T x C
        if self.project_out_dim is not None:
            x = self.project_out_dim(x)
        return x, {"attn": [attn], "inner_states": inner_states}


@register_model("deep_transformer")
class DeepTransformerModel(TransformerModel):
    """fairseq's Transformer with a deep-training recipe chosen by the arch (``args.deep_method``).

    Architectures: ``transformer_<recipe>`` for every registered recipe but Post-LN (base 512-2048-8), ``..._iwslt_de_en``
    (512-1024-4) and ``..._big`` (1024-4096-16); depth via ``--encoder-layers/--decoder-layers``.
    """

    #: Admin: set by ``--task translation_deep``, which sets omega when fairseq-train first asks for batches.
    omega_set_by_task = False

    @classmethod
    def add_args(cls, parser):
        super().add_args(parser)
        for method in METHODS.values():
            method.add_args(parser)

    @classmethod
    def build_model(cls, args, task):
        if getattr(args, "share_all_embeddings", False) and task.source_dictionary != task.target_dictionary:
            raise ArchitectureError("--share-all-embeddings needs one dictionary for both languages: binarize with "
                                    "fairseq-preprocess --joined-dictionary (or --srcdict and --tgtdict naming one "
                                    "file), or drop the flag")
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
    for suffix, size in SIZES.items():
        arch = f"transformer_{method_name}{suffix}"

        def architecture(args, size=size, arch=arch):
            args.deep_method = method_name
            size(args)
            check_depth(args, arch)
            record_recipe_layers(args)
            method = method_for(args)
            if method.layer_norm == "pre":
                args.encoder_normalize_before = args.decoder_normalize_before = True
            if method.layernorm_embedding:
                args.layernorm_embedding = True
            method.check_args(args, arch)
            check_layers_to_keep(args, arch)

        architecture.__name__ = arch
        register_model_architecture("deep_transformer", arch)(architecture)


for _name in METHODS:
    if _name != "postln":  # the stock transformer is fairseq's own
        register_deep_architectures(_name)
