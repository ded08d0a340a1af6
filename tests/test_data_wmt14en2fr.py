"""prepare-wmt14en2fr.sh end to end, offline, on tiny archives in the originals' exact layout."""

import gzip

import pytest

from data_fixtures import (
    WMT_ENFR_CORPORA,
    built_with_sacrebleu_cache,
    check_bpe_and_binarized,
    read,
    run_script,
    sacrebleu_echo,
    write_tarball,
    write_wmt_enfr_archives,
)
from deepnmt_plugin.data.archives import unpack_members
from deepnmt_plugin.data.pipeline import DataPrepError

pytestmark = pytest.mark.slow  # trains, generates or builds corpora through subprocesses

LANGUAGES = ("en", "fr")
# The raw lines of the fixture after normalize-punctuation | remove-non-printing-char | tokenizer -a -l LANG
TOKENIZED = {
    ("europarl", 5): (
        "He said : &quot; This is state @-@ of @-@ the @-@ art . &quot;",
        # « » become ", the spaces before : and ! go; French elision splits after the apostrophe
        "Il a dit : &quot; C&apos; est l&apos; état de l&apos; art ! &quot;",
    ),
    ("commoncrawl", 7): ("linewith controls", "ligneavec contrôles"),  # \r gone, U+200B a space
    ("un", 9): ("yes , well , that is really all .", "oui ."),
    ("giga", 3): ("Maybe the well @-@ known e @-@ mail .", "Peut @-@ être le courriel bien connu ."),
}


def tokenized_corpus(lang):
    """train.tags.en-fr.tok.LANG: Europarl, Common Crawl, UN, News Commentary v9 and Giga-FrEn, in this order."""
    word = {"en": "sentence", "fr": "phrase"}[lang]
    return [
        TOKENIZED[name, number][LANGUAGES.index(lang)] if (name, number) in TOKENIZED else f"{name} {word} {number} ."
        for name, size in WMT_ENFR_CORPORA
        for number in range(1, size + 1)
    ]


@pytest.fixture(scope="module")
def wmt14enfr(tmp_path_factory):
    return built_with_sacrebleu_cache(tmp_path_factory, "wmt14enfr", "prepare-wmt14en2fr.sh", write_wmt_enfr_archives)


def test_the_six_archives_are_unpacked_under_the_scripts_names(wmt14enfr):
    root, result, _ = wmt14enfr
    orig = root / "out" / "tmp" / "orig"
    for lang in LANGUAGES:
        for name in ("training/europarl-v7.fr-en", "commoncrawl.fr-en", "un/undoc.2000.fr-en",
                     "training/news-commentary-v9.fr-en"):
            assert (orig / f"{name}.{lang}").is_file()
        # tar xvf training-giga-fren.tar; gunzip giga-fren.release2.fixed.*.gz
        assert read(orig / f"giga-fren.release2.fixed.{lang}")[:2] == [
            f"giga {'sentence' if lang == 'en' else 'phrase'} {number} ." for number in (1, 2)
        ]
        assert not (orig / f"giga-fren.release2.fixed.{lang}.gz").exists()
    assert "[5/20] unpack training-giga-fren.tar ... 2 files" in result.stdout.splitlines()


def test_train_is_normalized_and_tokenized_with_dash_splitting_per_language(wmt14enfr):
    root, _, _ = wmt14enfr
    tmp = root / "out" / "tmp"
    for lang in LANGUAGES:
        assert read(tmp / f"train.tags.en-fr.tok.{lang}") == tokenized_corpus(lang)


