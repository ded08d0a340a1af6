"""Reliability through the real fairseq CLIs: exact resume after a kill, checkpoint averaging, every
written checkpoint loading weights-only, the divergence guard, and one clear line for bad input."""

import os
import re
import shutil
import sys
from types import SimpleNamespace

import pytest
import torch
from fairseq import checkpoint_utils, optim, options, tasks
from fairseq.dataclass.utils import convert_namespace_to_omegaconf

from conftest import USER_DIR, fairseq_cli
from deepnmt_plugin import average_checkpoints, compat, export
from deepnmt_plugin.tasks.divergence_guard import DivergenceError, DivergenceGuard, diverged
from deepnmt_plugin.tasks.translation_deep import TaskFlagError
from tiny_training import END, KILLED_AT, RECIPES, SAVE_EVERY, files_in, last_line, straight_run, train
from tiny_training import one_thread_per_process  # noqa: F401  (autouse fixture)

pytestmark = pytest.mark.slow  # trains, generates or builds corpora through subprocesses

DEEPNORM, ADMIN = "transformer_deepnorm_iwslt_de_en", "transformer_admin_iwslt_de_en"


@pytest.fixture(scope="module")
def runs(toy_data, tmp_path_factory):
    """Per arch: a straight run to END, and a run resumed from the straight run's checkpoint at KILLED_AT.

    fairseq writes a checkpoint once and copies it to its other names, so ``checkpoint_1_8.pt`` holds the
    bytes ``checkpoint_last.pt`` held when update 8 was saved: resuming from it is resuming after a
    kill right after that save.
    """
    result = {}
    for arch in RECIPES:
        straight, resumed = straight_run(toy_data, tmp_path_factory, arch), tmp_path_factory.mktemp(f"{arch}-resumed")
        shutil.copy(straight / f"checkpoint_1_{KILLED_AT}.pt", resumed / "checkpoint_last.pt")
        finished = train(toy_data, resumed, arch, END, *SAVE_EVERY)
        result[arch] = straight, resumed, finished.stdout + finished.stderr
    return result


def load(path):
    return checkpoint_utils.load_checkpoint_to_cpu(str(path))


@pytest.mark.parametrize("arch", list(RECIPES))
def test_resume_after_a_kill_reaches_the_same_parameters(arch, runs):
    straight, resumed, log = runs[arch]
    assert re.search(rf"Loaded checkpoint .*checkpoint_last\.pt \(epoch 1 @ {KILLED_AT} updates\)", log), log[-2000:]
    assert "omega initialised" not in log  # Admin's profiled omega comes from the checkpoint
    expected, found = load(straight / "checkpoint_last.pt"), load(resumed / "checkpoint_last.pt")
    before = load(straight / f"checkpoint_1_{KILLED_AT}.pt")["model"]
    assert expected["model"].keys() == found["model"].keys()
    assert any(not torch.equal(tensor, before[name]) for name, tensor in expected["model"].items())  # it trained on
    # Bitwise, Adam's moments too: fairseq reseeds every update (seed + num_updates) and orders data per epoch.
    for name, tensor in expected["model"].items():
        assert torch.equal(tensor, found["model"][name]), name
    moments = [(e, f) for e, f in zip(expected["last_optimizer_state"]["state"].values(),
                                      found["last_optimizer_state"]["state"].values())]
    assert moments and all(torch.equal(e["exp_avg_sq"], f["exp_avg_sq"]) for e, f in moments)
    if arch == ADMIN:
        assert any(name.endswith("omega") for name in expected["model"]) and bool(found["model"]["admin_initialized"])


def test_average_of_the_last_update_checkpoints_is_their_mean(runs, tmp_path):
    straight = runs[DEEPNORM][0]
    output = tmp_path / "averaged.pt"
    average_checkpoints.main(["--inputs", str(straight), "--num-update-checkpoints", "3", "--output", str(output)])
    newest_first = ("checkpoint_2_16.pt", "checkpoint_2_12.pt", "checkpoint_1_8.pt")
    inputs = [load(straight / name)["model"] for name in newest_first]
    averaged = load(output)
    assert averaged["optimizer_history"][-1]["num_updates"] == END  # everything but the model: the newest
    weight = "decoder.layers.1.fc2.weight"
    assert not torch.equal(inputs[0][weight], inputs[2][weight])
    for name, tensor in averaged["model"].items():
        torch.testing.assert_close(tensor, (inputs[0][name] + inputs[1][name] + inputs[2][name]) / 3, rtol=0, atol=1e-7)


