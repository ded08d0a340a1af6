"""The table scripts: dry-run plans, batch arithmetic, scoring conventions, collect, divergence."""

import contextlib
import csv
import io
import json
import os
import re
import subprocess
from pathlib import Path

import pytest
import torch
import yaml

from conftest import REPO
from deepnmt_plugin import reproduce
from deepnmt_plugin.reproduce import batching, collect, diverged_log
from deepnmt_plugin.scoring import compound_split, read_generate_output, score

CONFIGS = sorted((REPO / "configs").glob("*.yaml"))
SCRIPTS = {path.stem: REPO / "scripts" / f"reproduce_{path.stem}.sh" for path in CONFIGS}


def dry_run(config, *flags):
    output = io.StringIO()
    with contextlib.redirect_stdout(output):
        assert reproduce.main([str(REPO / "configs" / f"{config}.yaml"), "--data", "DATA", "--dry-run", *flags]) == 0
    return output.getvalue()


@pytest.mark.parametrize("config", list(SCRIPTS))
def test_each_table_has_a_script(config, tmp_path):
    """Each script runs the driver on its table: the ``python`` it execs is a stand-in that records its PYTHONPATH
    and arguments, which then run in this process (a fresh Python per script would import torch fourteen times;
    test_reliability_pipeline.py runs a script through a real one)."""
    stand_in, record = tmp_path / "bin" / "python", tmp_path / "argv"
    stand_in.parent.mkdir()
    stand_in.write_text(f"#!/bin/sh\nprintf '%s\\0' \"$PYTHONPATH\" \"$@\" > {record}\n")
    stand_in.chmod(0o755)
    subprocess.run(["bash", str(SCRIPTS[config]), "--data", "DATA", "--dry-run", "--gpus", "2"], check=True,
                   env=dict(os.environ, PATH=f"{stand_in.parent}{os.pathsep}{os.environ['PATH']}"))
    python_path, *argv = record.read_text().split("\0")[:-1]
    assert python_path.split(os.pathsep)[0] == str(REPO) and argv[:2] == ["-m", "deepnmt_plugin.reproduce"]
    output = io.StringIO()
    with contextlib.redirect_stdout(output):
        assert reproduce.main(argv[2:]) == 0
    assert output.getvalue() == dry_run(config, "--gpus", "2")


@pytest.mark.parametrize("config", list(SCRIPTS))
def test_dry_run_plans_every_run_with_the_recipe(config):
    spec = yaml.safe_load((REPO / "configs" / f"{config}.yaml").read_text())
    out = dry_run(config, "--gpus", "4")
    trains = [line for line in out.splitlines() if " train: " in line]
    seeds = spec.get("seeds", [1])
    method_depths = {method: [str(d) for d in depths] for method, depths in spec.get("method_depths", {}).items()}
    planned = [(method, depth) for method in spec["methods"] for depth in spec["depths"]
               if str(depth) in method_depths.get(method, [str(d) for d in spec["depths"]])]
    assert len(trains) == len(planned) * len(seeds)
    batch_by_depth = {str(depth): batch for depth, batch in spec.get("batch_by_depth", {}).items()}
    for method, depth in planned:
        flags = spec["methods"][method]
        arch = flags[flags.index("--arch") + 1]
        encoder, _, decoder = str(depth).partition("-")
        line = next(l for l in trains if f"] {method}_{encoder}L" in l)
        assert f"--arch {arch} " in line and f"--encoder-layers {encoder} --decoder-layers {decoder or encoder}" in line
        assert "--task translation_deep" in line and "--distributed-world-size 4" in line and "--cpu" not in line
        for flag in ("--lr", "--dropout", "--warmup-updates", "--weight-decay", "--optimizer"):
            if flag in spec["train"] or flag in flags:
                values = [str(v) for v in spec["train"] + flags]
                expected = values[len(values) - 1 - values[::-1].index(flag) + 1]  # the last one wins
                assert re.findall(rf"{flag} (\S+)", line)[-1] == expected
        batch = {**spec, **batch_by_depth.get(str(depth), {})}
        max_tokens, update_freq = batching(batch.get("tokens_per_update", batch.get("max_tokens", 4096)), 4,
                                           batch.get("max_tokens", 4096))
        assert f"--max-tokens {max_tokens} --update-freq {update_freq} " in line
    assert out.count(" generate: ") == len(trains) and out.count(" score: ") == len(trains)


@pytest.mark.parametrize("config, method, depth", [("deepnet_wmt17_en_de", "deepnorm", "6"),
                                                   ("tfixup_wmt17_en_de", "tfixup", "30"),
                                                   ("tfixup_wmt17_en_de", "tfixup_big", "6"),
                                                   ("tfixup_wmt14_en_de", "tfixup", "12")])
@pytest.mark.parametrize("gpus, max_tokens, update_freq", [(1, 4096, 128), (4, 4096, 32), (8, 4096, 16), (128, 4096, 1)])
def test_deepnet_batch_is_128_x_4096_tokens_on_any_gpu_count(config, method, depth, gpus, max_tokens, update_freq):
    """DeepNet's Table 1 batch, which the T-Fixup WMT tables use too (T-Fixup publishes none)."""
    out = dry_run(config, "--gpus", str(gpus), "--methods", method, "--depths", depth)
    assert f"524288 tokens per update = {gpus} GPU x {max_tokens} tokens x update-freq {update_freq}" in out
    assert f"--max-tokens {max_tokens} --update-freq {update_freq}" in out


