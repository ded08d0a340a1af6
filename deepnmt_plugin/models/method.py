"""What a deep-Transformer recipe is made of, and the Post-LN baseline every recipe departs from.

A recipe (``DeepMethod``) decides, each in one named place:

* where each sublayer's LayerNorm sits (``layer_norm``): after the residual sum ("post"), at the
  branch input ("pre"), or nowhere ("none"), for the whole model or sublayer by sublayer (``layer_norm_at``:
  Mix-LN, HybridNorm); whether each branch also normalises the input of its last projection (``sub_layer_norm``,
  Sub-LN) or its output (``branch_output_norm``, Peri-LN);
* which normalisation module each of those places builds (``norm``): fairseq's LayerNorm by default,
  DyT's ``tanh``, LayerNorm Scaling's LayerNorm times 1/sqrt(l); and whether attention normalises its queries,
  keys and values (``qkv_norm``, HybridNorm);
* how each projection of a layer uses its weight (``linear``): as it is, or σReparam's ``gamma / sigma(W) * W``;
* the residual sum of every sublayer of a layer (``residuals``), joining the sublayer input x_{i-1},
  the branch output f_i and the layer's input x_0 (which only B2T reads): ``x + f``, DeepNorm's
  ``alpha * x + f``, ReZero's ``x + a * f`` with one ``a`` per layer; with "post", ``x_i = LN(sum)``; and what
  the branch reads of the sublayer input (``Residual.branch_input``: x_{i-1} itself, or Hyper-Connections' learned
  mix of its residual streams);
* how the layers of a stack are connected (``stack_connection``): what the first layer reads, what
  each next layer reads, what the stack outputs (the previous layer's output, by default; DLCL and
  ResiDual reach across layers; Hyper-Connections widens the hidden state into several streams), and whether
  layers report the sum of their branch outputs (``branch_sum``, ResiDual's second stream);
* the initialisation applied once the model is built (``initialize``);
* which layouts and fairseq flags it admits (``check_args``): e.g. DeepNorm is Post-LN only;
* why stock fairseq cannot compute it (``export_refusal``), where ``deepnmt-export`` has no stock layout.

Post-LN (Vaswani et al. 2017, the stock fairseq ``transformer``) is ``x_i = LN(x_{i-1} + f_i(x_{i-1}))``.

Every constant a recipe derives from the depth is computed from ``recipe_layers(cfg)``: the
``--encoder-layers/--decoder-layers`` the model was trained with, recorded in its config (and so in
every checkpoint) when the arch is applied. ``--encoder-layers-to-keep`` prunes layers at load time;
the kept layers keep the constants they were trained with.
"""

from typing import Dict, List, Optional, Tuple, Type

import torch
import torch.nn as nn
from fairseq.modules import LayerNorm
from torch import Tensor

METHODS: Dict[str, Type["DeepMethod"]] = {}


def register_method(cls):
    METHODS[cls.name] = cls
    return cls


class ArchitectureError(SystemExit):
    """Contradictory model flags: exits with one line, before any data or checkpoint is touched."""

    def __init__(self, message: str):
        super().__init__(f"deepnmt: error: {message}")


class Residual(nn.Module):
    """A sublayer's residual connection. ``branch_input`` is what the branch reads of the sublayer input x_{i-1} (its
    LayerNorm, where the layout is "pre", comes after): x_{i-1} itself here. ``forward`` takes ``(x_{i-1}, f_i, x_0)``,
    x_0 the input of the sublayer's layer, and returns the sum."""

    def branch_input(self, x: Tensor) -> Tensor:
        return x


class PlainResidual(Residual):
    """The residual sum ``x_{i-1} + f_i(x_{i-1})`` of Post-LN, Pre-LN and T-Fixup."""

    def forward(self, x: Tensor, f: Tensor, layer_input: Tensor) -> Tensor:
        return x + f


