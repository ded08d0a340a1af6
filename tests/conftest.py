"""Shared fixtures: a binarized toy corpus, fairseq CLI runners, in-process model building; the test workers
(pytest-xdist, ``-n auto --dist loadscope`` in pytest.ini, scoped by ``pytest_xdist_make_scheduler`` below)."""

import fcntl
import os
import shutil
import socket
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
USER_DIR = str(REPO / "deepnmt_plugin")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import deepnmt_plugin  # noqa: E402,F401  (registers the plugin, as --user-dir does)
import torch  # noqa: E402
from corpus import write_corpus  # noqa: E402
from forked_cli import ForkServer  # noqa: E402
from time_budget import pytest_runtest_logreport, pytest_terminal_summary  # noqa: E402,F401  (pytest hooks)
from xdist_scheduling import pytest_xdist_make_scheduler  # noqa: E402,F401  (a pytest hook)

MAX_WORKERS = 4

if os.environ.get("PYTEST_XDIST_WORKER"):  # workers share the cores: one thread each, and in their subprocesses
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)


def pytest_xdist_auto_num_workers(config):
    """``-n auto``: a worker per core, at most MAX_WORKERS (each holds torch and fairseq in memory)."""
    return max(1, min(len(os.sched_getaffinity(0)), MAX_WORKERS))


def built_once(tmp_path_factory, name: str, build) -> Path:
    """The folder ``build(folder)`` fills, built once per pytest run whatever the number of workers: the first to
    ask builds it under a lock, the others wait for it and read it."""
    worker_base = tmp_path_factory.getbasetemp()
    run_base = worker_base.parent if os.environ.get("PYTEST_XDIST_WORKER") else worker_base
    folder = run_base / f"shared-{name}"
    with open(run_base / f"shared-{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (folder / ".built").exists():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            build(folder)
            (folder / ".built").touch()
    return folder


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (for a rendezvous of test processes)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


TINY_DIMS = [
    "--encoder-embed-dim", "64", "--decoder-embed-dim", "64",
    "--encoder-ffn-embed-dim", "128", "--decoder-ffn-embed-dim", "128",
    "--encoder-attention-heads", "2", "--decoder-attention-heads", "2",
]


FORK_SERVER = ForkServer()


def console_script(tool: str) -> str:
    """The path of an installed console script (``fairseq-train`` …) of this interpreter's environment."""
    return os.path.join(os.path.dirname(sys.executable), tool)


def fairseq_cli(tool, *args, cwd=None, check=True, stdin=None):
    """Run a real console script (``fairseq-train`` …) in a process of its own, forked from one that has imported
    torch and fairseq (``forked_cli.py``); returns the finished process."""
    result = FORK_SERVER.run([console_script(tool), *args], cwd=cwd, input=stdin,
                             env=dict(os.environ, PYTHONWARNINGS="ignore"), timeout=900)
    if check and result.returncode != 0:
        raise AssertionError(f"{tool} failed ({result.returncode}):\n{result.stderr[-4000:]}")
    return result


@pytest.fixture(scope="session")
def toy_data(tmp_path_factory):
    """The toy corpus binarized by ``fairseq-preprocess`` with a joined dictionary."""
    def build(root):
        raw = write_corpus(root / "raw")
        fairseq_cli(
            "fairseq-preprocess", "--source-lang", "de", "--target-lang", "en",
            "--trainpref", raw / "train", "--validpref", raw / "valid", "--testpref", raw / "test",
            "--destdir", root / "data-bin", "--joined-dictionary", "--workers", "1",
        )

    return built_once(tmp_path_factory, "toy", build) / "data-bin"


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
