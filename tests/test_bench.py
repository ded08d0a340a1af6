"""Depth sweep and depth study: run classification and log parsing, the --micro and study-micro presets end to end on the toy corpus."""

import csv
import json
import runpy
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from conftest import REPO
from deepnmt_plugin.bench import curves, depth, layers, runs

TRAIN_INNER = ("2026-01-01 | INFO | train_inner | epoch 001:      {n} / 11 loss={loss}, nll_loss=5.1, ppl=34.3, "
               "num_updates={n}, lr=0.0005, gnorm=1.2, update_norm={norm}, wall=3")
VALID = "2026-01-01 | INFO | valid | epoch 001 | valid on 'valid' subset | loss {loss} | ppl 29.39 | num_updates 4"


def log(losses, norms, valid_loss=None, tail=""):
    lines = [TRAIN_INNER.format(n=2 * i + 2, loss=loss, norm=norm) for i, (loss, norm) in enumerate(zip(losses, norms))]
    return "\n".join(lines + ([VALID.format(loss=valid_loss)] if valid_loss is not None else []) + [tail])


@pytest.mark.parametrize("text, returncode, status", [
    (log([6.2, 5.4], [1.5, 2.25], 4.9), 0, "finished"),
    (log([6.2, "nan"], [1.5, "nan"]), 1, "diverged"),  # fairseq stops on NaN gradients ...
    (log([6.2, 5.4], [1.5, 2.25], tail="FloatingPointError: gradients are Nan/Inf"), 1, "diverged"),
    (log([6.2, 9.7], [1.5, 40.0], 9.1), 0, "diverged"),  # ... not on a loss that exploded but stayed finite
    (log([6.2, 5.4], [1.5, 2.25], "inf"), 0, "diverged"),
    (log([6.2, 5.4], [1.5, 2.25], tail="RuntimeError: CUDA out of memory"), 1, "failed"),  # a crash, not a divergence
])
def test_classify(text, returncode, status):
    assert runs.classify(text, returncode) == status


def test_parse_curve_and_losses():
    text = log([6.2, 5.4, 5.1], [1.5, 2.25, 2.125], 4.875)
    assert runs.update_norm_curve(text) == [[2, 1.5], [4, 2.25], [6, 2.125]]
    assert runs.final_valid_loss(text) == 4.875
    assert runs.valid_loss_curve(text + "\n" + VALID.format(loss=4.5).replace("num_updates 4", "num_updates 8")) == [
        [4, 4.875], [8, 4.5]]
    # killed after update 6, resumed from the checkpoint at update 2: the resumed trainer's values, once each
    resumed = text + "\n" + "\n".join(TRAIN_INNER.format(n=n, loss=5.0, norm=norm) for n, norm in ((4, 2.5), (6, 2.0)))
    assert runs.update_norm_curve(resumed) == [[2, 1.5], [4, 2.5], [6, 2.0]]
    assert runs.valid_loss_curve(text + "\n" + VALID.format(loss=4.5)) == [[4, 4.5]]


def test_unigram_plateau_is_fairseqs_loss_of_the_best_model_that_ignores_the_source(toy_data):
    """Counted from the raw text (not fairseq's binaries), scored with fairseq's own label-smoothed loss; any other
    source-blind distribution scores worse."""
    import math
    from collections import Counter

    import torch
    from fairseq.criterions.label_smoothed_cross_entropy import label_smoothed_nll_loss

    vocabulary = ["<s>", "<pad>", "</s>", "<unk>"] + [line.split()[0] for line in
                                                      (toy_data / "dict.en.txt").read_text().splitlines()]
    index = {word: i for i, word in enumerate(vocabulary)}

    def targets(split):
        lines = (toy_data.parent / "raw" / f"{split}.en").read_text().splitlines()
        return [index.get(word, 3) for line in lines for word in line.split() + ["</s>"]]

    train, valid = Counter(targets("train")), torch.tensor(targets("valid"))
    eps, size = 0.1, len(vocabulary)
    eps_i = eps / (size - 1)
    unigram = torch.tensor([train[i] for i in range(size)], dtype=torch.float64) / sum(train.values())

    def loss(q):  # bits a token, as fairseq-train logs the validation loss
        lprobs = q.log().expand(len(valid), size)
        return label_smoothed_nll_loss(lprobs, valid.unsqueeze(1), eps)[0].item() / len(valid) / math.log(2)

    best = (1 - eps - eps_i) * unigram + eps_i
    plateau = runs.unigram_plateau(str(toy_data), eps)
    assert plateau == pytest.approx(loss(best), rel=1e-9)
    for other in (unigram.clamp(min=1e-9), torch.full((size,), 1 / size), 0.9 * best + 0.1 / size):
        assert loss(other / other.sum()) > plateau


@pytest.mark.parametrize("status, valid_loss, curve, distinct, expected", [
    ("diverged", None, [], None, "diverged"),
    ("failed", None, [], None, "crashed"),
    ("finished", 9.279, [], 0.002, "stalled at the unigram plateau"),  # Post-LN 18L-18L on l10n: plateau 9.264
    ("finished", 9.193, [[1000, 9.2], [2000, 9.193]], None, "stalled at the unigram plateau"),  # Admin 50L: BLEU 0.02
    ("finished", 10.6, [], None, "stalled at the unigram plateau"),  # above it
    ("finished", 9.2, [], 0.0008, "stalled at the unigram plateau"),  # on it, one sentence: stalled
    ("finished", 6.479, [[1500, 6.682], [2000, 6.479]], 0.0008, "ignores the source"),  # B2T 100L: 1 of 1,234 distinct
    ("finished", 6.0, [[500, 8.0], [1500, 6.5], [2000, 6.0]], 0.9, "still learning"),  # 7.7 % over the last quarter
    ("finished", 5.0, [[500, 5.3], [1500, 5.08], [2000, 5.0]], 0.9, "trained"),  # 1.6 %
    ("finished", 5.0, [], None, "left the plateau"),  # no curve kept: no slope to read
    ("finished", 5.0, [[2000, 5.0]], None, "left the plateau"),
])
def test_verdict_reads_the_loss_against_the_plateau(status, valid_loss, curve, distinct, expected):
    assert runs.verdict(status, valid_loss, curve, 9.264, distinct) == expected


