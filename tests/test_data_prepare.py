"""The data-prep scripts end to end, offline, on tiny archives in the originals' exact layout."""

import functools
import json
import shutil
import tarfile

import pytest

from data_fixtures import (
    BPE_OPS,
    IWSLT_TEST_SEGMENTS,
    binarized,
    built,
    built_with_sacrebleu_cache,
    check_bpe_and_binarized,
    read,
    run_script,
    sacrebleu_echo,
    write_ding_deb,
    write_iwslt_archive,
    write_tarball,
    write_wmt_archives,
)

pytestmark = pytest.mark.slow  # trains, generates or builds corpora through subprocesses


@pytest.fixture(scope="module")
def iwslt(tmp_path_factory):
    return built(tmp_path_factory, "iwslt", "prepare-iwslt14.sh", write_iwslt_archive)


@pytest.fixture(scope="module")
def wmt17(tmp_path_factory):
    return built_with_sacrebleu_cache(tmp_path_factory, "wmt17", "prepare-wmt17en2de.sh", write_wmt_archives)


@pytest.fixture(scope="module")
def ding(tmp_path_factory):
    return built(tmp_path_factory, "ding", "prepare-ding-de-en.sh", write_ding_deb)


# --- IWSLT'14 -------------------------------------------------------------------------------------

# The talk header lines fairseq's recipe keeps: <speaker> (a known quirk), <title>, <description>.
SPEAKER = "&lt; speaker &gt; jane doe &lt; / speaker &gt;"
IWSLT_HEADER = {
    "de": [SPEAKER, "jane doe : ein vortrag {}", "ted talk subtitles and transcript : über dinge ."],
    "en": [SPEAKER, "jane doe : a talk {}", "ted talk subtitles and transcript : about things ."],
}
IWSLT_RAW = {  # the last line of each talk, tokenized and lowercased
    ("de", 1): "vielen dank , chris .",
    ("en", 1): "thank you so much , chris .",
    ("de", 2): "es ist „ wahr “ – sagt ’ s .",
    ("en", 2): "it &apos;s true - isn &apos;t it ?",
}


def iwslt_cleaned(lang):
    """train.tags.de-en.LANG as the recipe leaves it: 27 lines per talk (its pair with a 1:7 ratio, or
    an empty side, dropped)."""
    sentence = {"de": "das ist satz {} im vortrag {} .", "en": "this is sentence {} of talk {} ."}[lang]
    return [
        line
        for talk in (1, 2)
        for line in [header.format(talk) for header in IWSLT_HEADER[lang]]
        + [sentence.format(number, talk) for number in range(1, 24)]
        + [IWSLT_RAW[lang, talk]]
    ]


def test_iwslt_train_is_filtered_tokenized_cleaned_and_lowercased(iwslt):
    root, _ = iwslt
    tmp = root / "out" / "tmp"
    assert read(tmp / "train.tags.de-en.tok.de")[:3] == [
        "&lt; speaker &gt; Jane Doe &lt; / speaker &gt;",
        "Jane Doe : Ein Vortrag 1",
        "TED Talk Subtitles and Transcript : Über Dinge .",
    ]
    assert len(read(tmp / "train.tags.de-en.tok.de")) == 56
    for lang in ("de", "en"):
        assert read(tmp / f"train.tags.de-en.{lang}") == iwslt_cleaned(lang)


def test_iwslt_valid_is_every_23rd_line_and_test_the_five_sets_in_order(iwslt):
    root, _ = iwslt
    tmp = root / "out" / "tmp"
    for lang in ("de", "en"):
        cleaned = iwslt_cleaned(lang)
        assert read(tmp / f"valid.{lang}") == [cleaned[22], cleaned[45]]
        assert read(tmp / f"train.{lang}") == [line for number, line in enumerate(cleaned, 1) if number % 23]
        assert read(tmp / f"test.{lang}") == [
            f"{test_set.split('.')[-1].lower()} {lang} seg {number} &apos; s text ."  # ’ -> ' as the recipe's sed
            for test_set, segments in IWSLT_TEST_SEGMENTS.items()
            for number in range(1, segments + 1)
        ]


def test_iwslt_bpe_and_binarized_output(iwslt):
    root, result = iwslt
    out = root / "out"
    counts = {"train": 52, "valid": 2, "test": 10}
    pre_bpe = {(split, lang): read(out / "tmp" / f"{split}.{lang}") for split in counts for lang in ("de", "en")}
    check_bpe_and_binarized(out, counts, ("de", "en"), pre_bpe)
    steps = [line for line in result.stdout.splitlines() if line.startswith("[")]
    assert len(steps) == 15
    assert steps[3] == "[4/15] clean-corpus-n train.tags.de-en.tok ... 54 of 56 pairs kept (ratio 1.5, 1-175 tokens)"
    assert "Sentence pairs: train 52, valid 2, test 10." in (out / "README").read_text()


