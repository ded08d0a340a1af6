"""A full disk or a read-only folder under every command's output: one line naming the output and the reason, exit
status 1, no traceback (each used to end in an OSError or torch's RuntimeError traceback). The full disk and the
read-only folder are tmpfs mounts, so these tests need root; elsewhere they skip, saying so."""

import os
import subprocess
import sys

import pytest
import torch

from conftest import FORK_SERVER, REPO, TINY_DIMS, USER_DIR, fairseq_cli
from tiny_training import checkpoint_of, last_line
from tiny_training import one_thread_per_process  # noqa: F401  (autouse fixture)

PRELN = "transformer_preln_iwslt_de_en"
REASONS = {"full": "No space left on device", "read-only": "Read-only file system"}


def mounted(folder, *options):
    if os.geteuid() != 0:
        pytest.skip("a full disk and a read-only folder are tmpfs mounts here: run the tests as root")
    folder.mkdir()
    mount = subprocess.run(["mount", "-t", "tmpfs", "-o", ",".join(options), "tmpfs", str(folder)], capture_output=True,
                           text=True)
    if mount.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {mount.stderr.strip()}")


@pytest.fixture(params=list(REASONS))
def unwritable(request, tmp_path):
    """(folder, reason): a tmpfs filled to its last block, or one mounted read-only."""
    folder = tmp_path / request.param
    mounted(folder, "size=256k", *(["ro"] if request.param == "read-only" else []))
    try:
        if request.param == "full":
            with open(folder / "filler", "wb", buffering=0) as filler, pytest.raises(OSError):
                while True:
                    filler.write(b"\0" * 4096)
        yield folder, REASONS[request.param]
    finally:
        subprocess.run(["umount", str(folder)], check=True)


@pytest.fixture(scope="module")
def checkpoint(build_model, tmp_path_factory):
    model, args = build_model(PRELN, "--encoder-layers", 1, "--decoder-layers", 1, *TINY_DIMS)
    path = tmp_path_factory.mktemp("model") / "checkpoint_last.pt"
    torch.save(checkpoint_of(model, args), path)
    return path


@pytest.fixture(scope="module")
def generated(checkpoint, toy_data):
    output = checkpoint.parent / "generate.txt"
    output.write_text(fairseq_cli("fairseq-generate", toy_data, "--user-dir", USER_DIR, "--path", checkpoint, "--cpu",
                                  "--beam", 1, "--max-len-b", 5).stdout)
    return output


def fake_archives(folder):
    (folder / "archives").mkdir(exist_ok=True)
    (folder / "archives" / "de-en.tgz").write_bytes(b"not read before the output is written")
    return folder / "archives"


def python_module(*args):
    return FORK_SERVER.run([sys.executable, "-m", *map(str, args)], env=dict(os.environ, PYTHONWARNINGS="ignore"))


COMMANDS = {  # what each writes into the folder, and how
    "fairseq-train --save-dir": (
        "ck", lambda out, toy, ckpt, gen: fairseq_cli(
            "fairseq-train", toy, "--user-dir", USER_DIR, "--arch", PRELN, "--cpu", *TINY_DIMS, "--encoder-layers", 1,
            "--decoder-layers", 1, "--optimizer", "adam", "--lr", 1e-3, "--max-tokens", 1500, "--max-update", 2,
            "--save-dir", out, check=False)),
    "export": ("stock.pt", lambda out, toy, ckpt, gen: python_module("deepnmt_plugin.export", ckpt, out)),
    "export --format ctranslate2": ("ct2", lambda out, toy, ckpt, gen: python_module(
        "deepnmt_plugin.export", "--format", "ctranslate2", "--data", toy, ckpt, out)),
    "average_checkpoints": ("average.pt", lambda out, toy, ckpt, gen: python_module(
        "deepnmt_plugin.average_checkpoints", "--inputs", ckpt, ckpt, "--output", out)),
    "scoring --json": ("scores.json", lambda out, toy, ckpt, gen: python_module(
        "deepnmt_plugin.scoring", gen, "--target-lang", "en", "--json", out)),
    "depth study --workdir": ("study", lambda out, toy, ckpt, gen: python_module(
        "deepnmt_plugin.bench.depth", "--preset", "study", "--data", toy.parent, "--workdir", out, "--methods", "preln",
        "--depths", 1, "--max-update", 2)),
    "data-prep --output": ("iwslt14", lambda out, toy, ckpt, gen: python_module(  # an archive that is there
        "deepnmt_plugin.data", "iwslt14", "--archives", fake_archives(ckpt.parent), "--output", out)),
}


@pytest.mark.parametrize("command", list(COMMANDS))
def test_an_unwritable_output_is_one_line(command, unwritable, toy_data, checkpoint, generated):
    folder, reason = unwritable
    name, run = COMMANDS[command]
    result = run(folder / name, toy_data, checkpoint, generated)
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    line = last_line(result.stderr)
    assert line.startswith(f"deepnmt: error: cannot write {folder / name}") and line.endswith(f": {reason}"), line
    # no torn file left (a study cell's empty lock file stays, as after every run)
    left = sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file() and p.name not in ("filler", "lock"))
    assert left == [], left
