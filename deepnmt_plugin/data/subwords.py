"""Joint subword segmentation of both sides: subword-nmt BPE (the recipes' and papers' choice) or
SentencePiece BPE, learned on the pre-processed training text and applied to every split."""

import contextlib
import functools
import io
import itertools
from pathlib import Path
from typing import Iterable, Iterator, Sequence

from deepnmt_plugin.data.pipeline import count_lines, parallel_map, read_lines

# What learning writes under --output: fairseq's recipes call the subword-nmt codes "code";
# "sentencepiece.bpe.model" is the name fairseq's own SentencePiece recipes use.
MODEL_NAMES = {"subword-nmt": "code", "sentencepiece": "sentencepiece.bpe.model"}


def learn(kind: str, train_files: Sequence[Path], operations: int, model: Path, workers: int) -> str:
    """Learn on the training files concatenated (source first, as the recipes ``cat`` them)."""
    lines = itertools.chain.from_iterable(read_lines(path) for path in train_files)
    if kind == "subword-nmt":
        from subword_nmt.learn_bpe import learn_bpe

        # learn_bpe.py -s N, its other options at their defaults; its progress bar would break the
        # one-line-per-step output, and the merges it stopped at (if fewer) are counted below.
        with open(model, "w", encoding="utf-8") as codes, contextlib.redirect_stderr(io.StringIO()):
            learn_bpe(lines, codes, operations)
        return f"{count_lines(model) - 1} merge operations"
    import sentencepiece

    with open(model, "wb") as model_file:
        sentencepiece.SentencePieceTrainer.train(
            sentence_iterator=lines,
            model_writer=model_file,
            model_type="bpe",
            vocab_size=operations,
            character_coverage=1.0,
            num_threads=workers,
            minloglevel=2,
        )
    return f"vocabulary of {operations}"


def apply(kind: str, model: Path, lines: Iterable[str], workers: int) -> Iterator[str]:
    """Segment each line (apply_bpe.py -c code, or SentencePiece pieces joined by spaces)."""
    return parallel_map(functools.partial(_segment, kind, str(model)), lines, workers)


def _segment(kind: str, model: str, line: str) -> str:
    return _segmenter(kind, model)(line)


@functools.lru_cache(maxsize=None)  # one per process: the workers load the model once each
def _segmenter(kind: str, model: str):
    if kind == "subword-nmt":
        from subword_nmt.apply_bpe import BPE

        with open(model, encoding="utf-8") as codes:
            return BPE(codes).process_line
    import sentencepiece

    processor = sentencepiece.SentencePieceProcessor(model_file=model)
    return lambda line: " ".join(processor.encode(line, out_type=str))
