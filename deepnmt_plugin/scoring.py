"""Score ``fairseq-generate`` output the three ways the deep-NMT papers report BLEU.

* tokenized BLEU: on the tokenized, BPE-removed text, as ``multi-bleu.perl`` / ``fairseq-score``;
* compound-split BLEU: the same after splitting hyphenated compounds as fairseq's
  ``scripts/compound_split_bleu.sh`` does (``s{(\\S)-(\\S)}{$1 ##AT##-##AT## $2}g``), the WMT En-De
  convention of Vaswani et al. and the DeepNet / T-Fixup tables;
* sacreBLEU: on detokenized hypotheses (sacremoses, target language) against detokenized references,
  or against a sacreBLEU test set (``--sacrebleu-test-set wmt14/full``), with its signature.

Beside BLEU it counts the distinct hypotheses and how many sentences got the most frequent one: a model that
writes one sentence for every input (a target-side language model that ignores the source) shows as 1 distinct.

``python -m deepnmt_plugin.scoring GENERATE_OUTPUT --target-lang de [--data-bin DIR] [--sacrebleu-test-set ...]``
prints the scores and writes them as JSON with ``--json``. Output that misses a sentence is refused, not
scored: every sentence id from 0 on must have its hypothesis and reference, and with ``--data-bin`` every
sentence of the test set (fairseq-generate leaves sentences out silently, e.g. a last batch that is not a
multiple of ``--required-batch-size-multiple``). So is output holding a sentence twice (a second run appended).
"""

import argparse
import json
import os
import re
import sys
from collections import Counter
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import sacrebleu
from sacremoses import MosesDetokenizer

from deepnmt_plugin.compat import atomic_write

COMPOUND_HYPHEN = re.compile(r"(\S)-(\S)")


def compound_split(line: str) -> str:
    """``perl -ple 's{(\\S)-(\\S)}{$1 ##AT##-##AT## $2}g'``: non-overlapping, left to right."""
    return COMPOUND_HYPHEN.sub(r"\1 ##AT##-##AT## \2", line)


class ScoringError(SystemExit):
    """The output cannot be scored as it is: one line naming the file, exit status 1."""

    def __init__(self, message: str):
        super().__init__(f"deepnmt: error: {message}")


def read_generate_output(path: str, sentences: Optional[int] = None) -> Tuple[List[str], List[str]]:
    """(hypotheses, references) in sentence-id order from fairseq-generate's ``H-``/``T-`` lines; refused
    unless they cover ids 0 .. ``sentences`` - 1 (or, not given, every id up to the highest), each once."""
    hypotheses: Dict[int, str] = {}
    references: Dict[int, str] = {}
    try:
        with open(path, "rb") as handle:
            content = handle.read()
    except OSError as error:
        raise ScoringError(f"cannot read {path}: {error.strerror}")
    # Lines end at "\n" (or "\r\n") only: a text may hold a lone "\r", which bytes.splitlines would end a line at.
    for number, raw in enumerate(content.split(b"\n"), 1):
        try:
            line = raw.removesuffix(b"\r").decode("utf-8")
        except UnicodeDecodeError as error:
            raise ScoringError(f"{path}, line {number}: not UTF-8 (its byte {error.start + 1} is "
                               f"{raw[error.start]:#x})")
        kind, _, rest = line.partition("-")
        if kind not in ("H", "T"):
            continue
        texts, column = (hypotheses, 2) if kind == "H" else (references, 1)  # H-id, score, text; T-id, text
        fields = rest.split("\t", column)  # the text is all after the id (and score): it may hold tabs
        if not fields[0].isdecimal():
            raise ScoringError(f"{path}, line {number}: {kind}-{fields[0]} is not a fairseq-generate sentence id")
        if int(fields[0]) in texts:
            raise ScoringError(f"{path}, line {number}: a second {kind}-{fields[0]} (a second fairseq-generate run "
                               "appended, or --nbest above 1?); score each run's output on its own, with --nbest 1")
        texts[int(fields[0])] = fields[column] if len(fields) > column else ""
    if not hypotheses:
        raise ScoringError(f"{path} holds no fairseq-generate output (H-/T- lines)")
    unmatched = sorted(hypotheses.keys() ^ references.keys())
    if unmatched:
        raise ScoringError(f"{path} is incomplete: sentences {id_list(unmatched)} lack a hypothesis or a reference")
    expected = sentences if sentences is not None else max(hypotheses) + 1
    extra = sorted(i for i in hypotheses if i >= expected)
    if extra:
        raise ScoringError(f"{path} holds sentences {id_list(extra)}, beyond the {expected} of the test set")
    if len(hypotheses) < expected:  # the ids are below expected and distinct: some are missing (named without
        # building the whole id range, which one stray huge id would make too large for memory)
        missing = first_missing(sorted(hypotheses), expected)
        raise ScoringError(f"{path} holds {len(hypotheses)} of the {expected} test sentences (missing "
                           f"{id_list(missing, total=expected - len(hypotheses))}): refusing a partial BLEU (fairseq-generate without the plugin "
                           "leaves out a last batch whose size is not a multiple of --required-batch-size-multiple: "
                           "pass 1, or --user-dir deepnmt_plugin)")
    return [hypotheses[i] for i in range(expected)], [references[i] for i in range(expected)]