def test_a_rerun_skips_every_step_and_redoes_an_interrupted_one(iwslt, tmp_path):
    root, _ = iwslt
    out = shutil.copytree(root / "out", tmp_path / "out")
    before = {path: path.stat().st_mtime_ns for path in out.glob("*.*")}
    flags = ["--archives", root / "archives", "--output", out, "--bpe-ops", BPE_OPS]
    rerun = run_script("prepare-iwslt14.sh", *flags)
    assert rerun.returncode == 0
    assert all(": done before, " in line for line in rerun.stdout.splitlines() if line.startswith("["))
    assert {path: path.stat().st_mtime_ns for path in out.glob("*.*")} == before

    (out / "tmp" / "done" / "apply-BPE-to-test.de-test.en").unlink()  # died before its marker...
    (out / "test.de").write_text("half written\n")  # ...after renaming one output
    (out / "test.en.partial").write_text("half written\n")
    redo = run_script("prepare-iwslt14.sh", *flags)
    assert "[13/15] apply BPE to test.de + test.en ... 10 lines + 10 lines" in redo.stdout.splitlines()
    assert (out / "test.de").read_text() == (root / "out" / "test.de").read_text()
    assert not list(out.rglob("*.partial"))


def test_a_rerun_on_another_archive_rebuilds_every_step_from_it(iwslt, tmp_path):
    """A second run into the same --output with another de-en.tgz printed `done before` for every
    step and kept the first archive's text, exit 0. Done-markers now record the archive they were built from."""
    root, _ = iwslt
    out = shutil.copytree(root / "out", tmp_path / "out")
    with tarfile.open(root / "archives" / "de-en.tgz") as tar:
        members = {member.name: tar.extractfile(member).read() for member in tar if member.isfile()}
    edited = {name: data.replace(b"Chris", b"Bruno") for name, data in members.items()}
    write_tarball(tmp_path / "other" / "de-en.tgz", edited)
    rerun = run_script("prepare-iwslt14.sh", "--archives", tmp_path / "other", "--output", out, "--bpe-ops", BPE_OPS)
    assert rerun.returncode == 0, rerun.stderr
    steps = [line for line in rerun.stdout.splitlines() if line.startswith("[")]
    assert steps[0] == ("[1/15] unpack de-en.tgz: built before from other inputs (de-en.tgz changed), "
                        "so it and every later step are redone")
    assert len(steps) == 16 and not any("done before" in line for line in steps)
    assert "thank you so much , bruno ." in read(out / "tmp" / "train.tags.de-en.en")
    assert read(out / "train.en") != read(root / "out" / "train.en")
    done = json.loads((out / "tmp" / "done" / "unpack-de-en.tgz").read_text())
    archive = tmp_path / "other" / "de-en.tgz"
    assert done["inputs"]["sources"] == {"de-en.tgz": [archive.stat().st_size, archive.stat().st_mtime_ns]}
    assert done["inputs"]["settings"] == {"recipe": "iwslt14", "bpe": "subword-nmt", "bpe_ops": int(BPE_OPS),
                                          "joined_dictionary": True}

    again = run_script("prepare-iwslt14.sh", "--archives", tmp_path / "other", "--output", out, "--bpe-ops", BPE_OPS)
    assert all(": done before, " in line for line in again.stdout.splitlines() if line.startswith("["))


def test_other_settings_never_overwrite_an_output(iwslt, tmp_path):
    root, _ = iwslt
    before = (root / "out" / "code").read_text()
    flags = ["--archives", root / "archives", "--output", root / "out", "--bpe-ops", "31"]
    result = run_script("prepare-iwslt14.sh", *flags)
    assert result.returncode == 1
    assert "was built with other settings (bpe_ops 30 -> 31)" in result.stderr
    assert (root / "out" / "code").read_text() == before


def test_a_corrupt_or_wrong_archive_is_named_and_nothing_is_written(tmp_path):
    (tmp_path / "archives").mkdir()
    (tmp_path / "archives" / "de-en.tgz").write_bytes(b"<html>404 Not Found</html>")
    result = run_script("prepare-iwslt14.sh", "--archives", tmp_path / "archives", "--output", tmp_path / "out")
    assert result.returncode == 1
    error = f"deepnmt: error: {tmp_path / 'archives' / 'de-en.tgz'} is corrupt or not a tar archive"
    assert result.stderr.strip().splitlines()[-1].startswith(error)
    assert "[1/15] unpack de-en.tgz ... failed" in result.stdout
    assert sorted(path.name for path in (tmp_path / "out").iterdir()) == ["tmp"]
    assert not list(tmp_path.rglob("*.partial"))

    write_tarball(tmp_path / "archives" / "de-en.tgz", {"fr-en/train.tags.fr-en.fr": "bonjour\n"})
    result = run_script("prepare-iwslt14.sh", "--archives", tmp_path / "archives", "--output", tmp_path / "wrong")
    assert result.returncode == 1
    assert "lacks de-en/train.tags.de-en.de, de-en/train.tags.de-en.en" in result.stderr


