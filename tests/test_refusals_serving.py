"""Serving and scoring under adversarial input: translate, export, scoring and averaging refuse what they
cannot do as asked in one line (exit status 1, nothing written or deleted) instead of cutting, dropping, replacing or
failing in a traceback."""

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import ctranslate2
import pytest
import torch
from fairseq.data import Dictionary

from conftest import FORK_SERVER, TINY_DIMS
from deepnmt_plugin import average_checkpoints, compat, export, scoring, translate
from tiny_training import checkpoint_of, files_in
from tiny_training import one_thread_per_process  # noqa: F401  (autouse fixture)

pytestmark = pytest.mark.slow  # trains, generates or builds corpora through subprocesses

SOURCE_POSITIONS = 1030  # more than the 1,024 tokens CTranslate2 cuts every input to by default
LONGEST = SOURCE_POSITIONS - 1  # </s> takes a position


def refused(result) -> str:
    """The one line a CLI stopped with: all of its stderr, exit status 1."""
    stderr = result.stderr.decode() if isinstance(result.stderr, bytes) else result.stderr
    assert result.returncode == 1 and len(stderr.splitlines()) == 1, stderr[-3000:]
    return stderr.strip()


def refused_in_process(command) -> str:
    """The line a main(argv) stopped with: a SystemExit carrying a message exits with status 1, printing it."""
    with pytest.raises(SystemExit) as stopped:
        command()
    assert isinstance(stopped.value.code, str)
    return stopped.value.code


def run(module, *args, stdin=b"", cwd=None):
    return FORK_SERVER.run([sys.executable, "-m", f"deepnmt_plugin.{module}", *args], input=stdin, cwd=cwd,
                           timeout=600, text=False)


def words(count: int) -> bytes:
    """A line of ``count`` toy words, each one subword."""
    return " ".join((["haus", "katze", "rot"] * count)[:count]).encode()


@pytest.fixture(scope="module")
def checkpoint(build_model, tmp_path_factory):
    """An untrained Pre-LN model (refusals need no training) with SOURCE_POSITIONS source and 16 target positions."""
    model, args = build_model("transformer_preln_iwslt_de_en", *TINY_DIMS, "--encoder-layers", 1,
                              "--decoder-layers", 1, "--max-source-positions", SOURCE_POSITIONS,
                              "--max-target-positions", 16)
    path = tmp_path_factory.mktemp("model") / "model.pt"
    torch.save(checkpoint_of(model, args), path)
    return path


@pytest.fixture(scope="module")
def model_dir(checkpoint):
    """Its CTranslate2 export (the toy data has no data-prep beside it: translate takes its tokens as they are)."""
    directory = checkpoint.parent / "ct2"
    export.export_ctranslate2(str(checkpoint), str(directory))
    return directory


def test_translate_refuses_a_line_longer_than_the_models_source_positions(model_dir):
    """The limit is the model's, recorded at export, not CTranslate2's default cut: a line of LONGEST subwords is
    translated (whole), one more is refused by its number, before anything of its buffer is written."""
    assert json.loads((model_dir / "text_processing.json").read_text())["max_source_positions"] == SOURCE_POSITIONS
    lines = b"haus\n" + words(LONGEST) + b"\n" + words(LONGEST + 1) + b"\n"
    message = (f"deepnmt: error: input line 3 is {LONGEST + 1} subwords long; the model takes at most {LONGEST} "
               f"({SOURCE_POSITIONS} source positions, one for </s>)")
    result = run("translate", "--model", model_dir, "--threads", 1, stdin=lines)
    assert refused(result) == message and result.stdout == b""
    # a buffer of two: lines 1 and 2 are translated and written, line 3 is still named by its number in the input
    result = run("translate", "--model", model_dir, "--threads", 1, "--buffer-size", 2, stdin=lines)
    assert refused(result) == message and len(result.stdout.decode().split("\n")) == 3