class ScaledResidualSum(torch.autograd.Function):
    """``addend + scale * scaled`` in one kernel, like stock ``x + f``, with the backward written out: the gradient of
    the addend is the incoming one, of the scaled term ``grad * scale``, of scale ``grad * scaled`` summed to the
    scale's shape. Admin scales the residual, ``f + omega * x`` (omega per channel); ReZero the branch,
    ``x + alpha * f`` (alpha a scalar). ``addcmul``'s own backward computes the same values but also multiplies both
    products by its ``value`` (1): two more operators per sublayer and update."""

    @staticmethod
    def forward(ctx, addend: Tensor, scaled: Tensor, scale: Tensor) -> Tensor:
        ctx.save_for_backward(scaled, scale)
        return torch.addcmul(addend, scaled, scale)

    @staticmethod
    def backward(ctx, grad: Tensor):
        scaled, scale = ctx.saved_tensors
        grad_scaled = grad * scale if ctx.needs_input_grad[1] else None
        grad_scale = (grad * scaled).sum_to_size(scale.shape) if ctx.needs_input_grad[2] else None
        return grad, grad_scaled, grad_scale


def scaled_residual_sum(addend: Tensor, scaled: Tensor, scale: Tensor) -> Tensor:
    """``addend + scale * scaled`` through ``ScaledResidualSum``; under TorchScript, which runs no autograd Function
    (a scripted model generates), through ``addcmul``."""
    if torch.jit.is_scripting():
        return torch.addcmul(addend, scaled, scale)
    return ScaledResidualSum.apply(addend, scaled, scale)


class AdoptedLinear(nn.Linear):
    """A projection that takes over a built ``nn.Linear``'s parameters under their names (``q_proj.weight``), for a
    recipe that changes how the projection computes; subclasses set its ``forward``."""

    def __init__(self, linear: nn.Linear):
        nn.Module.__init__(self)  # not nn.Linear's: it would draw a fresh weight from the random stream
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight, self.bias = linear.weight, linear.bias


class StackConnection(nn.Module):
    """How a stack's layers are joined; this default is the plain chain: layer l+1 reads layer l's output.

    The stack calls ``begin`` with its embedding output (after dropout), ``next_input`` after each layer with
    that layer's output and, where the recipe has ``branch_sum``, the sum of its branch outputs, and ``output``
    after the last layer, before the stack's final LayerNorm (Pre-LN layouts). ``state`` is the recipe's own
    list of tensors (DLCL's layer history, ResiDual's second stream), kept by the stack's loop.
    """

    def begin(self, x: Tensor, state: List[Tensor]) -> Tensor:
        """What the first layer reads, given the embedding output; fills ``state`` (empty until then)."""
        return x

    def next_input(self, index: int, x: Tensor, branches: Optional[Tensor], state: List[Tensor]) -> Tensor:
        return x

    def output(self, x: Tensor, state: List[Tensor]) -> Tensor:
        return x


def record_recipe_layers(args) -> None:
    """Record the depth the recipe's constants are computed for, once: what the arch sees first is
    ``--encoder-layers/--decoder-layers`` on the command line, or the checkpoint's saved config (where
    fairseq has not yet shrunk ``encoder_layers`` for ``--encoder-layers-to-keep``)."""
    if getattr(args, "recipe_layers", None) is None:
        args.recipe_layers = [args.encoder_layers, args.decoder_layers]


def recipe_layers(cfg) -> Tuple[int, int]:
    """(encoder, decoder) depth the recipe's constants belong to: the trained depth, not the pruned one."""
    encoder_layers, decoder_layers = getattr(cfg, "recipe_layers", None) or (cfg.encoder.layers, cfg.decoder.layers)
    return int(encoder_layers), int(decoder_layers)


def trained_layer_numbers(cfg, side: str) -> List[int]:
    """The 1-based number, in the trained stack, of each layer the ``side`` stack builds: 1 .. L, or the kept ones
    where ``--{side}-layers-to-keep`` prunes it (fairseq keeps them in ascending order), so that a layer keeps the
    per-layer constants it was trained with."""
    keep = getattr(getattr(cfg, side), "layers_to_keep", None)
    if keep:
        indices = keep.split(",") if isinstance(keep, str) else keep
        return [index + 1 for index in sorted(int(i) for i in indices)]
    return list(range(1, recipe_layers(cfg)[0 if side == "encoder" else 1] + 1))


#: fairseq transformer flags no recipe supports: refused at start-up (stock fairseq ignores or crashes on them).
UNSUPPORTED_FLAGS = {
    "base_layers": "BASE layers keep fairseq's own residual and LayerNorm, outside the recipe",
    "adaptive_input": "fairseq's translation transformer builds no adaptive input embedding (a transformer_lm flag)",
    "tie_adaptive_weights": "it ties the adaptive softmax to an adaptive input embedding, which is never built",
    "char_inputs": "a deprecated fairseq flag that builds nothing",
    # fairseq 0.12 declares --relu-dropout both as an alias of --activation-dropout and as a field of its own, and
    # the parser fills the field: activation dropout stays 0
    "relu_dropout": "fairseq 0.12's transformer never reads it; give the FFN's dropout as --activation-dropout",
}


