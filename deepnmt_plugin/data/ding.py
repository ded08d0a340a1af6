"""Quickstart corpus: German-English pairs from the Ding dictionary (Debian package trans-de-en, GPL-2+).

Its ``/usr/share/trans/de-en`` has one entry a line, ``German | ... :: English | ...``, the parts of
both sides aligned by position; each part gives one pair (``DING.about`` below states the rules). Test
and valid hold real example sentences only, so a quickstart model is scored on sentences, not words.
"""

import functools
import itertools
import re
import shutil
from pathlib import Path
from typing import Iterable, List, Optional

from deepnmt_plugin.data import debian, moses, recipes
from deepnmt_plugin.data.pipeline import DataPrepError, Step, read_lines, read_pairs, write_lines
from deepnmt_plugin.data.recipes import SPLITS, Options, Recipe

PACKAGE = "trans-de-en"
DICTIONARY_MEMBER = "usr/share/trans/de-en"
HELD_OUT_EVERY = 20  # test: sentences 20, 40, ...; valid: sentences 10, 30, ...
# Pairs longer than this, or one side more than CLEAN_RATIO times the other (German compounds often
# take several English words, so IWSLT's 1.5 would drop half the phrases), are dropped by clean-corpus-n.
CLEAN_RATIO = 3
MAX_TOKENS = 50
ANNOTATION = re.compile(r"\{[^{}]*\}|\[[^\[\]]*\]|<[^<>]*>|\([^()]*\)|(?<!\S)/[^/\s]+/(?=[\s;,]|$)")
SENTENCE = re.compile(r"[^\W\d_].*[.!?…][\"'“”’»«]?")


def find_dictionary(folder: Path) -> Optional[Path]:
    """The extracted ``de-en`` file, else the newest ``trans-de-en_*.deb``, in ``folder``."""
    if (folder / "de-en").is_file():
        return folder / "de-en"
    return debian.newest_deb(folder, PACKAGE)


def ensure_dictionary(options: Options) -> None:
    if not find_dictionary(options.archives):
        debian.download_missing([PACKAGE], options.archives, options.download,
                                f", or the de-en file it installs as /{DICTIONARY_MEMBER}")


def read_deb_member(deb: Path, member: str) -> bytes:
    for _, content in debian.deb_data_files(deb, lambda path: path == member):
        return content
    raise DataPrepError(f"{deb} lacks {member}: not the {PACKAGE} package")


def unpack_dictionary(options: Options, destination: Path) -> str:
    source = find_dictionary(options.archives)
    if source.suffix == ".deb":
        destination.write_bytes(read_deb_member(source, DICTIONARY_MEMBER))
    else:
        shutil.copyfile(source, destination)
    comments = itertools.takewhile(lambda line: line.startswith("#"), read_lines(destination))
    versions = [line.split("::", 1)[1].strip() for line in comments if line.startswith("# Version ::")]
    return f"Ding version {versions[0] if versions else 'unknown'} from {source.name}"


def first_alternative(part: str) -> str:
    """'Abmachung {f}; Vereinbarung {f}' -> 'Abmachung'; annotations go first, as they may hold ';'."""
    previous = None
    while previous != part:  # innermost first, for nested brackets
        previous, part = part, ANNOTATION.sub(" ", part)
    return " ".join(part.split(";")[0].split())


def is_sentence(text: str) -> bool:
    return bool(SENTENCE.fullmatch(text)) and text[0].isupper()


def split_pairs(lines: Iterable[str]):
    """{"train": [(de, en), ...], "valid": [...], "test": [...]} and the numbers of sentence and phrase pairs.

    Sentences are numbered once per German text, and train keeps no pair whose German is held out."""
    sentences, phrases, seen = {}, [], set()
    for line in lines:
        sides = line.split(" :: ")
        if line.startswith("#") or len(sides) != 2:
            continue
        german_parts, english_parts = (side.split(" | ") for side in sides)
        if len(german_parts) != len(english_parts):
            continue
        for german, english in zip(german_parts, english_parts):
            pair = (first_alternative(german), first_alternative(english))
            if not all(pair) or pair in seen:
                continue
            seen.add(pair)
            if all(map(is_sentence, pair)):
                sentences.setdefault(pair[0], pair)
            else:
                phrases.append(pair)
    splits = {split: [] for split in SPLITS}
    for number, pair in enumerate(sentences.values(), 1):
        if number % HELD_OUT_EVERY == 0:
            splits["test"].append(pair)
        elif number % HELD_OUT_EVERY == HELD_OUT_EVERY // 2:
            splits["valid"].append(pair)
        else:
            splits["train"].append(pair)
    held_out = {german for split in ("valid", "test") for german, _ in splits[split]}
    splits["train"] += [pair for pair in phrases if pair[0] not in held_out]
    return splits, len(sentences), len(phrases)


