"""Export a deepnmt checkpoint as a stock fairseq ``transformer`` checkpoint.

``python -m deepnmt_plugin.export IN.pt OUT.pt`` (or ``deepnmt-export IN.pt OUT.pt``). The result loads
and generates with plain fairseq, without ``--user-dir``, on torch >= 2.6 weights-only loading: it holds
only tensors and plain containers (the config is a dict, not fairseq's ``argparse.Namespace``).

Each recipe is re-parameterised as a stock layout computing the same function (eval mode):

* Pre-LN: already fairseq's ``--encoder-normalize-before/--decoder-normalize-before`` layout.
* DeepNorm: LayerNorm is scale invariant, ``LN(alpha*x + f(x)) = LN(x + f(x)/alpha)``, so 1/alpha
  goes into each branch's last projection (``out_proj``, ``fc2``: weights and biases) and the model is
  Post-LN. Exact up to LN's epsilon: the original normalises with an effective eps/alpha^2, the export
  with eps; it shows (about 1e-4) only where the summed input is near zero, e.g. at padding.
* Admin: ``x_i = LN_i(omega_i * x_{i-1} + f_i(x_{i-1}))`` with a per-dimension omega_i (Liu et al. 2020,
  Eq. 5). Per-dimension scaling is not absorbed by LN_i, so omega_i moves into whatever produced
  x_{i-1}: the output is stored pre-multiplied, x' = omega_i * x_{i-1}, and every reader of x_{i-1}
  divides it back out of its input columns (W x = (W / omega_i) x'). Readers of x_{i-1}: the residual
  (now x' + f_i), and f_i's input projections only: q/k/v for self-attention (its incremental keys and
  values too), q for encoder attention, fc1 for the FFN. Producers:

  - sublayer i > 1: x_{i-1} = LN_{i-1}(...), whose affine (gamma, beta) is multiplied by omega_i. The
    encoder output (last encoder LN, read by every decoder k/v projection) and the decoder output (last
    decoder LN) have no omega after them and are left alone.
  - sublayer 1 reads the embeddings, x_0 = s * E[token] + P[position]: with ``--layernorm-embedding``
    that LN takes omega_1; otherwise E and P are multiplied column-wise. Sinusoidal positions are not
    parameters, so they become a learned table holding omega_1 * sinusoid (same rows, same position
    numbering, ``--max-*-positions`` rows as fairseq already enforces). A scaled decoder table that is
    also the output projection gets 1/omega_1 into the last decoder LN (logits = (h/omega) (E*omega)^T),
    and encoder and decoder tables, scaled by different omegas, are untied (``share_all_embeddings``
    off, decoder input/output still shared).

* DS-Init: a Post-LN model; only its initialisation differs, so it is exported as it is.
* LayerNorm Scaling: Pre-LN whose sublayer LayerNorms in layer l are scaled by 1/sqrt(l); ``LN(x) * s`` is the
  LayerNorm with weight and bias times s, so the model is exported as Pre-LN with those folded in.
* T-Fixup, ReZero, DyT (no LayerNorm), Sub-LN, Peri-LN, HybridNorm (norms inside the branch), Mix-LN (two
  layouts in one stack), σReparam (weights rescaled at every step), B2T, ResiDual, DLCL and DenseFormer (connections
  across sublayers or layers) have no stock layout: refused in one line, the recipe's ``export_refusal``.
"""

import argparse
import dataclasses
import os
import shutil
import sys
import tempfile
from collections import OrderedDict
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import torch
from fairseq.data import Dictionary, data_utils
from fairseq.modules import SinusoidalPositionalEmbedding
from fairseq.tasks.translation import TranslationConfig

from deepnmt_plugin import compat
from deepnmt_plugin.models.deepnorm import deepnorm_alpha
from deepnmt_plugin.models.lns import lns_scale
from deepnmt_plugin.models.method import METHODS

