"""Depth sweep: run classification and log parsing, and the --micro preset end to end on the toy corpus."""

import json
from dataclasses import replace

import pytest

from deepnmt_plugin.bench import depth

TRAIN_INNER = ("2026-01-01 | INFO | train_inner | epoch 001:      {n} / 11 loss={loss}, nll_loss=5.1, ppl=34.3, "
               "num_updates={n}, lr=0.0005, gnorm=1.2, update_norm={norm}, wall=3")
VALID = "2026-01-01 | INFO | valid | epoch 001 | valid on 'valid' subset | loss {loss} | ppl 29.39 | num_updates 4"


def log(losses, norms, valid_loss=None, tail=""):
    lines = [TRAIN_INNER.format(n=2 * i + 2, loss=loss, norm=norm) for i, (loss, norm) in enumerate(zip(losses, norms))]
    return "\n".join(lines + ([VALID.format(loss=valid_loss)] if valid_loss is not None else []) + [tail])


@pytest.mark.parametrize("text, returncode, status", [
    (log([6.2, 5.4], [1.5, 2.25], 4.9), 0, "converged"),
    (log([6.2, "nan"], [1.5, "nan"]), 1, "diverged"),  # fairseq stops on NaN gradients ...
    (log([6.2, 5.4], [1.5, 2.25], tail="FloatingPointError: gradients are Nan/Inf"), 1, "diverged"),
    (log([6.2, 9.7], [1.5, 40.0], 9.1), 0, "diverged"),  # ... not on a loss that exploded but stayed finite
    (log([6.2, 5.4], [1.5, 2.25], "inf"), 0, "diverged"),
    (log([6.2, 5.4], [1.5, 2.25], tail="RuntimeError: CUDA out of memory"), 1, "failed"),  # a crash, not a divergence
])
def test_classify(text, returncode, status):
    assert depth.classify(text, returncode) == status


def test_parse_curve_and_losses():
    text = log([6.2, 5.4, 5.1], [1.5, 2.25, 2.125], 4.875)
    assert depth.update_norm_curve(text) == [[2, 1.5], [4, 2.25], [6, 2.125]]
    assert depth.final_valid_loss(text) == 4.875


