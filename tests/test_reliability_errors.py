"""Bad input: one line naming the cause and the file or flag, exit status not 0, no traceback,
and nothing overwritten, through the real CLIs."""

import contextlib
import io
import shutil

import pytest
import torch

from conftest import REPO, USER_DIR, fairseq_cli
from deepnmt_plugin import average_checkpoints, export, reproduce
from tiny_training import checkpoint_of, last_line, train
from tiny_training import one_thread_per_process  # noqa: F401  (autouse fixture)

pytestmark = pytest.mark.slow  # trains, generates or builds corpora through subprocesses

PRELN, ADMIN = "transformer_preln_iwslt_de_en", "transformer_admin_iwslt_de_en"
REBUILD = "rebuild the data directory with fairseq-preprocess (data-prep)"


def refused(result) -> str:
    """The one line a CLI stopped with (after fairseq's log lines, if any)."""
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    return last_line(result.stderr)


def refused_in_process(command) -> str:
    with pytest.raises(SystemExit) as stopped, contextlib.redirect_stdout(io.StringIO()):
        command()
    assert stopped.value.code != 0
    return str(stopped.value)


@pytest.fixture(scope="module")
def preln_checkpoint(build_model, tmp_path_factory):
    """A fairseq checkpoint dict of a tiny Pre-LN model (no training needed to be refused)."""
    model, args = build_model(PRELN, "--encoder-layers", 1, "--decoder-layers", 1)
    return checkpoint_of(model, args)


def test_a_checkpoint_with_a_smuggled_global_stops_training_in_one_line(toy_data, tmp_path):
    marker = tmp_path / "code-ran"

    class Payload:
        def __reduce__(self):
            import os

            return os.system, (f"touch {marker}",)

    torch.save({"model": {}, "args": None, "cfg": Payload()}, tmp_path / "checkpoint_last.pt")
    line = refused(train(toy_data, tmp_path, PRELN, 4, check=False))
    assert line.startswith(f"deepnmt: error: refusing to load checkpoint {tmp_path}/checkpoint_last.pt: it "
                           "references posix.system, which is not one of the types fairseq checkpoints contain")
    assert not marker.exists()


@pytest.mark.parametrize("content, reason", [
    (lambda state: [1, 2, 3],
     "it holds no fairseq checkpoint dict (TypeError: list indices must be integers or slices, not str)"),
    (lambda state: dict(state, model={}), "its 'model' holds no parameters"),
])
def test_a_checkpoint_without_parameters_stops_train_generate_and_export_in_one_line(
        content, reason, preln_checkpoint, toy_data, tmp_path):
    path = tmp_path / "checkpoint_last.pt"
    torch.save(content(preln_checkpoint), path)
    generated = fairseq_cli("fairseq-generate", toy_data, "--user-dir", USER_DIR, "--path", path, "--cpu", check=False)
    for result in (train(toy_data, tmp_path, PRELN, 4, check=False), generated):
        assert refused(result) == f"deepnmt: error: cannot read checkpoint {path}: {reason}"
    exported = refused_in_process(lambda: export.main([str(path), str(tmp_path / "stock.pt")]))
    assert exported.startswith(f"deepnmt: error: cannot read checkpoint {path}: ")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint_last.pt"]


@pytest.mark.parametrize("flag", ["--fp16", "--memory-efficient-fp16"])
def test_fp16_on_the_cpu_is_refused_in_one_line(flag, toy_data, tmp_path):
    line = refused(train(toy_data, tmp_path, PRELN, 4, flag, check=False))
    assert line == f"deepnmt: error: {flag} trains on a GPU; with --cpu, train in fp32 or --bf16 (drop {flag})"


@pytest.mark.parametrize("name, keep, problem", [
    ("train.de-en.en.bin", 0.5, "bin"),
    ("train.de-en.de.idx", 0.5, "idx"),
    ("valid.de-en.de.idx", 0.0, "empty idx"),
])
def test_a_truncated_data_file_is_named_in_one_line(name, keep, problem, toy_data, tmp_path):
    data = shutil.copytree(toy_data, tmp_path / "data-bin")
    truncated = data / name
    size = truncated.stat().st_size
    truncated.write_bytes(truncated.read_bytes()[: int(size * keep)])
    line = refused(train(data, tmp_path / "checkpoints", PRELN, 4, check=False))
    prefix = str(truncated)[: -len(".bin")]
    assert line.startswith(f"deepnmt: error: {truncated} is truncated (") and line.endswith(f"); {REBUILD}")
    if problem == "bin":
        assert f"bytes, {prefix}.idx needs {size})" in line
    elif problem == "idx":
        assert "entries need" in line
    else:
        assert "(0 bytes, shorter than its header)" in line