def first_missing(ids: List[int], expected: int, count: int = 5) -> List[int]:
    """The first ``count`` numbers of 0 .. expected - 1 that the sorted, distinct ``ids`` lack."""
    missing, next_id = [], 0
    for i in [*ids, expected]:
        missing += range(next_id, min(i, next_id + count - len(missing)))
        if len(missing) >= count:
            break
        next_id = i + 1
    return missing[:count]


def id_list(ids: List[int], shown: int = 5, total: Optional[int] = None) -> str:
    """The first ``shown`` ids, and how many more of ``total`` (default: of ``ids``)."""
    total = len(ids) if total is None else total
    return ", ".join(map(str, ids[:shown])) + (f" and {total - shown} more" if total > shown else "")


def source_language(data_bin: str, subset: str, target_lang: str) -> str:
    """The language ``data_bin``'s ``subset`` translates into ``target_lang``, as fairseq-preprocess named its files
    (``test.de-en.en.idx``)."""
    pairs = [path.name.split(".")[1].split("-") for path in Path(data_bin).glob(f"{subset}.*-*.{target_lang}.idx")]
    sources = sorted({source for pair in pairs for source in pair if target_lang in pair and source != target_lang})
    if not sources:
        raise ScoringError(f"--data-bin {data_bin} holds no {subset} set for --target-lang {target_lang}")
    if len(sources) > 1:
        raise ScoringError(f"--data-bin {data_bin} holds {subset} sets from {' and '.join(sources)} into "
                           f"{target_lang}: name --source-lang")
    return sources[0]


def subset_size(data_bin: str, subset: str, source_lang: str, target_lang: str) -> int:
    """How many sentences fairseq-generate reads from ``data_bin``'s ``subset`` (its binarized target side)."""
    from fairseq.data import indexed_dataset

    for pair in (f"{source_lang}-{target_lang}", f"{target_lang}-{source_lang}"):
        prefix = os.path.join(data_bin, f"{subset}.{pair}.{target_lang}")
        if indexed_dataset.dataset_exists(prefix, impl="mmap"):  # PREFIX.idx and .bin, as fairseq-preprocess writes
            return len(indexed_dataset.make_dataset(prefix, impl=indexed_dataset.infer_dataset_impl(prefix)))
    raise ScoringError(f"--data-bin {data_bin} holds no {subset} set for {source_lang}-{target_lang}")


def tokenized_bleu(hypotheses: List[str], references: List[str]) -> float:
    return sacrebleu.corpus_bleu(hypotheses, [references], tokenize="none", force=True).score


