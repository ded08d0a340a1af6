"""The reproduction pipeline: the table scripts take relative paths from where they are called,
and scoring refuses fairseq-generate output that leaves test sentences out."""

import re
import subprocess
import sys

import pytest
import torch

from conftest import FORK_SERVER, REPO, TINY_DIMS, USER_DIR, fairseq_cli
from deepnmt_plugin.scoring import ScoringError, read_generate_output
from tiny_training import checkpoint_of, hypotheses, last_line
from tiny_training import one_thread_per_process  # noqa: F401  (autouse fixture)

pytestmark = pytest.mark.slow  # trains, generates or builds corpora through subprocesses

SCRIPT = REPO / "scripts" / "reproduce_admin_iwslt14_de_en.sh"


def test_a_table_script_takes_relative_paths_from_the_callers_directory(toy_data, tmp_path):
    """The scripts used to cd into the checkout first: `--data mydata` was looked for there, and the error said
    to run data-prep first."""
    (tmp_path / "mydata").symlink_to(toy_data)
    planned = subprocess.run(["bash", str(SCRIPT), "--data", "mydata", "--workdir", "myruns", "--dry-run",
                              "--methods", "admin", "--seeds", "1"], cwd=tmp_path, capture_output=True, text=True)
    assert planned.returncode == 0, planned.stderr
    assert f"1 runs in {tmp_path}/myruns/admin_iwslt14_de_en," in planned.stdout.splitlines()[0]
    assert f" train: fairseq-train {tmp_path}/mydata --user-dir {USER_DIR} " in planned.stdout
    assert "--required-batch-size-multiple 1" in planned.stdout  # every test sentence is translated
    assert not (tmp_path / "myruns").exists()

    missing = subprocess.run(["bash", str(SCRIPT), "--data", "nowhere", "--workdir", "myruns"], cwd=tmp_path,
                             capture_output=True, text=True)
    assert missing.returncode == 1 and "Traceback" not in missing.stderr
    assert last_line(missing.stderr) == f"deepnmt: error: --data {tmp_path}/nowhere does not exist"


@pytest.fixture(scope="module")
def generated(build_model, toy_data, tmp_path_factory):
    """fairseq-generate's output on the 100 test sentences, whole ("whole"), and as fairseq without the plugin
    leaves it with its default --required-batch-size-multiple 8 ("partial": its last batch, 96 to 99, left out)."""
    model, args = build_model("transformer_preln_iwslt_de_en", "--encoder-layers", 1, "--decoder-layers", 1, *TINY_DIMS)
    directory = tmp_path_factory.mktemp("generated")
    torch.save(checkpoint_of(model, args), directory / "model.pt")
    result = fairseq_cli("fairseq-generate", toy_data, "--user-dir", USER_DIR, "--path", directory / "model.pt",
                         "--cpu", "--max-tokens", 4096, "--beam", 1, "--max-len-b", 5)
    assert "Translated 100 sentences" in result.stderr
    whole, partial = directory / "whole.txt", directory / "partial.txt"
    whole.write_text(result.stdout)
    partial.write_text("".join(line for line in result.stdout.splitlines(keepends=True)
                               if not re.match(r"[A-Z]-(96|97|98|99)\t", line)))
    return {"whole": whole, "partial": partial, "model": directory / "model.pt"}


@pytest.mark.parametrize("batching", [["--batch-size", 16], ["--batch-size", 64], ["--batch-size", 1],
                                      ["--batch-size", 16, "--required-batch-size-multiple", 3], ["--max-tokens", 300]])
def test_generate_translates_every_test_sentence_whatever_the_batches(batching, generated, toy_data):
    """fairseq's batch_by_size dropped a last batch whose size is not a multiple of --required-batch-size-multiple:
    --batch-size 16 translated 96 of the 100 sentences, --batch-size 1 99."""
    result = fairseq_cli("fairseq-generate", toy_data, "--user-dir", USER_DIR, "--path", generated["model"],
                         "--cpu", "--beam", 1, "--max-len-b", 5, *batching)
    assert "Translated 100 sentences" in result.stderr
    texts = lambda output: {i: text for i, (text, _) in hypotheses(output).items()}
    assert texts(result.stdout) == texts(generated["whole"].read_text())


def score(generate_output, toy_data, *flags):
    return FORK_SERVER.run([sys.executable, "-m", "deepnmt_plugin.scoring", generate_output, "--source-lang", "de",
                            "--target-lang", "en", *flags])


def test_scoring_refuses_an_output_that_leaves_test_sentences_out(generated, toy_data, tmp_path):
    refused = score(generated["partial"], toy_data, "--data-bin", toy_data, "--json", tmp_path / "scores.json")
    assert refused.returncode == 1 and "Traceback" not in refused.stderr
    assert last_line(refused.stderr).startswith(
        f"deepnmt: error: {generated['partial']} holds 96 of the 100 test sentences (missing 96, 97, 98, 99)")
    assert not (tmp_path / "scores.json").exists()

    scored = score(generated["whole"], toy_data, "--data-bin", toy_data, "--json", tmp_path / "scores.json")
    assert scored.returncode == 0, scored.stderr
    assert "sentences\t100" in scored.stdout and (tmp_path / "scores.json").exists()


def test_a_gap_in_the_sentence_ids_is_refused_even_without_the_data(generated, tmp_path):
    lines = generated["whole"].read_text().splitlines()
    holed = tmp_path / "holed.txt"
    holed.write_text("\n".join(line for line in lines if not line.split("\t")[0][2:] == "7") + "\n")
    with pytest.raises(ScoringError, match=r"holds 99 of the 100 test sentences \(missing 7\)"):
        read_generate_output(str(holed))
    assert len(read_generate_output(str(generated["whole"]), sentences=100)[0]) == 100