@pytest.mark.parametrize("damage, message", [
    ("model.bin", "CTranslate2 cannot load {model}: "),
    ("shared_vocabulary.json", "CTranslate2 cannot load {model}: "),
    ("text_processing.json", "{model}/text_processing.json is damaged ("),
])
def test_translate_refuses_a_damaged_model_directory_in_one_line(damage, message, model_dir, tmp_path):
    """A file missing (model.bin, the vocabulary) or cut short (the text steps): one line, not a traceback."""
    model = tmp_path / "model"
    shutil.copytree(model_dir, model)
    vocabularies = sorted(path.name for path in model.glob("*vocabulary*"))
    if damage == "text_processing.json":
        (model / damage).write_text((model / damage).read_text()[:20])
    else:
        for name in vocabularies if "vocabulary" in damage else [damage]:
            (model / name).unlink()
    line = refused(run("translate", "--model", model, "--threads", 1, stdin=b"haus\n"))
    assert line.startswith("deepnmt: error: " + message.format(model=model)) and line.endswith("export the model again")


def test_translate_whose_reader_closes_its_output_stops_in_one_line(model_dir):
    result = subprocess.run(["bash", "-c", f"{shlex.quote(sys.executable)} -m deepnmt_plugin.translate --model "
                             f"{shlex.quote(str(model_dir))} --threads 1 --buffer-size 1 | head -1; "
                             "echo \"status ${PIPESTATUS[0]}\" >&2"],
                            input=b"haus\n" * 5000, capture_output=True, timeout=600)
    assert len(result.stdout.splitlines()) == 1
    assert result.stderr.decode().splitlines() == [
        "deepnmt: error: stopped: the reader of the translations closed them (| head?)", "status 1"]


def test_translate_refuses_a_line_that_is_not_utf8(model_dir):
    result = run("translate", "--model", model_dir, "--threads", 1, stdin=b"haus\nSchlie\xdfen\n")
    assert refused(result) == ("deepnmt: error: input line 2 is not UTF-8 (its byte 7 is 0xdf); convert the input "
                               "first, e.g. iconv -f latin1 -t utf-8")
    assert result.stdout == b""


@pytest.mark.parametrize("flags, message", [
    (["--beam", "0"], "--beam must be at least 1, got 0"),
    (["--batch-size", "0"], "--batch-size must be at least 1, got 0"),
    (["--buffer-size", "0"], "--buffer-size must be at least 1, got 0"),
    (["--threads", "0"], "--threads must be at least 1, got 0"),
    (["--device", "cuda"], "--device cuda: CTranslate2 finds no CUDA device; use --device cpu or auto"),
    (["--max-len-a", "0", "--max-len-b", "0"], "--max-len-a 0 --max-len-b 0: the limit a * source length + b must be "
                                               "at least 1 target token, with a and b finite and not negative"),
    (["--max-len-b", "-1"], "--max-len-a 1.2 --max-len-b -1: the limit a * source length + b must be at least 1 "
                            "target token, with a and b finite and not negative"),
    (["--max-len-a", "nan"], "--max-len-a nan --max-len-b 10: the limit a * source length + b must be at least 1 "
                             "target token, with a and b finite and not negative"),
])
def test_translate_refuses_a_bad_flag_in_one_line(flags, message, model_dir, capsys):
    if "cuda" in flags and ctranslate2.get_cuda_device_count():
        pytest.skip("this machine has a CUDA device")
    line = refused_in_process(lambda: translate.main(["--model", str(model_dir), *flags]))
    assert line == f"deepnmt: error: {message}"
    assert capsys.readouterr().out == ""


def contents(directory) -> dict:
    return {name: (directory / name).read_bytes() for name in files_in(directory)}


class Killed(BaseException):
    """The process ends here (kill -9, power loss): nothing after it runs."""