def test_micro_sweep_writes_json_table_and_plots(toy_data, tmp_path, capsys):
    workdir = tmp_path / "sweep"
    # a run recorded as diverged by an earlier invocation: reused, not run again, and shown as diverged
    micro_budget = {"max_update": 4, "max_tokens": 512, "interval": 2, "lr": 5e-4, "warmup_updates": 0}
    earlier = {"method": "tfixup", "depth": 2, "budget": micro_budget, "status": "diverged", "returncode": 1, "final_valid_loss": None,
               "final_train_loss": None, "update_norm": [[2, 3.5]], "seconds": 4.0, "log": "earlier.log"}
    (workdir / "tfixup_2L").mkdir(parents=True)
    (workdir / "tfixup_2L" / "result.json").write_text(json.dumps(earlier))

    arguments = ["--data", str(toy_data), "--micro", "--methods", "postln", "tfixup", "--workdir", str(workdir), "--cpu"]
    assert depth.main(arguments + ["--jobs", "2"]) == 0
    report = json.loads((workdir / "bench_depth.json").read_text())
    assert report["preset"] == "micro" and report["settings"]["max_update"] == 4
    assert report["jobs"] == 2 and report["reused_runs"] == 1 and report["device"] == "CPU"
    runs = {(r["method"], r["depth"]): r for r in report["runs"]}
    assert list(runs) == [("postln", 1), ("tfixup", 1), ("postln", 2), ("tfixup", 2)]
    assert runs[("tfixup", 2)] == earlier
    for key in [("postln", 1), ("tfixup", 1), ("postln", 2)]:
        run = runs[key]
        assert run["status"] == "converged" and run["returncode"] == 0
        assert [step for step, _ in run["update_norm"]] == [2, 4]  # every --interval 2 updates
        assert all(value > 0 for _, value in run["update_norm"])
        assert 0 < run["final_valid_loss"] < run["final_train_loss"] + 2
        assert not (workdir / f"{key[0]}_{key[1]}L" / "checkpoints").exists()

    table = (workdir / "bench_depth.md").read_text()
    assert "| method | 1L-1L | 2L-2L |" in table
    assert "minutes wall clock on CPU, --jobs 2, 1 run reused from an earlier one." in table
    assert f"| tfixup | {runs[('tfixup', 1)]['final_valid_loss']:.3f} | diverged |" in table
    peak = max(v for _, v in runs[("postln", 2)]["update_norm"])
    assert f"| postln | {max(v for _, v in runs[('postln', 1)]['update_norm']):.3f} | {peak:.3f} |" in table
    for name in ("update_norm_1L.png", "update_norm_2L.png", "final_loss_vs_depth.png"):
        assert (workdir / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    output = capsys.readouterr().out
    # deepest first, and the table in the plan's order whatever order the two workers finished in
    assert "[2/4] tfixup 2L-2L: diverged, valid loss –, 4 s (log: earlier.log)" in output
    assert output.count(": converged, valid loss ") == 3
    for index, name in enumerate(["postln 2L", "tfixup 2L", "postln 1L", "tfixup 1L"], 1):
        assert f"[{index}/4] {name}-" in output


def test_a_kept_run_with_another_budget_stops_the_sweep_before_training(toy_data, tmp_path):
    kept = tmp_path / "sweep" / "postln_2L" / "result.json"
    kept.parent.mkdir(parents=True)
    kept.write_text(json.dumps({"method": "postln", "depth": 2, "budget": {"max_update": 200}}))
    with pytest.raises(SystemExit, match=r"postln_2L/result.json was trained with another budget .*another --workdir"):
        depth.main(["--data", str(toy_data), "--micro", "--workdir", str(tmp_path / "sweep"), "--cpu"])
    assert sorted(p.name for p in (tmp_path / "sweep").iterdir()) == ["postln_2L"]  # nothing trained or written
    assert json.loads(kept.read_text())["budget"] == {"max_update": 200}


def test_warmup_updates_change_the_schedule_the_budget_and_the_default_workdir(toy_data, tmp_path, monkeypatch):
    plain = depth.PRESETS["micro"]
    warm = replace(plain, warmup_updates=3)
    assert " --lr-scheduler fixed " in " ".join(depth.train_command("data", "admin", 2, plain, tmp_path, cpu=True))
    command = " ".join(depth.train_command("data", "admin", 2, warm, tmp_path, cpu=True))
    assert " --lr 0.0005 --lr-scheduler inverse_sqrt --warmup-updates 3 --warmup-init-lr 1e-7 " in command
    assert depth.budget(warm) == {**depth.budget(plain), "warmup_updates": 3}

    # a warmed-up sweep gets its own default workdir, and a no-warmup run found there is not reused
    monkeypatch.chdir(tmp_path)
    kept = tmp_path / "runs" / "bench_depth" / "4x512_warmup3" / "postln_2L" / "result.json"
    kept.parent.mkdir(parents=True)
    kept.write_text(json.dumps({"method": "postln", "depth": 2, "budget": depth.budget(plain)}))
    with pytest.raises(SystemExit, match=r"4x512_warmup3/postln_2L/result.json was trained with another budget"):
        depth.main(["--data", str(toy_data), "--micro", "--warmup-updates", "3", "--cpu"])


def test_throughput_reports_every_arch_against_the_baseline(toy_data, capsys):
    """Interleaved rounds on the same batches, a ratio per arch, and Admin's one-off costs."""
    from deepnmt_plugin.bench import throughput

    assert throughput.main(["--data", str(toy_data), "--dims", "tiny", "--layers", "1", "--max-tokens", "500",
                            "--rounds", "2", "--updates", "1", "--archs", "transformer", "transformer_admin", "--cpu"]) == 0
    out = capsys.readouterr().out
    assert out.count("words/s") >= 2 and "round 2/2" in out
    assert "| transformer | " in out and "| 1.000 | 1.000 .. 1.000 |" in out  # the baseline against itself
    ratio = float(out.split("| transformer_admin | ")[1].split(" | ")[1])
    assert 0 < ratio < 10
    assert "Admin omega profiling:" in out and "% of a 1000-update run" in out


def test_throughput_refuses_half_precision_on_the_cpu(toy_data):
    from deepnmt_plugin.bench import throughput

    with pytest.raises(SystemExit, match="--precision fp16 needs a CUDA device"):
        throughput.main(["--data", str(toy_data), "--cpu", "--precision", "fp16"])


def test_operator_counter_counts_kernels_not_views():
    import torch

    from deepnmt_plugin.bench.throughput import OperatorCounter

    a, b = torch.randn(4, 3), torch.randn(3, 4)
    with OperatorCounter() as counter:
        (a.view(3, 4).t().contiguous() + b.t()).sum()  # view, t, t: nothing launched; clone, add, sum: three kernels
    assert counter.count == 3


@pytest.mark.parametrize("arch", ["transformer_deepnorm", "transformer_admin"])
def test_scaled_residuals_run_as_many_forward_operators_as_stock(build_model, arch):
    """DeepNorm's alpha * x + f and Admin's omega * x + f are one kernel each, like stock x + f."""
    import torch

    from deepnmt_plugin.bench.throughput import OperatorCounter

    counts = {}
    for name in ("transformer", arch):
        model, _ = build_model(name, "--encoder-layers", 3, "--decoder-layers", 2, "--encoder-embed-dim", 16,
                               "--encoder-ffn-embed-dim", 32, "--decoder-embed-dim", 16, "--decoder-ffn-embed-dim", 32)
        if hasattr(model, "admin_initialized"):
            model.admin_initialized.fill_(True)
        model.eval()
        with torch.no_grad(), OperatorCounter() as counter:
            model(torch.tensor([[5, 6, 7, 2]]), torch.tensor([4]), torch.tensor([[2, 5, 6, 7]]))
        counts[name] = counter.count
    assert counts[arch] == counts["transformer"]
