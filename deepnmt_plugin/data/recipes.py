"""fairseq's translation data recipes, step by step, plus the shared BPE / binarize / README tail.

IWSLT'14 De-En follows ``examples/translation/prepare-iwslt14.sh``; WMT'17 En-De follows
``examples/translation/prepare-wmt14en2de.sh`` and WMT'14 En-De the same script with ``--icml17``;
WMT'14 En-Fr follows ``examples/translation/prepare-wmt14en2fr.sh``.
Intermediate files keep the scripts' names under ``OUTPUT/tmp`` (unpacked archives under ``tmp/orig``).
"""

import functools
import re
import subprocess
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

from deepnmt_plugin.data import moses, subwords
from deepnmt_plugin.data.archives import Archive, ensure_archives, unpack_members
from deepnmt_plugin.data.debian import SNAPSHOT_URL
from deepnmt_plugin.data.pipeline import (
    DataPrepError,
    Step,
    count_lines,
    done_summaries,
    open_for_writing,
    parallel_map,
    read_lines,
    read_pairs,
    source_fingerprints,
    write_lines,
    write_text_atomically,
)
from deepnmt_plugin.data.sacrebleu_cache import populate as populate_sacrebleu_cache

SPLITS = ("train", "valid", "test")


@dataclass
class Options:
    output: Path
    archives: Path
    bpe: str
    bpe_ops: int
    workers: int
    joined_dictionary: bool
    download: bool
    # l10n-de-en only: the manifest that pins its .debs and checksum (None: the recipe's own), where pinned
    # .debs are fetched by hash, and whether a corpus other than the pinned one may be built.
    manifest: Optional[Path] = None
    snapshot_url: str = SNAPSHOT_URL
    unpinned: bool = False

    @property
    def tmp(self) -> Path:
        return self.output / "tmp"

    @property
    def orig(self) -> Path:
        return self.tmp / "orig"


@dataclass
class Recipe:
    name: str
    title: str
    source_lang: str
    target_lang: str
    default_output: str
    default_bpe_ops: int
    ensure_sources: Callable[[Options], None]  # finds or downloads the inputs; raises before anything is done
    corpus_steps: Callable[[Options], List[Step]]  # every step up to the BPE'd text under --output
    about: str  # the README's description of source, licence and recipe
    sacrebleu_steps: Callable[[Options], List[Step]] = field(default=lambda options: [])
    binarized_steps: Callable[[Options], List[Step]] = field(default=lambda options: [])  # after data-bin/
    # The files the steps read (after ensure_sources): a change to one redoes them. Default: all of --archives.
    sources: Callable[[Options], List[Path]] = field(default=lambda options: archive_files(options.archives))
    # A line for the README, after its title: l10n-de-en says whether the corpus is the pinned one.
    readme_notice: Callable[[Options], str] = field(default=lambda options: "")

    @property
    def languages(self):
        return (self.source_lang, self.target_lang)

    def final_names(self, bpe: str) -> List[str]:
        texts = [f"{split}.{lang}" for split in SPLITS for lang in self.languages]
        return texts + [subwords.MODEL_NAMES[bpe], "data-bin", "README"]

    def steps(self, options: Options) -> List[Step]:
        steps = self.corpus_steps(options)
        steps.append(binarize_step(options, *self.languages))
        steps += self.binarized_steps(options)
        steps += self.sacrebleu_steps(options)
        steps.append(readme_step(options, self, list(steps)))
        inputs = {"sources": source_fingerprints(self.sources(options)), "settings": self.settings(options)}
        for step in steps:
            if step.inputs is None:
                step.inputs = inputs
        return steps

    def settings(self, options: Options) -> dict:
        """The flags that shape the output (not --workers, --archives or --output)."""
        return dict(recipe=self.name, bpe=options.bpe, bpe_ops=options.bpe_ops,
                    joined_dictionary=options.joined_dictionary)


