"""Translate raw text with a CTranslate2 model directory written by ``deepnmt-export --format ctranslate2``.

``python -m deepnmt_plugin.translate --model OUT_DIR < german.txt > english.txt``: one line in, one line out. Each
line goes through the data-prep's own steps (``text_processing.json``: Moses normalisation, tokenizer and lowercasing
as its recipe did, then its subword model), CTranslate2's beam search set up as fairseq-generate's, subword joining
and the Moses detokenizer of the target language. Input that cannot be translated as it is, a line that is not UTF-8
or longer than the model's source positions, stops the run in one line naming it (the lines of earlier buffers are
written already).
"""

import argparse
import itertools
import math
import sys
from pathlib import Path
from typing import BinaryIO, Iterable, Iterator, List

import ctranslate2

from deepnmt_plugin.data import subwords
from deepnmt_plugin.processes import silence_closed_stdout
from deepnmt_plugin.serving import TEXT_PROCESSING, TextProcessing, translate_batches


class TranslateError(SystemExit):
    """The input or a flag cannot be used: one line, exit status 1, nothing of its buffer written."""

    def __init__(self, message: str):
        super().__init__(f"deepnmt: error: {message}")


class RawTextTranslator:
    """A CTranslate2 model with the raw-text steps of the data it was trained on.

    Parameters
    ----------
    model_dir : a directory written by :func:`deepnmt_plugin.export.export_ctranslate2`.
    beam, max_len_a, max_len_b : fairseq-generate's ``--beam``, ``--max-len-a``, ``--max-len-b``.
    threads : CPU threads, as one-thread workers translating batches in parallel (CTranslate2's ``inter_threads``).
    batch_size : sentences per beam search; a batch holds sentences of similar length.
    device : ``cpu``, ``cuda`` or ``auto``.
    """

    def __init__(self, model_dir: str, beam: int = 4, max_len_a: float = 1.2, max_len_b: int = 10,
                 threads: int = 2, batch_size: int = 32, device: str = "cpu"):
        self.directory = Path(model_dir)
        try:
            self.steps = TextProcessing.load(self.directory)
        except (ValueError, TypeError) as error:  # not JSON, or not the fields an export writes
            raise TranslateError(f"{self.directory / TEXT_PROCESSING} is damaged ({' '.join(str(error).split())}): "
                                 "export the model again")
        if self.steps.subword is not None and not (self.directory / str(self.steps.subword_model)).is_file():
            raise TranslateError(f"{model_dir} lacks its subword model {self.steps.subword_model}: export the model "
                                 "again")
        try:
            self.translator = ctranslate2.Translator(str(self.directory), device=device, inter_threads=threads,
                                                     intra_threads=1)
        except (RuntimeError, ValueError) as error:  # no model.bin, no vocabulary, a damaged file
            raise TranslateError(f"CTranslate2 cannot load {model_dir}: {' '.join(str(error).split())}; export the "
                                 "model again")
        self.beam, self.max_len_a, self.max_len_b, self.batch_size = beam, max_len_a, max_len_b, batch_size

    def source_tokens(self, lines: Iterable[str]) -> List[List[str]]:
        """The model's input tokens of each raw line: pre-processed, then split by the subword model."""
        processed = (self.steps.preprocess(line) for line in lines)
        if self.steps.subword is not None:
            processed = subwords.apply(self.steps.subword, self.directory / self.steps.subword_model, processed, 1)
        return [line.split() for line in processed]

    def translate(self, lines: List[str], first_line: int = 1) -> List[str]:
        """One translation per line, in order; an empty line stays empty. A source longer than the model's positions
        is refused (CTranslate2 would cut it), naming its line: ``first_line`` is the number of ``lines[0]``."""
        sources = self.source_tokens(lines)
        longest = self.steps.max_source_positions - 1  # </s> takes a position
        for number, tokens in enumerate(sources, first_line):
            if len(tokens) > longest:
                raise TranslateError(f"input line {number} is {len(tokens)} subwords long; the model takes at most "
                                     f"{longest} ({longest + 1} source positions, one for </s>)")
        by_length = sorted((i for i, tokens in enumerate(sources) if tokens), key=lambda i: len(sources[i]))
        translations = [""] * len(lines)
        batches = [by_length[start:start + self.batch_size] for start in range(0, len(by_length), self.batch_size)]
        hypotheses = translate_batches(self.translator, [[sources[i] for i in batch] for batch in batches], self.beam,
                                       self.max_len_a, self.max_len_b, self.steps.max_target_positions)
        for batch, batch_hypotheses in zip(batches, hypotheses):
            for i, tokens in zip(batch, batch_hypotheses):
                translations[i] = self.steps.postprocess(tokens)
        return translations


