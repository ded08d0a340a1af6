"""Checkpoints: every file in --save-dir appears atomically, an unreadable checkpoint_last.pt falls
back to the newest intact checkpoint, and resuming repeats the uninterrupted run update for update, at an
epoch boundary and mid-epoch, dropout on (the setup that found the fault: Pre-LN, inverse_sqrt with 10 warmup updates,
seed 7, 500 tokens a batch: 32 updates an epoch on the toy corpus)."""

import contextlib
import os
import re
import shutil
import sys

import pytest
import torch
from fairseq import checkpoint_utils, optim, options
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from fairseq.file_io import PathManager

from conftest import FORK_SERVER, TINY_DIMS, USER_DIR, fairseq_cli
from tiny_training import last_line
from tiny_training import one_thread_per_process  # noqa: F401  (autouse fixture)

pytestmark = pytest.mark.slow  # trains, generates or builds corpora through subprocesses

EPOCH, END = 32, 44  # updates per epoch; the straight run saves every 4 updates up to END
ISSUE_SETUP = [
    "--user-dir", USER_DIR, "--arch", "transformer_preln", "--cpu", *TINY_DIMS, "--encoder-layers", 2,
    "--decoder-layers", 2, "--share-all-embeddings", "--dropout", 0.1, "--optimizer", "adam",
    "--adam-betas", "(0.9, 0.98)", "--lr", "2e-3", "--lr-scheduler", "inverse_sqrt", "--warmup-updates", 10,
    "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", 0.1, "--max-tokens", 500, "--seed", 7,
    "--max-update", END, "--save-interval-updates", 4, "--log-format", "simple", "--log-interval", 1,
]
# Kills fairseq-train (SIGKILL) halfway through its second copy to checkpoint_last.pt, the write a report
# saw torn; stock fairseq copies with shutil.copyfile straight into checkpoint_last.pt.
KILLED_DURING_COPY = """
import os, shutil, signal, sys
from fairseq_cli.train import cli_main

copyfile, copies = shutil.copyfile, []

def killed_halfway(source, target, **kwargs):
    if os.path.basename(target).startswith("checkpoint_last"):
        copies.append(target)
        if len(copies) == 2:
            with open(source, "rb") as whole, open(target, "wb") as torn:
                torn.write(whole.read()[: os.path.getsize(source) // 2])
            os.kill(os.getpid(), signal.SIGKILL)
    return copyfile(source, target, **kwargs)

shutil.copyfile = killed_halfway
sys.argv = ["fairseq-train", *sys.argv[1:]]
cli_main()
"""


def train(data, save_dir, check=True):
    """fairseq-train in that setup; returns the process, its log (fairseq logs to stdout) in ``.log``."""
    result = fairseq_cli("fairseq-train", data, *ISSUE_SETUP, "--save-dir", save_dir, check=check)
    result.log = result.stdout + result.stderr
    return result


def losses(log: str) -> dict:
    """update -> the train_inner loss logged for it (one update per line: --log-interval 1)."""
    return {int(u): float(l) for l, u in re.findall(r"\| train_inner \|.* loss=([\d.]+),.* num_updates=(\d+),", log)}


def load(path):
    return checkpoint_utils.load_checkpoint_to_cpu(str(path))


def assert_same_training_state(expected_path, found_path):
    expected, found = load(expected_path), load(found_path)
    assert found["optimizer_history"][-1]["num_updates"] == END
    for name, tensor in expected["model"].items():
        assert torch.equal(tensor, found["model"][name]), name
    moments = zip(expected["last_optimizer_state"]["state"].values(), found["last_optimizer_state"]["state"].values())
    for e, f in moments:
        assert torch.equal(e["exp_avg"], f["exp_avg"]) and torch.equal(e["exp_avg_sq"], f["exp_avg_sq"])
    assert expected["extra_state"]["train_iterator"] == found["extra_state"]["train_iterator"]


@pytest.fixture(scope="module")
def straight(toy_data, tmp_path_factory):
    save_dir = tmp_path_factory.mktemp("straight")
    result = train(toy_data, save_dir)
    return save_dir, losses(result.log)