def test_average_keeps_admins_flag_and_picks_checkpoints_like_fairseq(runs, tmp_path):
    straight = runs[ADMIN][0]
    chosen = average_checkpoints.last_n_checkpoints(str(straight), 2, update_based=True, upper_bound=12)
    assert chosen == [str(straight / "checkpoint_2_12.pt"), str(straight / "checkpoint_1_8.pt")]
    average_checkpoints.main(["--inputs", *chosen, "--output", str(tmp_path / "averaged.pt")])
    averaged, first, second = (load(p)["model"] for p in (tmp_path / "averaged.pt", *chosen))
    assert bool(averaged["admin_initialized"])
    omega = "encoder.layers.1.ffn_residual.omega"
    torch.testing.assert_close(averaged[omega], (first[omega] + second[omega]) / 2, rtol=0, atol=1e-7)

    for epoch in (1, 2, 3):
        (tmp_path / f"checkpoint{epoch}.pt").touch()
    assert average_checkpoints.last_n_checkpoints(str(tmp_path), 2, update_based=False) == [
        str(tmp_path / "checkpoint3.pt"), str(tmp_path / "checkpoint2.pt")]


def test_average_refuses_checkpoints_of_different_models(runs, tmp_path):
    admin = runs[ADMIN][0] / "checkpoint_last.pt"
    uninitialised = compat.read_checkpoint(str(admin))
    uninitialised["model"]["admin_initialized"] = torch.tensor(False)
    torch.save(uninitialised, tmp_path / "uninitialised.pt")
    preln = runs["transformer_preln_iwslt_de_en"][0] / "checkpoint_last.pt"
    for other, reason in ((tmp_path / "uninitialised.pt", "admin_initialized differs between"),
                          (preln, "has other parameters than")):
        with pytest.raises(average_checkpoints.AverageError, match=f"^deepnmt: error: .*{reason}"):
            average_checkpoints.average_checkpoints([str(admin), str(other)])


def unsafe_globals_without_allowlist(path):
    """The globals a plain ``torch.load`` (weights-only, nothing allowlisted) would refuse."""
    allowed = torch.serialization.get_safe_globals()
    torch.serialization.clear_safe_globals()
    try:
        return torch.serialization.get_unsafe_globals_in_checkpoint(path)
    finally:
        torch.serialization.add_safe_globals(allowed)


def test_every_checkpoint_the_plugin_writes_loads_weights_only(runs, tmp_path):
    written = [p for straight, resumed, _ in runs.values() for d in (straight, resumed) for p in sorted(d.glob("*.pt"))]
    averaged, exported = tmp_path / "averaged.pt", tmp_path / "exported.pt"
    average_checkpoints.main(["--inputs", str(runs[ADMIN][0]), "--num-update-checkpoints", "2",
                              "--output", str(averaged)])
    export.export_checkpoint(str(runs[ADMIN][0] / "checkpoint_last.pt"), str(exported))
    assert len(written) == len(RECIPES) * (6 + 4)  # straight: updates 4, 8, 12, 16, best, last; resumed: 12, 16, best, last
    for path in written + [averaged]:
        assert unsafe_globals_without_allowlist(path) == ["argparse.Namespace"], path  # exactly the allowlist
        assert load(path)["model"]
    assert unsafe_globals_without_allowlist(exported) == []  # loads with no allowlist at all
    assert load(exported)["model"]


GUARDED = ["--task", "translation_deep", "--divergence-guard"]
STOPPED = "stopped before saving, the last checkpoint written is left as it was"


def test_nan_stops_training_with_one_line_and_keeps_the_last_checkpoint(toy_data, tmp_path):
    """lr 1e30 from the first update: update 1 is finite and saved, its step makes update 2 NaN."""
    result = train(toy_data, tmp_path, DEEPNORM, 10, *GUARDED, "--lr", "1e30", "--lr-scheduler", "fixed",
                   "--warmup-updates", 0, "--save-interval-updates", 1, check=False)
    assert result.returncode == 1
    assert last_line(result.stderr) == f"deepnmt: diverged at update 2: gradient norm is nan; {STOPPED}"
    assert "Traceback" not in result.stderr and "crash.pt" not in files_in(tmp_path)
    saved = list(tmp_path.glob("*.pt"))
    assert saved and all(load(p)["optimizer_history"][-1]["num_updates"] == 1 for p in saved)


def test_divergence_ends_fairseq_train_at_once_and_lets_python_callers_go_on(monkeypatch):
    """fairseq-train stopped mid-epoch ends by os._exit(1) after its line (its batch thread can make the interpreter's
    exit abort the process); a Python program that called fairseq's main gets the error and goes on."""
    exits = []
    monkeypatch.setattr(os, "_exit", exits.append)
    assert isinstance(diverged(3, "training loss is nan"), DivergenceError) and exits == []  # pytest is __main__
    monkeypatch.setattr(sys.modules["__main__"], "__spec__", SimpleNamespace(name="fairseq_cli.train"))
    diverged(3, "training loss is nan")
    assert exits == [1]