def archive_files(folder: Path) -> List[Path]:
    return [path for path in folder.iterdir() if path.is_file() and not path.name.endswith(".partial")]


# --- generic steps --------------------------------------------------------------------------------


def unpack_step(options: Options, archive: Archive) -> Step:
    """Unpack the members the recipe reads, every run that has not done so (the pre-placed archive too)."""
    destinations = [options.orig / name for name in archive.unpacked]
    return Step(
        f"unpack {archive.name}",
        destinations,
        lambda *paths: unpack_members(
            options.archives / archive.name, archive.members, paths, gunzip=archive.gunzip
        ),
    )


def map_step(
    title: str, lines: Callable[[], Iterable[str]], function: Callable, output: Path, workers: int
) -> Step:
    """Write ``function(line)`` for each of ``lines()``, in order, over ``workers`` processes."""
    return Step(
        title, [output], lambda path: f"{write_lines(path, parallel_map(function, lines(), workers))} lines"
    )


def concatenated(paths: Sequence[Path]) -> Iterator[str]:
    for path in paths:
        yield from read_lines(path)


def split_every_nth_step(
    options: Options, every: int, corpus: Dict[str, Path], languages: Sequence[str]
) -> Step:
    """awk 'NR%N == 0' into tmp/valid.LANG, awk 'NR%N != 0' into tmp/train.LANG."""
    outputs = [options.tmp / f"{split}.{lang}" for lang in languages for split in ("train", "valid")]

    def split(*paths):
        for lang, train, valid in zip(languages, paths[0::2], paths[1::2]):
            train_count = write_lines(
                train, (line for number, line in enumerate(read_lines(corpus[lang]), 1) if number % every)
            )
            valid_count = write_lines(
                valid, (line for number, line in enumerate(read_lines(corpus[lang]), 1) if not number % every)
            )
        return f"train {train_count}, valid {valid_count} (valid: lines {every}, {2 * every}, ...)"

    return Step("split train / valid", outputs, split)


def clean_step(
    title: str,
    inputs: Sequence[Path],
    outputs: Sequence[Path],
    ratio: float,
    min_tokens: int,
    max_tokens: int,
) -> Step:
    """clean-corpus-n.perl -ratio RATIO ... MIN MAX on a pair of files."""

    def clean(source_path, target_path):
        kept = 0
        with open_for_writing(source_path) as source_out, open_for_writing(target_path) as target_out:
            for source, target in moses.clean_corpus(read_pairs(*inputs), ratio, min_tokens, max_tokens):
                source_out.write(source + "\n")
                target_out.write(target + "\n")
                kept += 1
        return (
            f"{kept} of {count_lines(inputs[0])} pairs kept (ratio {ratio}, {min_tokens}-{max_tokens} tokens)"
        )

    return Step(title, outputs, clean)


def learn_bpe_step(options: Options, train_files: Sequence[Path]) -> Step:
    model = options.output / subwords.MODEL_NAMES[options.bpe]
    return Step(
        f"learn {options.bpe} BPE on {' + '.join(path.name for path in train_files)}",
        [model],
        lambda path: subwords.learn(options.bpe, train_files, options.bpe_ops, path, options.workers),
    )


def apply_bpe_step(options: Options, inputs: Sequence[Path], outputs: Sequence[Path]) -> Step:
    model = options.output / subwords.MODEL_NAMES[options.bpe]

    def apply(*paths):
        counts = [
            write_lines(path, subwords.apply(options.bpe, model, read_lines(source), options.workers))
            for source, path in zip(inputs, paths)
        ]
        return " + ".join(f"{count} lines" for count in counts)

    return Step(f"apply BPE to {' + '.join(path.name for path in inputs)}", outputs, apply)


