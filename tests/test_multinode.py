"""The reproduction scripts on several nodes: two "nodes" of one CPU process each, on localhost, through the
driver's torchrun launch with gloo, against a one-process run with the same tokens per update."""

import os
import subprocess
import sys

import pytest
import torch
import yaml

from conftest import REPO, TINY_DIMS, free_port

pytestmark = pytest.mark.slow  # trains, generates or builds corpora through subprocesses

DRIVER = [sys.executable, "-m", "deepnmt_plugin.reproduce"]
TABLE = {
    "table": "two nodes", "source_lang": "de", "target_lang": "en",
    # 2 nodes x 800 tokens x update-freq 1, or 1 process x 800 tokens x update-freq 2: the same batches an update
    "tokens_per_update": 1600, "max_tokens": 800,
    "train": [*TINY_DIMS, "--share-all-embeddings", "--optimizer", "adam", "--lr", "1e-3", "--criterion",
              "label_smoothed_cross_entropy", "--label-smoothing", "0.1", "--dropout", "0", "--max-update", "4",
              "--no-epoch-checkpoints", "--log-format", "simple", "--log-interval", "1"],
    "methods": {"admin": ["--arch", "transformer_admin_iwslt_de_en"],
                "deepnorm": ["--arch", "transformer_deepnorm_iwslt_de_en"]},
    "depths": [2], "generate": ["--beam", "1"], "bleu": "bleu_tokenized",
}


def weights(path) -> dict:
    """A state dict, from rank_weights.py's rank<R>.pt or from a checkpoint, which must be at update 4."""
    state = torch.load(path, map_location="cpu", weights_only=False)
    if "model" not in state:
        return state
    assert state["optimizer_history"][-1]["num_updates"] == 4
    return state["model"]


@pytest.fixture(scope="module")
def tables(toy_data, tmp_path_factory):
    """The table trained by two nodes at once (each its own driver, one workdir) and by one process; the weights
    every rank held at its last checkpoint."""
    root = tmp_path_factory.mktemp("nodes")
    config = root / "two_nodes.yaml"
    config.write_text(yaml.safe_dump(TABLE))
    shim = root / "bin" / "fairseq-train"  # the trainer, recording each rank's weights (tests/rank_weights.py)
    shim.parent.mkdir()
    shim.write_text(f"#!{sys.executable}\n" + (REPO / "tests" / "rank_weights.py").read_text())
    shim.chmod(0o755)
    env = dict(os.environ, PATH=f"{shim.parent}{os.pathsep}{os.environ['PATH']}", OMP_NUM_THREADS="1")

    def drive(workdir, *flags):
        return subprocess.Popen([*DRIVER, str(config), "--data", str(toy_data), "--gpus", "0", "--workdir",
                                 str(workdir), *flags], cwd=REPO, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)

    port = free_port()
    nodes = [drive(root / "two_nodes", "--nnodes", "2", "--node-rank", str(rank), "--master-addr", "127.0.0.1",
                   "--master-port", str(port)) for rank in (0, 1)]
    single = drive(root / "one_process", "--methods", "deepnorm")  # the method compared with two nodes (below)
    outputs = [process.communicate(timeout=600)[0] for process in (*nodes, single)]
    for process, output in zip((*nodes, single), outputs):
        assert process.returncode == 0, output[-4000:]
    return {"two_nodes": root / "two_nodes" / "two_nodes", "one_process": root / "one_process" / "two_nodes",
            "outputs": outputs}


def test_each_node_trains_its_rank_and_node_0_scores(tables):
    node0, node1, single = tables["outputs"]
    assert "node 0 of 2, precision fp32, 1600 tokens per update = 2 CPU process x 800 tokens x update-freq 1" in node0
    assert "1600 tokens per update = 1 CPU process x 800 tokens x update-freq 2" in single
    assert "node 1 of 2" in node1 and "score" not in node1
    for method in TABLE["methods"]:
        run = tables["two_nodes"] / f"{method}_2L_seed1"
        assert "distributed init (rank 0): env://" in (run / "train.log").read_text()  # torchrun's rendezvous
        assert "distributed init (rank 1): env://" in (run / "train.node1.log").read_text()
        assert (run / "scores.json").exists() and (run / "train.node1.done").exists()


@pytest.mark.parametrize("method", TABLE["methods"])
def test_both_ranks_end_with_identical_weights(tables, method):
    checkpoints = tables["two_nodes"] / f"{method}_2L_seed1" / "checkpoints"
    rank0, rank1 = weights(checkpoints / "rank0.pt"), weights(checkpoints / "rank1.pt")
    assert rank0.keys() == rank1.keys() == weights(checkpoints / "checkpoint_last.pt").keys()
    assert all(torch.equal(rank0[name], rank1[name]) for name in rank0)
    if method == "admin":  # its omega, profiled by each rank on its own batches and pooled, included
        assert sum(name.endswith(".omega") for name in rank0) == 2 * 2 + 2 * 3


def test_two_nodes_train_what_one_process_trains(tables):
    """DeepNorm, dropout 0: the same 4 updates to float tolerance. (Admin profiles omega over padded batches, as
    its authors' code does, so one process profiling two batches joined pads them otherwise: its omega differs.)"""
    two = weights(tables["two_nodes"] / "deepnorm_2L_seed1" / "checkpoints" / "checkpoint_last.pt")
    one = weights(tables["one_process"] / "deepnorm_2L_seed1" / "checkpoints" / "checkpoint_last.pt")
    differences = {name: (two[name] - one[name]).abs().max().item() for name in two}
    assert max(differences.values()) < 1e-5, sorted(differences.items(), key=lambda item: -item[1])[:5]