@pytest.mark.parametrize(
    "gpus, batch_6l, batch_60l",  # (max tokens per GPU, update-freq) of 6L (8 x 8000 x 10) and 60L-12L (16 x 5000 x 16)
    [(1, (8000, 80), (5000, 256)), (4, (8000, 20), (5000, 64)), (8, (8000, 10), (5000, 32)), (128, (5000, 1), (5000, 2))],
)
def test_admin_en_fr_batch_differs_by_depth(gpus, batch_6l, batch_60l):
    out = dry_run("admin_wmt14_en_fr", "--gpus", str(gpus), "--methods", "admin")
    trains = [line for line in out.splitlines() if " train: " in line]
    assert len(trains) == 2
    for depth, tokens, (max_tokens, update_freq) in (("6L", 640000, batch_6l), ("60L-12L", 1280000, batch_60l)):
        line = next(l for l in trains if f"] admin_{depth}_seed1 train: " in l)
        assert f"--max-tokens {max_tokens} --update-freq {update_freq} " in line
        assert f"{tokens} tokens per update = {gpus} GPU x {max_tokens} tokens x update-freq {update_freq} ({depth})" in out
    only_60l = dry_run("admin_wmt14_en_fr", "--gpus", str(gpus), "--methods", "admin", "--depths", "60-12")
    max_tokens, update_freq = batch_60l  # one batch: no depth named
    assert only_60l.splitlines()[0].endswith(f"1280000 tokens per update = {gpus} GPU x {max_tokens} tokens "
                                             f"x update-freq {update_freq}")


def test_a_method_runs_only_at_its_depths():
    out = dry_run("tfixup_wmt17_en_de", "--gpus", "8")
    trains = [line.split(" train: ")[0] for line in out.splitlines() if " train: " in line]
    assert trains == ["[1/4] tfixup_6L_seed1", "[2/4] tfixup_20L_seed1", "[3/4] tfixup_30L_seed1", "[4/4] tfixup_big_6L_seed1"]
    big = next(line for line in out.splitlines() if "tfixup_big_6L_seed1 train: " in line)
    assert "--arch transformer_tfixup_big " in big and re.findall(r"--dropout (\S+)", big)[-1] == "0.3"


@pytest.mark.parametrize("methods, depths, expected", [
    (["tfixup_big"], ["06"], ["tfixup_big_6L_seed1"]),  # a method with depths of its own: no run was selected
    (["tfixup_big"], ["6-6"], ["tfixup_big_6L_seed1"]),
    (["tfixup", "tfixup_big"], ["6", "030"], ["tfixup_6L_seed1", "tfixup_30L_seed1", "tfixup_big_6L_seed1"]),
])
def test_a_depth_is_taken_however_it_is_spelled(methods, depths, expected):
    out = dry_run("tfixup_wmt17_en_de", "--gpus", "8", "--methods", *methods, "--depths", *depths)
    assert [line.split(" train: ")[0].split("] ")[1] for line in out.splitlines() if " train: " in line] == expected


@pytest.mark.parametrize("depths, message", [
    (["12"], r"^deepnmt: error: unknown depths \['12'\]; this table has \['6', '20', '30'\]$"),
    (["30"], r"^deepnmt: error: no run of this table has a method of \['tfixup_big'\] at a depth of \['30'\]; its "
             r"methods' depths: tfixup_big \['6'\]$"),
])
def test_depths_that_select_no_run_are_refused_in_one_line(depths, message):
    with pytest.raises(SystemExit, match=message):
        dry_run("tfixup_wmt17_en_de", "--gpus", "8", "--methods", "tfixup_big" if depths == ["30"] else "tfixup",
                "--depths", *depths)


@pytest.mark.parametrize("extra, message", [
    ({"batch_by_depth": {"60-12": {"tokens_per_update": 8}}}, r"names depths \['60-12'\] that are not among its depths"),
    ({"method_depths": {"admin": [6, 12]}}, r"names depths \['12'\] that are not among its depths"),
    ({"method_depths": {"big": [6]}}, "method_depths names big, which is not among its methods"),
])
def test_a_config_naming_a_depth_or_method_it_lacks_is_refused(tmp_path, extra, message):
    spec = {**yaml.safe_load((REPO / "configs" / "admin_wmt14_en_de.yaml").read_text()), "depths": [6], **extra}
    path = tmp_path / "table.yaml"
    path.write_text(yaml.safe_dump(spec))
    with pytest.raises(SystemExit, match=message):
        reproduce.load_config(str(path))


@pytest.mark.parametrize("gpus, expected", [(1, (8192, 4)), (4, (8192, 1)), (8, (4096, 1)), (128, (256, 1))])
def test_admin_batch_is_4_x_8192_tokens(gpus, expected):
    assert batching(32768, gpus, 8192) == expected


