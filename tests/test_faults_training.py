"""Faults around training, through the real entry points: a depth driver's trainer dies with the driver
(kill -9 included) and its rerun trains alone, a cell in training is locked against a second driver, a crashed sweep
run is named and retried instead of recorded, checkpoint writers never share a temporary file, and one line (no
traceback, nothing overwritten) for bad depths, bad Admin profile flags and a resume with other layers."""

import io
import json
import os
import re
import shutil
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from fairseq import checkpoint_utils

from conftest import REPO
from tiny_training import files_in, last_line, train
from tiny_training import one_thread_per_process  # noqa: F401  (autouse fixture)

pytestmark = pytest.mark.slow  # trains, generates or builds corpora through subprocesses

DRIVER = [sys.executable, "-m", "deepnmt_plugin.bench.depth"]
PRELN, ADMIN = "transformer_preln_iwslt_de_en", "transformer_admin_iwslt_de_en"
LONG = 4000  # updates: minutes of training, so a trainer that outlived its driver would still be there
LOADED = re.compile(r"Loaded checkpoint \S+checkpoint_last\.pt \(epoch \d+ @ (\d+) updates\)")


def processes_naming(text: str) -> list:
    """The live processes whose command line holds ``text`` (a zombie's is empty)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and text.encode() in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
        except OSError:  # it ended while listed
            continue
    return found


@pytest.fixture
def no_process_left(tmp_path):
    """Whatever a failing test left running in its tmp_path (a trainer that outlived its driver) is killed after it."""
    yield
    for pid in processes_naming(str(tmp_path)):
        os.kill(pid, signal.SIGKILL)


def start_driver(output: Path, *arguments) -> subprocess.Popen:
    """The depth driver as a user starts it, from the repository root; its output in ``output`` (a pipe nobody reads
    would stop it when full)."""
    with open(output, "w") as out:
        return subprocess.Popen([*DRIVER, *map(str, arguments)], cwd=REPO, stdout=out, stderr=subprocess.STDOUT)


def run_driver(*arguments) -> subprocess.CompletedProcess:
    return subprocess.run([*DRIVER, *map(str, arguments)], cwd=REPO, capture_output=True, text=True, timeout=600)


def wait_for(condition, seconds: float, what: str) -> None:
    deadline = time.time() + seconds
    while not condition():
        if time.time() > deadline:
            raise AssertionError(f"no {what} after {seconds} s")
        time.sleep(0.2)


def text(path: Path) -> str:
    return path.read_text() if path.exists() else ""


def logged_updates(log: str) -> list:
    return [int(update) for update in re.findall(r"\| train_inner \|.*?num_updates=(\d+)", log)]


@pytest.mark.parametrize("stop", [signal.SIGKILL, signal.SIGINT], ids=["kill-9", "ctrl-c"])
def test_a_killed_sweep_takes_its_trainer_along_and_its_rerun_trains_alone(stop, toy_data, tmp_path, no_process_left):
    """Before the fix the trainer trained on after kill -9 of the sweep, into the train.log its rerun wrote too."""
    workdir = tmp_path / "sweep"
    log = workdir / "postln_2L" / "train.log"
    arguments = ["--micro", "--data", toy_data, "--methods", "postln", "--depths", 2, "--workdir", workdir, "--cpu"]
    driver = start_driver(tmp_path / "driver.out", *arguments, "--max-update", LONG)
    wait_for(lambda: "| train_inner |" in text(log), 300, "training")
    driver.send_signal(stop)  # SIGINT: Ctrl-C, which the driver alone gets (its trainer has a process group of its own)
    assert driver.wait(timeout=60) != 0
    if stop == signal.SIGINT:  # one line, not a traceback
        output = (tmp_path / "driver.out").read_text()
        assert "Traceback" not in output and driver.returncode == 130, output[-3000:]
        assert "crashed" not in output, output[-3000:]  # the trainer it killed is no crash
        assert last_line(output) == "deepnmt: stopped by Ctrl-C; the same command resumes where it stopped"
    wait_for(lambda: not processes_naming(str(workdir)), 30, "end of the trainer and its data workers")
    assert not (workdir / "postln_2L" / "result.json").exists()

    rerun = run_driver(*arguments, "--max-update", 20)  # the killed run left no result: no budget is pinned
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert logged_updates(log.read_text()) == list(range(2, 21, 2))  # one trainer wrote it, every update once


def test_a_killed_study_takes_its_trainer_along_and_a_second_study_skips_the_busy_cell(toy_data, tmp_path,
                                                                                       no_process_left):
    """Before the fix a second study on the workdir trained the cell beside the first; killed, the first study's
    trainer trained on, unlogged, and the rerun resumed from the orphan's checkpoint beside it."""
    workdir = tmp_path / "study"
    cell = workdir / "preln_1L-1L"
    arguments = ["--preset", "study-micro", "--data", toy_data, "--methods", "preln", "--depths", 1,
                 "--workdir", workdir, "--cpu"]
    driver = start_driver(tmp_path / "driver.out", *arguments, "--max-update", LONG)
    wait_for(lambda: "Saved checkpoint" in text(cell / "train.log"), 300, "checkpoint")

    second = run_driver(*arguments, "--max-update", LONG)
    assert second.returncode == 1 and "Traceback" not in second.stderr, second.stderr[-3000:]
    assert f"[1/1] preln_1L-1L: busy, another driver (pid {driver.pid}) trains it; skipped" in second.stdout
    assert last_line(second.stderr) == ("deepnmt: error: preln_1L-1L busy in another driver on this --workdir: "
                                        "rerun once it is done")
    assert text(cell / "train.log").count("Preparing to load checkpoint") == 1  # no second trainer

    driver.kill()
    driver.wait(timeout=60)
    wait_for(lambda: not processes_naming(str(workdir)), 30, "end of the trainer and its data workers")
    killed_log = (cell / "train.log").read_text()
    saved = checkpoint_utils.load_checkpoint_to_cpu(str(cell / "checkpoints" / "checkpoint_last.pt"))
    stopped_at = saved["optimizer_history"][-1]["num_updates"]
    started_under = json.loads((cell / "train.json").read_text())  # written as training started, before the kill
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    assert started_under["returncode"] is None and started_under["environments"][0]["commit"] == head

    rerun = run_driver(*arguments, "--max-update", stopped_at + 6)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    resumed = (cell / "train.log").read_text()[len(killed_log):]
    assert [int(update) for update in LOADED.findall(resumed)] == [stopped_at]
    updates = logged_updates(killed_log) + logged_updates(resumed)
    assert sorted(set(updates)) == list(range(2, stopped_at + 7, 2))  # no gap
    record = json.loads((cell / "result.json").read_text())
    assert record["updates"] == stopped_at + 6 and record["environment"] == started_under["environments"][0]