def ding_steps(options: Options) -> List[Step]:
    tmp, languages = options.tmp, ("de", "en")
    dictionary = options.orig / "de-en"
    steps = [Step(f"unpack {PACKAGE}", [dictionary], functools.partial(unpack_dictionary, options))]

    def extract(*paths):
        splits, sentence_count, phrase_count = split_pairs(read_lines(dictionary))
        for split, (german_path, english_path) in zip(SPLITS, zip(paths[0::2], paths[1::2])):
            write_lines(german_path, (german for german, _ in splits[split]))
            write_lines(english_path, (english for _, english in splits[split]))
        counts = ", ".join(f"{split} {len(splits[split])}" for split in SPLITS)
        return f"{sentence_count} sentence and {phrase_count} phrase pairs: {counts}"

    steps.append(
        Step(
            "extract sentence and phrase pairs",
            [tmp / f"{split}.raw.{lang}" for split in SPLITS for lang in languages],
            extract,
        )
    )
    for split in SPLITS:
        for lang in languages:
            steps.append(
                recipes.map_step(
                    f"normalize + tokenize + lowercase {split}.{lang}",
                    functools.partial(read_lines, tmp / f"{split}.raw.{lang}"),
                    functools.partial(preprocess, lang=lang),
                    tmp / f"{split}.tok.{lang}",
                    options.workers,
                )
            )
        tokenized = [tmp / f"{split}.tok.{lang}" for lang in languages]
        steps.append(
            recipes.clean_step(
                f"clean-corpus-n {split}.tok",
                tokenized,
                [tmp / f"{split}.{lang}" for lang in languages],
                CLEAN_RATIO,
                1,
                MAX_TOKENS,
            )
        )
    steps.append(recipes.learn_bpe_step(options, [tmp / f"train.{lang}" for lang in languages]))
    for split in SPLITS:
        steps.append(
            recipes.apply_bpe_step(
                options,
                [tmp / f"{split}.{lang}" for lang in languages],
                [options.output / f"{split}.{lang}" for lang in languages],
            )
        )
    return steps


def train_sentence_count(tmp: Path) -> int:
    """How many cleaned train pairs are example sentences. ``extract`` writes the train sentences first,
    tokenizing keeps every line and clean-corpus-n keeps the order, so they are the cleaned file's first
    lines: those of the leading sentence pairs of train.raw that clean-corpus-n kept."""
    raw = read_pairs(tmp / "train.raw.de", tmp / "train.raw.en")
    sentences = sum(1 for _ in itertools.takewhile(lambda pair: all(map(is_sentence, pair)), raw))
    cleaned = read_pairs(tmp / "train.de", tmp / "train.en")
    kept, current = 0, next(cleaned, None)
    for _, pair in zip(range(sentences), read_pairs(tmp / "train.tok.de", tmp / "train.tok.en")):
        if current is not None and [" ".join(side.split()) for side in pair] == list(current):
            kept, current = kept + 1, next(cleaned, None)
    return kept


def sentence_steps(options: Options) -> List[Step]:
    """train-sentences.{de,en} and data-bin-sentences/: the train sentences alone (no dictionary phrases),
    binarized with data-bin's dictionaries. Word-for-word phrases are most of train and teach a small
    model little about sentences in a few minutes; the quickstart trains on these."""
    languages = ("de", "en")

    def select(*paths):
        count = train_sentence_count(options.tmp)
        for lang, path in zip(languages, paths):
            write_lines(path, itertools.islice(read_lines(options.output / f"train.{lang}"), count))
        return f"{count} pairs"

    return [
        Step("select the train sentences", [options.output / f"train-sentences.{lang}" for lang in languages], select),
        recipes.binarize_step(options, *languages, train="train-sentences", destination="data-bin-sentences",
                              dictionaries=options.output / "data-bin", title="binarize the train sentences"),
    ]


def preprocess(line: str, lang: str) -> str:
    """normalize-punctuation | remove-non-printing-char | tokenizer (no -a, as IWSLT) | lowercase."""
    return moses.lowercase(
        moses.tokenize(moses.remove_non_printing_chars(moses.normalize_punctuation(line, lang)), lang)
    )


DING = Recipe(
    name="ding-de-en",
    title="Ding German-English quickstart corpus",
    source_lang="de",
    target_lang="en",
    default_output="ding.tokenized.de-en",
    default_bpe_ops=8000,
    ensure_sources=ensure_dictionary,
    corpus_steps=ding_steps,
    binarized_steps=sentence_steps,
    about=f"""
Source: the Ding dictionary (Frank Richter, https://dict.tu-chemnitz.de/), from Debian's {PACKAGE}
package. Licence: GNU GPL version 2 or later; this corpus is derived from it, so the GPL applies too.
Pairs: each " | "-aligned part of an entry, its first ";" alternative, annotations ({{f}} [ugs.] <...>
(...) /Abbr./) removed. Split: the example sentences (both sides start upper-case and end in . ! ? or
…), one per German text, in file order: every {HELD_OUT_EVERY}th to test, every {HELD_OUT_EVERY}th from the
{HELD_OUT_EVERY // 2}th on to valid; the other sentences and all phrases (less any whose German is held out)
to train.
Pre-processing: normalize-punctuation, remove-non-printing-char, Moses tokenizer (no -a, as IWSLT),
lowercase; clean-corpus-n -ratio {CLEAN_RATIO}, 1-{MAX_TOKENS} tokens, on every split; joint BPE on train.
Sentences only: train-sentences.{{de,en}} and data-bin-sentences/ (same dictionaries, valid and test) hold
the train sentences without the phrases, for short runs such as the quickstart's.
""",
)