def test_several_nodes_launch_fairseq_train_under_torchrun_with_the_worlds_batch():
    out = dry_run("deepnet_wmt17_en_de", "--gpus", "8", "--nnodes", "2", "--node-rank", "1", "--master-addr", "10.0.0.1",
                  "--methods", "deepnorm", "--depths", "6")
    assert "node 1 of 2, precision fp16, 524288 tokens per update = 16 GPU x 4096 tokens x update-freq 8" in out
    train = next(line for line in out.splitlines() if " train: " in line)
    assert re.search(r"train: torchrun --nnodes 2 --node-rank 1 --nproc-per-node 8 --master-addr 10.0.0.1 "
                     r"--master-port 29500 \S+/fairseq-train \S+ --user-dir", train), train
    assert "--distributed-world-size 16" in train and "--update-freq 8" in train
    assert " generate: " not in out and " score: " not in out  # node 0 holds the checkpoints: it goes on alone


@pytest.mark.parametrize("flags, message", [
    (["--nnodes", "2"], "--nnodes above 1 needs --master-addr, the address of node 0"),
    (["--nnodes", "2", "--node-rank", "2", "--master-addr", "a"], "--node-rank 2 is not below --nnodes 2"),
    (["--nnodes", "0"], "--nnodes must be at least 1"),
    (["--nnodes", "2", "--master-addr", "a", "--master-port", "0"],
     "--master-port 0 is not a TCP port every node can reach: give one of 1 to 65535"),
    (["--master-port", "70000"], "--master-port 70000 is not a TCP port every node can reach: give one of 1 to 65535"),
])
def test_bad_node_flags_are_refused_in_one_line(flags, message):
    with pytest.raises(SystemExit, match=f"^deepnmt: error: {re.escape(message)}$"):
        reproduce.parse_arguments(["configs/deepnet_wmt17_en_de.yaml", "--data", "DATA", *flags])


def test_precision_flags():
    fp16 = dry_run("admin_wmt14_en_de", "--gpus", "4", "--methods", "admin", "--depths", "6")
    assert "--fp16 --fp16-scale-window 256 --threshold-loss-scale 0.03125" in fp16  # the Clinic recipe
    bf16 = dry_run("admin_wmt14_en_de", "--gpus", "4", "--precision", "bf16", "--methods", "admin", "--depths", "6")
    assert "--bf16" in bf16 and "--fp16" not in bf16
    fp32 = dry_run("admin_wmt14_en_de", "--gpus", "4", "--precision", "fp32", "--methods", "admin", "--depths", "6")
    assert "--fp16" not in fp32 and "--bf16" not in fp32
    cpu = dry_run("admin_wmt14_en_de", "--gpus", "0", "--methods", "admin", "--depths", "6")
    assert "--cpu" in cpu and "--fp16" not in cpu


def test_half_precision_without_a_gpu_is_refused_in_one_line():
    with pytest.raises(SystemExit, match="--precision fp16 needs a CUDA device"):
        reproduce.main([str(REPO / "configs" / "admin_wmt14_en_de.yaml"), "--data", "unused", "--dry-run", "--gpus", "0",
                        "--precision", "fp16"])


