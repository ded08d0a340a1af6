"""docs/training.md's "Your own data" block, run as a user would: raw parallel text to a trained model."""

import os
import re
import subprocess
import sys

import pytest

from conftest import REPO
from corpus import write_corpus

pytestmark = pytest.mark.slow

# the block's model and budget, shrunk to a toy's (later flags override earlier ones in fairseq-train)
TOY_TRAINING = ("--encoder-layers 2 --decoder-layers 2 --encoder-embed-dim 16 --decoder-embed-dim 16 "
                "--encoder-ffn-embed-dim 32 --decoder-ffn-embed-dim 32 --encoder-attention-heads 2 "
                "--decoder-attention-heads 2 --max-update 2 --max-tokens 512 --cpu --no-epoch-checkpoints")


def own_data_block() -> str:
    page = (REPO / "docs" / "training.md").read_text()
    block = re.search(r"```bash\n(# own data:.*?)```", page, re.S)
    assert block, "docs/training.md has no '# own data:' bash block"
    return block.group(1)


def run_bash(script: str, cwd) -> subprocess.CompletedProcess:
    bin_dir = os.path.dirname(sys.executable)  # the environment's sacremoses, subword-nmt and fairseq-* scripts
    env = dict(os.environ, PATH=bin_dir + os.pathsep + os.environ["PATH"], PYTHONWARNINGS="ignore")
    return subprocess.run(["bash", "-eo", "pipefail", "-c", script], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=900)


def test_the_own_data_block_turns_raw_text_into_a_trained_model(tmp_path):
    write_corpus(tmp_path / "raw", sizes=(("train", 300), ("valid", 20), ("test", 20)))
    (tmp_path / "deepnmt_plugin").symlink_to(REPO / "deepnmt_plugin")  # the block's relative --user-dir
    block = own_data_block()
    assert "BPE_OPS=10000" in block and block.rstrip().endswith("--save-dir checkpoints/own")
    script = block.replace("BPE_OPS=10000", "BPE_OPS=40").rstrip() + " " + TOY_TRAINING
    result = run_bash(script, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "@@" in (tmp_path / "bpe" / "train.de").read_text()  # the BPE was applied
    assert (tmp_path / "data-bin" / "dict.de.txt").read_text() == (tmp_path / "data-bin" / "dict.en.txt").read_text()
    assert (tmp_path / "checkpoints" / "own" / "checkpoint_last.pt").exists()


def test_separate_dictionaries_are_refused_with_the_line_the_page_quotes(tmp_path):
    """The page says fairseq-train stops with this line when the dictionary is not joined."""
    write_corpus(tmp_path / "raw", sizes=(("train", 100), ("valid", 10), ("test", 10)))
    (tmp_path / "deepnmt_plugin").symlink_to(REPO / "deepnmt_plugin")
    block = own_data_block().replace("--joined-dictionary ", "").replace("BPE_OPS=10000", "BPE_OPS=40")
    result = run_bash(block.rstrip() + " " + TOY_TRAINING, tmp_path)
    quoted = re.search(r'with one line: "([^"]+)"', (REPO / "docs" / "training.md").read_text(), re.S).group(1)
    assert result.returncode != 0 and " ".join(quoted.split()) in result.stderr.splitlines()[-1]
    assert not (tmp_path / "checkpoints" / "own" / "checkpoint_last.pt").exists()
