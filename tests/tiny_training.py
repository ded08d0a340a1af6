"""Helpers for the export and reliability tests: short real fairseq-train runs of every arch, and a
fairseq-style checkpoint dict of an in-process model."""

import re
from pathlib import Path

import pytest
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from omegaconf import OmegaConf

from conftest import TINY_DIMS, USER_DIR, built_once, fairseq_cli

WARMUP = ["--lr", "2e-3", "--lr-scheduler", "inverse_sqrt", "--warmup-updates", 8]
RECIPES = {  # 2 + 2 layers; Admin needs the translation_deep task, T-Fixup its no-warmup schedule
    "transformer_preln_iwslt_de_en": WARMUP,
    "transformer_deepnorm_iwslt_de_en": WARMUP,
    "transformer_tfixup_iwslt_de_en": ["--lr", "1e-3", "--lr-scheduler", "inverse_sqrt_nowarmup"],
    "transformer_admin_iwslt_de_en": ["--task", "translation_deep", *WARMUP],
    # the later recipes whose state reaches across sublayers or layers: a shared alpha, a second stream, a history
    "transformer_rezero_iwslt_de_en": WARMUP,
    "transformer_resi_dual_iwslt_de_en": WARMUP,
    "transformer_dlcl_iwslt_de_en": WARMUP,
    # recipes a resume must not turn into one another (test_faults_training.py)
    "transformer_b2t_iwslt_de_en": WARMUP,
    "transformer_mixln_iwslt_de_en": WARMUP,
}
KILLED_AT, END = 8, 16  # mid-epoch 1 (11 updates an epoch); a run resumed there crosses into epoch 2
SAVE_EVERY = ["--save-interval-updates", 4]


@pytest.fixture(scope="module", autouse=True)
def one_thread_per_process():
    """One OpenMP thread per fairseq subprocess: faster for tiny models, and several times faster when
    another job shares the cores (oversubscribed OpenMP threads spin)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("OMP_NUM_THREADS", "1")
        yield


def train(data, save_dir, arch, max_update, *extra, check=True):
    """``fairseq-train`` with the plugin, tiny dims, dropout on, seed 1; returns the finished process."""
    return fairseq_cli(
        "fairseq-train", data, "--user-dir", USER_DIR, "--arch", arch, "--cpu", *TINY_DIMS,
        "--encoder-layers", 2, "--decoder-layers", 2, "--share-all-embeddings", "--dropout", 0.1,
        "--optimizer", "adam", "--adam-betas", "(0.9, 0.98)", *RECIPES[arch],
        "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", 0.1,
        "--max-tokens", 1500, "--max-update", max_update, "--seed", 1, "--save-dir", save_dir,
        "--no-epoch-checkpoints", "--log-format", "simple", "--log-interval", 10, *extra, check=check,
    )


def straight_run(data, tmp_path_factory, arch) -> Path:
    """The save dir of one fairseq-train run of ``arch`` to END, saving every 4 updates; trained once per pytest
    run and shared by the export and reliability tests (which only read it)."""
    return built_once(tmp_path_factory, f"{arch}-straight",
                      lambda save_dir: train(data, save_dir, arch, END, *SAVE_EVERY))


def hypotheses(generate_output: str) -> dict:
    """``fairseq-generate``'s hypotheses: sentence id -> (text, score)."""
    found = re.findall(r"^H-(\d+)\t(\S+)\t(.*)$", generate_output, re.M)
    return {int(i): (text, float(score)) for i, score, text in found}


def checkpoint_of(model, args) -> dict:
    """What fairseq-train saves for ``model`` (built from ``args`` in-process), without training state."""
    cfg = OmegaConf.to_container(convert_namespace_to_omegaconf(args), resolve=True, enum_to_str=True)
    return {
        "args": None, "cfg": cfg, "model": model.state_dict(),
        "optimizer_history": [{"criterion_name": "LabelSmoothedCrossEntropyCriterion", "optimizer_name": "FairseqAdam",
                               "lr_scheduler_state": {"best": None}, "num_updates": 0}],
        "extra_state": {"train_iterator": {"epoch": 1, "iterations_in_epoch": 0, "shuffle": True}},
    }


def last_line(stderr: str) -> str:
    return stderr.strip().splitlines()[-1]


def files_in(directory: Path) -> list:
    return sorted(p.name for p in Path(directory).iterdir())