@pytest.mark.parametrize(
    "config, method, expected",
    [  # the papers' / reference code's recipes
        ("admin_wmt14_en_de", "admin", "--optimizer radam --adam-betas '(0.9, 0.98)' --lr 1e-3 --lr-scheduler inverse_sqrt "
         "--warmup-updates 8000 --warmup-init-lr 1e-7 --criterion label_smoothed_cross_entropy --label-smoothing 0.1 --clip-norm 0"),
        ("admin_iwslt14_de_en", "admin", "--lr 7e-4 --lr-scheduler inverse_sqrt --warmup-updates 6000"),
        ("admin_iwslt14_de_en", "admin", "--dropout 0.3 --attention-dropout 0.1 --activation-dropout 0.1 --weight-decay 1e-4"),
        ("deepnet_wmt17_en_de", "deepnorm", "--optimizer adam --adam-betas '(0.9, 0.98)' --adam-eps 1e-8 --lr 0.0015 "
         "--lr-scheduler inverse_sqrt --warmup-updates 4000 --warmup-init-lr 1e-7"),
        ("deepnet_wmt17_en_de", "deepnorm", "--clip-norm 0 --dropout 0.4 --weight-decay 1e-4 --max-update 100000"),
        ("tfixup_iwslt14_de_en", "tfixup", "--lr 5e-4 --lr-scheduler inverse_sqrt_nowarmup --decay-period 4000"),
        ("tfixup_iwslt14_de_en", "tfixup", "--dropout 0.5 --weight-decay 1e-4"),
        ("admin_wmt14_en_fr", "admin", "--optimizer radam --adam-betas '(0.9, 0.98)' --lr 7e-4 --lr-scheduler inverse_sqrt "
         "--warmup-updates 8000 --warmup-init-lr 1e-7 --criterion label_smoothed_cross_entropy --label-smoothing 0.1 "
         "--clip-norm 0 --dropout 0.1 --attention-dropout 0.1 --activation-dropout 0.1 --weight-decay 0 --max-epoch 50"),
        ("admin_wmt14_en_fr", "postln", "--arch transformer_wmt_en_de --encoder-layers 60 --decoder-layers 12"),
        ("admin_wmt14_en_fr", "preln", "--arch transformer_preln --encoder-layers 60 --decoder-layers 12"),
        ("tfixup_wmt17_en_de", "tfixup", "--share-all-embeddings --optimizer adam --adam-betas '(0.9, 0.98)' --adam-eps 1e-8 "
         "--lr 5e-4 --lr-scheduler inverse_sqrt_nowarmup --decay-period 4000"),
        ("tfixup_wmt17_en_de", "tfixup", "--clip-norm 0 --dropout 0.4 --weight-decay 1e-4 --max-update 100000"),
        ("tfixup_wmt14_en_de", "tfixup", "--lr 5e-4 --lr-scheduler inverse_sqrt_nowarmup --decay-period 4000"),
        ("tfixup_wmt14_en_de", "tfixup", "--arch transformer_tfixup --encoder-layers 12 --decoder-layers 12"),
        ("b2t_wmt16_en_de", "b2t", "--optimizer adam --adam-betas '(0.9, 0.98)' --lr 1e-3 --lr-scheduler inverse_sqrt "
         "--warmup-updates 4000 --warmup-init-lr 1e-7 --criterion label_smoothed_cross_entropy --label-smoothing 0.1 "
         "--clip-norm 0.1 --dropout 0.5 --weight-decay 0.0 --max-update 50000"),
        ("b2t_wmt16_en_de", "b2t", "--arch transformer_b2t --encoder-layers 18 --decoder-layers 18"),
        ("b2t_wmt16_en_de", "preln", "--arch transformer_preln --encoder-layers 18 --decoder-layers 18"),
        ("dlcl_wmt16_en_de", "dlcl", "--lr 2e-3 --lr-scheduler inverse_sqrt --warmup-updates 16000 --warmup-init-lr 1e-7"),
        ("dlcl_wmt16_en_de", "dlcl", "--clip-norm 0 --dropout 0.1 --weight-decay 0 --max-epoch 20 --keep-last-epochs 5"),
        ("resi_dual_iwslt14_de_en", "resi_dual", "--share-all-embeddings --encoder-embed-dim 256 --decoder-embed-dim 256 "
         "--optimizer adam --adam-betas '(0.9, 0.98)' --lr 5e-4 --lr-scheduler inverse_sqrt --warmup-updates 4000"),
        ("resi_dual_iwslt14_de_en", "resi_dual", "--clip-norm 0 --dropout 0.3 --attention-dropout 0.1 "
         "--activation-dropout 0.1 --weight-decay 1e-4 --max-update 500000"),
        ("resi_dual_iwslt14_de_en", "resi_dual", "--arch transformer_resi_dual_iwslt_de_en --enc-res-input-norm-scale 1.0 "
         "--dec-res-input-norm-scale 1.0 --encoder-layers 12 --decoder-layers 12"),
        ("resi_dual_wmt14_en_de", "resi_dual", "--lr 1e-3 --lr-scheduler inverse_sqrt --warmup-updates 4000 "
         "--warmup-init-lr 1e-7"),
        ("resi_dual_wmt14_en_de", "resi_dual", "--dropout 0.3 --attention-dropout 0.1 --activation-dropout 0.1 "
         "--weight-decay 1e-4 --max-update 50000 --keep-last-epochs 10 --arch transformer_resi_dual"),
        ("subln_wmt17_en_de", "subln", "--share-decoder-input-output-embed --optimizer adam --adam-betas '(0.9, 0.98)' "
         "--clip-norm 0.0 --lr 5e-4 --lr-scheduler inverse_sqrt --warmup-updates 4000 --criterion cross_entropy "
         "--dropout 0.3 --weight-decay 1e-4"),
        ("subln_wmt17_en_de", "subln", "--arch transformer_subln --encoder-layers 6 --decoder-layers 6"),
    ],
)
def test_recipe_values(config, method, expected):
    assert expected in dry_run(config, "--methods", method)


def test_evaluation_settings():
    assert "--beam 4 --lenpen 0.6" in dry_run("admin_wmt14_en_de", "--methods", "admin")
    assert "--beam 5" in dry_run("admin_iwslt14_de_en", "--methods", "admin")
    assert "--beam 4 --lenpen 0.3" in dry_run("tfixup_iwslt14_de_en")
    assert "--num-epoch-checkpoints 10" in dry_run("admin_wmt14_en_de", "--methods", "admin")
    en_fr = dry_run("admin_wmt14_en_fr", "--methods", "admin", "--depths", "6")
    assert "--beam 5 --lenpen 0.8" in en_fr and "--num-epoch-checkpoints 10" in en_fr  # Clinic's eval_wmt_en-fr.sh
    assert "--source-lang en --target-lang fr --json" in en_fr and "--sacrebleu-test-set" not in en_fr
    for config in ("tfixup_wmt17_en_de", "tfixup_wmt14_en_de"):
        out = dry_run(config)
        assert "--warmup-updates" not in out  # T-Fixup trains without warmup
        assert out.count("--beam 4 --lenpen 0.6") == out.count(" generate: ") > 0
        assert "--num-update-checkpoints 10" in out and "--sacrebleu-test-set wmt14/full" in out


def test_method_flags_override_the_table():
    out = dry_run("deepnet_wmt17_en_de", "--methods", "tfixup", "deepnorm", "--depths", "18")
    tfixup = next(l for l in out.splitlines() if "tfixup_18L" in l and " train: " in l)
    deepnorm = next(l for l in out.splitlines() if "deepnorm_18L" in l and " train: " in l)
    assert re.findall(r"--lr (\S+)", tfixup)[-1] == "5e-4" and re.findall(r"--lr (\S+)", deepnorm)[-1] == "0.0015"