@pytest.mark.parametrize("checkpoint, where", [
    ("checkpoint1.pt", "the epoch boundary (update 32: epoch 2 builds its iterator)"),
    ("checkpoint_2_40.pt", "mid-epoch 2"),
    ("checkpoint_1_20.pt", "mid-epoch 1, crossing into epoch 2"),
])
def test_resume_repeats_the_uninterrupted_run_update_for_update(checkpoint, where, straight, toy_data, tmp_path):
    """Before the fix, resuming in epoch 2 built the reused batches with numpy seed ``seed + 2`` instead of the
    straight run's ``seed + 1``: update 33's loss was 4.591 against 4.599 straight through."""
    straight_dir, straight_losses = straight
    shutil.copy(straight_dir / checkpoint, tmp_path / "checkpoint_last.pt")
    resumed_at = load(tmp_path / "checkpoint_last.pt")["optimizer_history"][-1]["num_updates"]
    resumed_losses = losses(train(toy_data, tmp_path).log)
    assert sorted(resumed_losses) == list(range(resumed_at + 1, END + 1)), where
    assert resumed_losses == {u: straight_losses[u] for u in resumed_losses}, where
    assert_same_training_state(straight_dir / "checkpoint_last.pt", tmp_path / "checkpoint_last.pt")


def test_a_kill_while_copying_to_checkpoint_last_leaves_the_previous_one(straight, toy_data, tmp_path):
    killed = FORK_SERVER.run([sys.executable, "-c", KILLED_DURING_COPY, toy_data, *ISSUE_SETUP, "--save-dir", tmp_path],
                             timeout=900)
    assert killed.returncode == -9, killed.stderr[-2000:]
    assert load(tmp_path / "checkpoint_last.pt")["optimizer_history"][-1]["num_updates"] == 4  # not torn
    assert load(tmp_path / "checkpoint_1_8.pt")["optimizer_history"][-1]["num_updates"] == 8

    resumed = train(toy_data, tmp_path)
    assert f"Loaded checkpoint {tmp_path}/checkpoint_last.pt (epoch 1 @ 4 updates)" in resumed.log
    assert_same_training_state(straight[0] / "checkpoint_last.pt", tmp_path / "checkpoint_last.pt")


def test_an_unreadable_checkpoint_last_resumes_from_the_newest_intact_checkpoint(straight, toy_data, tmp_path):
    """The torn file that was reported: a 0-byte checkpoint_last.pt beside intact checkpoints. The newest other one is
    truncated too, so the fallback is the epoch checkpoint written before it."""
    straight_dir = straight[0]
    for age, name in enumerate(["checkpoint_1_28.pt", "checkpoint1.pt", "checkpoint_2_36.pt"]):
        shutil.copy(straight_dir / name, tmp_path / name)
        os.utime(tmp_path / name, ns=(10**18 + age * 10**9,) * 2)  # written in this order
    newest = tmp_path / "checkpoint_2_36.pt"
    newest.write_bytes(newest.read_bytes()[:1000])
    (tmp_path / "checkpoint_last.pt").write_bytes(b"")

    resumed = train(toy_data, tmp_path)
    notices = [line for line in resumed.log.splitlines() if "is unreadable" in line]
    assert len(notices) == 1 and notices[0].endswith(
        f"deepnmt: {tmp_path}/checkpoint_last.pt is unreadable (the file is truncated, corrupt or not a fairseq "
        f"checkpoint (EOFError)); resuming from {tmp_path}/checkpoint1.pt, the newest intact checkpoint in {tmp_path}")
    assert f"Loaded checkpoint {tmp_path}/checkpoint1.pt (epoch 2 @ {EPOCH} updates)" in resumed.log
    assert_same_training_state(straight_dir / "checkpoint_last.pt", tmp_path / "checkpoint_last.pt")


def test_without_an_intact_checkpoint_the_unreadable_one_is_named_in_one_line(toy_data, tmp_path):
    (tmp_path / "checkpoint_last.pt").write_bytes(b"")
    (tmp_path / "checkpoint_1_4.pt").write_bytes(b"torn")
    result = train(toy_data, tmp_path, check=False)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert last_line(result.stderr) == (f"deepnmt: error: cannot read checkpoint {tmp_path}/checkpoint_last.pt: the "
                                        "file is truncated, corrupt or not a fairseq checkpoint (EOFError)")