def test_reexport_keeps_other_files_and_replaces_an_earlier_export_by_renaming_it_aside(checkpoint, tmp_path,
                                                                                         monkeypatch):
    out = tmp_path / "ct2"
    export.export_ctranslate2(str(checkpoint), str(out))
    earlier = contents(out)
    (out / "notes.txt").write_text("my notes")
    (out / "backup").mkdir()
    (out / "backup" / "model.bin").write_bytes(earlier["model.bin"])
    reexport = [str(checkpoint), str(out), "--format", "ctranslate2", "--quantization", "int8"]
    assert refused_in_process(lambda: export.main(reexport)) == (
        f"deepnmt: error: {out} holds files an export does not write (backup, notes.txt), which replacing it would "
        "delete: move them out or choose a new OUT_DIR")
    assert files_in(tmp_path) == ["ct2"] and files_in(out) == sorted([*earlier, "backup", "notes.txt"])
    assert (out / "notes.txt").read_text() == "my notes"
    assert contents(out / "backup") == {"model.bin": earlier["model.bin"]}

    (out / "notes.txt").unlink()
    shutil.rmtree(out / "backup")
    rename = os.rename

    def killed_before_the_new_export_is_in(source, target):
        if Path(source).name.startswith(".ct2.partial-"):
            raise Killed
        rename(source, target)

    with monkeypatch.context() as patch:  # between the renames: each export whole, in a folder of the call's own
        patch.setattr(os, "rename", killed_before_the_new_export_is_in)
        with pytest.raises(Killed):
            export.main(reexport)
    partial, = tmp_path.glob(".ct2.partial-*")
    aside, = tmp_path.glob(".ct2.replaced-*")
    assert sorted(files_in(tmp_path)) == sorted([partial.name, aside.name])
    assert contents(aside / "ct2") == earlier and files_in(partial) == sorted(earlier)

    export.main(reexport)  # the next export writes anew; what the crash left is the user's to look at
    assert sorted(files_in(tmp_path)) == sorted(["ct2", partial.name, aside.name]) and files_in(out) == sorted(earlier)
    assert (out / "model.bin").read_bytes() != earlier["model.bin"]  # int8 now
    assert contents(aside / "ct2") == earlier


def test_ctranslate2_export_leaves_folders_beside_it_alone(checkpoint, tmp_path):
    """OUT.partial and OUT.replaced are names a user may have chosen: an export (first or again) never touches them."""
    out = tmp_path / "ct2"
    for name in ("ct2.partial", "ct2.replaced"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "mine.txt").write_text(name)
    export.main([str(checkpoint), str(out), "--format", "ctranslate2"])
    export.main([str(checkpoint), str(out), "--format", "ctranslate2", "--quantization", "int8"])
    assert files_in(tmp_path) == ["ct2", "ct2.partial", "ct2.replaced"]
    for name in ("ct2.partial", "ct2.replaced"):
        assert files_in(tmp_path / name) == ["mine.txt"] and (tmp_path / name / "mine.txt").read_text() == name
    assert oct(out.stat().st_mode & 0o777) == oct(0o777 & ~current_umask())  # the folder as any the user makes


def current_umask() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return umask


def test_export_refuses_a_directory_as_the_checkpoint_to_write(checkpoint, tmp_path):
    result = run("export", checkpoint, ".", cwd=tmp_path)
    assert refused(result) == "deepnmt: error: cannot write .: it is a directory; name the checkpoint file to write"
    (tmp_path / "exported").mkdir()
    assert refused_in_process(lambda: export.main([str(checkpoint), str(tmp_path / "exported")])) == (
        f"deepnmt: error: cannot write {tmp_path / 'exported'}: it is a directory; name the checkpoint file to write")
    assert files_in(tmp_path) == ["exported"] and files_in(tmp_path / "exported") == []


def test_both_export_formats_refuse_a_missing_parent_folder(checkpoint, tmp_path):
    target = tmp_path / "missing" / "out"
    for flags in ([], ["--format", "ctranslate2"]):
        assert refused_in_process(lambda: export.main([str(checkpoint), str(target), *flags])) == (
            f"deepnmt: error: cannot write {target}: directory {tmp_path / 'missing'} does not exist")
    assert files_in(tmp_path) == []