def score(
    hypotheses: List[str],
    references: List[str],
    target_lang: str,
    sacrebleu_references: Optional[List[str]] = None,
) -> Dict[str, object]:
    detokenizer = MosesDetokenizer(lang=target_lang)
    detokenized = [detokenizer.detokenize(h.split()) for h in hypotheses]
    if sacrebleu_references is None:
        sacrebleu_references = [detokenizer.detokenize(r.split()) for r in references]
    metric = sacrebleu.metrics.BLEU()
    sacre = metric.corpus_score(detokenized, [sacrebleu_references])
    hypothesis_counts = Counter(hypotheses)
    return {
        "bleu_tokenized": round(tokenized_bleu(hypotheses, references), 2),
        "bleu_compound_split": round(
            tokenized_bleu([compound_split(h) for h in hypotheses], [compound_split(r) for r in references]), 2
        ),
        "sacrebleu": round(sacre.score, 2),
        "sacrebleu_signature": str(metric.get_signature()),
        "sentences": len(hypotheses),
        "distinct_hypotheses": len(hypothesis_counts),
        "most_frequent_hypothesis_count": hypothesis_counts.most_common(1)[0][1],
    }


def sacrebleu_test_set_references(test_set: str, source_lang: str, target_lang: str) -> List[str]:
    """The raw references of a sacreBLEU test set (data-prep fills its cache for offline use)."""
    from sacrebleu.dataset import DATASETS
    from sacrebleu.utils import get_reference_files

    if test_set not in DATASETS:
        raise ScoringError(f"--sacrebleu-test-set {test_set}: sacreBLEU knows no such test set (e.g. wmt14/full, "
                           "wmt17; sacrebleu --list names them)")
    pairs = DATASETS[test_set].langpairs
    if f"{source_lang}-{target_lang}" not in pairs:
        raise ScoringError(f"--sacrebleu-test-set {test_set} has no {source_lang}-{target_lang} references")
    (path,) = get_reference_files(test_set, f"{source_lang}-{target_lang}")
    with open(path, encoding="utf-8") as lines:
        return [line.rstrip("\n") for line in lines]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser("python -m deepnmt_plugin.scoring", description=__doc__.split("\n\n")[0])
    parser.add_argument("generate_output", help="file holding fairseq-generate's output (run with --remove-bpe)")
    parser.add_argument("--source-lang", help="with --data-bin: found in its file names unless given")
    parser.add_argument("--target-lang", required=True)
    parser.add_argument("--data-bin", help="the data fairseq-generate read: refuse unless it translated every "
                                           "sentence of --gen-subset")
    parser.add_argument("--gen-subset", default="test", help="with --data-bin: the subset generated (default: test)")
    parser.add_argument("--sacrebleu-test-set", help="score detokenized output against this sacreBLEU test set")
    parser.add_argument("--json", help="also write the scores here")
    args = parser.parse_args(argv)
    if args.json and not os.path.isdir(os.path.dirname(args.json) or "."):
        raise ScoringError(f"cannot write --json {args.json}: directory {os.path.dirname(args.json)} does not exist")
    if args.json and os.path.isdir(args.json):
        raise ScoringError(f"cannot write --json {args.json}: it is a directory; name a file")
    source_lang, sentences = args.source_lang, None
    if args.data_bin:
        source_lang = source_lang or source_language(args.data_bin, args.gen_subset, args.target_lang)
        sentences = subset_size(args.data_bin, args.gen_subset, source_lang, args.target_lang)
    if args.sacrebleu_test_set and not source_lang:
        raise ScoringError("--sacrebleu-test-set needs the language pair: give --source-lang, or --data-bin")
    hypotheses, references = read_generate_output(args.generate_output, sentences)
    raw = None
    if args.sacrebleu_test_set:
        raw = sacrebleu_test_set_references(args.sacrebleu_test_set, source_lang, args.target_lang)
        if len(raw) != len(hypotheses):
            raise ScoringError(f"{args.sacrebleu_test_set} has {len(raw)} references, "
                               f"{args.generate_output} has {len(hypotheses)} hypotheses")
    scores = score(hypotheses, references, args.target_lang, raw)
    if args.json:  # its existence marks the step done (reproduce.py): never half-written
        with atomic_write(args.json) as partial, open(partial, "w") as handle:
            json.dump(scores, handle, indent=1)
    for key, value in scores.items():
        print(f"{key}\t{value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