def binarize_step(
    options: Options,
    source_lang: str,
    target_lang: str,
    train: str = "train",
    destination: str = "data-bin",
    dictionaries: Optional[Path] = None,
    title: str = "binarize with fairseq-preprocess",
) -> Step:
    """fairseq-preprocess of ``train`` (a text prefix under --output), valid and test into ``destination``;
    with ``dictionaries`` (a fairseq-preprocess folder) its dictionaries are reused, not built."""
    log = options.tmp / ("fairseq-preprocess.log" if destination == "data-bin" else f"fairseq-preprocess-{destination}.log")

    def binarize(destdir: Path) -> str:
        command = [sys.executable, "-m", "fairseq_cli.preprocess"]  # fairseq-preprocess, from this Python
        command += ["--source-lang", source_lang, "--target-lang", target_lang]
        for split, prefix in zip(SPLITS, (train, "valid", "test")):
            command += [f"--{split}pref", str(options.output / prefix)]
        command += ["--destdir", str(destdir), "--workers", str(options.workers)]
        if dictionaries is not None:
            command += ["--srcdict", str(dictionaries / f"dict.{source_lang}.txt"),
                        "--tgtdict", str(dictionaries / f"dict.{target_lang}.txt")]
        elif options.joined_dictionary:
            command.append("--joined-dictionary")
        with open(log, "w", encoding="utf-8") as out:
            if subprocess.run(command, stdout=out, stderr=subprocess.STDOUT).returncode != 0:
                raise DataPrepError(f"fairseq-preprocess failed, see {log}")
        types = [count_lines(destdir / f"dict.{lang}.txt") for lang in (source_lang, target_lang)]
        dictionaries_used = (
            f"joined dictionary of {types[0]}"
            if options.joined_dictionary
            else f"dictionaries of {types[0]} / {types[1]}"
        )
        return f"{dictionaries_used} types (log: {log.relative_to(options.output)})"

    return Step(title, [options.output / destination], binarize)


def sacrebleu_step(options: Options, test_set: str, langpair: str, archive_name: str) -> Step:
    """Fills sacreBLEU's cache from an optional archive: keyed to that archive alone, so adding it later
    adds this step without redoing the corpus."""
    archive = options.archives / archive_name
    return Step(
        f"cache {test_set} {langpair} for sacreBLEU",
        [],
        lambda: populate_sacrebleu_cache(test_set, langpair, archive),
        inputs={"sources": source_fingerprints([archive])},
    )


def readme_step(options: Options, recipe: Recipe, steps: Sequence[Step]) -> Step:
    def readme(path: Path) -> str:
        counts = ", ".join(
            f"{split} {count_lines(options.output / f'{split}.{recipe.source_lang}')}" for split in SPLITS
        )
        log = "\n".join(
            f"  {title}: {summary}" for title, summary in done_summaries(options.tmp / "done", steps)
        )
        dictionary = "a joined dictionary" if options.joined_dictionary else "separate dictionaries"
        subword_model = subwords.MODEL_NAMES[options.bpe]
        size = "merges" if options.bpe == "subword-nmt" else "vocabulary"
        languages = ",".join(recipe.languages)
        files = (
            f"{{train,valid,test}}.{{{languages}}} (text after {options.bpe} BPE, "
            f"{options.bpe_ops} {size}: {subword_model}), data-bin/ (fairseq-preprocess, {dictionary}), "
            "tmp/ (intermediate files; deletable)"
        )
        header = f"{recipe.title}, built by deepnmt's data-prep ({recipe.name}).\n"
        notice = recipe.readme_notice(options)
        header += f"{notice}\n" if notice else ""
        write_text_atomically(
            path,
            f"{header}\n{recipe.about.strip()}\n\n"
            f"Sentence pairs: {counts}.\n\nFiles: {files}.\n\nSteps:\n{log}\n",
        )
        return counts

    return Step("write README", [options.output / "README"], readme)


# --- IWSLT'14 De-En (prepare-iwslt14.sh) ----------------------------------------------------------

