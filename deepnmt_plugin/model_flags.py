"""Which of a checkpoint's flags define its model: what averaging and resuming compare, so that checkpoints of
different models are never averaged into one, and a training never resumes as another model than it started as.

fairseq-train saves its whole command line as ``cfg['model']``; of it, the model is the arch, the recipe and depth the
arch records (``deep_method``, ``recipe_layers``) and every flag fairseq's transformer and the recipes declare, but
``RUN_FLAGS``: flags that may change between the checkpoints of one run without changing what its parameters compute.
"""

import argparse
from typing import List

from deepnmt_plugin.models.deep_transformer import DeepTransformerModel

RUN_FLAGS = {
    # regularisation, active in training only
    "dropout", "attention_dropout", "activation_dropout", "relu_dropout", "adaptive_softmax_dropout",
    "encoder_layerdrop", "decoder_layerdrop", "quant_noise_pq", "quant_noise_pq_block_size", "quant_noise_scalar",
    # memory: activations recomputed or offloaded in the backward pass, FSDP's wrapping
    "checkpoint_activations", "offload_activations", "min_params_to_wrap",
    # fairseq's TorchScript-exportable LayerNorm instead of the fused one: the same function
    "export",
    # a file of embeddings read only to initialise them (trained on since), named by a path that may move on resume
    "encoder_embed_path", "decoder_embed_path",
}


# what the arch records from the command line (no flag of their own): --arch sets the recipe, the layer flags the depth
ARCH_RECORDED = ("deep_method", "recipe_layers")


def model_flags() -> List[str]:
    """The names of the flags that define a model (module docstring)."""
    parser = argparse.ArgumentParser()
    DeepTransformerModel.add_args(parser)
    declared = vars(parser.parse_args([]))
    return ["arch", *ARCH_RECORDED, *(name for name in declared if name not in RUN_FLAGS)]


MODEL_FLAGS = model_flags()


def as_dict(model_cfg) -> dict:
    """A ``cfg['model']`` (a dict, omegaconf's DictConfig or fairseq's argparse.Namespace) as a dict."""
    return vars(model_cfg) if isinstance(model_cfg, argparse.Namespace) else dict(model_cfg or {})


def differing_model_flags(first, other) -> List[str]:
    """The model flags both configs record with different values (a flag one lacks, saved by another fairseq or
    plugin version, is not known to differ)."""
    first, other = as_dict(first), as_dict(other)
    return [name for name in MODEL_FLAGS if name in first and name in other and first[name] != other[name]]