def test_loss_above_the_threshold_stops_training_before_any_save(toy_data, tmp_path):
    result = train(toy_data, tmp_path, DEEPNORM, 10, *GUARDED, "--divergence-max-loss", 5, check=False)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    stop = re.fullmatch(rf"deepnmt: diverged at update 1: training loss (\d+\.\d+) > --divergence-max-loss 5; "
                        rf"{STOPPED}", last_line(result.stderr))
    assert stop and float(stop.group(1)) > 5
    assert not list(tmp_path.glob("*.pt"))


def test_a_nan_training_loss_with_finite_gradients_stops_too():
    guard = DivergenceGuard(max_loss=None, overflow_patience=10)
    guard.check_training_loss([{"loss": torch.tensor(40.0), "sample_size": 10}, {"loss": 0.0, "sample_size": 5}])
    with pytest.raises(DivergenceError, match=f"^deepnmt: diverged at update 0: training loss is nan; {STOPPED}$"):
        guard.check_training_loss([{"loss": torch.tensor(float("nan")), "sample_size": 10}])


@pytest.mark.parametrize("flags,message", [
    (["--divergence-max-loss", 5], "--divergence-max-loss needs --divergence-guard"),
    (["--divergence-guard", "--divergence-overflow-patience", 0], "--divergence-overflow-patience must be at least 1"),
])
def test_guard_flags_are_checked_when_the_task_starts(flags, message, toy_data):
    args = options.parse_args_and_arch(options.get_training_parser(), [
        str(toy_data), "--user-dir", USER_DIR, "--task", "translation_deep", "--arch", DEEPNORM, *map(str, flags)])
    with pytest.raises(TaskFlagError, match=f"^deepnmt: error: {message}"):
        tasks.setup_task(args)


def test_flush_denormal_makes_subnormal_results_zero_once_the_task_starts(toy_data):
    subnormal = torch.tensor([1e-39])  # below float32's smallest normal, 1.18e-38
    args = options.parse_args_and_arch(options.get_training_parser(), [
        str(toy_data), "--user-dir", USER_DIR, "--task", "translation_deep", "--arch", DEEPNORM, "--flush-denormal"])
    try:
        assert (subnormal * 1.0).item() > 0
        tasks.setup_task(args)
        assert (subnormal * 1.0).item() == 0 and (subnormal * 1e10).item() == 0
        assert (torch.tensor([1e-37]) * 1.0).item() > 0  # normal floats are computed as before
    finally:
        torch.set_flush_denormal(False)
    assert (subnormal * 1.0).item() > 0


def loss_scaled_optimizer(data, *flags):
    """A real fairseq fp16 or AMP optimizer over one parameter, on the CPU: fp16 without the flat fp32
    copy (CUDA only), AMP with torch's GradScaler for the CPU device where fairseq builds a CUDA one."""
    args = options.parse_args_and_arch(options.get_training_parser(), [
        str(data), "--arch", "transformer", "--optimizer", "adam", "--lr", "1e-3", *flags])
    cfg = convert_namespace_to_omegaconf(args)
    parameter = torch.nn.Parameter(torch.zeros(3, dtype=torch.half if "--fp16" in flags else torch.float))
    if "--fp16" in flags:
        return optim.FP16Optimizer.build_optimizer(cfg, [parameter]), parameter
    optimizer = optim.AMPOptimizer.build_optimizer(cfg, [parameter])
    optimizer._grad_scaler = torch.amp.GradScaler("cpu", init_scale=cfg.common.fp16_init_scale)
    return optimizer, parameter


LOSS_SCALING = {"fp16": ["--fp16", "--fp16-no-flatten-grads"], "amp": ["--amp"]}


@pytest.mark.parametrize("precision", list(LOSS_SCALING))
def test_consecutive_overflows_stop_after_the_patience(precision, toy_data):
    optimizer, parameter = loss_scaled_optimizer(toy_data, *LOSS_SCALING[precision])
    guard = DivergenceGuard(max_loss=None, overflow_patience=2)

    def step(update, gradient):
        guard.watch(optimizer, update)
        optimizer.zero_grad()
        optimizer.backward((parameter.float() * gradient).sum())  # scaled by the loss scale, as in training
        try:
            grad_norm = optimizer.clip_grad_norm(0)
        except OverflowError:  # fp16 signals an overflow so; fairseq's trainer skips the update
            return float("inf")
        optimizer.step()  # as fairseq's trainer: AMP steps on overflow too (its scaler skips and backs off)
        return grad_norm

    assert step(0, float("inf")) == float("inf")  # overflow 1: skipped, training goes on
    assert step(0, 1.0) < float("inf")  # a good update resets the count
    assert step(1, float("inf")) == float("inf")
    with pytest.raises(DivergenceError) as stopped:
        step(1, float("inf"))
    assert str(stopped.value) == (
        "deepnmt: diverged at update 2: 2 gradient overflows in a row in fp16/AMP, each one skipped "
        f"(--divergence-overflow-patience 2); {STOPPED}"
    )