# Our archs are transformer_<method><size>; stock fairseq names the same sizes so.
STOCK_ARCHS = {
    "": "transformer", "_iwslt_de_en": "transformer_iwslt_de_en", "_big": "transformer_vaswani_wmt_en_de_big",
}
# fairseq's Dictionary puts <pad> at index 1; position numbering and the sinusoid's zero row follow it.
PAD = Dictionary().pad()
StateDict = Dict[str, torch.Tensor]


class ExportError(SystemExit):
    """The checkpoint cannot be exported: one line, exit status 1, nothing written."""

    def __init__(self, message: str):
        super().__init__(f"deepnmt: error: {message}")


def stock_layout_refusal(method: str) -> str:
    """Why ``method``'s models have no stock fairseq layout ("" when they have one)."""
    if method not in METHODS:
        return f"no stock fairseq layout for deep method {method!r}"
    return METHODS[method].export_refusal and f"transformer_{method}: {METHODS[method].export_refusal}"


def sublayers(side: str, layers: int) -> List[Tuple[str, str, List[str]]]:
    """A stack's residual sublayers in forward order: (residual module, its LayerNorm, the projections
    reading the sublayer's input)."""
    attention_inputs = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"]
    order = [("self_attn_residual", "self_attn_layer_norm", attention_inputs)]
    if side == "decoder":
        order.append(("encoder_attn_residual", "encoder_attn_layer_norm", ["encoder_attn.q_proj"]))
    order.append(("ffn_residual", "final_layer_norm", ["fc1"]))
    return [
        (f"{side}.layers.{i}.{residual}", f"{side}.layers.{i}.{norm}", [f"{side}.layers.{i}.{p}" for p in projections])
        for i in range(layers) for residual, norm, projections in order
    ]


def trained_layers(cfg: dict) -> Tuple[int, int]:
    """(encoder, decoder) depth the recipe's constants were computed for (``recipe_layers(cfg)``, for a config dict)."""
    encoder_layers, decoder_layers = cfg.get("recipe_layers") or (cfg["encoder_layers"], cfg["decoder_layers"])
    return int(encoder_layers), int(decoder_layers)


def fold_deepnorm(model: StateDict, cfg: dict) -> StateDict:
    """LN(alpha*x + f(x)) = LN(x + f(x)/alpha): divide the branch's last projection by alpha."""
    model = OrderedDict(model)
    for side in ("encoder", "decoder"):
        alpha = deepnorm_alpha(side, *trained_layers(cfg))
        for i in range(cfg[f"{side}_layers"]):
            for last in ("self_attn.out_proj", "encoder_attn.out_proj", "fc2"):
                for name in (f"{side}.layers.{i}.{last}.weight", f"{side}.layers.{i}.{last}.bias"):
                    if name in model:  # the decoder's encoder_attn only
                        model[name] = model[name] / alpha
    return model


def fold_lns(model: StateDict, cfg: dict) -> StateDict:
    """LN(x) / sqrt(l) is the LayerNorm whose weight and bias are divided by sqrt(l): fold the scale into them."""
    model = OrderedDict(model)
    for side in ("encoder", "decoder"):
        for i in range(cfg[f"{side}_layers"]):
            for norm in ("self_attn_layer_norm", "encoder_attn_layer_norm", "final_layer_norm"):
                for name in (f"{side}.layers.{i}.{norm}.weight", f"{side}.layers.{i}.{norm}.bias"):
                    if name in model:  # the decoder's encoder_attn only
                        model[name] = model[name] * lns_scale(i + 1)
    return model