IWSLT_TEST_SETS = (
    "IWSLT14.TED.dev2010",
    "IWSLT14.TEDX.dev2012",
    "IWSLT14.TED.tst2010",
    "IWSLT14.TED.tst2011",
    "IWSLT14.TED.tst2012",
)
IWSLT_ARCHIVE = Archive(
    "de-en.tgz",
    "http://dl.fbaipublicfiles.com/fairseq/data/iwslt14/de-en.tgz",
    tuple(f"de-en/train.tags.de-en.{lang}" for lang in ("de", "en"))
    + tuple(f"de-en/{test_set}.de-en.{lang}.xml" for test_set in IWSLT_TEST_SETS for lang in ("de", "en")),
)
IWSLT_DROPPED_TAGS = ("<url>", "<talkid>", "<keywords>")  # grep -v
IWSLT_STRIPPED_TAGS = ("<title>", "</title>", "<description>", "</description>")  # sed s/<title>//g
SEG_OPEN = re.compile(r'<seg id="[0-9]*">\s*')
SEG_CLOSE = re.compile(r"\s*</seg>\s*")


def iwslt_train_lines(path: Path) -> Iterator[str]:
    for line in read_lines(path):
        if not any(tag in line for tag in IWSLT_DROPPED_TAGS):
            for tag in IWSLT_STRIPPED_TAGS:
                line = line.replace(tag, "")
            yield line


def seg_lines(paths: Iterable[Path]) -> Iterator[str]:
    """grep '<seg id' | sed 's/<seg id="[0-9]*">\\s*//g' | sed 's/\\s*<\\/seg>\\s*//g' | sed "s/’/'/g"."""
    for path in paths:
        for line in read_lines(path):
            if "<seg id" in line:
                yield SEG_CLOSE.sub("", SEG_OPEN.sub("", line)).replace("’", "'")


def tokenize_lowercase(line: str, lang: str) -> str:
    return moses.lowercase(moses.tokenize(line, lang))


def iwslt_steps(options: Options) -> List[Step]:
    tmp, languages = options.tmp, ("de", "en")
    steps = [unpack_step(options, IWSLT_ARCHIVE)]
    for lang in languages:
        raw = options.orig / f"de-en/train.tags.de-en.{lang}"
        steps.append(
            map_step(
                f"tokenize train.tags.de-en.{lang}",
                functools.partial(iwslt_train_lines, raw),
                functools.partial(moses.tokenize, lang=lang),
                tmp / f"train.tags.de-en.tok.{lang}",
                options.workers,
            )
        )
    tokenized, cleaned = (
        [tmp / f"train.tags.de-en.{kind}.{lang}" for lang in languages] for kind in ("tok", "clean")
    )
    steps.append(
        clean_step(
            "clean-corpus-n train.tags.de-en.tok", tokenized, cleaned, ratio=1.5, min_tokens=1, max_tokens=175
        )
    )
    for lang, path in zip(languages, cleaned):
        steps.append(
            map_step(
                f"lowercase train.tags.de-en.clean.{lang}",
                functools.partial(read_lines, path),
                moses.lowercase,
                tmp / f"train.tags.de-en.{lang}",
                options.workers,
            )
        )
    for lang in languages:
        xml_files = [options.orig / f"de-en/{test_set}.de-en.{lang}.xml" for test_set in IWSLT_TEST_SETS]
        steps.append(
            map_step(
                f"tokenize + lowercase test.{lang} (dev2010, TEDX.dev2012, tst2010-2012)",
                functools.partial(seg_lines, xml_files),
                functools.partial(tokenize_lowercase, lang=lang),
                tmp / f"test.{lang}",
                options.workers,
            )
        )
    steps.append(
        split_every_nth_step(
            options, 23, {lang: tmp / f"train.tags.de-en.{lang}" for lang in languages}, languages
        )
    )
    steps.append(learn_bpe_step(options, [tmp / f"train.{lang}" for lang in languages]))
    for split in SPLITS:
        steps.append(
            apply_bpe_step(
                options,
                [tmp / f"{split}.{lang}" for lang in languages],
                [options.output / f"{split}.{lang}" for lang in languages],
            )
        )
    return steps