@register_method
class DeepMethod:
    """Post-LN; subclasses override what their paper changes."""

    name = "postln"
    #: LayerNorm layout: "post" (after the residual sum), "pre" (inside the branch) or "none".
    layer_norm = "post"
    #: a LayerNorm before the last projection of each self-attention and FFN branch (Sub-LN)
    sub_layer_norm = False
    #: a normalisation of each branch's output, before the residual sum (Peri-LN's output LayerNorm)
    branch_output_norm = False
    #: the embedding output is normalised (fairseq's ``--layernorm-embedding``, which the arch then sets)
    layernorm_embedding = False
    #: every attention normalises its queries, keys and values, each head's features (HybridNorm's QKV norm)
    qkv_norm = False
    #: layers also return the sum of their branch outputs, for ``stack_connection`` (ResiDual)
    branch_sum = False
    #: why stock fairseq's transformer cannot compute this model; None: ``deepnmt-export`` writes it as one
    export_refusal: Optional[str] = None

    def __init__(self, encoder_layers: int, decoder_layers: int):
        self.encoder_layers = encoder_layers
        self.decoder_layers = decoder_layers

    #: the ``dest`` of each flag ``add_args`` registers; refused with any other recipe
    flag_names: Tuple[str, ...] = ()

    @classmethod
    def add_args(cls, parser) -> None:
        """The recipe's own model flags (default None: unset), on every deep arch's parser."""

    @classmethod
    def from_config(cls, cfg) -> "DeepMethod":
        """The recipe sized to the trained depth; a recipe with flags reads them here (saved with the model)."""
        return cls(*recipe_layers(cfg))

    def layer_norm_at(self, side: str, layer_number: int, sublayer: str) -> str:
        """The LayerNorm layout ("post", "pre" or "none") of ``sublayer`` ("self_attn", "encoder_attn" or "ffn") in
        layer ``layer_number`` (1-based, in the trained stack) of the ``side`` stack; every sublayer has the model's by
        default. The stack's final LayerNorm follows ``layer_norm`` (fairseq builds it when the layout is "pre")."""
        return self.layer_norm

    def norm(self, role: str, dim: int, layer_number: Optional[int], export: bool) -> nn.Module:
        """The normalisation module at ``role``: a sublayer's ("self_attn", "encoder_attn", "ffn": at its input in
        a "pre" layer, after its residual sum in a "post" one), a branch output's ("self_attn_output",
        "encoder_attn_output", "ffn_output", with ``branch_output_norm``), an attention's query, key or value
        projection's ("self_attn_q", ..., "encoder_attn_v", with ``qkv_norm``: ``dim`` is the head's), the stack's
        final one ("final") or the embedding's ("embedding", with ``--layernorm-embedding``). ``layer_number`` is the layer's 1-based number in
        the trained stack (None for the stack's own). fairseq's LayerNorm by default."""
        return LayerNorm(dim, export=export)

    def linear(self, linear: nn.Linear) -> nn.Linear:
        """How a layer's projection (attention q/k/v/out, FFN fc1/fc2) uses its weight: as it is by default; σReparam
        rescales it by its spectral norm. Builds nothing that draws from the random stream (``initialize`` may)."""
        return linear

    def residual(self, side: str, embed_dim: int) -> Residual:
        """The residual sum of one sublayer of the ``side`` ("encoder" or "decoder") stack."""
        return PlainResidual()

    def residuals(self, side: str, embed_dim: int, count: int, layer_number: int) -> List[Residual]:
        """The residual connections of the ``count`` sublayers of layer ``layer_number`` (1-based, in the trained
        stack), in forward order (one ``residual`` each)."""
        return [self.residual(side, embed_dim) for _ in range(count)]

    def stack_connection(self, side: str, embed_dim: int, num_layers: int) -> nn.Module:
        """How the ``side`` stack's ``num_layers`` layers are joined (``StackConnection``: a plain chain)."""
        return StackConnection()

    def initialize(self, model: nn.Module) -> None:
        """Re-initialise a freshly built model; Post-LN keeps fairseq's initialisation."""

    def check_args(self, args, arch: str) -> None:
        """Refuse, in one line at start-up, fairseq flags no recipe supports and flags contradicting this one."""
        for name, reason in UNSUPPORTED_FLAGS.items():
            if getattr(args, name, None):
                raise ArchitectureError(f"--{name.replace('_', '-')} is not supported by --arch {arch}: {reason}")
        for other in METHODS.values():
            for dest in other.flag_names:
                if other is not type(self) and getattr(args, dest, None) is not None:
                    raise ArchitectureError(f"--{dest.replace('_', '-')} is a flag of transformer_{other.name}; "
                                            f"--arch {arch} would ignore it")
        wants_pre = self.layer_norm == "pre"
        for side in ("encoder", "decoder"):
            if getattr(args, f"{side}_normalize_before", False) != wants_pre:
                flag = f"--{side}-normalize-before"
                raise ArchitectureError(
                    f"{flag} contradicts --arch {arch}: {self.name} is "
                    + ("Pre-LN and always sets it" if wants_pre else "a Post-LN layout; drop the flag")
                )
        replaces_projections = self.sub_layer_norm or self.qkv_norm or type(self).linear is not DeepMethod.linear
        if replaces_projections and getattr(args, "quant_noise_scalar", 0) > 0:  # its swap is looked up by exact class
            raise ArchitectureError(f"--quant-noise-scalar is not supported by --arch {arch}: fairseq's scalar "
                                    f"quantization swaps each nn.Linear for its own, and {self.name} replaces "
                                    "projections with its own")
        if self.layer_norm == "none" and getattr(args, "layernorm_embedding", False):
            raise ArchitectureError(
                f"--layernorm-embedding contradicts --arch {arch}: {self.name} removes every LayerNorm"
            )


