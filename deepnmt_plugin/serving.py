"""Serve a trained model with CTranslate2: conversion, fairseq-generate's beam search, the raw-text steps.

``python -m deepnmt_plugin.export CKPT OUT_DIR --format ctranslate2`` (:func:`deepnmt_plugin.export.export_ctranslate2`)
exports a deepnmt checkpoint to a stock fairseq transformer in memory (folding DeepNorm's alpha and Admin's omega into
the weights; CTranslate2's Transformer is Pre-LN or Post-LN with no residual scale) and hands it to :func:`convert`,
ctranslate2's fairseq converter.

The model directory is self-contained: CTranslate2's ``model.bin``, ``config.json`` and vocabularies, the data-prep's
subword model, and ``text_processing.json`` saying which raw-text steps the data-prep applied, so that
``python -m deepnmt_plugin.translate --model OUT_DIR`` takes raw text (:class:`TextProcessing`).
"""

import argparse
import dataclasses
import functools
import json
import re
import shutil
from pathlib import Path
from typing import List, Optional, Sequence

import torch
from ctranslate2.converters import FairseqConverter
from ctranslate2.converters.fairseq import _get_model_spec, _get_vocab, set_transformer_decoder, set_transformer_encoder
from fairseq import models, tasks
from fairseq.models.transformer import DEFAULT_MAX_SOURCE_POSITIONS, DEFAULT_MAX_TARGET_POSITIONS
from sacremoses import MosesDetokenizer

from deepnmt_plugin.data import moses
from deepnmt_plugin.data.subwords import MODEL_NAMES as SUBWORD_MODEL_NAMES

TEXT_PROCESSING = "text_processing.json"
# Every file an export writes: CTranslate2's model, config and vocabularies (one shared, or source and target), the
# data-prep's subword model and the raw-text steps. A directory holding others is not replaced (they would be lost).
EXPORT_FILES = {"model.bin", "config.json", "shared_vocabulary.json", "source_vocabulary.json",
                "target_vocabulary.json", *SUBWORD_MODEL_NAMES.values(), TEXT_PROCESSING}
README_RECIPE = re.compile(r"built by deepnmt's data-prep \(([^)]+)\)\.")


@dataclasses.dataclass
class TextProcessing:
    """What a raw source line goes through before the model, and a hypothesis after it.

    Source: [normalize-punctuation, remove-non-printing-char], [Moses tokenizer [-a]], [lowercase], subword
    segmentation; target: subword joining, Moses detokenizer. Each flag is what the data-prep recipe did; the
    position limits are the model's.
    """

    source_lang: str
    target_lang: str
    recipe: Optional[str]  # the data-prep recipe; None: unknown, the input must come pre-processed
    normalize_punctuation: bool = False  # normalize-punctuation.perl and remove-non-printing-char.perl
    moses_tokenizer: bool = False
    aggressive_dash_splits: bool = False  # tokenizer.perl -a
    lowercase: bool = False
    subword: Optional[str] = None  # "subword-nmt" or "sentencepiece"
    subword_model: Optional[str] = None  # its file name inside the model directory
    # the encoder's and decoder's positions (--max-*-positions, </s> included): the longest source translated whole,
    # the longest hypothesis; an export written before they were recorded has fairseq's defaults
    max_source_positions: int = DEFAULT_MAX_SOURCE_POSITIONS
    max_target_positions: int = DEFAULT_MAX_TARGET_POSITIONS

    def preprocess(self, line: str) -> str:
        """What the data-prep did to a source line before its subword model."""
        if self.normalize_punctuation:
            line = moses.remove_non_printing_chars(moses.normalize_punctuation(line, self.source_lang))
        if self.moses_tokenizer:
            line = moses.tokenize(line, self.source_lang, aggressive_dash_splits=self.aggressive_dash_splits)
        return moses.lowercase(line) if self.lowercase else line

    def postprocess(self, tokens: Sequence[str]) -> str:
        """A hypothesis as text: subwords joined (fairseq's ``--remove-bpe``), then detokenized."""
        text = " ".join(tokens)
        if self.subword == "subword-nmt":
            text = (text + " ").replace("@@ ", "").rstrip()
        elif self.subword == "sentencepiece":
            text = text.replace(" ", "").replace("\u2581", " ").strip()
        return _detokenizer(self.target_lang).detokenize(text.split()) if self.moses_tokenizer else text

    def save(self, directory: Path) -> None:
        (directory / TEXT_PROCESSING).write_text(json.dumps(dataclasses.asdict(self), indent=1) + "\n")

    @classmethod
    def load(cls, directory: Path) -> "TextProcessing":
        return cls(**json.loads((directory / TEXT_PROCESSING).read_text()))