def test_b2t_table_is_18l_with_the_papers_batch_and_sacrebleu_on_newstest2014():
    out = dry_run("b2t_wmt16_en_de", "--gpus", "8")
    trains = [line.split(" train: ")[0] for line in out.splitlines() if " train: " in line]
    assert trains == ["[1/2] preln_18L_seed1", "[2/2] b2t_18L_seed1"]
    assert "458752 tokens per update = 8 GPU x 3584 tokens x update-freq 16" in out  # 3584 x 16 x 8
    assert out.count("--clip-norm 0.1 --dropout 0.5 ") == 2
    assert "--max-tokens 3584 --update-freq 16 " in out
    assert out.count("--num-epoch-checkpoints 10") == 2 and out.count("--beam 4 --lenpen 0.6") == 2
    assert out.count("--sacrebleu-test-set wmt14/full") == 2
    spec = yaml.safe_load((REPO / "configs" / "b2t_wmt16_en_de.yaml").read_text())
    assert spec["bleu"] == "sacrebleu" and spec["paper"] == {"b2t": {18: 28.48}}
    four = dry_run("b2t_wmt16_en_de", "--gpus", "4", "--methods", "b2t")  # the README's 4 GPUs x 3584 x 32
    assert "--max-tokens 3584 --update-freq 32 " in four


def test_dlcl_table_runs_each_method_at_its_encoder_depth():
    out = dry_run("dlcl_wmt16_en_de", "--gpus", "8")
    trains = {line.split(" train: ")[0]: line for line in out.splitlines() if " train: " in line}
    assert list(trains) == ["[1/4] postln_6L_seed1", "[2/4] preln_20L-6L_seed1", "[3/4] dlcl_postnorm_25L-6L_seed1",
                            "[4/4] dlcl_30L-6L_seed1"]
    assert "--arch transformer_wmt_en_de --encoder-layers 6 --decoder-layers 6 " in trains["[1/4] postln_6L_seed1"]
    preln, post, pre = (trains["[2/4] preln_20L-6L_seed1"], trains["[3/4] dlcl_postnorm_25L-6L_seed1"],
                        trains["[4/4] dlcl_30L-6L_seed1"])
    assert "--arch transformer_preln --attention-dropout 0.1 --activation-dropout 0.1 --adam-betas '(0.9, 0.997)' " \
           "--encoder-layers 20 --decoder-layers 6 " in preln
    assert "--arch transformer_dlcl --dlcl-post-norm --encoder-layers 25 --decoder-layers 6 " in post
    assert re.findall(r"--adam-betas ('[^']+')", post)[-1] == "'(0.9, 0.98)'" and "--attention-dropout" not in post
    assert "--arch transformer_dlcl --attention-dropout 0.1 --activation-dropout 0.1 --adam-betas '(0.9, 0.997)' " \
           "--encoder-layers 30 --decoder-layers 6 " in pre and "--dlcl-post-norm" not in pre
    assert "65536 tokens per update = 8 GPU x 4096 tokens x update-freq 2" in out
    assert out.count("--max-epoch 20 ") == 4 and out.count("--num-epoch-checkpoints 5") == 4
    assert out.count("--beam 4 --lenpen 0.6") == 4
    spec = yaml.safe_load((REPO / "configs" / "dlcl_wmt16_en_de.yaml").read_text())
    assert spec["bleu"] == "bleu_compound_split"
    assert spec["paper"] == {"postln": {6: 27.3}, "preln": {"20-6": 28.9}, "dlcl_postnorm": {"25-6": 29.2},
                             "dlcl": {"30-6": 29.3}}


def test_resi_dual_tables_compare_post_ln_pre_ln_and_resi_dual_at_6_and_12_layers():
    iwslt = dry_run("resi_dual_iwslt14_de_en", "--gpus", "1")
    wmt = dry_run("resi_dual_wmt14_en_de", "--gpus", "1")
    for out, suffix in ((iwslt, "_iwslt_de_en"), (wmt, "")):
        trains = [line.split(" train: ")[0].split("] ")[1] for line in out.splitlines() if " train: " in line]
        assert trains == [f"{m}_{d}L_seed1" for m in ("postln", "preln", "resi_dual") for d in (6, 12)]
        for arch in (f"transformer{suffix or '_wmt_en_de'}", f"transformer_preln{suffix}", f"transformer_resi_dual{suffix}"):
            assert out.count(f"--arch {arch} ") == 2
        assert out.count("--beam 5 --max-len-a 1.2 --max-len-b 10") == 6
    assert "4096 tokens per update = 1 GPU x 4096 tokens x update-freq 1" in iwslt  # iwslt.yaml: max_tokens 4096
    assert iwslt.count("--best-checkpoint-metric bleu --maximize-best-checkpoint-metric --patience 20 ") == 6
    assert "65536 tokens per update = 1 GPU x 4096 tokens x update-freq 16" in wmt  # wmt.yaml: 4096 x update_freq 16
    assert wmt.count(" --amp") == 6 and "--fp16" not in wmt and wmt.count("--num-epoch-checkpoints 10") == 6
    for config in ("resi_dual_iwslt14_de_en", "resi_dual_wmt14_en_de"):
        spec = yaml.safe_load((REPO / "configs" / f"{config}.yaml").read_text())
        assert spec["bleu"] == "sacrebleu" and "paper" not in spec  # the README prints no BLEU