@pytest.mark.parametrize("precision", list(LOSS_SCALING))
def test_minimum_loss_scale_stops_with_one_line(precision, toy_data):
    """fairseq raises FloatingPointError there (which would write crash.pt); the guard says it in one line."""
    optimizer, parameter = loss_scaled_optimizer(toy_data, *LOSS_SCALING[precision], "--fp16-init-scale", "1",
                                                 "--min-loss-scale", "0.5")
    DivergenceGuard(max_loss=None, overflow_patience=10).watch(optimizer, 6)
    optimizer.zero_grad()
    optimizer.backward((parameter.float() * float("inf")).sum())
    with pytest.raises(DivergenceError, match=rf"^deepnmt: diverged at update 7: (AMP: )?Minimum loss scale reached "
                                              rf"\(0\.5\); {STOPPED}$"):
        optimizer.clip_grad_norm(0)


def truncated_copy(source, target):
    data = source.read_bytes()
    target.write_bytes(data[: len(data) // 2])
    return target


def unreadable_line(path):
    return (f"deepnmt: error: cannot read checkpoint {path}: the file is truncated, corrupt or not a fairseq "
            "checkpoint (RuntimeError: PytorchStreamReader failed reading zip archive: "
            "failed finding central directory)")


def test_truncated_checkpoint_stops_train_and_generate_with_one_line(runs, toy_data, tmp_path):
    checkpoint = truncated_copy(runs[DEEPNORM][0] / "checkpoint_last.pt", tmp_path / "checkpoint_last.pt")
    truncated = checkpoint.read_bytes()
    resumed = train(toy_data, tmp_path, DEEPNORM, END + 4, check=False)
    generated = fairseq_cli("fairseq-generate", toy_data, "--user-dir", USER_DIR, "--path", checkpoint, "--cpu",
                            check=False)
    for result in (resumed, generated):
        assert result.returncode == 1 and "Traceback" not in result.stderr
        assert last_line(result.stderr) == unreadable_line(checkpoint)
    assert files_in(tmp_path) == ["checkpoint_last.pt"] and checkpoint.read_bytes() == truncated


def test_truncated_checkpoint_stops_export_and_average_without_writing(runs, tmp_path):
    good = runs[DEEPNORM][0] / "checkpoint_last.pt"
    truncated = truncated_copy(good, tmp_path / "truncated.pt")
    output = tmp_path / "output.pt"
    output.write_text("an earlier result")
    for command in (lambda: export.main([str(truncated), str(output)]),
                    lambda: average_checkpoints.main(["--inputs", str(good), str(truncated), "--output", str(output)])):
        with pytest.raises(SystemExit) as stopped:
            command()
        assert str(stopped.value) == unreadable_line(truncated)
        assert output.read_text() == "an earlier result" and files_in(tmp_path) == ["output.pt", "truncated.pt"]


@pytest.mark.parametrize("content,reason", [
    (b"", "EOFError"),
    (b"not a checkpoint at all", "UnpicklingError: Unsupported operand 110"),
])
def test_unreadable_files_are_named_in_one_line(content, reason, tmp_path):
    path = tmp_path / "bad.pt"
    path.write_bytes(content)
    for read in (checkpoint_utils.load_checkpoint_to_cpu, compat.read_checkpoint):
        with pytest.raises(compat.CorruptCheckpointError) as refused:
            read(str(path))
        assert str(refused.value) == (f"deepnmt: error: cannot read checkpoint {path}: the file is truncated, "
                                      f"corrupt or not a fairseq checkpoint ({reason})")


@pytest.mark.parametrize("problem", ["missing", "empty"])
def test_bad_data_directory_names_it_in_one_line_and_writes_nothing(problem, tmp_path):
    data = tmp_path / "data-bin"
    if problem == "empty":
        data.mkdir()
    result = train(data, tmp_path / "checkpoints", DEEPNORM, 10, check=False)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert last_line(result.stderr) == {
        "missing": f"deepnmt: error: data directory {data} does not exist",
        "empty": f"deepnmt: error: data directory {data} holds no fairseq-preprocess output (no dict.*.txt)",
    }[problem]
    assert not list((tmp_path / "checkpoints").glob("*"))


def test_generate_with_the_stock_task_checks_the_data_directory_too(tmp_path):
    result = fairseq_cli("fairseq-generate", tmp_path / "nowhere", "--user-dir", USER_DIR, "--path", "x.pt",
                         "--cpu", check=False)
    assert result.returncode == 1
    assert last_line(result.stderr) == f"deepnmt: error: data directory {tmp_path / 'nowhere'} does not exist"