def fold_admin(model: StateDict, cfg: dict) -> Tuple[StateDict, dict]:
    """Move every omega into the producer of its sublayer's input (module docstring); returns the new
    state dict and the model flags that change."""
    model, flags = OrderedDict(model), {}
    between = [k for k in model if k.startswith(("decoder.project_in_dim", "decoder.project_out", "decoder.adaptive"))]
    if between:  # a layer between the embedding tables and the first sublayer or the logits
        raise ExportError(f"cannot export Admin with {between[0]}: omega_1 is folded through the embedding tables")
    if cfg.get("cross_self_attention"):  # the decoder's keys and values read the encoder output, which has no omega
        raise ExportError("cannot export Admin with --cross-self-attention: its self-attention reads the encoder "
                          "output and the decoder input through the same projections, and only the latter carries "
                          "omega")
    for side in ("encoder", "decoder"):
        producer = None  # the LayerNorm whose output the next sublayer reads; None: the embeddings
        for residual, layer_norm, projections in sublayers(side, cfg[f"{side}_layers"]):
            omega = model.pop(f"{residual}.omega")
            if (omega == 0).any():
                raise ExportError(f"{residual}.omega has a zero entry; it cannot be divided out of its branch")
            if producer is None:
                fold_into_embeddings(model, cfg, flags, side, omega)
            else:
                for name in (f"{producer}.weight", f"{producer}.bias"):
                    model[name] = model[name] * omega
            for projection in projections:  # W (out x in) / omega: input column j divided by omega_j
                model[f"{projection}.weight"] = model[f"{projection}.weight"] / omega
            producer = layer_norm
    model.pop("admin_initialized")
    return model, flags


def fold_into_embeddings(model: StateDict, cfg: dict, flags: dict, side: str, omega: torch.Tensor) -> None:
    """omega_1 * x_0, x_0 = s * E[token] + P[position] (or LN_emb of it): see the module docstring."""
    if f"{side}.layernorm_embedding.weight" in model:
        for name in (f"{side}.layernorm_embedding.weight", f"{side}.layernorm_embedding.bias"):
            model[name] = model[name] * omega
        return
    tokens = f"{side}.embed_tokens.weight"
    original = model[tokens]
    model[tokens] = original * omega
    if cfg["share_all_embeddings"]:
        flags["share_all_embeddings"] = False  # encoder and decoder tables now differ
    if side == "decoder" and cfg["share_decoder_input_output_embed"]:
        model["decoder.output_projection.weight"] = model[tokens]
        last = sublayers("decoder", cfg["decoder_layers"])[-1][1]
        for name in (f"{last}.weight", f"{last}.bias"):
            model[name] = model[name] / omega
    if cfg["no_token_positional_embeddings"]:
        return
    positions = f"{side}.embed_positions.weight"
    if positions not in model:  # sinusoidal: the same rows as a learned table
        rows = cfg[f"max_{'source' if side == 'encoder' else 'target'}_positions"] + PAD + 1
        sinusoid = SinusoidalPositionalEmbedding.get_embedding(rows, original.size(1), PAD)
        model[positions] = sinusoid.to(original.dtype)
        flags[f"{side}_learned_pos"] = True
    model[positions] = model[positions] * omega


def plain(value, where: str):
    """``value`` with argparse.Namespace as dicts, checked to hold nothing torch's weights-only loading refuses."""
    if isinstance(value, argparse.Namespace):
        value = vars(value)
    if isinstance(value, dict):
        return type(value)((key, plain(item, f"{where}[{key!r}]")) for key, item in value.items())
    if isinstance(value, (list, tuple)):
        return type(value)(plain(item, f"{where}[{i}]") for i, item in enumerate(value))
    if value is None or isinstance(value, (str, bool, torch.Tensor)):
        return value
    if isinstance(value, float):  # numpy.float64 is a float, but pickles as a numpy global
        return float(value)
    if type(value) is int:
        return value
    raise ExportError(f"cannot export {where}: {type(value).__name__} is not a plain value")


def stock_config(cfg: dict, model_flags: dict) -> dict:
    """The training config, with the model as a stock transformer and the task as fairseq's translation."""
    cfg = plain(cfg, "cfg")
    model = dict(cfg["model"], **model_flags)
    method = model.pop("deep_method")
    model.pop("recipe_layers", None)  # folded into the weights; stock fairseq has no such flag
    size = model["arch"][len(f"transformer_{method}"):]
    model["arch"] = model["_name"] = STOCK_ARCHS[size]
    translation_fields = {f.name for f in dataclasses.fields(TranslationConfig)}
    task = {k: v for k, v in cfg["task"].items() if k in translation_fields or k == "_name"}
    task["_name"] = "translation"
    common = dict(cfg["common"], user_dir=None)
    return dict(cfg, model=model, task=task, common=common)