def test_subln_table_uses_the_torchscale_mt_example():
    out = dry_run("subln_wmt17_en_de", "--gpus", "2")
    trains = [line for line in out.splitlines() if " train: " in line]
    assert [line.split(" train: ")[0] for line in trains] == ["[1/2] preln_6L_seed1", "[2/2] subln_6L_seed1"]
    assert "8192 tokens per update = 2 GPU x 4096 tokens x update-freq 1" in out  # --nproc_per_node=2 x 4096
    assert all("--share-all-embeddings" not in line and "--warmup-init-lr" not in line for line in trains)
    assert "paper" not in yaml.safe_load((REPO / "configs" / "subln_wmt17_en_de.yaml").read_text())


@pytest.mark.parametrize("config", sorted(path.stem for path in (REPO / "configs").glob("*.yaml")))
def test_every_table_parses_in_fairseq_with_its_dropouts_in_effect(config):
    """fairseq's own parser reads every planned command; each dropout the command names is the one the model gets
    (fairseq 0.12's --relu-dropout alias would fill an unused field, leaving activation dropout at 0)."""
    import shlex

    from fairseq import options

    spec = yaml.safe_load((REPO / "configs" / f"{config}.yaml").read_text())
    lines = [line for line in dry_run(config, "--gpus", "1").splitlines() if " train: " in line or " generate: " in line]
    assert lines
    for line in lines:
        argv = shlex.split(line.split(": ", 1)[1])
        parser = options.get_training_parser() if argv[0] == "fairseq-train" else options.get_generation_parser()
        args = options.parse_args_and_arch(parser, input_args=argv[1:])
        if argv[0] != "fairseq-train":
            continue
        method = re.search(r"\] (\w+?)_\d+L", line).group(1)
        flags = [str(v) for v in spec["train"] + spec["methods"][method]]
        assert "--relu-dropout" not in flags
        for flag, attribute in (("--dropout", "dropout"), ("--attention-dropout", "attention_dropout"),
                                ("--activation-dropout", "activation_dropout")):
            if flag in flags:
                expected = flags[len(flags) - 1 - flags[::-1].index(flag) + 1]
                assert getattr(args, attribute) == float(expected), (line, flag)
        if method == "dlcl_postnorm":
            assert args.dlcl_post_norm


def test_collect_reads_the_encoder_decoder_depths_of_a_config(tmp_path):
    config = yaml.safe_load((REPO / "configs" / "admin_wmt14_en_fr.yaml").read_text())
    (tmp_path / "admin_60L-12L_seed1").mkdir()
    (tmp_path / "admin_60L-12L_seed1" / "scores.json").write_text(json.dumps({"bleu_tokenized": 43.0}))
    (tmp_path / "postln_60L-12L_seed1").mkdir()
    (tmp_path / "postln_60L-12L_seed1" / "diverged").write_text("")
    markdown = Path(collect(tmp_path, config)["markdown"]).read_text()
    assert "| admin | 60-12 | 1 | 43.00 | 43.8 | -0.80 |" in markdown
    assert "| postln | 60-12 | 1 | diverged | diverged |  |" in markdown


def test_compound_split_matches_the_perl_one_liner():
    # perl -ple 's{(\S)-(\S)}{$1 ##AT##-##AT## $2}g': non-overlapping, so "a-b-c" splits once
    assert compound_split("Welt-Meister a-b-c x - y") == "Welt ##AT##-##AT## Meister a ##AT##-##AT## b-c x - y"


def write_generate_output(path, pairs):
    lines = []
    for i, (hyp, ref) in enumerate(pairs):
        lines += [f"S-{i}\tsrc", f"T-{i}\t{ref}", f"H-{i}\t-0.5\t{hyp}", f"D-{i}\t-0.5\t{hyp}", f"P-{i}\t-0.5"]
    path.write_text("\n".join(lines) + "\nGenerate test with beam=4: BLEU4 = 1.00\n")


def test_scores_on_a_small_real_output(tmp_path):
    pairs = [("das ist ein gut-gemachtes Haus .", "das ist ein gut-gemachtes Haus ."),
             ("er sagt , es sei gut .", "er sagte , es sei gut ."),
             ("ein Test-Fall", "ein Test-Fall !")]
    path = tmp_path / "generate.txt"
    write_generate_output(path, pairs[::-1])
    hypotheses, references = read_generate_output(str(path))
    assert hypotheses[0] == pairs[2][0]  # ordered by sentence id
    scores = score(hypotheses, references, "de")
    import sacrebleu

    hyps, refs = [h for h, _ in pairs[::-1]], [r for _, r in pairs[::-1]]
    assert scores["bleu_tokenized"] == round(sacrebleu.corpus_bleu(hyps, [refs], tokenize="none").score, 2)
    split = sacrebleu.corpus_bleu([compound_split(h) for h in hyps], [[compound_split(r) for r in refs]], tokenize="none")
    assert scores["bleu_compound_split"] == round(split.score, 2) != scores["bleu_tokenized"]
    assert scores["sacrebleu_signature"].startswith("nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:")
    assert (scores["distinct_hypotheses"], scores["most_frequent_hypothesis_count"]) == (3, 1)


def test_scores_count_a_source_blind_output_as_one_distinct_hypothesis():
    hypotheses = ["the file already exists ."] * 3 + ["create new"]
    scores = score(hypotheses, ["a", "b", "c", "create new rule"], "en")
    assert (scores["distinct_hypotheses"], scores["most_frequent_hypothesis_count"]) == (2, 3)


