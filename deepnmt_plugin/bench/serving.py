"""Serving speed and fidelity: fairseq-generate against CTranslate2 float32 and int8 on a test set,
``python -m deepnmt_plugin.bench.serving --checkpoint CKPT [--data DIR]``.

One process loads the original checkpoint as fairseq-generate does (the plugin, ``prepare_for_inference_``, the task's
``build_generator``) and converts it to CTranslate2 twice (``deepnmt-export --format ctranslate2``, float32 and int8).
All three translate the same batches: fairseq-generate's (``--max-tokens``/``--batch-size``, sorted by length), with the
same beam, the same length limit (``a * batch width + b``) and the same CPU threads: fairseq's as intra-op threads,
CTranslate2's as that many one-thread workers taking batches in turn (``inter_threads``, its throughput setting). What
is timed is the beam search alone, on sentences already binarized: ``task.inference_step`` on a collated batch for
fairseq, ``translate_batches`` on their tokens for CTranslate2; loading, start-up and text conversion are not. A first
pass of each engine is untimed (and gives the hypotheses compared and scored); then every round runs the three in turn,
rotating the order, so machine noise falls on all alike. Reported: sentences/s per engine (median and best round) and
the median of the per-round ratios to fairseq.

Where a hypothesis reaches the length limit, fairseq forces ``</s>`` and scores it while CTranslate2 stops without it,
so the two can rank such hypotheses differently; elsewhere they differ only by floating-point rounding.
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import List, Optional

import ctranslate2
import torch
from fairseq import checkpoint_utils, options, tasks, utils
from fairseq.data.data_utils import post_process
from fairseq.dataclass.utils import convert_namespace_to_omegaconf

from deepnmt_plugin import compat
from deepnmt_plugin.reproduce import USER_DIR
from deepnmt_plugin.scoring import score
from deepnmt_plugin.export import export_ctranslate2
from deepnmt_plugin.serving import translate_batches

ENGINES = ("fairseq", "ctranslate2 float32", "ctranslate2 int8")
# fairseq's --post-process names for the data-prep's subword models
SUBWORD_SYMBOLS = {"subword-nmt": "subword_nmt", "sentencepiece": "sentencepiece", None: None}


class FairseqEngine:
    """The original checkpoint, loaded and searched as fairseq-generate does."""

    def __init__(self, args, data: str):
        generation = options.get_generation_parser()
        cfg = convert_namespace_to_omegaconf(options.parse_args_and_arch(generation, [
            data, "--user-dir", USER_DIR, "--path", args.checkpoint, "--gen-subset", args.subset, "--cpu",
            "--beam", str(args.beam), "--max-len-a", str(args.max_len_a), "--max-len-b", str(args.max_len_b),
        ]))
        self.task = tasks.setup_task(cfg.task)
        self.models, saved_cfg = checkpoint_utils.load_model_ensemble([args.checkpoint], task=self.task)
        for model in self.models:
            model.prepare_for_inference_(cfg)
        self.task.load_dataset(args.subset, task_cfg=saved_cfg.task)
        self.dataset = self.task.dataset(args.subset)
        self.generator = self.task.build_generator(self.models, cfg.generation)

    def batches(self, sentences: int, max_tokens: int, batch_size: Optional[int]) -> List[dict]:
        """fairseq-generate's batches (length-sorted) of the first ``sentences`` sentences, collated."""
        indices = [i for i in self.dataset.ordered_indices() if i < sentences]
        groups = self.dataset.batch_by_size(indices, max_tokens=max_tokens, max_sentences=batch_size,
                                            required_batch_size_multiple=1)  # fairseq's 8 can drop sentences
        return [self.dataset.collater([self.dataset[i] for i in group]) for group in groups]

    def translate(self, batch: dict) -> List[List[int]]:
        return [best[0]["tokens"].tolist() for best in self.task.inference_step(self.generator, self.models, batch)]


def source_tokens(batch: dict, dictionary) -> List[List[str]]:
    """A collated batch's sources as token strings, without padding and ``</s>`` (CTranslate2 adds it)."""
    return [[dictionary[t] for t in row if t not in (dictionary.pad(), dictionary.eos())]
            for row in batch["net_input"]["src_tokens"].tolist()]