def failing_halfway(target):
    """Write half a file, then fail, as a full disk does (``target``: a path or an open file)."""
    with contextlib.nullcontext(target) if hasattr(target, "write") else open(target, "wb") as handle:
        handle.write(b"half")
    raise OSError("No space left on device")


@pytest.mark.parametrize("write", ["copy to checkpoint_last.pt", "save checkpoint_last.pt"])
def test_a_failed_save_or_copy_leaves_the_previous_checkpoint_whole(write, tmp_path, monkeypatch):
    last, newer = tmp_path / "checkpoint_last.pt", tmp_path / "checkpoint_1_8.pt"
    checkpoint_utils.torch_persistent_save({"model": {"w": torch.ones(2)}}, str(last))
    checkpoint_utils.torch_persistent_save({"model": {"w": torch.zeros(2)}}, str(newer))
    if write.startswith("copy"):
        monkeypatch.setattr(shutil, "copyfile", lambda source, target, **kwargs: failing_halfway(target))
        with pytest.raises(OSError, match="No space left"):
            PathManager.copy(str(newer), str(last), overwrite=True)
    else:
        monkeypatch.setattr(torch, "save", lambda obj, target, **kwargs: failing_halfway(target))
        with pytest.raises(OSError, match="No space left"):
            checkpoint_utils.torch_persistent_save({"model": {"w": torch.zeros(2)}}, str(last))
    monkeypatch.undo()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint_1_8.pt", "checkpoint_last.pt"]
    assert torch.load(last)["model"]["w"].tolist() == [1.0, 1.0]
    assert PathManager.copy(str(newer), str(last), overwrite=True)
    assert torch.load(last)["model"]["w"].tolist() == [0.0, 0.0]


def fp16_optimizer(data):
    """A real fairseq fp16 optimizer over one parameter, on the CPU (no flat fp32 copy: that one is CUDA only);
    its loss scale doubles after 2 updates without an overflow."""
    args = options.parse_args_and_arch(options.get_training_parser(), [
        str(data), "--arch", "transformer", "--optimizer", "adam", "--lr", "1e-3", "--fp16", "--fp16-no-flatten-grads",
        "--fp16-scale-window", "2"])
    parameter = torch.nn.Parameter(torch.zeros(3, dtype=torch.half))
    return optim.FP16Optimizer.build_optimizer(convert_namespace_to_omegaconf(args), [parameter]), parameter


def loss_scales(optimizer, parameter, gradients):
    """The loss scale after each update (an infinite gradient overflows: fairseq skips that update)."""
    scales = []
    for gradient in gradients:
        optimizer.zero_grad()
        optimizer.backward((parameter.float() * gradient).sum())
        try:
            optimizer.clip_grad_norm(0)
            optimizer.step()
        except OverflowError:
            pass
        scales.append(optimizer.scaler.loss_scale)
    return scales


def test_an_fp16_loss_scale_resumes_on_the_uninterrupted_runs_schedule(toy_data, tmp_path):
    """fairseq saved the loss scale but not when the scaler last overflowed or rescaled: resumed after update 3
    of [1, inf, 1, 1, 1, 1, 1], the scale doubled at updates 5 and 7 instead of 4 and 6."""
    gradients = [1.0, float("inf"), 1.0, 1.0, 1.0, 1.0, 1.0]
    straight = loss_scales(*fp16_optimizer(toy_data), gradients)
    interrupted, parameter = fp16_optimizer(toy_data)
    before = loss_scales(interrupted, parameter, gradients[:3])
    torch.save(interrupted.state_dict(), tmp_path / "optimizer.pt")
    resumed, parameter = fp16_optimizer(toy_data)
    resumed.load_state_dict(torch.load(tmp_path / "optimizer.pt"))  # weights-only: the counters are plain ints
    assert before + loss_scales(resumed, parameter, gradients[3:]) == straight
    assert len(set(straight)) > 2  # the scale went down and up again