def refuse_below_one(args, flags) -> None:
    """A recipe's whole-number flags (``dest`` names), each refused in one line when given below 1."""
    for flag in flags:
        value = getattr(args, flag, None)
        if value is not None and value < 1:
            raise ArchitectureError(f"--{flag.replace('_', '-')} {value}: give a whole number of at least 1")


def check_depth(args, arch: str) -> None:
    """At least one layer per stack: every recipe's constants divide by, or take the log of, the depth."""
    for side in ("encoder", "decoder"):
        layers = getattr(args, f"{side}_layers")
        if layers < 1:
            raise ArchitectureError(f"--{side}-layers {layers}: --arch {arch} needs at least 1 layer")


def check_layers_to_keep(args, arch: str) -> None:
    """Layers to keep given where they work (at load, not to fairseq-train) and that exist; checked after the recipe's
    own refusals, so that a recipe that cannot be pruned says so instead of advising a form it then refuses."""
    for side in ("encoder", "decoder"):
        layers = getattr(args, f"{side}_layers")
        keep = getattr(args, f"{side}_layers_to_keep", None)
        if isinstance(keep, list):  # parsed from fairseq-train's command line, where fairseq 0.12 crashes on it
            raise ArchitectureError(
                f"--{side}-layers-to-keep prunes a trained model when it is loaded: give it to fairseq-generate "
                f"as --model-overrides \"{{'{side}_layers_to_keep': '{','.join(map(str, keep))}'}}\""
            )
        if keep and not all(0 <= int(i) < layers for i in keep.split(",")):
            raise ArchitectureError(f"{side}_layers_to_keep {keep}: the model has layers 0 .. {layers - 1}")


def method_for(cfg) -> DeepMethod:
    """The recipe a model config names (``cfg.deep_method``, set by the arch), sized to its trained depth."""
    name = getattr(cfg, "deep_method", None) or "postln"
    if name not in METHODS:
        raise ArchitectureError(f"unknown deep method {name!r}; known: {', '.join(sorted(METHODS))}")
    return METHODS[name].from_config(cfg)


def layer_attentions(layer: nn.Module) -> List[nn.Module]:
    """A layer's attentions: its self-attention and, in a decoder layer that has one, its encoder attention."""
    return [a for a in (layer.self_attn, getattr(layer, "encoder_attn", None)) if a is not None]


def all_layers(stack: nn.Module):
    """Every layer of an encoder or decoder, in order. Iterating ``stack.layers`` itself yields a random
    subset in training mode when it is fairseq's ``LayerDropModuleList`` (``--encoder-layerdrop``)."""
    return list(stack.layers.children())