def test_export_data_holding_only_the_dictionaries(checkpoint, toy_data, tmp_path):
    """fairseq-train finds the languages in the names of the binarized files and records them nowhere (unless given
    --source-lang/--target-lang): the dictionaries alone do not say which one is the source."""
    dictionaries = tmp_path / "dictionaries"
    dictionaries.mkdir()
    for language in ("de", "en"):
        shutil.copy(toy_data / f"dict.{language}.txt", dictionaries)
    out = tmp_path / "ct2"
    convert = ["--format", "ctranslate2", "--data", str(dictionaries)]
    assert refused_in_process(lambda: export.main([str(checkpoint), str(out), *convert])) == (
        f"deepnmt: error: cannot tell the translation direction: {dictionaries}, given with --data, holds no "
        f"binarized data (such as train.de-en.de.idx) and {checkpoint} records no --source-lang/--target-lang; name "
        "the fairseq-preprocess output folder with --data DIR")
    assert files_in(tmp_path) == ["dictionaries"]

    state = compat.read_checkpoint(str(checkpoint))
    state["cfg"]["task"].update(source_lang="de", target_lang="en")
    recorded = tmp_path / "recorded.pt"
    torch.save(state, recorded)
    export.main([str(recorded), str(out), *convert])
    steps = json.loads((out / "text_processing.json").read_text())
    assert (steps["source_lang"], steps["target_lang"]) == ("de", "en")

    exported = contents(out)
    rows = len(Dictionary.load(str(dictionaries / "dict.de.txt")))
    with open(dictionaries / "dict.de.txt", "a") as dictionary:
        dictionary.write("zusatz 1\n")
    assert refused_in_process(lambda: export.main([str(recorded), str(out), *convert])) == (
        f"deepnmt: error: {dictionaries / 'dict.de.txt'} has {rows + 1} entries but {recorded}'s encoder embeddings "
        f"have {rows} rows: name the folder of the dictionaries the model was trained with in --data DIR")
    assert contents(out) == exported and files_in(tmp_path) == ["ct2", "dictionaries", "recorded.pt"]


@pytest.fixture(scope="module")
def references(toy_data):
    return (toy_data.parent / "raw" / "test.en").read_text().splitlines()


def generate_output(references, hypotheses) -> str:
    """fairseq-generate's lines for each sentence: S, T, H, D, P (five a sentence)."""
    return "".join(f"S-{i}\tsource\nT-{i}\t{reference}\nH-{i}\t-0.5\t{hypothesis}\nD-{i}\t-0.5\t{hypothesis}\n"
                   f"P-{i}\t-0.5\n" for i, (reference, hypothesis) in enumerate(zip(references, hypotheses)))


def test_scoring_refuses_a_sentence_id_twice(references, tmp_path):
    """A second run appended used to replace the first: scored, exit 0, with the second run's BLEU."""
    generated = tmp_path / "generate.txt"
    generated.write_text(generate_output(references, references))
    scored = run("scoring", generated, "--target-lang", "en")
    assert scored.returncode == 0 and b"bleu_tokenized\t100.0" in scored.stdout

    with open(generated, "a") as appended:
        appended.write(generate_output(references, ["haus_en"] * len(references)))
    result = run("scoring", generated, "--target-lang", "en", "--json", tmp_path / "scores.json")
    assert refused(result) == (f"deepnmt: error: {generated}, line {5 * len(references) + 2}: a second T-0 (a second "
                               "fairseq-generate run appended, or --nbest above 1?); score each run's output on its "
                               "own, with --nbest 1")
    assert result.stdout == b"" and files_in(tmp_path) == ["generate.txt"]


