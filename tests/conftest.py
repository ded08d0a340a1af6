"""Shared fixtures: a binarized toy corpus, fairseq CLI runners, in-process model building."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
USER_DIR = str(REPO / "deepnmt_plugin")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import deepnmt_plugin  # noqa: E402,F401  (registers the plugin, as --user-dir does)
from corpus import write_corpus  # noqa: E402

TINY_DIMS = [
    "--encoder-embed-dim", "64", "--decoder-embed-dim", "64",
    "--encoder-ffn-embed-dim", "128", "--decoder-ffn-embed-dim", "128",
    "--encoder-attention-heads", "2", "--decoder-attention-heads", "2",
]


def fairseq_cli(tool, *args, cwd=None, check=True, stdin=None):
    """Run a real fairseq entry point (``fairseq-train`` …) in a subprocess; returns the result."""
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    result = subprocess.run(
        [os.path.join(os.path.dirname(sys.executable), tool), *map(str, args)],
        cwd=cwd, env=env, input=stdin, capture_output=True, text=True, timeout=900,
    )
    if check and result.returncode != 0:
        raise AssertionError(f"{tool} failed ({result.returncode}):\n{result.stderr[-4000:]}")
    return result


@pytest.fixture(scope="session")
def toy_data(tmp_path_factory):
    """The toy corpus binarized by ``fairseq-preprocess`` with a joined dictionary."""
    root = tmp_path_factory.mktemp("toy")
    raw = write_corpus(root / "raw")
    fairseq_cli(
        "fairseq-preprocess", "--source-lang", "de", "--target-lang", "en",
        "--trainpref", raw / "train", "--validpref", raw / "valid", "--testpref", raw / "test",
        "--destdir", root / "data-bin", "--joined-dictionary", "--workers", "1",
    )
    return root / "data-bin"


@pytest.fixture(scope="session")
def build_model(toy_data):
    """``build_model(arch, *flags)``: parse like ``fairseq-train`` and build; returns (model, args)."""
    from fairseq import options, tasks

    def build(arch, *flags):
        parser = options.get_training_parser()
        args = options.parse_args_and_arch(
            parser, [str(toy_data), "--user-dir", USER_DIR, "--arch", arch, "--cpu", *map(str, flags)]
        )
        task = tasks.setup_task(args)
        return task.build_model(args), args

    return build
