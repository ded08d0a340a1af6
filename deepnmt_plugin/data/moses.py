"""The Moses pre-processing that fairseq's recipes run, without a mosesdecoder checkout.

Tokenization and punctuation normalisation come from sacremoses, adjusted where it departs from the
current Perl scripts; non-printing characters, lowercasing and ``clean-corpus-n.perl`` are
re-implemented here. Every function takes and returns one line without its newline.
"""

import functools
from typing import Iterable, Iterator, Tuple

import regex
from sacremoses import MosesPunctNormalizer, MosesTokenizer

# What Perl's \s matches in a Unicode string (Python's str.split() also splits on U+001C..U+001F).
PERL_SPACES = regex.compile(r"\p{White_Space}+")
NON_PRINTING = regex.compile(r"\p{C}")
FINAL_DOT = regex.compile(r"^(\S+)\.$")


class PerlMosesTokenizer(MosesTokenizer):
    """sacremoses' tokenizer plus mosesdecoder commit 9fc964da7 (2018-11), which fairseq's recipes
    get since they clone Moses master: the last word's final dot is split off even after a
    non-breaking prefix ("ergibt 7." -> "ergibt 7 .")."""

    def handles_nonbreaking_prefixes(self, text):
        tokens = text.split()
        if tokens:
            tokens[-1] = FINAL_DOT.sub(r"\1 .", tokens[-1])
        return super().handles_nonbreaking_prefixes(" ".join(tokens))


@functools.lru_cache(maxsize=None)
def _tokenizer(lang: str) -> MosesTokenizer:
    return PerlMosesTokenizer(lang)


@functools.lru_cache(maxsize=None)
def _normalizer(lang: str) -> MosesPunctNormalizer:
    return MosesPunctNormalizer(lang, perl_parity=True)


def normalize_punctuation(line: str, lang: str) -> str:
    """normalize-punctuation.perl LANG, less surrounding whitespace (which the tokenizer drops anyway).
    Perl sees the line with its newline, which its rule for a period before a closing quote
    (non-English) relies on: 'sagte "Ja."' -> 'sagte "Ja".'."""
    return _normalizer(lang).normalize(line + "\n")


def remove_non_printing_chars(line: str) -> str:
    """remove-non-printing-char.perl: every \\p{C} character becomes a space."""
    return NON_PRINTING.sub(" ", line)


def tokenize(line: str, lang: str, aggressive_dash_splits: bool = False) -> str:
    """tokenizer.perl -l LANG [-a], escaping special characters (its default)."""
    if PERL_SPACES.sub("", line) == "":
        return line  # tokenizer.perl copies blank lines through untouched
    return _tokenizer(lang).tokenize(
        line, aggressive_dash_splits=aggressive_dash_splits, return_str=True, escape=True
    )


def lowercase(line: str) -> str:
    """lowercase.perl. Perl's lc maps Σ to σ everywhere; Python's lower() makes a word-final one ς."""
    return line.replace("Σ", "σ").lower()


def clean_corpus(
    pairs: Iterable[Tuple[str, str]],
    ratio: float,
    min_tokens: int,
    max_tokens: int,
    max_word_length: int = 1000,
) -> Iterator[Tuple[str, str]]:
    """clean-corpus-n.perl -ratio RATIO corpus src tgt out MIN MAX: yields the kept pairs, as it writes them.

    Both sides get "|" removed (unless the first pair has one: a factored corpus), whitespace collapsed
    and trimmed; a pair is dropped when a side is empty, has fewer than MIN or more than MAX tokens, is
    more than RATIO times as long as the other, or holds a word of more than MAX_WORD_LENGTH characters.
    """
    long_word = regex.compile(r"[^\s|]{%d}" % (max_word_length + 1))
    blank_factor = regex.compile(r"[ |]\|")
    factored = None
    for number, (source, target) in enumerate(pairs, 1):
        if factored is None:
            factored = "|" in source or "|" in target
        source, target = (_squeeze(line, factored) for line in (source, target))
        if not source or not target:
            continue
        source_count, target_count = len(source.split(" ")), len(target.split(" "))
        if not min_tokens <= source_count <= max_tokens or not min_tokens <= target_count <= max_tokens:
            continue
        if target_count / source_count > ratio or source_count / target_count > ratio:
            continue
        if long_word.search(source) or long_word.search(target):
            continue
        for side, line in (("source", source), ("target", target)):
            if blank_factor.search(line):
                raise ValueError(f"blank factor in the {side} of pair {number}: {line}")
        yield source, target


def _squeeze(line: str, factored: bool) -> str:
    if not factored:
        line = line.replace("|", "")
    return PERL_SPACES.sub(" ", line).strip(" ")