def measure(args) -> dict:
    """Convert, translate untimed once, then time ``args.rounds`` interleaved rounds; returns the results."""
    data = args.data or str(compat.read_checkpoint(args.checkpoint)["cfg"]["task"]["data"]).split(os.pathsep)[0]
    torch.set_num_threads(args.threads)
    fairseq_engine = FairseqEngine(args, data)
    target_dict = fairseq_engine.task.target_dictionary
    batches = fairseq_engine.batches(args.sentences or sys.maxsize, args.max_tokens, args.batch_size)
    sources = [source_tokens(batch, fairseq_engine.task.source_dictionary) for batch in batches]
    ids = [i for batch in batches for i in batch["id"].tolist()]

    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="bench_serving_"))
    parameters = fairseq_engine.models[0].parameters()  # not the file, which also holds the optimizer's state
    sizes, translators = {"fairseq": sum(p.numel() * p.element_size() for p in parameters)}, {}
    for engine, quantization in zip(ENGINES[1:], (None, "int8")):
        directory = workdir / engine.replace(" ", "_")
        steps = export_ctranslate2(args.checkpoint, str(directory), quantization, data)
        sizes[engine] = (directory / "model.bin").stat().st_size
        # the threads as parallel one-thread workers, each translating whole batches: CTranslate2's throughput
        # setting, faster than intra-op threads on small models (fairseq has only intra-op threads)
        translators[engine] = ctranslate2.Translator(str(directory), device="cpu", inter_threads=args.threads,
                                                     intra_threads=1)

    def translate_all(engine) -> list:
        """The engine's best hypothesis of every sentence, in ``ids`` order: what each round times."""
        if engine == "fairseq":
            return [tokens for batch in batches for tokens in fairseq_engine.translate(batch)]
        return [tokens for batch in translate_batches(translators[engine], sources, args.beam, args.max_len_a,
                                                      args.max_len_b) for tokens in batch]

    def as_text(engine, hypotheses: list) -> List[str]:
        return [target_dict.string(tokens) if engine == "fairseq" else " ".join(tokens) for tokens in hypotheses]

    texts = {engine: as_text(engine, translate_all(engine)) for engine in ENGINES}  # the warm-up pass
    seconds = {engine: [] for engine in ENGINES}
    for round_number in range(args.rounds):
        for engine in ENGINES[round_number % 3:] + ENGINES[:round_number % 3]:
            start = time.perf_counter()
            translate_all(engine)
            seconds[engine].append(time.perf_counter() - start)

    symbol = SUBWORD_SYMBOLS[steps.subword]
    targets = {i: utils.strip_pad(target, target_dict.pad())
               for batch in batches for i, target in zip(batch["id"].tolist(), batch["target"])}
    references = [target_dict.string(targets[i], symbol, escape_unk=True) for i in ids]
    results = {}
    for engine in ENGINES:
        bleu = score([post_process(text, symbol) for text in texts[engine]], references, steps.target_lang)
        results[engine] = {
            "identical_to_fairseq": sum(a == b for a, b in zip(texts[engine], texts["fairseq"])),
            "sacrebleu": bleu["sacrebleu"],
            "sentences_per_second_median": len(ids) / statistics.median(seconds[engine]),
            "sentences_per_second_best": len(ids) / min(seconds[engine]),
            "speed_ratio_median": statistics.median(f / s for f, s in zip(seconds["fairseq"], seconds[engine])),
            "model_bytes": sizes[engine],
        }
    return {"checkpoint": args.checkpoint, "sentences": len(ids), "rounds": args.rounds, "threads": args.threads,
            "beam": args.beam, "max_len": f"{args.max_len_a} * width + {args.max_len_b}",
            "sacrebleu_signature": bleu["sacrebleu_signature"], "engines": results}


def table(measured: dict) -> str:
    lines = [
        f"{measured['checkpoint']}: {measured['sentences']} sentences, beam {measured['beam']}, max length "
        f"{measured['max_len']}, {measured['threads']} threads, {measured['rounds']} interleaved rounds "
        "(beam search timed alone, on binarized input)",
        "",
        "| engine | identical to fairseq | sacreBLEU | sentences/s (median) | best round | speed-up (median) | model |",
        "|---|---|---|---|---|---|---|",
    ]
    for engine, result in measured["engines"].items():
        lines.append(
            f"| {engine} | {result['identical_to_fairseq']} / {measured['sentences']} | {result['sacrebleu']:.2f} | "
            f"{result['sentences_per_second_median']:.1f} | {result['sentences_per_second_best']:.1f} | "
            f"{result['speed_ratio_median']:.2f}x | {result['model_bytes'] / 1e6:.1f} MB |"
        )
    return "\n".join(lines + ["", f"sacreBLEU: {measured['sacrebleu_signature']}"])


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m deepnmt_plugin.bench.serving",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", required=True, help="a deepnmt (preln, deepnorm, admin) or stock checkpoint")
    parser.add_argument("--data", help="its fairseq-preprocess folder (default: the checkpoint's data path)")
    parser.add_argument("--subset", default="test")
    parser.add_argument("--sentences", type=int, help="only the first N sentences of the subset (default: all)")
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds after the untimed one (default: 5)")
    parser.add_argument("--threads", type=int, default=2, help="CPU threads of every engine (default: 2)")
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument("--max-len-a", type=float, default=1.2)
    parser.add_argument("--max-len-b", type=int, default=10)
    parser.add_argument("--max-tokens", type=int, default=12000, help="batching as fairseq-generate's (default: 12000)")
    parser.add_argument("--batch-size", type=int, help="at most this many sentences a batch")
    parser.add_argument("--workdir", help="where the CTranslate2 models go (default: a new temporary folder)")
    parser.add_argument("--json", help="also write the measurements here")
    args = parser.parse_args(argv)
    measured = measure(args)
    if args.json:
        Path(args.json).write_text(json.dumps(measured, indent=1) + "\n")
    print(table(measured))


if __name__ == "__main__":
    main()