def test_the_choosing_reading_follows_its_rule():
    from deepnmt_plugin.bench.choosing import reading

    def seeds(method, *bleus, verdict="still learning"):
        return method, [{"test_bleu": b, "verdict": verdict, "status": "finished"} for b in bleus]

    rows = [seeds("dlcl", 20.0, 21.0, 22.0), seeds("tfixup", 19.0, 20.0, 21.0), seeds("deepnorm", 17.0, 18.0, 19.0),
            seeds("rezero", 9.0, 10.0, 11.0), seeds("admin", 9.3, verdict="stalled at the unigram plateau")]
    assert reading(rows) == [
        "- Best: **dlcl**, 21.00 ± 1.00 (3 seeds).",
        "- Level with it (within one standard deviation): tfixup.",  # 20 + 1 >= 21 - 1; deepnorm's 18 + 1 is not
        "- Learned no translation in a seed (stalled, ignores the source or diverged): admin.",
        "- Below 50% of the best's BLEU: rezero.",  # 10 < 10.5
        "- Best that exports to stock fairseq and CTranslate2: deepnorm, 18.00 ± 1.00."]


def test_the_choosing_page_is_written_from_the_committed_cells(tmp_path):
    from deepnmt_plugin.bench import study
    from deepnmt_plugin.bench.from_cells import committed_groups

    written = tmp_path / "choosing.md"
    study.write_choosing(committed_groups(REPO / "docs" / "depth_study" / "cells"), study.WARMUP_METHODS,
                         study.STUDY.warmup_updates, study.study_title(study.STUDY), written)
    assert written.read_text() == (REPO / "docs" / "choosing.md").read_text()


@pytest.mark.parametrize("variant", ["fairseq_init", "authors_schedule"])
def test_a_variants_table_is_written_from_its_cells(tmp_path, monkeypatch, capsys, variant):
    """Sections 5.8's and 5.9's tables and their compare.md: each script rewrites both byte for byte from the
    committed cells (run as ``python <script>`` from a copy of the repository's root, in this process)."""
    shutil.copytree(REPO / "docs" / "depth_study", tmp_path / "docs" / "depth_study")
    script = tmp_path / "docs" / "depth_study" / "variants" / variant / "compare.py"
    monkeypatch.chdir(tmp_path)
    runpy.run_path(str(script), run_name="__main__")
    assert capsys.readouterr().out.startswith(f"wrote {script.parent / 'compare.md'}")
    for page in ("README.md", f"variants/{variant}/compare.md"):
        assert (tmp_path / "docs" / "depth_study" / page).read_text() == (REPO / "docs" / "depth_study" / page).read_text()


def test_the_readme_block_and_the_reports_budget_bound_cells_are_written_from_the_records():
    """Every number of the README's depth-study table and findings is the committed cells' (mean ± sd, standing), and
    the report's budget-bound cells are the trained-on records' by the rule."""
    from deepnmt_plugin.bench import choosing, study
    from deepnmt_plugin.bench.from_cells import committed_groups

    groups = committed_groups(REPO / "docs" / "depth_study" / "cells")
    readme = (REPO / "README.md").read_text()
    assert choosing.splice(readme, choosing.README_START, choosing.readme_block(groups, study.STUDY)) == readme
    assert "| dlcl | 17.12 ± 1.11 |" in readme  # the cells (its authors' init) as the report quotes them
    report = (REPO / "docs" / "depth_study" / "README.md").read_text()
    lines = choosing.budget_bound_lines(REPO / "docs" / "depth_study" / "extended", groups, study.STUDY.max_update)
    assert choosing.splice(report, choosing.BUDGET_BOUND_START, lines) == report
    assert choosing.rewrite_seed_tables(report, groups) == report
    from deepnmt_plugin.bench.from_cells import committed_results

    seed_one = choosing.seed_one_table(committed_results(REPO / "docs" / "depth_study" / "cells"))
    assert choosing.splice(report, choosing.SEED_ONE_START, seed_one) == report  # section 3's table
    assert "| deepnorm | 14.96 | 16.72 | 112 | 3.57 | 24 | 0.35 | 2 | 0.00 |" in seed_one  # 500L: the checkpointed cell
    # the eleven's three tables (6L/18L, 50L, 12L-3L/50L-6L: their shapes named) and the 2024–2026 recipes' three
    assert len(choosing.SEED_TABLE_START.findall(report)) == 6
    assert "| method | 6L-6L seeds 1 / 2 / 3 | 18L-18L seeds 1 / 2 / 3 |\n" in report
    results = committed_results(REPO / "docs" / "depth_study" / "cells")
    assert choosing.rewrite_seed_one_values(report, results) == report  # section 3's valid-loss and peak-RSS tables
    assert len(choosing.SEED_ONE_VALUES_START.findall(report)) == 2
    assert "| deepnorm | 5.267 | 5.007 | 6.193 | 6.527 | 9.281 |" in report  # 500L: the checkpointed cell
    assert "preln 18L-18L (at update 4,000)" in " ".join(lines)  # 16.10 >= 0.9 x its 6L seed's 14.91; 11.24 is not


def test_a_seed_cell_lists_each_seed_then_the_spread_the_share_of_6L_and_failures():
    from deepnmt_plugin.bench.choosing import seed_cell

    def cell(seed, bleu, verdict="still learning"):
        return {"seed": seed, "test_bleu": bleu, "verdict": verdict, "status": "finished"}

    six_layer = [cell(1, 10.0), cell(2, 12.0), cell(3, 14.0)]
    assert seed_cell([cell(2, 9.0), cell(1, 6.0)], six_layer) == "6.00 / 9.00 (7.50 ± 2.12; 62\u00a0% of 6L)"
    assert seed_cell([cell(1, 0.0, "stalled at the unigram plateau")], six_layer) == "0.00 (0\u00a0% of 6L; stalled)"
    assert seed_cell(six_layer, None) == "10.00 / 12.00 / 14.00 (12.00 ± 2.00)"


def test_the_committed_results_csv_is_the_cells(tmp_path):
    """results.csv, which the report's tables quote, holds exactly the committed cells' records."""
    from deepnmt_plugin.bench import study
    from deepnmt_plugin.bench.from_cells import CELLS

    cells = REPO / CELLS
    corpus = json.loads(next(cells.glob("*/result.json")).read_text())["corpus"]
    study.write_csv(study.kept_results(cells, study.STUDY, corpus), tmp_path / "results.csv")
    assert (tmp_path / "results.csv").read_text() == (REPO / "docs" / "depth_study" / "results.csv").read_text()


@pytest.mark.parametrize("bleu, six_layer, learned_nothing, expected", [
    (9.0, 10.0, False, runs.KEEPS_BLEU), (8.99, 10.0, False, runs.LOSES_BLEU), (5.0, 10.0, False, runs.LOSES_BLEU),
    (4.99, 10.0, False, runs.FAILS), (12.0, 10.0, True, runs.FAILS)])