def ensure_iwslt_archives(options: Options) -> None:
    ensure_archives([IWSLT_ARCHIVE], options.archives, options.download)


IWSLT14 = Recipe(
    name="iwslt14",
    title="IWSLT'14 German-English",
    source_lang="de",
    target_lang="en",
    default_output="iwslt14.tokenized.de-en",
    default_bpe_ops=10000,
    ensure_sources=ensure_iwslt_archives,
    sources=lambda options: [options.archives / IWSLT_ARCHIVE.name],
    corpus_steps=iwslt_steps,
    about=f"""
Source: {IWSLT_ARCHIVE.name} ({IWSLT_ARCHIVE.url}), the IWSLT 2014 TED talk transcripts (WIT3,
CC BY-NC-ND 3.0 like the TED talks: research use, no redistribution of derivatives).
Recipe: fairseq's examples/translation/prepare-iwslt14.sh. Train: lines with <url>, <talkid> or
<keywords> dropped, <title>/<description> tags stripped, Moses-tokenized, clean-corpus-n -ratio 1.5
(1-175 tokens), lowercased; valid is every 23rd line of it, train the rest. Test: the <seg> lines of
dev2010, TEDX.dev2012, tst2010, tst2011 and tst2012, tokenized and lowercased. Joint BPE on train.
""",
)


# --- WMT'14 / WMT'17 En-De (prepare-wmt14en2de.sh [--icml17]), WMT'14 En-Fr (prepare-wmt14en2fr.sh) -----

EUROPARL = Archive(
    "training-parallel-europarl-v7.tgz",
    "http://statmt.org/wmt13/training-parallel-europarl-v7.tgz",
    ("training/europarl-v7.de-en.de", "training/europarl-v7.de-en.en"),
)
COMMONCRAWL = Archive(
    "training-parallel-commoncrawl.tgz",
    "http://statmt.org/wmt13/training-parallel-commoncrawl.tgz",
    ("commoncrawl.de-en.de", "commoncrawl.de-en.en"),
)
NEWS_COMMENTARY_V12 = Archive(
    "training-parallel-nc-v12.tgz",
    "http://data.statmt.org/wmt17/translation-task/training-parallel-nc-v12.tgz",
    ("training/news-commentary-v12.de-en.de", "training/news-commentary-v12.de-en.en"),
)
NEWS_COMMENTARY_V9 = Archive(
    "training-parallel-nc-v9.tgz",
    "http://statmt.org/wmt14/training-parallel-nc-v9.tgz",
    ("training/news-commentary-v9.de-en.de", "training/news-commentary-v9.de-en.en"),
)
TEST_FULL = Archive(
    "test-full.tgz",
    "http://statmt.org/wmt14/test-full.tgz",
    ("test-full/newstest2014-deen-src.en.sgm", "test-full/newstest2014-deen-ref.de.sgm"),
)
# Optional, only for sacreBLEU's cache: used when present in --archives, never downloaded.
WMT17_TEST = Archive("test.tgz", "http://data.statmt.org/wmt17/translation-task/test.tgz")