@functools.lru_cache(maxsize=None)
def _detokenizer(lang: str) -> MosesDetokenizer:
    return MosesDetokenizer(lang=lang)


# The raw-text steps of each data-prep recipe on its training text (deepnmt_plugin/data/).
_IWSLT = dict(moses_tokenizer=True, lowercase=True)  # prepare-iwslt14.sh: tokenizer | lowercase
_WMT = dict(normalize_punctuation=True, moses_tokenizer=True, aggressive_dash_splits=True)  # prepare-wmt14en2*.sh
_SMALL_DE_EN = dict(normalize_punctuation=True, moses_tokenizer=True, lowercase=True)  # data.ding.preprocess
RECIPE_TEXT_STEPS = {
    "iwslt14": _IWSLT, "wmt14en2de": _WMT, "wmt17en2de": _WMT, "wmt14en2fr": _WMT,
    "ding-de-en": _SMALL_DE_EN, "l10n-de-en": _SMALL_DE_EN,
}


class InMemoryFairseqConverter(FairseqConverter):
    """ctranslate2's fairseq converter for a stock checkpoint already in memory.

    The upstream ``_load`` reads a file and needs ``cfg.model`` as an ``argparse.Namespace``; an exported checkpoint
    keeps it a dict so that it loads weights-only. The Namespace exists here only, and the task is stock ``translation``
    (training may have used ``translation_deep``, which stock fairseq does not register).
    """

    def __init__(self, checkpoint: dict, data_dir: str, languages: Sequence[str]):
        super().__init__(model_path="", data_dir=data_dir)
        self.checkpoint, self.languages = checkpoint, languages
        self.max_positions = None  # (source, target), known once loaded

    def _load(self):
        model_cfg = self.checkpoint["cfg"]["model"]
        args = argparse.Namespace(**(model_cfg if isinstance(model_cfg, dict) else vars(model_cfg)))
        args.data, args.task, args.user_dir = self._data_dir, "translation", None
        args.source_lang, args.target_lang = self.languages  # not inferred: a folder of dictionaries does not name them
        spec = _get_model_spec(args)
        task = tasks.setup_task(args)
        with torch.no_grad():
            model = models.build_model(args, task)
            model.load_state_dict(self.checkpoint["model"])
            model.eval()
            set_transformer_encoder(spec.encoder, model.encoder)
            set_transformer_decoder(spec.decoder, model.decoder)
        spec.register_source_vocabulary(_get_vocab(task.source_dictionary))
        spec.register_target_vocabulary(_get_vocab(task.target_dictionary))
        spec.config.decoder_start_token = spec.config.eos_token  # fairseq starts decoding from </s>
        spec.config.add_source_eos = True  # and ends every source with </s>
        spec.config.layer_norm_epsilon = model.encoder.layers[0].final_layer_norm.eps
        self.max_positions = model.max_positions()
        return spec


def data_prep_directory(data_dir: Path) -> Optional[Path]:
    """The data-prep output holding ``data_dir`` (``OUTPUT/data-bin``): the folder with the subword model."""
    for directory in (data_dir, data_dir.parent):
        if any((directory / name).is_file() for name in SUBWORD_MODEL_NAMES.values()):
            return directory
    return None