def test_the_lock_dies_with_its_driver(toy_data, tmp_path, no_process_left):
    """A sweep skips the cell another sweep trains, without touching its log; once that one is killed, it trains it."""
    workdir = tmp_path / "sweep"
    log = workdir / "postln_2L" / "train.log"
    arguments = ["--micro", "--data", toy_data, "--methods", "postln", "--depths", 2, "--workdir", workdir, "--cpu"]
    driver = start_driver(tmp_path / "driver.out", *arguments, "--max-update", LONG)
    wait_for(lambda: "| train_inner |" in text(log), 300, "training")
    before = log.read_text()

    second = run_driver(*arguments, "--max-update", 20)
    assert second.returncode == 1 and "Traceback" not in second.stderr, second.stderr[-3000:]
    assert f"[1/1] postln 2L-2L: busy, another driver (pid {driver.pid}) trains it; skipped" in second.stdout
    assert last_line(second.stderr) == ("deepnmt: error: postln_2L busy in another driver on this --workdir: "
                                        "rerun once it is done")
    assert log.read_text().startswith(before)  # the first trainer's log, neither truncated nor written by another

    driver.kill()
    driver.wait(timeout=60)
    rerun = run_driver(*arguments, "--max-update", 20)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert logged_updates(log.read_text()) == list(range(2, 21, 2))