# En-Fr reads the fr-en files of the same Europarl, Common Crawl, News Commentary v9 and test archives,
# plus the UN corpus and Giga-FrEn: a plain tar of the two gzipped sides, which the script gunzips.
EUROPARL_FR = Archive(
    EUROPARL.name, EUROPARL.url, ("training/europarl-v7.fr-en.en", "training/europarl-v7.fr-en.fr")
)
COMMONCRAWL_FR = Archive(COMMONCRAWL.name, COMMONCRAWL.url, ("commoncrawl.fr-en.en", "commoncrawl.fr-en.fr"))
UN = Archive(
    "training-parallel-un.tgz",
    "http://statmt.org/wmt13/training-parallel-un.tgz",
    ("un/undoc.2000.fr-en.en", "un/undoc.2000.fr-en.fr"),
)
NEWS_COMMENTARY_V9_FR = Archive(
    NEWS_COMMENTARY_V9.name,
    NEWS_COMMENTARY_V9.url,
    ("training/news-commentary-v9.fr-en.en", "training/news-commentary-v9.fr-en.fr"),
)
GIGA_FREN = Archive(
    "training-giga-fren.tar",
    "http://statmt.org/wmt10/training-giga-fren.tar",
    ("giga-fren.release2.fixed.en.gz", "giga-fren.release2.fixed.fr.gz"),
    gunzip=True,
)
TEST_FULL_FR = Archive(
    TEST_FULL.name,
    TEST_FULL.url,
    ("test-full/newstest2014-fren-src.en.sgm", "test-full/newstest2014-fren-ref.fr.sgm"),
)


@dataclass(frozen=True)
class WmtData:
    """What prepare-wmt14en2de.sh and prepare-wmt14en2fr.sh differ in; their steps are the same."""

    languages: Tuple[str, str]  # source, target ($src $tgt)
    training: Tuple[Archive, ...]  # concatenated in this order (the script's CORPORA)
    test: Archive  # newstest2014: the source side's src sgm, then the target side's ref sgm
    valid_every: int  # awk 'NR%N == 0' of the tokenized training text

    @property
    def pair(self) -> str:
        return "-".join(self.languages)


def wmt_train_line(line: str, lang: str) -> str:
    """normalize-punctuation.perl LANG | remove-non-printing-char.perl | tokenizer.perl -a -l LANG."""
    return moses.tokenize(
        moses.remove_non_printing_chars(moses.normalize_punctuation(line, lang)),
        lang,
        aggressive_dash_splits=True,
    )


def wmt_steps(options: Options, data: WmtData) -> List[Step]:
    tmp, languages, pair = options.tmp, data.languages, data.pair
    steps = [unpack_step(options, archive) for archive in data.training + (data.test,)]
    for lang in languages:
        corpora = [
            options.orig / name
            for archive in data.training
            for name in archive.unpacked
            if name.endswith(f".{lang}")
        ]
        steps.append(
            map_step(
                f"normalize + tokenize train.tags.{pair}.tok.{lang}",
                functools.partial(concatenated, corpora),
                functools.partial(wmt_train_line, lang=lang),
                tmp / f"train.tags.{pair}.tok.{lang}",
                options.workers,
            )
        )
    for lang, sgm in zip(languages, data.test.unpacked):
        steps.append(
            map_step(
                f"tokenize test.{lang} (newstest2014)",
                functools.partial(seg_lines, [options.orig / sgm]),
                functools.partial(moses.tokenize, lang=lang, aggressive_dash_splits=True),
                tmp / f"test.{lang}",
                options.workers,
            )
        )
    tokenized = {lang: tmp / f"train.tags.{pair}.tok.{lang}" for lang in languages}
    steps.append(split_every_nth_step(options, data.valid_every, tokenized, languages))
    steps.append(learn_bpe_step(options, [tmp / f"train.{lang}" for lang in languages]))
    for split in SPLITS:
        # the test set is copied as it is, train and valid go through clean-corpus-n first
        destination = options.output if split == "test" else tmp
        prefix = "" if split == "test" else "bpe."
        steps.append(
            apply_bpe_step(
                options,
                [tmp / f"{split}.{lang}" for lang in languages],
                [destination / f"{prefix}{split}.{lang}" for lang in languages],
            )
        )
    for split in ("train", "valid"):
        bpe_files = [tmp / f"bpe.{split}.{lang}" for lang in languages]
        steps.append(
            clean_step(
                f"clean-corpus-n bpe.{split}",
                bpe_files,
                [options.output / f"{split}.{lang}" for lang in languages],
                ratio=1.5,
                min_tokens=1,
                max_tokens=250,
            )
        )
    return steps