def test_missing_archives_are_listed_with_their_urls_before_anything_is_done(tmp_path):
    europarl = {"training/europarl-v7.de-en.de": "x\n"}
    write_tarball(tmp_path / "archives" / "training-parallel-europarl-v7.tgz", europarl)
    result = run_script("prepare-wmt17en2de.sh", "--archives", tmp_path / "archives", "--output", tmp_path / "out")
    assert result.returncode == 1
    assert result.stderr.splitlines()[-3:] == [
        "  training-parallel-commoncrawl.tgz  http://statmt.org/wmt13/training-parallel-commoncrawl.tgz",
        "  training-parallel-nc-v12.tgz  http://data.statmt.org/wmt17/translation-task/training-parallel-nc-v12.tgz",
        "  test-full.tgz  http://statmt.org/wmt14/test-full.tgz",
    ]
    assert "nothing was done" in result.stderr and not (tmp_path / "out").exists()


# --- WMT'17 / WMT'14 En-De ------------------------------------------------------------------------


def wmt_raw_tokenized(lang, news_commentary="ncv12"):
    """train.tags.en-de.tok.LANG: the three corpora concatenated (Europarl, Common Crawl, News Commentary)."""
    word = {"de": "satz", "en": "sentence"}[lang]
    corpora = (("europarl", 120), ("commoncrawl", 70), (news_commentary, 60))
    lines = [f"{name} {word} {number} ." for name, size in corpora for number in range(1, size + 1)]
    lines[4] = {
        "de": "Er sagte : &quot; Das ist state @-@ of @-@ the @-@ art &quot; .",
        "en": "He said : &quot; This is state @-@ of @-@ the @-@ art . &quot;",
    }[lang]
    lines[126] = {"de": "Zeilemit Steuerzeichen", "en": "linewith controls"}[lang]  # \r gone, U+200B a space
    lines[128] = {"de": "ja .", "en": "yes , well , that is really all ."}[lang]
    return lines


def test_wmt17_train_is_normalized_tokenized_split_and_cleaned_after_bpe(wmt17):
    root, result, _ = wmt17
    out, tmp = root / "out", root / "out" / "tmp"
    pre_bpe = {}
    for lang in ("en", "de"):
        raw = wmt_raw_tokenized(lang)
        assert read(tmp / f"train.tags.en-de.tok.{lang}") == raw
        assert read(tmp / f"valid.{lang}") == [raw[99], raw[199]]
        train = [line for number, line in enumerate(raw, 1) if number % 100]
        assert read(tmp / f"train.{lang}") == train
        pre_bpe["train", lang] = train[:127] + train[128:]  # the 1:8 pair, dropped by clean-corpus-n on BPE
        pre_bpe["valid", lang] = [raw[99], raw[199]]
        pre_bpe["test", lang] = [
            f"newstest2014 {'src en' if lang == 'en' else 'ref de'} &apos; s seg {number}"
            for number in range(1, 5)
        ]
    check_bpe_and_binarized(out, {"train": 247, "valid": 2, "test": 4}, ("en", "de"), pre_bpe)
    step = "[14/19] clean-corpus-n bpe.train ... 247 of 248 pairs kept (ratio 1.5, 1-250 tokens)"
    assert step in result.stdout.splitlines()


def test_sacrebleu_reads_the_cached_test_sets_offline(wmt17):
    _, _, cache = wmt17
    for test_set, field, expected in (
        ("wmt14/full", "ref", [f"newstest2014 ref de ’s seg {number}" for number in range(1, 5)]),
        ("wmt17", "src", [f"newstest2017 src en ’s seg {number}" for number in range(1, 4)]),
    ):
        assert sacrebleu_echo(cache, test_set, "en-de", field) == expected


def test_wmt14_uses_news_commentary_v9(tmp_path_factory):
    archives = functools.partial(write_wmt_archives, news_commentary_versions=("v9",))
    root, result, _ = built_with_sacrebleu_cache(tmp_path_factory, "wmt14", "prepare-wmt14en2de.sh", archives)
    assert read(root / "out" / "tmp" / "train.tags.en-de.tok.en") == wmt_raw_tokenized("en", "ncv9")
    assert "[3/18] unpack training-parallel-nc-v9.tgz ... 2 files" in result.stdout.splitlines()
    assert len(read(root / "out" / "train.de")) == 247