def input_lines(stream: BinaryIO) -> Iterator[str]:
    """The lines of ``stream`` without their newline, decoded strictly: a byte that is not UTF-8 is refused with its
    line (text-mode stdin, by the locale, escapes it for the Moses steps to drop silently, or fails in a traceback)."""
    for number, line in enumerate(stream, 1):
        try:
            yield line.decode("utf-8").rstrip("\n")
        except UnicodeDecodeError as error:
            raise TranslateError(f"input line {number} is not UTF-8 (its byte {error.start + 1} is "
                                 f"{line[error.start]:#x}); convert the input first, e.g. iconv -f latin1 -t utf-8")


def chunks(lines: Iterable[str], size: int) -> Iterator[List[str]]:
    iterator = iter(lines)
    while chunk := list(itertools.islice(iterator, size)):
        yield chunk


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m deepnmt_plugin.translate", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="a directory written by deepnmt-export --format ctranslate2")
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument("--max-len-a", type=float, default=1.2, help="at most a * source length + b target tokens")
    parser.add_argument("--max-len-b", type=int, default=10)
    parser.add_argument("--threads", type=int, default=2, help="CPU threads (default: 2)")
    parser.add_argument("--batch-size", type=int, default=32, help="sentences per beam search (default: 32)")
    parser.add_argument("--buffer-size", type=int, default=1024,
                        help="lines read before translating; each is written once its buffer is done (default: 1024)")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda", "auto"))
    args = parser.parse_args(argv)
    for flag, value in (("--beam", args.beam), ("--threads", args.threads), ("--batch-size", args.batch_size),
                        ("--buffer-size", args.buffer_size)):
        if value < 1:  # CTranslate2 raises on a beam of 0, waits forever with no thread; no buffer reads nothing
            raise TranslateError(f"{flag} must be at least 1, got {value}")
    if not math.isfinite(args.max_len_a) or args.max_len_a < 0 or args.max_len_b < 0 \
            or int(2 * args.max_len_a + args.max_len_b) < 1:
        # a one-subword source is 2 tokens with its </s>; CTranslate2 raises on a limit of 0
        raise TranslateError(f"--max-len-a {args.max_len_a:g} --max-len-b {args.max_len_b}: the limit a * source "
                             "length + b must be at least 1 target token, with a and b finite and not negative")
    if args.device == "cuda" and ctranslate2.get_cuda_device_count() == 0:
        raise TranslateError("--device cuda: CTranslate2 finds no CUDA device; use --device cpu or auto")
    if not (Path(args.model) / TEXT_PROCESSING).is_file():
        raise TranslateError(f"{args.model} is not a model directory written by deepnmt-export --format ctranslate2 "
                             f"(no {TEXT_PROCESSING})")
    translator = RawTextTranslator(args.model, args.beam, args.max_len_a, args.max_len_b, args.threads,
                                   args.batch_size, args.device)
    try:
        for index, chunk in enumerate(chunks(input_lines(sys.stdin.buffer), args.buffer_size)):
            translations = translator.translate(chunk, first_line=index * args.buffer_size + 1)
            sys.stdout.write("".join(translation + "\n" for translation in translations))
            sys.stdout.flush()
    except BrokenPipeError:  # the reader went away (| head): nothing more to translate for
        silence_closed_stdout()
        raise TranslateError("stopped: the reader of the translations closed them (| head?)")


if __name__ == "__main__":
    main()