def test_two_writers_of_one_checkpoint_never_share_a_temporary_file(tmp_path, monkeypatch):
    """fairseq saves to ``NAME.tmp`` and renames it: a second trainer saving the same checkpoint meanwhile truncated
    the first's temporary file, renamed it, and the first's rest landed in the renamed file (a torn checkpoint)."""
    path = str(tmp_path / "checkpoint_last.pt")
    save, partials = torch.save, []

    def another_writer_halfway(obj, target, **kwargs):
        """Write half of ``obj``, let another process save the same checkpoint, then write the rest."""
        partials.append(str(target))
        buffer = io.BytesIO()
        save(obj, buffer)
        data = buffer.getvalue()
        with open(target, "wb") as handle:
            handle.write(data[: len(data) // 2])
            handle.flush()
            if len(partials) == 1:
                checkpoint_utils.torch_persistent_save({"model": {"w": torch.zeros(64)}}, path)
            handle.write(data[len(data) // 2:])

    monkeypatch.setattr(torch, "save", another_writer_halfway)
    checkpoint_utils.torch_persistent_save({"model": {"w": torch.ones(64)}}, path)
    monkeypatch.undo()
    first, second = partials
    assert first != second and Path(first).parent == Path(second).parent == tmp_path
    assert torch.load(path)["model"]["w"].tolist() == [1.0] * 64  # whole: the save that ended last
    assert files_in(tmp_path) == ["checkpoint_last.pt"]


def test_a_crashed_sweep_run_is_named_and_retried_not_recorded(toy_data, tmp_path):
    """Before the fix the sweep recorded the crash as a finished 'failed' run, exited 0 and never retried it."""
    data = shutil.copytree(toy_data, tmp_path / "data-bin")
    source = data / "train.de-en.de.bin"  # read by the trainer only: the driver reads the target side
    whole = source.read_bytes()
    source.write_bytes(whole[: len(whole) // 2])
    workdir = tmp_path / "sweep"
    arguments = ["--micro", "--data", data, "--methods", "postln", "--depths", 1, "--workdir", workdir, "--cpu"]
    crashed = run_driver(*arguments)
    assert crashed.returncode == 1 and "Traceback" not in crashed.stderr, crashed.stderr[-3000:]
    assert last_line(crashed.stderr) == ("deepnmt: error: postln_1L crashed (not a divergence): see their train.log, "
                                         "then rerun to retry them")
    assert "is truncated" in (workdir / "postln_1L" / "train.log").read_text()
    assert not (workdir / "postln_1L" / "result.json").exists() and not (workdir / "bench_depth.json").exists()

    source.write_bytes(whole)
    retried = run_driver(*arguments)
    assert retried.returncode == 0, retried.stderr[-3000:]
    assert json.loads((workdir / "postln_1L" / "result.json").read_text())["status"] == "finished"


@pytest.mark.parametrize("depth", ["-3", "0", "12-0"])
def test_depths_below_one_are_refused_in_one_line(depth, toy_data, tmp_path):
    """-3 crashed inside fairseq-train; 0 trained a 0-layer Post-LN model and recorded it as diverged."""
    for preset in (["--micro"], ["--preset", "study-micro"]):
        refused = run_driver(*preset, "--data", toy_data, "--methods", "postln", "--depths", depth,
                             "--workdir", tmp_path / "w", "--cpu")
        assert refused.returncode == 1 and refused.stdout == ""
        assert refused.stderr == ("deepnmt: error: argument --depths: expected N or N-M layers, whole numbers >= 1, "
                                  f"got '{depth}'\n")
    assert not (tmp_path / "w").exists()


def refused(result) -> str:
    """The one line fairseq-train stopped with (after its log lines)."""
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    return last_line(result.stderr)


@pytest.mark.parametrize("flags, message", [
    (["--admin-profile-batches", 0], "--admin-profile-batches must be at least 1, got 0"),
    (["--admin-profile-batches", -1], "--admin-profile-batches must be at least 1, got -1"),
    (["--admin-profile-file", "{binary}"], "--admin-profile-file {binary}: not a text file; expected '<index> <value>' "
                                           "lines"),
])
def test_bad_admin_profile_flags_are_refused_in_one_line(flags, message, toy_data, tmp_path):
    binary = tmp_path / "profile.ratio.init"
    binary.write_bytes(bytes(range(256)) * 4)  # e.g. a checkpoint given by mistake
    save_dir = tmp_path / "checkpoints"
    result = train(toy_data, save_dir, ADMIN, 4, *[str(flag).format(binary=binary) for flag in flags], check=False)
    assert refused(result) == "deepnmt: error: " + message.format(binary=binary)
    assert files_in(save_dir) == []


def test_resuming_with_other_layers_names_both_values_and_overwrites_nothing(toy_data, tmp_path):
    train(toy_data, tmp_path, PRELN, 2)
    before = {name: (tmp_path / name).read_bytes() for name in files_in(tmp_path)}
    result = train(toy_data, tmp_path, PRELN, 4, "--encoder-layers", 3, check=False)
    assert refused(result) == (f"deepnmt: error: cannot resume from {tmp_path}/checkpoint_last.pt: it was trained with "
                               "--encoder-layers 2, not --encoder-layers 3; give the flags it was trained with, or "
                               "another --save-dir")
    assert {name: (tmp_path / name).read_bytes() for name in files_in(tmp_path)} == before


@pytest.mark.parametrize("first, resumed, trained_with, given", [
    # the same parameter names and shapes: fairseq would train on as the other recipe and save it so
    (["--arch", "transformer_deepnorm_iwslt_de_en"], ["--arch", "transformer_b2t_iwslt_de_en"],
     "--arch transformer_deepnorm_iwslt_de_en", "--arch transformer_b2t_iwslt_de_en"),
    (["--arch", "transformer_resi_dual_iwslt_de_en"], ["--arch", "transformer_resi_dual_iwslt_de_en", "--enc-alpha", 0.5],
     "--enc-alpha None", "--enc-alpha 0.5"),
    (["--arch", "transformer_mixln_iwslt_de_en", "--mixln-alpha", 0.5],
     ["--arch", "transformer_mixln_iwslt_de_en", "--mixln-alpha", 0.25], "--mixln-alpha 0.5", "--mixln-alpha 0.25"),
], ids=["arch", "recipe-constant", "mixln-alpha"])
def test_resuming_as_another_model_is_refused_before_anything_is_loaded(first, resumed, trained_with, given, toy_data,
                                                                        tmp_path):
    train(toy_data, tmp_path, first[1], 2, *first[2:])
    before = {name: (tmp_path / name).read_bytes() for name in files_in(tmp_path)}
    result = train(toy_data, tmp_path, resumed[1], 4, *resumed[2:], check=False)
    assert refused(result) == (f"deepnmt: error: cannot resume from {tmp_path}/checkpoint_last.pt: it was trained with "
                               f"{trained_with}, not {given}; give the flags it was trained with, or another --save-dir")
    assert {name: (tmp_path / name).read_bytes() for name in files_in(tmp_path)} == before


def test_resuming_with_other_training_flags_or_a_reset_optimizer_goes_on(toy_data, tmp_path):
    """Dropout, layerdrop, activation checkpointing: the same model; --reset-optimizer: a new training from its weights,
    which may change the model."""
    train(toy_data, tmp_path, "transformer_mixln_iwslt_de_en", 2)
    train(toy_data, tmp_path, "transformer_mixln_iwslt_de_en", 3, "--dropout", 0.3, "--checkpoint-activations")
    train(toy_data, tmp_path, "transformer_mixln_iwslt_de_en", 4, "--mixln-alpha", 0.5, "--reset-optimizer")
    state = torch.load(tmp_path / "checkpoint_last.pt", weights_only=False)
    assert state["optimizer_history"][-1]["num_updates"] == 4 and state["cfg"]["model"].mixln_alpha == 0.5


def test_a_killed_reproduction_driver_takes_its_trainer_along(tmp_path, no_process_left):
    """reproduce.run_logged (every step of the reproduction scripts: fairseq-train, torchrun, generate) owns its child
    as the depth drivers do; here the child is a stand-in that would run for ten minutes."""
    log = tmp_path / "train.log"
    child = f"import time; time.sleep(600)  # {tmp_path}"
    driver = subprocess.Popen([sys.executable, "-c", "import sys; from pathlib import Path; "
                               "from deepnmt_plugin.reproduce import run_logged; "
                               "run_logged([sys.executable, '-c', sys.argv[1]], Path(sys.argv[2]), echo=False)",
                               child, str(log)], cwd=REPO)
    # the driver names tmp_path in its arguments too
    wait_for(lambda: len(processes_naming(str(tmp_path))) == 2, 120, "child")
    driver.kill()
    driver.wait(timeout=60)
    wait_for(lambda: not processes_naming(str(tmp_path)), 30, "end of the child")


def test_a_resumed_reproduction_training_keeps_the_lines_of_the_killed_attempt(tmp_path, no_process_left):
    """The train step's log is written by the trainer itself and appended to: a driver killed mid-training loses none
    of the lines already printed, and the rerun (which resumes from checkpoint_last.pt) adds its own after them, so
    divergence is judged on the whole training."""
    log = tmp_path / "train.log"
    first = f"import time; print('| train_inner | loss=9.1 | num_updates=1', flush=True); time.sleep(600)  # {tmp_path}"
    driver = subprocess.Popen([sys.executable, "-c", "import sys; from pathlib import Path; "
                               "from deepnmt_plugin.reproduce import run_logged; "
                               "run_logged([sys.executable, '-c', sys.argv[1]], Path(sys.argv[2]), echo=True, "
                               "append=True)", first, str(log)], cwd=REPO, stdout=subprocess.DEVNULL)
    wait_for(lambda: log.exists() and "num_updates=1" in log.read_text(), 120, "the first attempt's line")
    driver.kill()
    driver.wait(timeout=60)
    wait_for(lambda: not processes_naming(str(tmp_path)), 30, "end of the child")
    from deepnmt_plugin.reproduce import logged_losses, run_logged

    second = "print('| train_inner | loss=8.0 | num_updates=2')"
    assert run_logged([sys.executable, "-c", second], log, echo=False, append=True) == 0
    assert logged_losses(log.read_text()) == [9.1, 8.0]


def test_a_driver_whose_reader_closes_its_output_stops_in_one_line(tmp_path):
    """``driver | head -1``: the drivers (study, sweep, reproduction) end with one line, not a BrokenPipeError
    traceback, and the shell's status for SIGPIPE."""
    driver = ("import sys; from deepnmt_plugin.processes import stop_on_ctrl_c\n"
              "def main():\n    for _ in range(10 ** 6):\n        print('| train_inner | loss=9.1', flush=True)\n"
              "    return 0\nsys.exit(stop_on_ctrl_c(main))")
    result = subprocess.run(f"{shlex.quote(sys.executable)} -c {shlex.quote(driver)} | head -1; "
                            "echo \"status ${PIPESTATUS[0]}\" >&2", shell=True, executable="/bin/bash", cwd=REPO,
                            capture_output=True, text=True, timeout=120)
    assert result.stdout == "| train_inner | loss=9.1\n"
    assert result.stderr.splitlines() == [
        "deepnmt: stopped: the reader of its output closed it (| head?); the same command resumes where it stopped",
        "status 141"]