def test_a_methods_standing_at_a_depth_is_its_share_of_its_6L_bleu(bleu, six_layer, learned_nothing, expected):
    assert runs.standing(bleu, six_layer, learned_nothing) == expected


def test_a_cell_is_budget_bound_only_when_trained_on_it_keeps_its_bleu_within_three_budgets():
    assert runs.budget_bound_at({3000: 8.0, 4000: 9.0, 5000: 12.0}, 10.0, 2000) == 4000
    assert runs.budget_bound_at({3000: 8.0, 6000: 8.9}, 10.0, 2000) is None  # still below 90 % at 6,000
    assert runs.budget_bound_at({8000: 15.0}, 10.0, 2000) is None  # past three budgets: not by this rule
    assert runs.budget_bound_at({2000: 15.0}, 10.0, 2000) is None  # the budget itself is not trained on


def test_the_findings_rank_each_shape_and_say_each_recipes_standing():
    from deepnmt_plugin.bench.choosing import findings

    def group(*bleus, verdict="still learning"):
        return [{"seed": seed, "test_bleu": b, "verdict": verdict, "status": "finished"} for seed, b in enumerate(bleus, 1)]

    groups = {("dlcl", 6, 6): group(18.0, 19.0, 20.0), ("preln", 6, 6): group(14.0, 15.0, 16.0),
              ("admin", 6, 6): group(15.0),
              ("dlcl", 18, 18): group(20.0, 21.0, 22.0), ("preln", 18, 18): group(9.0, 10.0, 11.0),
              ("admin", 18, 18): group(0.0, verdict="stalled at the unigram plateau")}
    assert findings(groups) == [
        "- **6L-6L**: best dlcl (19.00 ± 1.00).",  # preln's 15 + 1 does not reach 19 - 1
        "- **18L-18L**: best dlcl (21.00 ± 1.00); keep ≥ 90\u00a0% of their 6L BLEU: dlcl; keep 50\u00a0%–90\u00a0%: "
        "preln; fail (below 50\u00a0%, or a seed learned no translation): admin."]


def test_a_table_cell_names_failed_seeds_and_partial_seed_sets():
    from deepnmt_plugin.bench.choosing import table_cell
    from deepnmt_plugin.bench.runs import DIVERGED, IGNORES_SOURCE, STALLED

    def cell(seed, bleu, verdict="still learning", status="finished"):
        return {"seed": seed, "test_bleu": bleu, "verdict": verdict, "status": status}

    assert table_cell([cell(1, 0.39, IGNORES_SOURCE)]) == "0.39 (ignores the source)"
    assert table_cell([cell(1, 19.0), cell(2, 20.0)]) == "19.50 ± 0.71 (seeds 1–2)"
    assert table_cell([cell(1, 0.0, STALLED), cell(2, 1.0, IGNORES_SOURCE), cell(3, None, status=DIVERGED)]) == (
        "0.33 ± 0.58 (1/3 stalled; 1/3 ignore the source; 1/3 diverged)")


def test_every_committed_study_record_carries_the_rules_verdict():
    """The tables recompute verdicts on read; the records (docs/depth_study/cells) must say the same."""
    from deepnmt_plugin.bench.study import cell_verdict

    records = sorted((REPO / "docs" / "depth_study" / "cells").glob("*/result.json"))
    assert len(records) > 200
    stale = [(path.parent.name, record["verdict"], cell_verdict(record, record["unigram_plateau"])["verdict"])
             for path in records for record in [json.loads(path.read_text())]
             if record["verdict"] != cell_verdict(record, record["unigram_plateau"])["verdict"]]
    assert stale == []


LAYERS = ("2026-01-01 | INFO | train_inner | epoch 001:     {n} / 933 loss=9.3, num_updates={n}, gnorm=0.5, "
          "gnorm/enc.00={e0}, gnorm/enc.01={e1}, gnorm/dec.00={d0}, gnorm/dec.01=0.25, gnorm/other=0.2, "
          "beta/enc.00.attn=0.875, beta/enc.00.ffn=0.5, beta/dec.00.cross=0.125, update_norm=10.5, wall=0")


def test_layer_values_plot_and_errors(tmp_path, capsys):
    text = "\n".join([LAYERS.format(n=10, e0=0.125, e1=0.25, d0=0.5), LAYERS.format(n=20, e0="1.5e-13", e1=0.5, d0="None")])
    assert layers.layer_values(text, "gnorm") == {
        10: {"enc": [0.125, 0.25], "dec": [0.5, 0.25]},
        20: {"enc": [1.5e-13, 0.5], "dec": [0.25]},  # None: not measured since the previous line
    }
    assert layers.layer_values(text, "beta", "cross") == {10: {"dec": [0.125]}, 20: {"dec": [0.125]}}
    assert layers.layer_values(text, "omega", "attn") == {}

    log = tmp_path / "admin_50L" / "train.log"
    log.parent.mkdir()
    log.write_text(text)
    assert layers.main([str(log), "--updates", "10", "20", "--out", str(tmp_path / "gnorm.png")]) == 0
    assert (tmp_path / "gnorm.png").read_bytes()[:4] == b"\x89PNG"
    for argv, error in [
        (["--updates", "30"], "gnorm was not measured at update 30 (measured at 2 updates, 10 to 20)"),
        (["--key", "omega", "--sublayer", "ffn", "--updates", "10"], "no train_inner line has omega (ffn) per layer; "
         "train with --task translation_deep --diagnostics-interval K --diagnostics-groups omega"),
        (["--key", "beta", "--updates", "10"], "--key beta: name the sublayer, --sublayer {attn,cross,ffn}"),
        (["--sublayer", "ffn", "--updates", "10"], "--key gnorm: gnorm is per layer, drop --sublayer"),
    ]:
        with pytest.raises(SystemExit):
            layers.main([str(log), "--out", str(tmp_path / "x.png"), *argv])
        assert error in capsys.readouterr().err
    assert not (tmp_path / "x.png").exists()