def export(state: dict, path: str = "checkpoint") -> dict:
    """A stock fairseq checkpoint computing what ``state``'s model computes (no optimizer state: for inference)."""
    if state.get("cfg") is None:
        raise ExportError(f"{path} has no 'cfg': not a fairseq >= 0.10 checkpoint")
    model_cfg = plain(state["cfg"]["model"], "cfg['model']")
    method = model_cfg.get("deep_method")
    if method is None:
        raise ExportError(
            f"{path} is not a deepnmt checkpoint (arch {model_cfg.get('arch')}); it loads without the plugin already"
        )
    refusal = stock_layout_refusal(method)
    if refusal:
        raise ExportError(f"cannot export {path}: {refusal}; serve it with --user-dir")
    model, flags = state["model"], {}
    if method == "deepnorm":
        model = fold_deepnorm(model, model_cfg)
    elif method == "lns":
        model = fold_lns(model, model_cfg)
    elif method == "admin":
        model, flags = fold_admin(model, model_cfg)
    return {
        "args": None,
        "cfg": stock_config(state["cfg"], flags),
        "model": model,
        "optimizer_history": plain(state["optimizer_history"], "optimizer_history"),
        "extra_state": {"train_iterator": plain(state["extra_state"]["train_iterator"], "train_iterator")},
    }


def export_checkpoint(source: str, target: str) -> None:
    """Read ``source``, write its stock export to ``target`` (atomically: a failure leaves no file)."""
    if os.path.exists(source) and os.path.exists(target) and os.path.samefile(source, target):
        raise ExportError(f"refusing to overwrite the checkpoint being exported ({source})")
    if os.path.isdir(target):
        raise ExportError(f"cannot write {target}: it is a directory; name the checkpoint file to write")
    check_parent(target)
    compat.save_atomically(export(compat.read_checkpoint(source), source), target)


def check_parent(target: str) -> None:
    """Refuse an output whose directory does not exist (a mistyped path), for either format."""
    directory = os.path.dirname(target) or "."
    if not os.path.isdir(directory):
        raise ExportError(f"cannot write {target}: directory {directory} does not exist")


def model_flag(model_cfg, name: str):
    """A flag of a checkpoint's ``cfg['model']``: a dict, or fairseq's argparse.Namespace (None when absent)."""
    return model_cfg.get(name) if isinstance(model_cfg, dict) else getattr(model_cfg, name, None)


def stock_checkpoint(state: dict, path: str) -> dict:
    """``state`` as a stock fairseq transformer checkpoint for CTranslate2: exported in memory when it is a deepnmt one."""
    model_cfg = (state.get("cfg") or {}).get("model")
    method = model_flag(model_cfg, "deep_method")
    refusal = method and stock_layout_refusal(method)
    if refusal:
        raise ExportError(f"cannot convert {path} to CTranslate2: {refusal}; serve it with fairseq --user-dir")
    if model_flag(model_cfg, "cross_self_attention"):  # ctranslate2's converter ignores the flag and converts
        raise ExportError(f"cannot convert {path} to CTranslate2: it was trained with --cross-self-attention, whose "
                          "decoder self-attention reads the source and the target, and CTranslate2's reads the target "
                          "only; serve it with fairseq")
    for flag, reason in CTRANSLATE2_UNSUPPORTED.items():
        value = model_flag(model_cfg, flag)
        if value and not (flag == "decoder_output_dim" and value == model_flag(model_cfg, "decoder_embed_dim")):
            raise ExportError(f"cannot convert {path} to CTranslate2: it was trained with --{flag.replace('_', '-')}, "
                              f"{reason}; serve it with fairseq")
    return state if model_cfg is not None and method is None else export(state, path)