def test_export_and_average_refuse_a_missing_directory_or_input_and_overwriting_an_input(preln_checkpoint, tmp_path):
    checkpoint, other = tmp_path / "a.pt", tmp_path / "b.pt"
    torch.save(preln_checkpoint, checkpoint)
    torch.save(preln_checkpoint, other)
    before = checkpoint.read_bytes()
    missing_dir = tmp_path / "no" / "out.pt"
    assert refused_in_process(lambda: export.main([str(checkpoint), str(missing_dir)])) == (
        f"deepnmt: error: cannot write {missing_dir}: directory {missing_dir.parent} does not exist")
    average = average_checkpoints.main
    assert refused_in_process(lambda: average(["--inputs", str(checkpoint), str(other), "--output",
                                               str(missing_dir)])) == (
        f"deepnmt: error: cannot write --output {missing_dir}: directory {missing_dir.parent} does not exist")
    assert refused_in_process(lambda: average(["--inputs", str(checkpoint), str(tmp_path / "c.pt"), "--output",
                                               str(tmp_path / "avg.pt")])) == (
        f"deepnmt: error: cannot read checkpoint {tmp_path / 'c.pt'}: no such file")
    assert refused_in_process(lambda: average(["--output", str(checkpoint), "--inputs", str(checkpoint),
                                               str(other)])) == (
        f"deepnmt: error: refusing to overwrite {checkpoint}, one of the checkpoints being averaged; "
        "choose another --output")
    assert checkpoint.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.pt", "b.pt"]


@pytest.mark.parametrize("flags, message", [
    (["--diagnostics-groups", "update,gnrom"],
     "--diagnostics-groups: unknown ['gnrom']; choose from update,gnorm,ln_input,beta,omega"),
    (["--divergence-guard", "--divergence-max-loss", 0], "--divergence-max-loss must be above 0, got 0"),
    (["--divergence-max-loss", 5], "--divergence-max-loss needs --divergence-guard"),
    (["--divergence-guard", "--divergence-overflow-patience", 0],
     "--divergence-overflow-patience must be at least 1, got 0"),
    (["--diagnostics-interval", -1], "--diagnostics-interval must be 0 (off) or positive, got -1"),
])
def test_task_flags_are_refused_in_one_line(flags, message, toy_data, tmp_path):
    result = train(toy_data, tmp_path, ADMIN, 4, *flags, check=False)
    assert refused(result) == f"deepnmt: error: {message}"
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("profile, message", [
    (None, "{path}: no such file"),
    ("1 1.5\n2 x\n", "{path}:2: expected '<index> <value>', got '2 x'"),
    ("1 1.5\n", "{path}: 1 lines, but this model has 4 encoder and 6 decoder sublayers (10 lines expected)"),
])
def test_a_missing_or_malformed_admin_profile_file_is_named_in_one_line(profile, message, toy_data, tmp_path):
    path = tmp_path / "profile.ratio.init"
    if profile is not None:
        path.write_text(profile)
    result = train(toy_data, tmp_path / "checkpoints", ADMIN, 4, "--admin-profile-file", path, check=False)
    assert refused(result) == "deepnmt: error: --admin-profile-file " + message.format(path=path)


NOT_A_DEPTH = "is not a depth: give a layer count (18) or encoder-decoder (60-12)"


@pytest.mark.parametrize("flags, message", [
    (["--depths", "abc"], f"argument --depths: 'abc' {NOT_A_DEPTH}"),
    (["--depths", "6", "0"], f"argument --depths: '0' {NOT_A_DEPTH}"),
    (["--seeds", "1", "-2"], "argument --seeds: '-2' is not a whole number of 0 or more"),
    (["--gpus", "two"], "argument --gpus: 'two' is not a whole number of 0 or more"),
])
def test_reproduce_refuses_bad_depths_and_seeds_in_one_line(flags, message):
    config = str(REPO / "configs" / "admin_iwslt14_de_en.yaml")
    assert refused_in_process(lambda: reproduce.main([config, "--data", "DATA", "--dry-run", *flags])) == (
        f"deepnmt: error: {message}")