def test_curves_join_a_cell_and_its_continuation_and_refuse_files_without_losses(tmp_path, capsys):
    cell = tmp_path / "result.json"  # a study cell's record, then the log of the run that trained it on
    cell.write_text(json.dumps({"valid_loss_curve": [[100, 9.5], [2000, 6.5]]}))
    continued = tmp_path / "train.log"
    continued.write_text(VALID.format(loss=6.25).replace("num_updates 4", "num_updates 3000") + "\n"
                         + VALID.format(loss=6.5).replace("num_updates 4", "num_updates 2000"))
    assert curves.read_curve([cell, continued]) == [[100, 9.5], [2000, 6.5], [3000, 6.25]]
    out = tmp_path / "valid.png"
    assert curves.main(["--curve", "lr 2e-3", str(cell), str(continued), "--curve", "lr 1e-3", str(continued),
                        "--out", str(out)]) == 0
    assert out.read_bytes()[:4] == b"\x89PNG"
    empty = tmp_path / "empty.log"
    empty.write_text("no validation here\n")
    for argv, error in [(["--curve", "a", str(empty)], "--curve a: no validation loss in"),
                        (["--curve", "a"], "--curve a: name the logs or result.json files after the label"),
                        (["--curve", "a", str(tmp_path / "gone.log")], "--curve a: no such file:")]:
        with pytest.raises(SystemExit):
            curves.main([*argv, "--out", str(tmp_path / "x.png")])
        assert error in capsys.readouterr().err
    assert not (tmp_path / "x.png").exists()