def test_valid_is_every_1333rd_line_and_clean_corpus_n_runs_on_the_bpe_text(wmt14enfr):
    root, result, _ = wmt14enfr
    out, tmp = root / "out", root / "out" / "tmp"
    pre_bpe = {}
    for lang in LANGUAGES:
        corpus = tokenized_corpus(lang)
        assert len(corpus) == 2800
        valid = [corpus[1332], corpus[2665]]  # UN line 133, Giga-FrEn line 566
        train = [line for number, line in enumerate(corpus, 1) if number % 1333]
        assert read(tmp / f"valid.{lang}") == valid
        assert read(tmp / f"train.{lang}") == train
        pre_bpe["train", lang] = train[:1208] + train[1209:]  # UN line 9 (8 : 2 tokens) dropped
        pre_bpe["valid", lang] = valid
        side = "src en" if lang == "en" else "ref fr"
        pre_bpe["test", lang] = [f"newstest2014 {side} &apos; s seg {number}" for number in range(1, 5)]
    check_bpe_and_binarized(out, {"train": 2797, "valid": 2, "test": 4}, LANGUAGES, pre_bpe)
    steps = [line for line in result.stdout.splitlines() if line.startswith("[")]
    assert len(steps) == 20
    assert "[11/20] split train / valid ... train 2798, valid 2 (valid: lines 1333, 2666, ...)" in steps
    assert "[16/20] clean-corpus-n bpe.train ... 2797 of 2798 pairs kept (ratio 1.5, 1-250 tokens)" in steps


def test_output_layout_and_readme(wmt14enfr):
    root, _, _ = wmt14enfr
    out = root / "out"
    assert sorted(path.name for path in out.iterdir()) == [
        "README", "code", "data-bin", "test.en", "test.fr", "tmp", "train.en", "train.fr", "valid.en", "valid.fr",
    ]
    assert {path.name for path in (out / "data-bin").iterdir()} >= {
        "dict.en.txt", "dict.fr.txt", *(f"{split}.en-fr.{lang}.{ext}" for split in ("train", "valid", "test")
                                        for lang in LANGUAGES for ext in ("bin", "idx"))
    }
    readme = (out / "README").read_text()
    assert readme.startswith("WMT'14 English-French, built by deepnmt's data-prep (wmt14en2fr).")
    assert "Sentence pairs: train 2797, valid 2, test 4." in readme
    assert "prepare-wmt14en2fr.sh" in readme and "training-giga-fren.tar" in readme


def test_sacrebleu_reads_the_cached_en_fr_test_set_offline(wmt14enfr):
    _, _, cache = wmt14enfr
    assert sacrebleu_echo(cache, "wmt14/full", "en-fr", "ref") == [f"newstest2014 ref fr ’s seg {number}" for number in range(1, 5)]


def test_missing_archives_are_listed_with_their_urls_in_the_scripts_order(tmp_path):
    result = run_script("prepare-wmt14en2fr.sh", "--archives", tmp_path / "archives", "--output", tmp_path / "out")
    assert result.returncode == 1
    assert result.stderr.splitlines()[-6:] == [
        "  training-parallel-europarl-v7.tgz  http://statmt.org/wmt13/training-parallel-europarl-v7.tgz",
        "  training-parallel-commoncrawl.tgz  http://statmt.org/wmt13/training-parallel-commoncrawl.tgz",
        "  training-parallel-un.tgz  http://statmt.org/wmt13/training-parallel-un.tgz",
        "  training-parallel-nc-v9.tgz  http://statmt.org/wmt14/training-parallel-nc-v9.tgz",
        "  training-giga-fren.tar  http://statmt.org/wmt10/training-giga-fren.tar",
        "  test-full.tgz  http://statmt.org/wmt14/test-full.tgz",
    ]
    assert "nothing was done" in result.stderr and not (tmp_path / "out").exists()


def test_gzipped_members_are_unpacked_decompressed_and_a_corrupt_one_is_named(tmp_path):
    archive = write_tarball(tmp_path / "giga.tar", {"a.en.gz": gzip.compress(b"one\ntwo\n")}, compression="")
    assert unpack_members(archive, ["a.en.gz"], [tmp_path / "a.en"], gunzip=True) == "1 files"
    assert (tmp_path / "a.en").read_bytes() == b"one\ntwo\n"
    broken = write_tarball(tmp_path / "broken.tar", {"a.en.gz": b"not gzip\n"}, compression="")
    with pytest.raises(DataPrepError, match="broken.tar is corrupt or not a tar archive of gzipped files"):
        unpack_members(broken, ["a.en.gz"], [tmp_path / "b.en"], gunzip=True)
