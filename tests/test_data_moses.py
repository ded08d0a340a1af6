"""The Moses re-implementations against the Perl scripts' semantics, on crafted edge cases.

Every expected value here was checked against mosesdecoder's own Perl scripts (tokenizer.perl,
normalize-punctuation.perl, remove-non-printing-char.perl, lowercase.perl, clean-corpus-n.perl).
"""

import pytest

from deepnmt_plugin.data import moses


def clean(pairs, ratio=1.5, min_tokens=1, max_tokens=5, **options):
    return list(moses.clean_corpus(pairs, ratio, min_tokens, max_tokens, **options))


def test_clean_corpus_collapses_whitespace_and_removes_bars():
    assert clean([("  a   b  ", "x\ty"), ("a |b|", "x y"), ("a\u00a0b", "x\u2028y")]) == [("a b", "x y")] * 3


def test_clean_corpus_drops_empty_sides_and_token_counts_out_of_range():
    pairs = [("", "x"), ("a", "   "), ("a b c d e f", "u v w x y z"), ("a b c d e", "v w x y z")]
    assert clean(pairs) == [("a b c d e", "v w x y z")]
    assert clean([("a", "x"), ("a b", "x y")], min_tokens=2) == [("a b", "x y")]


def test_clean_corpus_ratio_is_checked_both_ways_and_inclusive():
    pairs = [("a", "x y"), ("a b", "x"), ("a b", "x y z"), ("a b c", "x y")]
    assert clean(pairs) == [("a b", "x y z"), ("a b c", "x y")]  # 2:1 dropped, 1.5:1 kept
    assert clean([("a", "x y")], ratio=2) == [("a", "x y")]


def test_clean_corpus_drops_words_longer_than_1000_characters():
    assert clean([("w" * 1001, "x"), ("w" * 1000, "x")]) == [("w" * 1000, "x")]
    assert clean([("w" * 11, "x")], max_word_length=10) == []


def test_clean_corpus_counts_tokens_on_perl_whitespace_only():
    # U+001C is whitespace to Python's str.split() but not to Perl's \s: one token, so ratio 2
    assert clean([("a\x1cb", "x y")]) == []


def test_clean_corpus_keeps_factors_when_the_first_pair_has_them():
    factored = [("a|N b|V", "x|N y|V"), ("c|N", "z|N"), ("d", "|")]
    assert clean(factored) == factored
    with pytest.raises(ValueError, match="blank factor in the source of pair 2"):
        clean([("a|N", "x|N"), ("b |N", "y|N")], ratio=9)  # clean-corpus-n.perl dies here too


def test_tokenize_matches_tokenizer_perl():
    assert moses.tokenize('state-of-the-art a|b <c> & "d"', "de", aggressive_dash_splits=True) == (
        "state @-@ of @-@ the @-@ art a &#124; b &lt; c &gt; &amp; &quot; d &quot;"
    )
    assert moses.tokenize("state-of-the-art", "en") == "state-of-the-art"
    assert moses.tokenize("It's John's", "en") == "It &apos;s John &apos;s"
    assert moses.tokenize("Das ist Nr. 7 im Test.", "de") == "Das ist Nr. 7 im Test ."
    assert moses.tokenize("   ", "de") == "   "  # blank lines pass through untouched


def test_tokenize_splits_the_final_dot_after_a_nonbreaking_prefix():
    # mosesdecoder 9fc964da7 (2018-11), which sacremoses 0.2 lacks
    assert moses.tokenize("5 plus 2 ergibt 7.", "de") == "5 plus 2 ergibt 7 ."
    assert moses.tokenize("Wait...", "en") == "Wait ..."


def test_normalize_punctuation_matches_the_perl_script():
    assert moses.normalize_punctuation("Er sagte: „Ja.“", "de") == 'Er sagte: "Ja".'
    assert moses.normalize_punctuation('He said "yes".', "en") == 'He said "yes."'
    assert moses.normalize_punctuation("I’ve got 1\u00a0000 – ok", "en") == "I've got 1.000 - ok"
    assert moses.normalize_punctuation("1\u00a0000", "de") == "1,000"


def test_remove_non_printing_chars_and_lowercase():
    assert moses.remove_non_printing_chars("a\u200bb\x07c\td") == "a b c d"
    assert moses.lowercase("ΟΔΟΣ Äpfel") == "οδοσ äpfel"
