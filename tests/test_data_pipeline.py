"""Resumable steps, archive unpacking and the Ding extraction rules, in-process."""

import functools

import pytest

from data_fixtures import ding_dictionary, write_ding_deb, write_tarball
from deepnmt_plugin.data import ding, moses
from deepnmt_plugin.data.archives import unpack_members
from deepnmt_plugin.data.pipeline import DataPrepError, Step, parallel_map, read_lines, run_steps, write_lines
from deepnmt_plugin.data.recipes import Options


def writing(text, calls):
    def make(path):
        calls.append(path.name)
        path.write_text(text)
        return f"wrote {text!r}"

    return make


def test_a_finished_step_is_skipped_and_says_so(tmp_path, capsys):
    calls = []
    steps = [Step("write a", [tmp_path / "a"], writing("1", calls))]
    run_steps(steps, tmp_path / "done")
    run_steps(steps, tmp_path / "done")
    assert calls == ["a.partial"]
    assert capsys.readouterr().out.splitlines() == [
        "[1/1] write a ... wrote '1'",
        "[1/1] write a: done before, wrote '1'",
    ]


def test_a_failed_step_leaves_no_partial_file_no_marker_and_the_old_output(tmp_path, capsys):
    (tmp_path / "a").write_text("old")

    def fail(path):
        path.write_text("half")
        raise RuntimeError("interrupted")

    with pytest.raises(RuntimeError):
        run_steps([Step("write a", [tmp_path / "a"], fail)], tmp_path / "done")
    assert sorted(path.name for path in tmp_path.iterdir()) == ["a", "done"]
    assert (tmp_path / "a").read_text() == "old" and not any((tmp_path / "done").iterdir())
    assert capsys.readouterr().out == "[1/1] write a ... failed\n"


def test_a_step_interrupted_before_its_marker_is_redone(tmp_path):
    calls = []
    (tmp_path / "a").write_text("stale")  # renamed into place, then the run died
    (tmp_path / "a.partial").write_text("half")
    run_steps([Step("write a", [tmp_path / "a"], writing("1", calls))], tmp_path / "done")
    assert calls == ["a.partial"] and (tmp_path / "a").read_text() == "1"
    assert not (tmp_path / "a.partial").exists()


def test_lines_split_on_newline_only_as_perl_reads_them(tmp_path):
    assert write_lines(tmp_path / "t", ["a\rb", "c\u2028d", ""]) == 3
    assert list(read_lines(tmp_path / "t")) == ["a\rb", "c\u2028d", ""]


def test_unpack_names_a_corrupt_or_wrong_archive(tmp_path):
    (tmp_path / "bad.tgz").write_bytes(b"\x1f\x8b not really gzip")
    with pytest.raises(DataPrepError, match=r"bad\.tgz is corrupt or not a tar archive"):
        unpack_members(tmp_path / "bad.tgz", ["x"], [tmp_path / "x"])
    write_tarball(tmp_path / "other.tgz", {"other/file": "text\n"})
    with pytest.raises(DataPrepError, match=r"other\.tgz lacks de-en/a, de-en/b: not the archive"):
        unpack_members(tmp_path / "other.tgz", ["de-en/a", "de-en/b"], [tmp_path / "a", tmp_path / "b"])
    write_tarball(tmp_path / "good.tgz", {"./de-en/a": "text\n", "de-en/b": "more\n"})
    assert unpack_members(tmp_path / "good.tgz", ["de-en/a"], [tmp_path / "a"]) == "1 files"
    assert (tmp_path / "a").read_text() == "text\n"


def test_first_alternative_drops_annotations():
    assert (
        ding.first_alternative("Ablöse {f} /Abl./; Abstandszahlung {f} (Mietobjekt) <Ablösebetrag>")
        == "Ablöse"
    )
    assert ding.first_alternative("Aal {m} (auf der Speisekarte (bes. Restaurant; Bistro)) [cook.]") == "Aal"
    assert ding.first_alternative("er/sie hat/hatte verschenkt") == "er/sie hat/hatte verschenkt"
    assert (
        ding.first_alternative("Noch ist nicht aller Tage Abend.; Man soll den Tag nicht loben.")
        == "Noch ist nicht aller Tage Abend."
    )
    assert ding.first_alternative("{n} [ugs.]") == ""