CTRANSLATE2_UNSUPPORTED = {  # model flags whose model CTranslate2's transformer does not compute: flag -> why
    "no_cross_attention": "and every CTranslate2 decoder layer attends to the encoder",
    "decoder_output_dim": "a projection of the decoder output to another width, which CTranslate2 does not have",
    "adaptive_softmax_cutoff": "an adaptive softmax output, which CTranslate2 does not compute",
}


def export_ctranslate2(checkpoint: str, output_dir: str, quantization: Optional[str] = None,
                       data: Optional[str] = None):
    """Write ``checkpoint`` (deepnmt or stock fairseq) as a self-contained CTranslate2 model directory.

    Parameters
    ----------
    checkpoint : a fairseq-train checkpoint of a deep arch with a stock layout, or a stock transformer (exported).
    output_dir : the model directory, in an existing folder; it must be new, empty, or an earlier export holding
        only the files an export writes (replaced whole: a crash at any point leaves the earlier export or the new one).
    quantization : None (float32 weights), ``int8``, ``int8_float32`` or ``float16``.
    data : the fairseq-preprocess folder with the dictionaries, and its binarized data unless the checkpoint records
        the languages; default: the checkpoint's own data path.

    Returns
    -------
    The raw-text steps written to ``text_processing.json`` (:class:`deepnmt_plugin.serving.TextProcessing`).
    """
    from deepnmt_plugin import serving  # ctranslate2 only when asked

    check_parent(os.path.normpath(output_dir))
    output = Path(os.path.abspath(output_dir))  # absolute: it is renamed, and "." has no name
    if output.exists():
        if not (output.is_dir() and (not any(output.iterdir()) or (output / serving.TEXT_PROCESSING).exists())):
            raise ExportError(f"{output_dir} exists and is not an earlier CTranslate2 export: choose a new or empty "
                              "OUT_DIR")
        others = sorted(path.name for path in output.iterdir()
                        if path.name not in serving.EXPORT_FILES or path.is_dir())
        if others:
            raise ExportError(f"{output_dir} holds files an export does not write ({', '.join(others[:5])}"
                              f"{', ...' if len(others) > 5 else ''}), which replacing it would delete: move them out "
                              "or choose a new OUT_DIR")
    state = stock_checkpoint(compat.read_checkpoint(checkpoint), checkpoint)
    data_dir = Path(data or str(state["cfg"]["task"]["data"]).split(os.pathsep)[0])
    where = "given with --data" if data else "the checkpoint's data path"
    languages = dictionary_languages(state, checkpoint, data_dir, where)
    # a folder of this call's own beside OUT (a name like OUT.partial may be the user's)
    partial = Path(tempfile.mkdtemp(prefix=f".{output.name}.partial-", dir=output.parent))
    umask = os.umask(0)
    os.umask(umask)
    partial.chmod(0o777 & ~umask)  # mkdtemp's 0700 would become the model folder's
    try:
        steps = serving.convert(state, data_dir, languages, partial, quantization)
    except ValueError as unsupported:  # ctranslate2's ConfigurationChecker lists its reasons on several lines
        shutil.rmtree(partial, ignore_errors=True)
        raise ExportError(f"cannot convert {checkpoint} to CTranslate2: {' '.join(str(unsupported).split())}")
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)  # a failure leaves no half-written directory
        raise
    replace_directory(partial, output)
    return steps