@pytest.mark.slow
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
    plateau = round(runs.unigram_plateau(str(toy_data)), 3)
    swept = {(r["method"], r["depth"]): r for r in report["runs"]}
    assert list(swept) == [("postln", 1), ("tfixup", 1), ("postln", 2), ("tfixup", 2)]
    assert swept[("tfixup", 2)] == {**earlier, "unigram_plateau": plateau, "verdict": "diverged"}
    for key in [("postln", 1), ("tfixup", 1), ("postln", 2)]:
        run = swept[key]
        assert run["status"] == "finished" and run["returncode"] == 0
        assert run["unigram_plateau"] == plateau  # one validation, at the end: no slope to read
        assert run["verdict"] in ("stalled at the unigram plateau", "left the plateau")
        assert [step for step, _ in run["update_norm"]] == [2, 4]  # every --interval 2 updates
        assert all(value > 0 for _, value in run["update_norm"])
        assert 0 < run["final_valid_loss"] < run["final_train_loss"] + 2
        assert not (workdir / f"{key[0]}_{key[1]}L" / "checkpoints").exists()

    table = (workdir / "bench_depth.md").read_text()
    assert "| method | 1L-1L | 2L-2L |" in table
    assert "minutes wall clock on CPU, --jobs 2, 1 run reused from an earlier one." in table
    assert f"| tfixup | {swept[('tfixup', 1)]['final_valid_loss']:.3f} | diverged |" in table
    peak = max(v for _, v in swept[("postln", 2)]["update_norm"])
    assert f"| postln | {max(v for _, v in swept[('postln', 1)]['update_norm']):.3f} | {peak:.3f} |" in table
    for name in ("update_norm_1L.png", "update_norm_2L.png", "final_loss_vs_depth.png"):
        assert (workdir / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    output = capsys.readouterr().out
    # deepest first, and the table in the plan's order whatever order the two workers finished in
    assert f"[2/4] tfixup 2L-2L: diverged, valid loss – (unigram plateau {plateau:.3f}), 4 s (log: earlier.log)" in output
    verdicts = [swept[key]["verdict"] for key in [("postln", 1), ("tfixup", 1), ("postln", 2)]]
    assert sum(output.count(f": {verdict}, valid loss ") for verdict in set(verdicts)) == 3
    assert "| postln | " + " | ".join(verdicts[::2]) + " |" in table  # the verdict table
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


def test_a_kept_run_on_another_corpus_stops_the_sweep_before_training(toy_data, tmp_path):
    from deepnmt_plugin.bench import study

    kept = tmp_path / "sweep" / "postln_2L" / "result.json"
    kept.parent.mkdir(parents=True)
    preset = depth.PRESETS["micro"]
    kept.write_text(json.dumps({"method": "postln", "depth": 2, "budget": depth.budget(preset),
                                "corpus": {"checksum": "0" * 64, "pinned": False}}))
    this = study.corpus_record(str(toy_data), str(toy_data))["checksum"]
    with pytest.raises(SystemExit, match=rf"^deepnmt: error: {kept} was trained on another corpus \(checksum 0{{64}}\) "
                                         rf"than this sweep's \({this}\); give this sweep another --workdir$"):
        depth.main(["--data", str(toy_data), "--micro", "--workdir", str(tmp_path / "sweep"), "--cpu"])
    assert sorted(p.name for p in kept.parent.iterdir()) == ["result.json"]  # nothing trained or written


@pytest.mark.parametrize("record, flags, message", [
    # finished on another corpus: its BLEU would be reported against this corpus's plateau
    ("result.json", [], r"was trained on another corpus \(checksum 0{64}\) than this study's \([0-9a-f]{64}\)"),
    # started under another peak lr: resuming it would mix two budgets in one record
    ("train.json", ["--lr", "1e-3"], r"was started under another budget than \{.*'lr': 0.001"),
    ("train.json", [], r"was started on another corpus \(checksum 0{64}\)"),
])
def test_a_cell_of_another_corpus_or_budget_stops_the_study_before_training(record, flags, message, toy_data,
                                                                              tmp_path, monkeypatch):
    from deepnmt_plugin.bench import study

    monkeypatch.chdir(REPO)
    cell = tmp_path / "study" / "preln_1L-1L"
    cell.mkdir(parents=True)
    corpus = {"checksum": "0" * 64, "pinned": False} if not flags else study.corpus_record(str(toy_data), str(toy_data))
    (cell / record).write_text(json.dumps({"budget": study.budget(study.STUDY_MICRO), "corpus": corpus,
                                           "seconds": 10.0, "rss_kib": 1, "returncode": None}))
    with pytest.raises(SystemExit, match=rf"^deepnmt: error: {cell} {message}.*give this study another --workdir$"):
        depth.main(["--data", str(toy_data), "--preset", "study-micro", "--methods", "preln", "--workdir",
                    str(tmp_path / "study"), "--cpu", *flags])
    assert sorted(p.name for p in cell.iterdir()) == [record]  # nothing trained or written


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


def test_lr_overrides_the_peak_lr_of_sweep_and_study_for_every_method(toy_data, tmp_path, monkeypatch):
    from deepnmt_plugin.bench import study

    monkeypatch.chdir(tmp_path)
    kept = tmp_path / "runs" / "bench_depth" / "4x512_lr0.001" / "postln_2L" / "result.json"
    kept.parent.mkdir(parents=True)
    kept.write_text(json.dumps({"method": "postln", "depth": 2, "budget": depth.budget(depth.PRESETS["micro"])}))
    with pytest.raises(SystemExit, match=r"4x512_lr0.001/postln_2L/result.json was trained with another budget"):
        depth.main(["--data", str(toy_data), "--micro", "--lr", "1e-3", "--cpu"])

    planned = {}
    monkeypatch.setattr(study, "run", lambda args, preset, threads: planned.update(preset=preset) or 0)
    assert depth.main(["--data", str(toy_data), "--preset", "study", "--lr", "0.001", "--depths", "50"]) == 0
    assert planned["preset"] == replace(study.STUDY, lr=0.001, depths=((50, 50),), checkpointed=())
    for method in ("postln", "preln", "admin", "deepnorm", "tfixup"):
        command = study.train_command("data", study.Cell(method, 50, 50), planned["preset"], Path("s"), cpu=True)
        assert command[command.index("--lr") + 1] == "0.001"
    for bad in ("0", "-1e-3", "nan", "fast"):
        with pytest.raises(SystemExit):
            depth.parse_arguments(["--data", "d", "--lr", bad])


def test_schedule_authors_trains_under_the_authors_optimiser_and_cosine_schedule(toy_data, tmp_path, monkeypatch):
    """The variant cells' fairseq-train gets the authors' betas, weight decay, clipping and warmup-then-cosine curve,
    scaled to the study's updates; a method without one, or a flag that contradicts it, is refused in one line."""
    from fairseq import options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from fairseq.optim import build_optimizer
    from fairseq.optim.lr_scheduler import build_lr_scheduler

    from deepnmt_plugin.bench import study

    planned = {}
    monkeypatch.setattr(study, "run", lambda args, preset, threads: planned.update(preset=preset) or 0)
    assert depth.main(["--data", str(toy_data), "--preset", "study", "--schedule", "authors", "--methods",
                       "hybridnorm", "mixln", "dyt", "--depths", "18"]) == 0
    preset = planned["preset"]
    assert preset.schedule == "authors" and study.budget(preset)["schedule"] == "authors"
    assert "schedule" not in study.budget(study.STUDY)  # the study's records, written before, stay comparable
    for method, betas, decay, clip, peak, warmup in (("hybridnorm", (0.9, 0.95), 0.1, 1.0, 3e-4, 17),
                                                      ("mixln", (0.9, 0.999), 0.0, 0.0, 1e-3, 200),
                                                      ("dyt", (0.9, 0.95), 0.1, 1.0, 3e-4, 4)):
        command = study.train_command(str(toy_data), study.Cell(method, 18, 18), preset, tmp_path, cpu=True)
        parsed = options.parse_args_and_arch(options.get_training_parser(), command[3:])
        cfg = convert_namespace_to_omegaconf(parsed)
        assert (tuple(eval(cfg.optimizer.adam_betas)), cfg.optimizer.weight_decay, cfg.optimization.clip_norm) == (
            betas, decay, clip)
        optimizer = build_optimizer(cfg.optimizer, [torch.nn.Parameter(torch.zeros(1))])
        scheduler = build_lr_scheduler(cfg.lr_scheduler, optimizer)
        lrs = [scheduler.step_update(update) for update in range(preset.max_update)]
        assert lrs[0] == 0 and lrs[warmup] == pytest.approx(peak) and max(lrs) == pytest.approx(peak)
        assert lrs[warmup // 2] == pytest.approx(peak * (warmup // 2) / warmup)
        assert lrs[-1] == pytest.approx(0.1 * peak, rel=1e-3)  # the cosine ends at the authors' floor
    for argv, line in ((["--methods", "preln", "mixln"], r"^deepnmt: error: --schedule authors has no schedule for "
                                                         r"preln \(only for mixln, lns, hybridnorm, dyt\)$"),
                       (["--methods", "mixln", "--lr", "1e-3"], r"^deepnmt: error: --lr contradicts --schedule authors"),
                       (["--micro", "--methods", "mixln"], r"^deepnmt: error: --schedule authors is the study's")):
        preset_flags = [] if "--micro" in argv else ["--preset", "study"]
        with pytest.raises(SystemExit, match=line):
            depth.main(["--data", str(toy_data), *preset_flags, "--schedule", "authors", *argv])


def test_max_update_overrides_the_study_checkpointed_cells_own_updates(toy_data, monkeypatch):
    from deepnmt_plugin.bench import study

    planned = {}
    monkeypatch.setattr(study, "run", lambda args, preset, threads: planned.update(preset=preset) or 0)
    assert depth.main(["--data", str(toy_data), "--preset", "study", "--methods", "deepnorm", "--depths", "500"]) == 0
    assert planned["preset"].checkpointed == (("deepnorm", 500, 500, 1000), ("postln", 500, 500, 300))
    assert depth.main(["--data", str(toy_data), "--preset", "study", "--depths", "500", "--max-update", "3000"]) == 0
    assert planned["preset"].checkpointed == (("deepnorm", 500, 500, 3000), ("postln", 500, 500, 3000))
    (cell,) = [cell for cell in study.cells(planned["preset"], ["deepnorm"]) if cell.layers == 1000]
    command = study.train_command("data", cell, planned["preset"], Path("s"), cpu=True)
    assert command[command.index("--max-update") + 1] == "3000"


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


def study_cell(workdir, name):
    return json.loads((workdir / name / "result.json").read_text())


@pytest.mark.slow
def test_study_micro_trains_generates_scores_and_resumes(toy_data, tmp_path, capsys, monkeypatch):
    """--preset study-micro end to end on the toy corpus: a cell interrupted after its first checkpoint resumes
    from it, every cell is scored on test, results.csv has one column per figure the report reads, and the plots are written."""
    from deepnmt_plugin.bench import study

    monkeypatch.chdir(REPO)
    workdir = tmp_path / "study"
    # an earlier invocation stopped after update 2 of 4: its checkpoint_last.pt and log are there, no result
    interrupted = study.Cell("deepnorm", 2, 2)
    (workdir / interrupted.name).mkdir(parents=True)
    stopped = study.train_command(str(toy_data), interrupted, study.STUDY_MICRO, workdir / interrupted.name / "checkpoints",
                                  cpu=True)
    stopped[stopped.index("--max-update") + 1] = "2"
    with open(workdir / interrupted.name / "train.log", "w") as log:
        subprocess.run(stopped, stdout=log, stderr=subprocess.STDOUT, check=True)

    arguments = ["--data", str(toy_data), "--preset", "study-micro", "--methods", "preln", "deepnorm",
                 "--workdir", str(workdir), "--cpu", "--jobs", "2"]
    assert depth.main(arguments) == 0
    printed = capsys.readouterr().out
    assert "    preln_1L-1L: valid loss " in printed  # progress, read from the log the trainer writes
    corpus = study_cell(workdir, "preln_1L-1L")["corpus"]  # the data-bin's own checksum: no text beside it
    assert corpus["of"] == "data-bin" and not corpus["pinned"] and len(corpus["checksum"]) == 64
    assert (f"the corpus: its text unknown (no data-prep output beside the data-bin), data-bin checksum "
            f"{corpus['checksum']}, its unigram plateau at validation loss ") in printed
    reading = printed.strip().splitlines()[-1]  # the last line reads the table, a verdict per cell
    assert reading.startswith("Reading the table: ")
    for name in ("preln_1L-1L", "deepnorm_1L-1L", "preln_2L-2L", "deepnorm_2L-2L", "deepnorm_2L-2L_ckpt"):
        assert f"{name} {study_cell(workdir, name)['verdict']}" in reading
    resumed = (workdir / interrupted.name / "train.log").read_text()
    assert "Loaded checkpoint" in resumed and "@ 2 updates)" in resumed
    assert [update for update, _ in study_cell(workdir, interrupted.name)["update_norm"]] == [2, 4]

    rows = list(csv.DictReader((workdir / "results.csv").open()))
    assert list(rows[0]) == ["method", "encoder_layers", "decoder_layers", "seed", "updates", "valid_loss", "test_bleu",
                             "diverged", "peak_rss_gib", "verdict"]
    assert [(r["method"], r["encoder_layers"], r["decoder_layers"], r["updates"]) for r in rows] == [
        ("preln", "1", "1", "4"), ("deepnorm", "1", "1", "4"), ("preln", "2", "2", "4"), ("deepnorm", "2", "2", "4"),
        ("deepnorm", "2", "2", "2")]  # the checkpointed twin, with its own budget
    for row in rows:
        result = study_cell(workdir, f"{row['method']}_{row['encoder_layers']}L-{row['decoder_layers']}L"
                            + ("_ckpt" if row["updates"] == "2" else ""))
        assert row["diverged"] == str(result["status"] == "diverged")
        assert row["verdict"] == result["verdict"]
        if result["status"] == "finished":
            assert float(row["test_bleu"]) == result["scores"]["sacrebleu"] >= 0
            assert result["scores"]["sentences"] == 100  # every test sentence
        assert 0.1 < float(row["peak_rss_gib"]) < 8 and float(row["valid_loss"]) > 0
    command = (workdir / "preln_1L-1L" / "train_command.txt").read_text()
    assert " --arch transformer_preln --encoder-layers 1 " in command
    # pasteable in the repository root, where the test runs: no interpreter or checkout path of this machine
    assert command.startswith(f"python -m fairseq_cli.train {toy_data} --user-dir deepnmt_plugin ")
    assert sys.executable not in command and str(REPO) not in command
    ckpt = study_cell(workdir, "deepnorm_2L-2L_ckpt")
    ckpt_log = (workdir / ckpt["name"] / "train.log").read_text()
    assert ckpt["checkpoint_activations"] and "checkpoint_activations=True" in ckpt_log
    assert "--flush-denormal: subnormal floats are flushed to zero on the CPU" in ckpt_log
    assert "--flush-denormal" not in command
    assert sum(study_cell(workdir, name)["status"] == "finished" for name in ("preln_1L-1L", "preln_2L-2L")) >= 1
    samples = (workdir / "samples.md").read_text()  # the first test sentences as every converged cell translated them
    assert samples.count("- source: ") == 6 and "  - preln_1L-1L: " in samples
    # the records alone (no log, no generate output: what docs/ keeps) redraw the same samples and curves
    records = tmp_path / "records"
    for kept_record in workdir.glob("*/result.json"):
        (records / kept_record.parent.name).mkdir(parents=True)
        shutil.copy(kept_record, records / kept_record.parent.name)
    kept = study.kept_results(records, study.STUDY_MICRO, corpus)
    study.write_samples(kept, records, records / "samples.md")
    assert (records / "samples.md").read_text() == samples
    for result in kept:
        curve = runs.valid_loss_curve((workdir / result["name"] / "train.log").read_text())
        assert result["valid_loss_curve"] == curve and curve[-1] == [result["updates"], result["valid_loss"]]
    assert [path.name for path in study.write_plots(kept, records, study.STUDY_MICRO)][-1] == "valid_loss_vs_update.png"
    for name in ("bleu_vs_depth.png", "update_norm_1L.png", "update_norm_2L.png", "valid_loss_vs_update.png"):
        assert (workdir / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not (workdir / "bleu_by_shape.png").exists()  # equal stacks only: bleu_vs_depth.png shows them
    assert "| deepnorm_2L-2L_ckpt | 2 |" in (workdir / "results.md").read_text()

    # a second invocation reuses every cell, and brings a record written under another verdict rule to today's;
    # another preset in the same workdir is refused before training
    stale = workdir / "deepnorm_1L-1L" / "result.json"
    today = json.loads(stale.read_text())
    stale.write_text(json.dumps({**today, "verdict": "an earlier rule's word"}, indent=1))
    capsys.readouterr()
    assert depth.main(arguments) == 0
    assert "[1/5]" in capsys.readouterr().out
    assert json.loads(stale.read_text()) == today
    with pytest.raises(SystemExit, match=r"was trained under another budget .* give this study another --workdir"):
        depth.main(arguments + ["--max-update", "6"])

    # a record torn by a crash mid-write (before records were written atomically) is named and rebuilt, not retrained
    record = workdir / "preln_1L-1L" / "result.json"
    whole = json.loads(record.read_text())
    record.write_text(record.read_text()[:100])
    capsys.readouterr()
    assert depth.main(arguments) == 0
    assert f"deepnmt: {record} is torn (a write was cut short); rebuilding it" in capsys.readouterr().out
    rebuilt = json.loads(record.read_text())
    assert {k: v for k, v in rebuilt.items() if k != "environment"} == {k: v for k, v in whole.items() if k != "environment"}
    assert rebuilt["valid_loss_curve"] == whole["valid_loss_curve"]  # from the log: nothing was retrained


def test_a_seed_or_method_named_twice_is_one_cell():
    from deepnmt_plugin.bench import study

    cells = study.cells(study.STUDY_MICRO, ["preln", "preln"], [2, 2])
    assert [cell.name for cell in cells] == ["preln_1L-1L_seed2", "preln_2L-2L_seed2"]


def test_study_schedules_and_post_ln_failure_rule():
    from deepnmt_plugin.bench import study

    preset = study.STUDY
    for method in ("postln", "admin", "deepnorm"):
        command = " ".join(study.train_command("data", study.Cell(method, 6, 6), preset, Path("s"), cpu=True))
        assert f"--lr 0.002 --lr-scheduler inverse_sqrt --warmup-updates {preset.warmup_updates} --warmup-init-lr 1e-7" in command
    for method in ("preln", "tfixup"):
        command = " ".join(study.train_command("data", study.Cell(method, 6, 6), preset, Path("s"), cpu=True))
        assert f"--lr 0.002 --lr-scheduler inverse_sqrt_nowarmup --decay-period {preset.warmup_updates}" in command

    def row(depth, bleu, status="finished"):
        return {"method": "postln", "encoder_layers": depth, "decoder_layers": depth, "checkpoint_activations": False,
                "test_bleu": bleu, "status": status}

    assert study.post_ln_failure_depth([row(6, 20.0), row(18, 12.0), row(50, 9.9)]) == 50  # below half of 20
    assert study.post_ln_failure_depth([row(6, 20.0), row(18, None, "diverged"), row(50, 9.9)]) == 18
    assert study.post_ln_failure_depth([row(6, 20.0), row(18, 10.0)]) is None


@pytest.mark.slow
def test_study_seeds_and_unequal_stacks(toy_data, tmp_path, capsys, monkeypatch):
    """--seeds and --depths N-M: a cell per seed (seed 1 keeps its name), the seed in the command, the CSV and the
    record with the environment that produced it, and the spread over seeds in results.md."""
    from deepnmt_plugin.bench import study

    monkeypatch.chdir(REPO)
    workdir = tmp_path / "study"
    assert depth.main(["--data", str(toy_data), "--preset", "study-micro", "--methods", "preln", "--depths", "2-1",
                       "--seeds", "1", "2", "--workdir", str(workdir), "--cpu", "--jobs", "2"]) == 0
    first, second = study_cell(workdir, "preln_2L-1L"), study_cell(workdir, "preln_2L-1L_seed2")
    assert (first["encoder_layers"], first["decoder_layers"], first["seed"], second["seed"]) == (2, 1, 1, 2)
    assert " --encoder-layers 2 --decoder-layers 1 " in second["command"] and " --seed 2 " in second["command"]
    assert first["update_norm"] != second["update_norm"]  # another initialisation and batch order
    environment = second["environment"]
    assert environment["commit"] == subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True,
                                                   text=True).stdout.strip()
    assert environment["torch"] == torch_version() and environment["threads"] == max(1, depth.available_cores() // 2) and environment["device"]
    rows = list(csv.DictReader((workdir / "results.csv").open()))
    assert [(row["method"], row["encoder_layers"], row["decoder_layers"], row["seed"]) for row in rows] == [
        ("preln", "2", "1", "1"), ("preln", "2", "1", "2")]
    bleus = [first["test_bleu"], second["test_bleu"]]
    spread = f"{sum(bleus) / 2:.2f} ± {study.statistics.stdev(bleus):.2f}"
    stalled = sum(cell["verdict"] == "stalled at the unigram plateau" for cell in (first, second))
    ignoring = sum(cell["verdict"] == "ignores the source" for cell in (first, second))
    assert f"| preln | 2-1 | 2 | {spread} | {stalled}/2 | {ignoring}/2 | 0/2 |" in (workdir / "results.md").read_text()
    assert (workdir / "bleu_by_shape.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_a_cell_records_the_environment_it_started_training_under(toy_data, tmp_path, monkeypatch):
    """The record names the environment read as training starts (a commit made while a cell trains is not its);
    train.json keeps the seconds and peak RSS so far while it trains (a killed driver loses at most MEASURE_EVERY
    seconds of them), and a resume under another environment is named beside the first. A cell stopped after its
    last save is not trained again: fairseq would take one update past the budget."""
    from deepnmt_plugin.bench import study

    monkeypatch.chdir(REPO)
    readings = iter(range(1, 10))
    monkeypatch.setattr(study, "provenance", lambda cpu, threads: {"commit": f"commit-{next(readings)}"})
    monkeypatch.setattr(study, "MEASURE_EVERY", 0)
    measured = []
    monkeypatch.setattr(study, "peak_rss_kib", lambda pid: measured.append(pid) or 1)
    workdir = tmp_path / "study"
    arguments = ["--data", str(toy_data), "--preset", "study-micro", "--methods", "preln", "--depths", "1",
                 "--workdir", str(workdir), "--cpu"]
    cell = workdir / "preln_1L-1L"
    starts = "| fairseq_cli.train | task: "  # one line per fairseq-train start

    def killed(record: dict) -> None:
        """What a driver killed while fairseq-train ran leaves: train.json as last measured, no scores, no record."""
        (cell / "train.json").write_text(json.dumps({**record, "returncode": None}))
        for name in ("result.json", "scores.json", "generate.txt"):
            (cell / name).unlink()

    assert depth.main([*arguments, "--max-update", "2"]) == 0  # stands for a run stopped at its checkpoint of update 2
    first = study_cell(workdir, cell.name)
    assert first["environment"] == {"commit": "commit-1"} and "resumed_under" not in first and first["updates"] == 2
    kept = json.loads((cell / "train.json").read_text())
    assert measured and kept["returncode"] == 0 and kept["environments"] == [{"commit": "commit-1"}]
    assert first["seconds"] == round(kept["seconds"]) and kept["seconds"] > 0 and kept["rss_kib"] > 1

    # killed mid-training: the rerun resumes from update 2 under its own environment, named beside the first
    killed(kept)
    assert depth.main(arguments) == 0
    resumed = study_cell(workdir, cell.name)
    assert resumed["environment"] == {"commit": "commit-1"} and resumed["resumed_under"] == [{"commit": "commit-2"}]
    assert resumed["seconds"] >= first["seconds"] and resumed["updates"] == 4
    log = (cell / "train.log").read_text()
    assert log.count(starts) == 2 and "@ 2 updates)" in log

    # killed after its last save, before fairseq-train exited: the checkpoint at the budget is the cell's
    killed(json.loads((cell / "train.json").read_text()))
    assert depth.main(arguments) == 0
    saved = study_cell(workdir, cell.name)
    assert (cell / "train.log").read_text() == log and saved["updates"] == 4
    assert {key: saved[key] for key in ("resumed_under", "test_bleu", "valid_loss", "seconds")} == {
        key: resumed[key] for key in ("resumed_under", "test_bleu", "valid_loss", "seconds")}

    # a start stopped before its first checkpoint: the next trains from scratch, and its record is that start's alone
    (cell / "train.json").write_text(json.dumps({**kept, "seconds": 1e6, "returncode": None}))
    (cell / "result.json").unlink()
    shutil.rmtree(cell / "checkpoints")
    assert depth.main(arguments) == 0
    restarted = study_cell(workdir, cell.name)
    assert restarted["environment"] == {"commit": "commit-3"} and "resumed_under" not in restarted
    assert (cell / "train.log").read_text().count(starts) == 1 and restarted["seconds"] < 1e6
    assert restarted["update_norm"][:1] == first["update_norm"][:1] and restarted["updates"] == 4


def test_the_depth_plots_draw_a_checkpointed_cell_only_where_no_plain_cell_of_its_shape_is():
    """The 100L twin (50 updates, for memory and time) stays out of DeepNorm's 100L mean; the 500L cells are drawn."""
    from deepnmt_plugin.bench import study

    def cell(method, layers, checkpointed=False, seed=1, decoder=None):
        return {"method": method, "encoder_layers": layers, "decoder_layers": decoder or layers,
                "checkpoint_activations": checkpointed, "seed": seed}

    plain, twin, deep, other_seed = cell("deepnorm", 100), cell("deepnorm", 100, True), cell("deepnorm", 500, True), \
        cell("deepnorm", 100, True, seed=2)
    assert study.depth_curve_cells([plain, twin, deep, other_seed, cell("preln", 50, decoder=6)]) == [
        plain, deep, other_seed]


def test_a_study_on_a_data_prep_output_records_its_corpus_checksum(tmp_path):
    from deepnmt_plugin.bench import study
    from deepnmt_plugin.data import l10n

    for name in l10n.TEXTS:
        (tmp_path / name).write_text(f"{name}\n")
    (tmp_path / "data-bin").mkdir()
    expected = {"checksum": l10n.checksum(l10n.text_hashes(tmp_path)), "pinned": False}
    assert study.corpus_record(str(tmp_path), str(tmp_path / "data-bin")) == expected
    assert study.corpus_record(str(tmp_path / "data-bin"), str(tmp_path / "data-bin")) == expected  # --data data-bin
    bare = tmp_path / "data-bin" / "x"  # a data-bin with no text beside it: its files' checksum
    bare.mkdir()
    (bare / "dict.de.txt").write_text("a 1\n")
    record = study.corpus_record(str(bare), str(bare))
    assert record == {"checksum": record["checksum"], "pinned": False, "of": "data-bin"}
    (bare / "dict.de.txt").write_text("b 1\n")
    assert study.corpus_record(str(bare), str(bare))["checksum"] != record["checksum"]


def torch_version() -> str:
    import torch

    return torch.__version__


def test_memory_bench_reports_each_archs_step_peak_against_the_first(toy_data, tmp_path, capsys):
    from deepnmt_plugin.bench import memory

    records = tmp_path / "memory.csv"
    assert memory.main(["--data", str(toy_data), "--layers", "1", "--tokens", "64", "--archs", "transformer_preln",
                        "transformer_dlcl", "--csv", str(records)]) == 0
    table = capsys.readouterr().out
    assert "| transformer_preln | 1L-1L |" in table and "| transformer_dlcl | 1L-1L |" in table
    rows = list(csv.DictReader(records.open()))
    assert [row["arch"] for row in rows] == ["transformer_preln", "transformer_dlcl"]
    assert all(float(row["step_peak_mib"]) >= 0 for row in rows) and rows[0]["ratio"] in ("1.0", "")


def test_memory_bench_measures_admin_and_names_a_failed_worker_in_one_line(toy_data, monkeypatch):
    """Admin's step runs with omega set as the throughput tool sets it (it refuses to train with omega unset); a worker
    that fails ends the run with one line naming the arch and the worker's own error, and a bad flag or an unknown arch
    is refused in one line before any worker starts."""
    from deepnmt_plugin.bench import memory
    from deepnmt_plugin.reproduce import data_bin

    row = memory.one_step(data_bin(str(toy_data)), "transformer_admin", 1, "tiny", 64)
    assert row["arch"] == "transformer_admin" and row["step_peak_mib"] >= 0
    failed = subprocess.CompletedProcess([], 1, stdout="", stderr="Traceback ...\nRuntimeError: out of memory\n")
    monkeypatch.setattr(memory.subprocess, "run", lambda *args, **kwargs: failed)
    with pytest.raises(SystemExit, match=r"^deepnmt: error: transformer_dlcl's step failed in its worker: "
                                         r"RuntimeError: out of memory$"):
        memory.main(["--data", str(toy_data), "--archs", "transformer_dlcl"])
    for argv, line in ((["--layers", "0"], r"argument --layers: expected a whole number >= 1, got '0'"),
                       (["--tokens", "-4"], r"argument --tokens: expected a whole number >= 1, got '-4'"),
                       (["--archs", "transformer_preln", "transformer_nope"],
                        r"--archs: transformer_nope: not an arch of fairseq or the plugin")):
        with pytest.raises(SystemExit, match=rf"^deepnmt: error: {line}$"):
            memory.main(["--data", str(toy_data), *argv])


def test_throughput_refuses_bad_counts_and_unknown_archs_in_one_line():
    """--rounds or --updates 0 divided by zero after every arch was built, and an unknown arch printed fairseq's usage
    with its whole arch list; each is refused in one line before anything is built."""
    from deepnmt_plugin.bench import throughput

    for argv, line in ((["--rounds", "0"], r"argument --rounds: expected a whole number >= 1, got '0'"),
                       (["--updates", "0"], r"argument --updates: expected a whole number >= 1, got '0'"),
                       (["--max-tokens", "0"], r"argument --max-tokens: expected a whole number >= 1, got '0'"),
                       (["--layers", "-1"], r"argument --layers: expected a whole number >= 1, got '-1'"),
                       (["--archs", "transformer", "transformer_nope", "nope2"],
                        r"--archs: transformer_nope, nope2: not an arch of fairseq or the plugin")):
        with pytest.raises(SystemExit, match=rf"^deepnmt: error: {line}$"):
            throughput.parse_arguments(["--data", "d", *argv])
    assert throughput.parse_arguments(["--data", "d", "--archs", "transformer", "transformer_dyt"]).rounds == 30