def test_sentences_start_upper_case_and_end_in_sentence_punctuation():
    assert [
        ding.is_sentence(text) for text in ("Oh!", "Kommst du?", "„Ja.“ sagte er.", "Er sagte „Ja.“")
    ] == [True, True, False, True]
    assert [ding.is_sentence(text) for text in ("objection!", "Aal", "4% der Leute.", "Ablauf …")] == [
        False,
        False,
        False,
        True,
    ]


def test_the_dictionary_comes_from_the_deb_or_the_extracted_file(tmp_path):
    options = Options(tmp_path / "out", tmp_path / "archives", "subword-nmt", 10, 1, True, False)
    write_ding_deb(options.archives)
    assert (
        ding.read_deb_member(ding.find_dictionary(options.archives), ding.DICTIONARY_MEMBER).decode()
        == ding_dictionary()
    )
    (options.archives / "de-en").write_text("# Version :: 2.0\nA :: B\n")
    assert ding.unpack_dictionary(options, tmp_path / "de-en") == "Ding version 2.0 from de-en"
    (tmp_path / "broken_1_all.deb").write_bytes(
        b"!<arch>\ndata.tar.xz     0           0     0     100644  4         `\nxxxx"
    )
    with pytest.raises(DataPrepError, match=r"broken_1_all\.deb is corrupt or not a \.deb"):
        ding.read_deb_member(tmp_path / "broken_1_all.deb", ding.DICTIONARY_MEMBER)


def test_split_pairs_holds_out_every_20th_sentence_and_keeps_their_german_out_of_train():
    entries = [
        f"Satz {{m}} | Ich lese Satz {number}. :: sentence | I read sentence {number}."
        for number in range(1, 41)
    ]
    entries += ["Lesen | Ich lese Satz 20. :: reading | i read sentence 20", "a | b :: x", "# comment :: x"]
    splits, sentences, phrases = ding.split_pairs(entries)
    assert (sentences, phrases) == (40, 3)  # ("Satz", "sentence") once, "Lesen", the held-out German
    assert splits["test"] == [
        ("Ich lese Satz 20.", "I read sentence 20."),
        ("Ich lese Satz 40.", "I read sentence 40."),
    ]
    assert splits["valid"] == [
        ("Ich lese Satz 10.", "I read sentence 10."),
        ("Ich lese Satz 30.", "I read sentence 30."),
    ]
    assert (
        len(splits["train"]) == 36 + 2 and ("Ich lese Satz 20.", "i read sentence 20") not in splits["train"]
    )
    assert splits["train"][-2:] == [("Satz", "sentence"), ("Lesen", "reading")]


def test_parallel_map_keeps_the_order(tmp_path):
    lines = [f"Satz {number}, oder?" for number in range(2500)]
    tokenized = list(parallel_map(functools.partial(moses.tokenize, lang="de"), lines, workers=2))
    assert tokenized == [f"Satz {number} , oder ?" for number in range(2500)]


def test_train_sentence_count_follows_clean_corpus_n(tmp_path):
    """The cleaned train's leading sentences: a sentence clean-corpus-n dropped is not counted, and a
    phrase that ends like a sentence is not taken for one."""
    raw = [("Ich gehe.", "I go."), ("Sehr langer Satz hier.", "Long."), ("Du kommst.", "You come."), ("Einspruch!", "objection!")]
    tokenized = [("ich gehe .", "i go ."), ("sehr langer satz hier .", "long ."), ("du kommst .", "you come ."),
                 ("einspruch !", "objection !")]
    cleaned = [tokenized[0], tokenized[2], tokenized[3]]  # the 4 : 2 pair dropped
    for name, pairs in (("train.raw", raw), ("train.tok", tokenized), ("train", cleaned)):
        for side, lang in enumerate(("de", "en")):
            (tmp_path / f"{name}.{lang}").write_text("".join(pair[side] + "\n" for pair in pairs))
    assert ding.train_sentence_count(tmp_path) == 2