@pytest.mark.parametrize(
    "log, diverged",
    [
        ("| train_inner | epoch 001: 10 / 9 loss=9.1, nll_loss=9.0\n| train_inner | epoch 001: 20 / 9 loss=6.2, n", False),
        ("| train_inner | epoch 001: 10 / 9 loss=9.1, nll\n| train_inner | epoch 001: 20 / 9 loss=nan, nll", True),
        ("| train_inner | epoch 001: 10 / 9 loss=9.1, nll\n| train_inner | epoch 001: 20 / 9 loss=inf, nll", True),
        ("FloatingPointError: Minimum loss scale reached (0.0001). Your loss is probably exploding.", True),
        ("| train_inner | epoch 001: 10 / 9 loss=9.1, nll\n| train_inner | epoch 001: 20 / 9 loss=14.7, n", True),
    ],
)
def test_divergence_classification(log, diverged):
    assert diverged_log(log) is diverged


def test_collect_writes_the_table_with_paper_and_difference(tmp_path):
    config = {"table": "toy", "bleu": "bleu_tokenized",
              "paper": {"admin": {6: 27.9, 18: 28.8}, "postln": {6: 27.8, 18: "diverged"}}}
    for name, value in [("admin_6L_seed1", 27.0), ("admin_6L_seed2", 28.0), ("postln_6L_seed1", 27.5)]:
        (tmp_path / name).mkdir()
        (tmp_path / name / "scores.json").write_text(json.dumps({"bleu_tokenized": value}))
    (tmp_path / "postln_18L_seed1").mkdir()
    (tmp_path / "postln_18L_seed1" / "diverged").write_text("")
    (tmp_path / "admin_18L_seed1").mkdir()  # still running
    paths = collect(tmp_path, config)
    markdown = Path(paths["markdown"]).read_text()
    assert "| admin | 6 | 2 | 27.50 | 27.9 | -0.40 |" in markdown
    assert "| admin | 18 | 0 | – | 28.8 |  |" in markdown
    assert "| postln | 6 | 1 | 27.50 | 27.8 | -0.30 |" in markdown
    assert "| postln | 18 | 1 | diverged | diverged |  |" in markdown
    assert Path(paths["csv"]).read_text().splitlines()[0] == (
        "method,depth,seeds,bleu,paper,difference,status,commit,torch,fairseq,python,device,threads")


def test_collect_records_each_runs_environment_and_command(tmp_path):
    config = {"table": "toy", "bleu": "bleu_tokenized", "paper": {}}
    for seed, device in [(1, "CPU A"), (2, "CPU B")]:
        run = tmp_path / f"admin_6L_seed{seed}"
        run.mkdir()
        (run / "scores.json").write_text(json.dumps({"bleu_tokenized": 27.0 + seed}))
        (run / "environment.json").write_text(json.dumps({
            "commit": "abc", "uncommitted_changes": False, "torch": "2.13.0", "fairseq": "0.12.3", "python": "3.11.9",
            "device": device, "threads": 2, "seed": seed, "command": f"fairseq-train data-bin --seed {seed}"}))
    paths = collect(tmp_path, config)
    row = next(csv.DictReader(open(paths["csv"])))
    assert (row["commit"], row["torch"], row["device"], row["threads"]) == ("abc", "2.13.0", "CPU A / CPU B", "2")
    runs = list(csv.DictReader(open(paths["runs"])))
    assert [(r["seed"], r["bleu"], r["device"], r["command"]) for r in runs] == [
        ("1", "28.0", "CPU A", "fairseq-train data-bin --seed 1"), ("2", "29.0", "CPU B", "fairseq-train data-bin --seed 2")]
    assert ("Trained at commit abc with torch 2.13.0, fairseq 0.12.3, Python 3.11.9 on CPU A / CPU B (2 threads a "
            "process); each run's seed, environment and training command: runs.csv.") in Path(paths["markdown"]).read_text()


