"""Admin through the real entry points: profiled once in fairseq-train, resumed, generated, distributed."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import TINY_DIMS, USER_DIR, fairseq_cli, free_port

pytestmark = pytest.mark.slow  # trains, generates or builds corpora through subprocesses

ADMIN = ["--user-dir", USER_DIR, "--task", "translation_deep", "--arch", "transformer_admin_iwslt_de_en",
         "--cpu", *TINY_DIMS, "--share-all-embeddings", "--optimizer", "adam", "--adam-betas", "(0.9, 0.98)",
         "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", 0.1, "--seed", 1,
         "--no-epoch-checkpoints", "--log-format", "simple", "--log-interval", 50]
PROFILED = "admin: omega initialised once by profile"


def train(data, save_dir, max_update, *extra, cwd=None):
    result = fairseq_cli("fairseq-train", data, *ADMIN, "--encoder-layers", 3, "--decoder-layers", 3,
                         "--lr", "2e-3", "--lr-scheduler", "inverse_sqrt", "--warmup-updates", 50,
                         "--max-tokens", 1500, "--max-update", max_update, "--validate-interval", 100,
                         "--save-dir", save_dir, *extra, cwd=cwd)
    return result.stdout + result.stderr


def test_profile_once_resume_and_generate_from_the_checkpoint_alone(toy_data, tmp_path):
    work, elsewhere = tmp_path / "work", tmp_path / "elsewhere"
    work.mkdir(), elsewhere.mkdir()
    save_dir = tmp_path / "checkpoints"
    log = train(toy_data, save_dir, 250, cwd=work)
    assert log.count(PROFILED) == 1, log[-3000:]
    profile = json.loads((save_dir / "admin_profile.json").read_text())
    assert profile["mode"] == "profile" and profile["batches"] == 1
    assert len(profile["omega"]["encoder"]) == 6 and len(profile["omega"]["decoder"]) == 9
    assert profile["omega"]["encoder"][0] == profile["omega"]["decoder"][0] == 1.0
    assert os.listdir(work) == []  # no side file in the working directory

    resumed = train(toy_data, save_dir, 270, cwd=work)
    assert re.search(r"Loaded checkpoint .*checkpoint_last\.pt \(epoch \d+ @ 250 updates\)", resumed)
    assert PROFILED not in resumed and "initialised once" not in resumed

    generated = fairseq_cli("fairseq-generate", toy_data, "--user-dir", USER_DIR, "--path",
                            save_dir / "checkpoint_last.pt", "--beam", 4, "--cpu", "--quiet", cwd=elsewhere).stdout
    assert float(re.search(r"BLEU4 = ([\d.]+)", generated).group(1)) > 50, generated


def test_analytic_and_file_modes(toy_data, tmp_path):
    log = train(toy_data, tmp_path / "analytic", 2, "--admin-init", "analytic")
    assert "admin: omega initialised once by analytic (encoder 1.612, decoder 1.828)" in log  # sqrt(7/ln 7 - 1), sqrt(10/ln 10 - 1)

    profile = tmp_path / "profile.ratio.init"
    profile.write_text("".join(f"{i} {1 + i / 10}\n" for i in range(1, 7)) + "".join(f"{i} {1 + i / 20}\n" for i in range(1, 10)))
    log = train(toy_data, tmp_path / "file", 2, "--admin-profile-file", profile)
    assert "admin: omega initialised once by file (encoder 1.100 .. 1.600, decoder 1.050 .. 1.450)" in log


def test_malformed_profile_file_stops_training_with_its_name(toy_data, tmp_path):
    profile = tmp_path / "profile.ratio.init"
    profile.write_text("1 1.0\n2 oops\n")
    save_dir = tmp_path / "checkpoints"
    result = fairseq_cli("fairseq-train", toy_data, *ADMIN, "--encoder-layers", 1, "--decoder-layers", 1, "--lr", "1e-3",
                         "--max-tokens", 1500, "--max-update", 2, "--save-dir", save_dir,
                         "--admin-profile-file", profile, check=False)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        f"deepnmt: error: --admin-profile-file {profile}:2: expected '<index> <value>', got '2 oops'")
    assert not (save_dir / "checkpoint_last.pt").exists()


def test_two_ranks_end_with_identical_omega(toy_data, tmp_path):
    """Each rank profiles its own shard; the pooled variances give both the same omega."""
    init = f"tcp://127.0.0.1:{free_port()}"
    ranks = [
        subprocess.Popen(
            [sys.executable, str(Path(__file__).with_name("admin_rank.py")), str(tmp_path), str(toy_data), *map(str, ADMIN),
             "--encoder-layers", "2", "--decoder-layers", "2", "--lr", "1e-3", "--max-tokens", "800", "--max-update", "3",
             "--save-dir", str(tmp_path / "checkpoints"), "--distributed-no-spawn", "--distributed-world-size", "2",
             "--distributed-rank", str(rank), "--distributed-backend", "gloo", "--ddp-backend", "legacy_ddp",
             "--distributed-init-method", init],
            env=dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(Path(USER_DIR).parent)), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        for rank in (0, 1)
    ]
    outputs = [process.communicate(timeout=600)[0] for process in ranks]
    assert [p.returncode for p in ranks] == [0, 0], outputs[0][-3000:] + outputs[1][-3000:]
    rank0, rank1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    assert rank0["src_tokens_sum"] != rank1["src_tokens_sum"]  # different batches ...
    assert rank0["omega"] == rank1["omega"]  # ... identical omega
    assert len(rank0["omega"]) == 2 * 2 + 2 * 3 and any(v[0] > 1.0 for v in rank0["omega"].values())