def data_prep_recipe(directory: Path) -> Optional[str]:
    """The recipe that built a data-prep output: its settings stamp, or the README's first line (tmp/ is deletable)."""
    settings, readme = directory / "tmp" / "settings.json", directory / "README"
    if settings.is_file():
        return json.loads(settings.read_text()).get("recipe")
    if readme.is_file():
        found = README_RECIPE.search(readme.read_text(encoding="utf-8").split("\n", 1)[0])
        return found.group(1) if found else None
    return None


def text_processing(data_dir: Path, languages: Sequence[str], model_dir: Path) -> TextProcessing:
    """Copy the data-prep's subword model beside ``data_dir`` into ``model_dir``; say what raw text goes through."""
    steps = TextProcessing(*languages, recipe=None)
    prep = data_prep_directory(data_dir)
    if prep is None:
        return steps
    recipe = data_prep_recipe(prep)
    if recipe in RECIPE_TEXT_STEPS:
        steps = TextProcessing(*languages, recipe=recipe, **RECIPE_TEXT_STEPS[recipe])
    steps.subword, steps.subword_model = next(
        (kind, name) for kind, name in SUBWORD_MODEL_NAMES.items() if (prep / name).is_file()
    )
    shutil.copyfile(prep / steps.subword_model, model_dir / steps.subword_model)
    return steps


def convert(state: dict, data_dir: Path, languages: Sequence[str], directory: Path,
            quantization: Optional[str]) -> TextProcessing:
    """CTranslate2's files for the stock checkpoint ``state`` translating ``languages`` (source, target), the subword
    model and ``text_processing.json``; ValueError (ctranslate2's, its reasons on several lines) when CTranslate2
    cannot represent the model."""
    converter = InMemoryFairseqConverter(state, str(data_dir), languages)
    converter.convert(str(directory), quantization=quantization, force=True)
    steps = text_processing(data_dir, languages, directory)
    steps.max_source_positions, steps.max_target_positions = converter.max_positions
    steps.save(directory)
    return steps


def fairseq_max_length(sources: Sequence[Sequence[str]], max_len_a: float, max_len_b: int,
                       max_target_positions: int) -> int:
    """fairseq-generate's limit for a batch: ``a * width + b`` target tokens before ``</s>``, where ``width`` is the
    longest source with its ``</s>`` (SequenceGenerator reads the padded width of the batch, not each sentence), and
    at most one less than the decoder's positions, as fairseq-generate caps it (CTranslate2 fails past its table)."""
    return min(int(max_len_a * (max(len(tokens) for tokens in sources) + 1) + max_len_b), max_target_positions - 1)


def translate_batches(
    translator, batches: List[List[List[str]]], beam: int, max_len_a: float, max_len_b: int,
    max_target_positions: int = DEFAULT_MAX_TARGET_POSITIONS,
) -> List[List[List[str]]]:
    """CTranslate2 beam search set up as fairseq-generate's (length-normalised scores, padding never generated) on
    every batch, queued at once so that each of the translator's workers (``inter_threads``) takes the next batch as
    soon as it is free; the best hypotheses come back in order. Sources go in whole (CTranslate2 cuts them after
    1,024 tokens by default): the caller keeps them within the model's source positions. ``max_target_positions``:
    the decoder's (default: fairseq's)."""
    pending = [
        translator.translate_batch(
            sources,
            beam_size=beam,
            max_decoding_length=fairseq_max_length(sources, max_len_a, max_len_b, max_target_positions),
            max_input_length=0,
            suppress_sequences=[["<blank>"]],  # fairseq's <pad>, renamed by the converter
            asynchronous=True,
        )
        for sources in batches
    ]
    return [[result.result().hypotheses[0] for result in batch] for batch in pending]