def test_scoring_takes_the_source_language_from_the_data(references, toy_data, tmp_path, capsys):
    """--source-lang has no default (it was en, wrong for an English target): --data-bin's file names give it."""
    generated = tmp_path / "generate.txt"
    generated.write_text(generate_output(references, references))
    scoring.main([str(generated), "--target-lang", "en", "--data-bin", str(toy_data), "--json",
                  str(tmp_path / "scores.json")])
    assert json.loads((tmp_path / "scores.json").read_text())["sentences"] == len(references)
    assert refused_in_process(lambda: scoring.main([str(generated), "--target-lang", "en", "--sacrebleu-test-set",
                                                    "wmt14"])) == (
        "deepnmt: error: --sacrebleu-test-set needs the language pair: give --source-lang, or --data-bin")


@pytest.mark.parametrize("case", ["missing file", "malformed id", "not UTF-8", "json into a missing folder",
                                  "json onto a folder"])
def test_scoring_refuses_bad_input_in_one_line(case, references, tmp_path, capsys):
    generated, scores = tmp_path / "generate.txt", tmp_path / "scores.json"
    text = generate_output(references, references)
    if case == "malformed id":
        text = text.replace("H-12\t", "H-12x\t")
    if case == "not UTF-8":  # Latin-1
        text = text.replace(f"T-7\t{references[7]}\n", "T-7\tSchlie\xdfen\n")
    generated.write_bytes(text.encode("latin-1"))
    if case == "missing file":
        generated.unlink()
    if case == "json into a missing folder":
        scores = tmp_path / "missing" / "scores.json"
    if case == "json onto a folder":
        scores.mkdir()
    message = {
        "missing file": f"cannot read {generated}: No such file or directory",
        "malformed id": f"{generated}, line 63: H-12x is not a fairseq-generate sentence id",
        "not UTF-8": f"{generated}, line 37: not UTF-8 (its byte 11 is 0xdf)",
        "json into a missing folder": f"cannot write --json {scores}: directory {tmp_path / 'missing'} does not exist",
        "json onto a folder": f"cannot write --json {scores}: it is a directory; name a file",
    }[case]
    before = files_in(tmp_path)
    assert refused_in_process(lambda: scoring.main([str(generated), "--target-lang", "en", "--json", str(scores)])) == (
        f"deepnmt: error: {message}")
    assert files_in(tmp_path) == before and capsys.readouterr().out == ""


@pytest.mark.parametrize("flag", ["--num-update-checkpoints", "--num-epoch-checkpoints"])
def test_average_refuses_averaging_no_checkpoints(flag, tmp_path):
    output = tmp_path / "averaged.pt"
    assert refused_in_process(lambda: average_checkpoints.main(["--inputs", str(tmp_path), flag, "0", "--output",
                                                                str(output)])) == (
        f"deepnmt: error: {flag} must be at least 1, got 0")
    assert files_in(tmp_path) == []


@pytest.mark.parametrize("name", ["checkpoint_last.pt", "checkpoint_best.pt", "checkpoint3.pt", "checkpoint_2_40.pt"])
def test_average_refuses_to_write_over_a_trainings_checkpoints(name, checkpoint, tmp_path):
    """checkpoint_last.pt is where fairseq-train resumes; the others where it resumes when that one is unreadable."""
    for saved in ("checkpoint1.pt", "checkpoint2.pt", name):
        shutil.copy(checkpoint, tmp_path / saved)
    saved = contents(tmp_path)
    output = tmp_path / name
    inputs = ["--inputs", str(tmp_path / "checkpoint1.pt"), str(tmp_path / "checkpoint2.pt")]
    assert refused_in_process(lambda: average_checkpoints.main([*inputs, "--output", str(output)])) == (
        f"deepnmt: error: refusing to write --output {output}: fairseq-train saves and resumes from checkpoints of "
        "that name; choose another name, e.g. checkpoint_averaged.pt")
    assert contents(tmp_path) == saved
    average_checkpoints.main([*inputs, "--output", str(tmp_path / "checkpoint_averaged.pt")])
    assert files_in(tmp_path) == sorted([*saved, "checkpoint_averaged.pt"])