def wmt_recipe(
    name: str,
    title: str,
    data: WmtData,
    script: str,
    corpora: str,
    test_sets: Sequence[tuple],
) -> Recipe:
    """A recipe of fairseq's ``script`` ("prepare-wmt14en2de.sh --icml17"); ``corpora`` describes the training
    text for the README, ``test_sets`` are the (sacreBLEU test set, archive) caches to fill when present."""
    archives = list(data.training) + [data.test]

    def ensure(options: Options) -> None:
        ensure_archives(archives, options.archives, options.download)

    def sacrebleu_steps(options: Options) -> List[Step]:
        return [
            sacrebleu_step(options, test_set, data.pair, archive.name)
            for test_set, archive in test_sets
            if (options.archives / archive.name).is_file()
        ]

    names = [archive.name for archive in archives]
    about = (
        "Sources (statmt.org; the WMT shared task's terms: research use, each corpus under its own terms): "
        f"{', '.join(names[:-1])} and {names[-1]}.\n"
        f"Recipe: fairseq's examples/translation/{script}. Train: {corpora}, normalize-punctuation, "
        f"remove-non-printing-char, tokenizer -a; valid is lines {data.valid_every}, "
        f"{2 * data.valid_every}, ... of it, train the rest; joint BPE learned on train and applied to all; "
        "clean-corpus-n -ratio 1.5 (1-250 tokens) on BPE'd train and valid. Test: newstest2014 (the full "
        "version, 3003 sentences), tokenizer -a.\n"
        f"Scoring: sacrebleu -t wmt14/full -l {data.pair} works offline once its cache step has run."
    )
    return Recipe(
        name=name,
        title=title,
        source_lang=data.languages[0],
        target_lang=data.languages[1],
        default_output=f"{name[:5]}_{data.languages[0]}_{data.languages[1]}",  # the script's $prep
        default_bpe_ops=40000,
        ensure_sources=ensure,
        corpus_steps=functools.partial(wmt_steps, data=data),
        sacrebleu_steps=sacrebleu_steps,
        sources=lambda options: [options.archives / archive.name for archive in archives],
        about="\n".join(textwrap.fill(line, 100, break_on_hyphens=False) for line in about.split("\n")),
    )


WMT17 = wmt_recipe(
    "wmt17en2de",
    "WMT'17 English-German (fairseq's default WMT En-De data)",
    WmtData(("en", "de"), (EUROPARL, COMMONCRAWL, NEWS_COMMENTARY_V12), TEST_FULL, valid_every=100),
    "prepare-wmt14en2de.sh",
    "Europarl v7 + Common Crawl + News Commentary v12",
    [("wmt14/full", TEST_FULL), ("wmt17", WMT17_TEST)],
)
WMT14 = wmt_recipe(
    "wmt14en2de",
    "WMT'14 English-German (fairseq's --icml17 data)",
    WmtData(("en", "de"), (EUROPARL, COMMONCRAWL, NEWS_COMMENTARY_V9), TEST_FULL, valid_every=100),
    "prepare-wmt14en2de.sh --icml17",
    "Europarl v7 + Common Crawl + News Commentary v9",
    [("wmt14/full", TEST_FULL)],
)
WMT14_EN_FR = wmt_recipe(
    "wmt14en2fr",
    "WMT'14 English-French",
    WmtData(
        ("en", "fr"),
        (EUROPARL_FR, COMMONCRAWL_FR, UN, NEWS_COMMENTARY_V9_FR, GIGA_FREN),
        TEST_FULL_FR,
        valid_every=1333,
    ),
    "prepare-wmt14en2fr.sh",
    "Europarl v7 + Common Crawl + UN (undoc.2000) + News Commentary v9 + Giga-FrEn (release 2, fixed)",
    [("wmt14/full", TEST_FULL_FR)],
)