# --- Ding quickstart ------------------------------------------------------------------------------


def test_ding_holds_out_sentences_only_and_builds_the_pipeline(ding):
    root, result = ding
    out, tmp = root / "out", root / "out" / "tmp"
    assert read(tmp / "test.raw.de") == ["Ich lese heute Satz 20.", "Ich lese heute Satz 40."]
    assert read(tmp / "valid.raw.en") == ["Today I read sentence 10.", "Today I read sentence 30."]
    train = list(zip(read(tmp / "train.raw.de"), read(tmp / "train.raw.en")))
    assert train[:3] == [
        ("Noch ist nicht aller Tage Abend.", "It’s not over until it’s over."),
        ("Das Abendessen hat mir geschmeckt.", "I enjoyed my supper."),
        ("Ich lese heute Satz 3.", "Today I read sentence 3."),
    ]
    assert train[37:] == [
        ("Abend", "evening"),
        ("Abendessen", "supper"),
        ("Ablöse", "key money"),
        ("Aal", "eel"),
        ("Aal blau", "eel au bleu"),
        ("Aalsuppe", "a soup made from eels in the northern style"),
        ("Geschmack", "taste"),
        ("Einspruch!", "objection!"),
        ("Satz", "sentence"),
        ("Satzlesen", "reading"),
    ]
    step = "[2/19] extract sentence and phrase pairs ... 41 sentence and 11 phrase pairs: train 47, valid 2, test 2"
    assert step in result.stdout.splitlines()
    assert "[17/19] select the train sentences ... 37 pairs" in result.stdout.splitlines()
    assert read(tmp / "train.de")[:2] == ["noch ist nicht aller tage abend .", "das abendessen hat mir geschmeckt ."]
    assert read(tmp / "train.en")[0] == "it &apos;s not over until it &apos;s over ."  # ’ normalized to '
    assert "aalsuppe" not in read(tmp / "train.de")  # 1 : 9 tokens, over clean-corpus-n's ratio 3
    counts = {"train": 46, "valid": 2, "test": 2}
    pre_bpe = {(split, lang): read(tmp / f"{split}.{lang}") for split in counts for lang in ("de", "en")}
    check_bpe_and_binarized(out, counts, ("de", "en"), pre_bpe)
    # the sentences alone (the 37 train sentences lead train), binarized with data-bin's dictionary
    for lang in ("de", "en"):
        assert read(out / f"train-sentences.{lang}") == read(out / f"train.{lang}")[:37]
        assert binarized(out / "data-bin-sentences", "train", "de-en", lang) == binarized(out / "data-bin", "train", "de-en", lang)[:37]
        for split in ("valid", "test"):
            assert binarized(out / "data-bin-sentences", split, "de-en", lang) == binarized(out / "data-bin", split, "de-en", lang)
        assert read(out / "data-bin-sentences" / f"dict.{lang}.txt") == read(out / "data-bin" / f"dict.{lang}.txt")
    readme = (out / "README").read_text()
    assert "GNU GPL version 2 or later" in readme
    assert "data-bin-sentences/" in readme
    assert "Ding version devel 2023-01-30 from trans-de-en_1.9-6_all.deb" in readme


def test_ding_with_sentencepiece(tmp_path):
    write_ding_deb(tmp_path / "archives")
    flags = ["--archives", tmp_path / "archives", "--output", tmp_path / "out", "--bpe", "sentencepiece"]
    result = run_script("prepare-ding-de-en.sh", *flags, "--bpe-ops", "90")
    assert result.returncode == 0, result.stderr
    out = tmp_path / "out"
    assert (out / "sentencepiece.bpe.model").is_file() and not (out / "code").exists()
    pieces = read(out / "test.de")
    assert all("▁" in line for line in pieces)
    decoded = ["".join(line.split()).replace("▁", " ").strip() for line in pieces]
    assert decoded == read(out / "tmp" / "test.de")
    assert binarized(out / "data-bin", "train", "de-en", "de") == read(out / "train.de")


def test_ding_without_the_package_says_how_to_get_it(tmp_path):
    result = run_script(
        "prepare-ding-de-en.sh", "--archives", tmp_path / "empty", "--output", tmp_path / "out"
    )
    assert result.returncode == 1
    assert "`apt-get download trans-de-en`, or the de-en file it installs as /usr/share/trans/de-en" in result.stderr
    assert "  trans-de-en_<version>_<arch>.deb  (https://packages.debian.org/trans-de-en)" in result.stderr
    assert not (tmp_path / "out").exists()