def dictionary_languages(state: dict, checkpoint: str, data_dir: Path, where: str) -> Tuple[str, str]:
    """(source, target) language of ``state``'s model, whose dictionaries ``data_dir`` must hold, with as many entries
    as its embedding tables have rows."""
    if not any(data_dir.glob("dict.*.txt")):
        raise ExportError(f"no dictionaries (dict.*.txt) in {data_dir}, {where}: name their folder with --data DIR")
    task = state["cfg"]["task"]
    languages = task.get("source_lang"), task.get("target_lang")
    if None in languages:  # fairseq-train finds them in the names of the binarized files and records them nowhere
        languages = data_utils.infer_language_pair(str(data_dir))
    if None in languages:
        raise ExportError(f"cannot tell the translation direction: {data_dir}, {where}, holds no binarized data (such "
                          f"as train.de-en.de.idx) and {checkpoint} records no --source-lang/--target-lang; name the "
                          "fairseq-preprocess output folder with --data DIR")
    for side, language in zip(("encoder", "decoder"), languages):
        path = data_dir / f"dict.{language}.txt"
        if not path.is_file():
            raise ExportError(f"no dictionary dict.{language}.txt in {data_dir}, {where}: name the folder of the "
                              "model's dictionaries with --data DIR")
        entries, rows = len(Dictionary.load(str(path))), len(state["model"][f"{side}.embed_tokens.weight"])
        if entries != rows:
            raise ExportError(f"{path} has {entries} entries but {checkpoint}'s {side} embeddings have {rows} rows: "
                              "name the folder of the dictionaries the model was trained with in --data DIR")
    return tuple(languages)


def replace_directory(new: Path, output: Path) -> None:
    """Rename ``new`` to ``output``; an earlier ``output`` is moved aside first, into a folder of this call's own, and
    deleted last, so a crash at any point leaves one of the two whole (between the renames: the earlier one inside
    ``.OUT.replaced-*``, the new one under its name). Nothing else beside ``output`` is touched."""
    for path in [*new.iterdir(), new]:  # written through before the renames: a power loss leaves no empty file
        compat.fsync(path)
    aside = None
    if output.exists():
        aside = Path(tempfile.mkdtemp(prefix=f".{output.name}.replaced-", dir=output.parent))
        os.rename(output, aside / output.name)
    os.rename(new, output)
    compat.fsync(output.parent)
    if aside is not None:
        shutil.rmtree(aside, ignore_errors=True)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(
        prog="deepnmt-export",
        description="Export a transformer_{deepnorm,preln,admin} checkpoint as a stock fairseq transformer "
                    "checkpoint that loads and generates without --user-dir, or as a CTranslate2 model directory.",
    )
    parser.add_argument("input", help="a checkpoint written by fairseq-train --user-dir deepnmt_plugin "
                                      "(--format ctranslate2: or a stock transformer checkpoint, e.g. an export)")
    parser.add_argument("output", help="where to write the stock checkpoint, or the CTranslate2 model directory")
    parser.add_argument("--format", choices=("fairseq", "ctranslate2"), default="fairseq",
                        help="fairseq (default): a stock checkpoint; ctranslate2: model.bin, vocabularies, "
                             "config.json, the data-prep's subword model and text_processing.json, "
                             "for python -m deepnmt_plugin.translate")
    parser.add_argument("--quantization", choices=("int8", "int8_float32", "float16"),
                        help="ctranslate2 only: weight type (default: float32)")
    parser.add_argument("--data", help="ctranslate2 only: the fairseq-preprocess folder with the dictionaries, and "
                                       "its binarized data unless the checkpoint records --source-lang/--target-lang "
                                       "(default: the checkpoint's data path)")
    args = parser.parse_args(argv)
    if args.format == "fairseq":
        if args.quantization or args.data:
            parser.error("--quantization and --data go with --format ctranslate2")
        with compat.writing(args.output):
            export_checkpoint(args.input, args.output)
        print(f"exported {args.input} -> {args.output}: a stock fairseq transformer, no --user-dir needed",
              file=sys.stderr)
        return
    with compat.writing(args.output):
        steps = export_ctranslate2(args.input, args.output, args.quantization, args.data)
    raw_text = (f"raw text, pre-processed as the {steps.recipe} recipe did" if steps.recipe
                else "text pre-processed as for training (no data-prep recipe found beside the data)")
    print(f"exported {args.input} -> {args.output}: a CTranslate2 model ({args.quantization or 'float32'}); "
          f"python -m deepnmt_plugin.translate --model {args.output} takes {raw_text}", file=sys.stderr)


if __name__ == "__main__":
    main()