@pytest.mark.slow
def test_smoke_run_of_a_table_end_to_end(toy_data, tmp_path):
    """--smoke through the real fairseq-train / average / fairseq-generate / score, then collect."""
    output = io.StringIO()
    with contextlib.redirect_stdout(output):
        reproduce.main([str(REPO / "configs" / "admin_iwslt14_de_en.yaml"), "--data", str(toy_data), "--smoke",
                        "--methods", "postln", "admin", "--seeds", "1", "--workdir", str(tmp_path)])
    log = output.getvalue()
    assert "[1/2] postln_6L_seed1 average: finished" in log and "[2/2] admin_6L_seed1 score: finished" in log
    table = (tmp_path / "admin_iwslt14_de_en_smoke" / "results.md").read_text()
    rows = re.findall(r"^\| (postln|admin) \| 6 \| 1 \| ([\d.]+) \| ([\d.]+) \| ([-+\d.]+) \|$", table, re.M)
    assert {r[0] for r in rows} == {"postln", "admin"}, table
    for method, ours, paper, difference in rows:
        run = tmp_path / "admin_iwslt14_de_en_smoke" / f"{method}_6L_seed1"
        scores = json.loads((run / "scores.json").read_text())
        assert float(ours) == scores["bleu_tokenized"] and float(paper) == {"postln": 35.64, "admin": 35.67}[method]
        assert float(difference) == pytest.approx(float(ours) - float(paper), abs=0.011)
        fairseq_bleu = float(re.search(r"BLEU4 = ([\d.]+)", (run / "generate.txt").read_text()).group(1))
        assert scores["bleu_tokenized"] == pytest.approx(fairseq_bleu, abs=0.01)  # fairseq's own tokenized BLEU
    assert (tmp_path / "admin_iwslt14_de_en_smoke" / "admin_6L_seed1" / "checkpoint_averaged.pt").exists()
    environment = json.loads((tmp_path / "admin_iwslt14_de_en_smoke" / "admin_6L_seed1" / "environment.json").read_text())
    assert environment["seed"] == 1 and environment["torch"] and environment["device"] and environment["threads"] >= 1
    assert environment["command"].startswith("fairseq-train ") and " --seed 1 " in environment["command"]
    assert "Trained at commit " in table

    rerun = io.StringIO()
    with contextlib.redirect_stdout(rerun):  # every step is skipped the second time
        reproduce.main([str(REPO / "configs" / "admin_iwslt14_de_en.yaml"), "--data", str(toy_data), "--smoke",
                        "--methods", "postln", "admin", "--seeds", "1", "--workdir", str(tmp_path)])
    assert rerun.getvalue().count("done before") == 8
    assert not (tmp_path / "admin_iwslt14_de_en").exists()  # the table's own runs never find a smoke run's steps

    # stopped after its last save, before fairseq-train exited: the run is not stepped past its --max-update
    run = tmp_path / "admin_iwslt14_de_en_smoke" / "postln_6L_seed1"
    (run / "train.done").unlink()
    trained = (run / "train.log").read_text()
    resumed = io.StringIO()
    with contextlib.redirect_stdout(resumed):
        reproduce.main([str(REPO / "configs" / "admin_iwslt14_de_en.yaml"), "--data", str(toy_data), "--smoke",
                        "--methods", "postln", "--seeds", "1", "--workdir", str(tmp_path)])
    assert "postln_6L_seed1 train: its checkpoint_last.pt is at --max-update: finished before its exit" in resumed.getvalue()
    assert (run / "train.log").read_text() == trained and (run / "train.done").exists()
    last = torch.load(run / "checkpoints" / "checkpoint_last.pt", map_location="cpu", weights_only=False)
    assert last["optimizer_history"][-1]["num_updates"] == 20

    config = yaml.safe_load((REPO / "configs" / "admin_iwslt14_de_en.yaml").read_text())
    config["generate"] = [*config["generate"], "--lenpen", "0.6"]
    changed = tmp_path / "changed" / "admin_iwslt14_de_en.yaml"  # the same table, decoded otherwise
    changed.parent.mkdir()
    changed.write_text(yaml.safe_dump(config))
    refused = io.StringIO()
    with contextlib.redirect_stdout(refused), pytest.raises(SystemExit) as stopped:
        reproduce.main([str(changed), "--data", str(toy_data), "--smoke", "--methods", "postln", "--seeds", "1",
                        "--workdir", str(tmp_path)])
    run = tmp_path / "admin_iwslt14_de_en_smoke" / "postln_6L_seed1"
    assert str(stopped.value.code) == (
        "deepnmt: error: [1/1] postln_6L_seed1 generate was done with another command (this one adds --lenpen 0.6): "
        f"its result is not this run's; give another --workdir, or delete {run} to redo it")
    assert "postln_6L_seed1 average: done before" in refused.getvalue()


@pytest.mark.slow
def test_a_crash_that_is_not_a_divergence_stops_the_table_and_is_not_marked_diverged(toy_data, tmp_path):
    config = yaml.safe_load((REPO / "configs" / "admin_iwslt14_de_en.yaml").read_text())
    config["methods"] = {"broken": ["--arch", "transformer_admin_iwslt_de_en", "--no-such-flag"]}
    config_path = tmp_path / "broken_table.yaml"
    config_path.write_text(yaml.safe_dump(config))
    with pytest.raises(SystemExit, match=r"broken_6L_seed1 train failed \(exit 2\); see .*train.log"):
        with contextlib.redirect_stdout(io.StringIO()):
            reproduce.main([str(config_path), "--data", str(toy_data), "--smoke", "--seeds", "1", "--workdir", str(tmp_path)])
    run = tmp_path / "broken_table_smoke" / "broken_6L_seed1"
    assert not (run / "diverged").exists() and "unrecognized arguments: --no-such-flag" in (run / "train.log").read_text()


def test_a_torn_or_missing_checkpoint_last_is_not_taken_for_a_finished_run(tmp_path):
    """Only a checkpoint_last.pt that loads and was saved at --max-update stops a rerun (the smoke test above and the
    study's environment test); a torn one is left to fairseq-train, which resumes from the newest intact checkpoint
    (tests/test_reliability_resume.py)."""
    command = ["fairseq-train", "data-bin", "--max-update", "5", "--save-dir", str(tmp_path)]
    assert not reproduce.saved_at_budget(command)  # none saved yet
    (tmp_path / "checkpoint_last.pt").write_bytes(b"PK\x03\x04torn")
    assert not reproduce.saved_at_budget(command)
    torch.save({"optimizer_history": [{"num_updates": 5}]}, tmp_path / "checkpoint_last.pt")  # not a fairseq one
    assert not reproduce.saved_at_budget(command)
