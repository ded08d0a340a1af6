"""The tests' console scripts run forked from a process that has imported torch and fairseq (forked_cli.py): each
command prints, to the same stream, what its console script prints in a fresh process, and exits the same way."""

import os
import re
import shutil
import subprocess
import sys

import pytest

from conftest import FORK_SERVER, TINY_DIMS, USER_DIR, console_script, fairseq_cli

pytestmark = pytest.mark.slow  # trains, generates or builds corpora through subprocesses


IGNORE_WARNINGS = dict(os.environ, PYTHONWARNINGS="ignore")  # as fairseq_cli runs the tests' commands
SHOW_WARNINGS = {name: value for name, value in os.environ.items() if name != "PYTHONWARNINGS"}


def masked(output: str) -> list:
    """The lines without what differs from run to run: numbers (times, speeds) and each run's own folder."""
    return [re.sub(r"\d+(\.\d+)?", "#", line.replace("/forked/", "/run/").replace("/fresh/", "/run/"))
            for line in output.splitlines()]


def assert_same(tool, *args, cwd, stdin=None, env=IGNORE_WARNINGS):
    """Run ``tool ARGS`` (a console script, or ``python``) both ways, each in its own folder under ``cwd`` (what one
    writes, the other must not read); returns the forked one."""
    command = [sys.executable if tool == "python" else console_script(tool), *args]
    for run in ("forked", "fresh"):
        (cwd / run).mkdir(exist_ok=True)
    forked = FORK_SERVER.run(command, cwd=cwd / "forked", input=stdin, env=env)
    fresh = subprocess.run(list(map(str, command)), cwd=cwd / "fresh", input=stdin, env=env, capture_output=True,
                           text=True, timeout=900)
    assert forked.returncode == fresh.returncode
    assert masked(forked.stdout) == masked(fresh.stdout)
    assert masked(forked.stderr) == masked(fresh.stderr)
    return forked


def test_train_generate_and_their_failures_print_and_exit_as_in_a_fresh_process(toy_data, tmp_path):
    train = ["fairseq-train", toy_data, "--user-dir", USER_DIR, "--arch", "transformer_deepnorm", "--cpu", *TINY_DIMS,
             "--encoder-layers", 1, "--decoder-layers", 1, "--optimizer", "adam", "--lr", "1e-3", "--max-tokens", 500,
             "--max-update", 3, "--seed", 1, "--log-format", "simple", "--log-interval", 1, "--save-dir", "saved",
             "--no-epoch-checkpoints"]
    trained = assert_same(*train, cwd=tmp_path)
    assert re.search(r"\| INFO \| fairseq_cli.train \| done training", trained.stdout)  # on stdout, at INFO
    for run in ("forked", "fresh"):  # one model for both (their checkpoints differ in their saving times)
        shutil.copy(tmp_path / "forked" / "saved" / "checkpoint_last.pt", tmp_path / run / "model.pt")
    generated = assert_same("fairseq-generate", toy_data, "--user-dir", USER_DIR, "--path", "model.pt", "--beam", 2,
                            "--cpu", "--max-sentences", 8, cwd=tmp_path)
    assert "INFO:fairseq_cli.generate:" in generated.stderr  # fairseq's own import configured the logger
    assert_same("fairseq-generate", toy_data, "--user-dir", USER_DIR, "--path", "model.pt", "--beam", 2, "--cpu",
                "--results-path", "results", cwd=tmp_path)
    assert masked((tmp_path / "forked" / "results" / "generate-test.txt").read_text()) == masked(
        (tmp_path / "fresh" / "results" / "generate-test.txt").read_text())

    interactive = assert_same("fairseq-interactive", toy_data, "--user-dir", USER_DIR, "--path", "model.pt",
                              "--source-lang", "de", "--target-lang", "en", "--cpu", stdin="katze sieht hund\nhaus\n",
                              cwd=tmp_path)
    assert len(re.findall(r"^H-\d+\t", interactive.stdout, re.M)) == 2

    refused = assert_same(*train, "--encoder-normalize-before", cwd=tmp_path)  # SystemExit with a message
    assert refused.returncode == 1 and refused.stderr.strip().splitlines()[-1].startswith("deepnmt: error:")
    assert assert_same(*train, "--arch", "no_such_arch", cwd=tmp_path).returncode == 2  # argparse
    crashed = assert_same("fairseq-train", "no-data", "--arch", "transformer", "--cpu", cwd=tmp_path)  # an exception
    assert crashed.returncode == 1 and "Traceback" in crashed.stderr


def test_python_c_and_m_print_and_exit_as_in_a_fresh_process(toy_data, tmp_path):
    code = ("import sys; print(sys.argv, repr(sys.path[0]), __name__, sys.stdin.read().upper()); "
            "import fairseq; raise ValueError(sys.argv[1])")
    crashed = assert_same("python", "-c", code, "one", "two", cwd=tmp_path, stdin="katze\n")
    assert crashed.returncode == 1 and crashed.stderr.strip().splitlines()[-1] == "ValueError: one"
    assert assert_same("python", "-m", "deepnmt_plugin.scoring", cwd=tmp_path).returncode == 2  # argparse, by name
    refused = assert_same("python", "-m", "deepnmt_plugin.scoring", "missing.txt", "--source-lang", "de",
                          "--target-lang", "en", cwd=tmp_path)
    assert refused.returncode == 1 and "Traceback" not in refused.stderr


def test_warnings_show_as_the_environment_says(tmp_path):
    code = "import warnings; warnings.warn('shown unless PYTHONWARNINGS says otherwise')"
    assert "UserWarning: shown unless" in assert_same("python", "-c", code, cwd=tmp_path, env=SHOW_WARNINGS).stderr
    assert not assert_same("python", "-c", code, cwd=tmp_path).stderr
    always = assert_same("python", "-c", f"{code}; {code}", cwd=tmp_path,
                         env=dict(SHOW_WARNINGS, PYTHONWARNINGS="always"))
    assert always.stderr.count("UserWarning: shown unless") == 2


def test_a_command_past_its_timeout_is_killed_and_the_next_one_runs(toy_data, tmp_path):
    endless = [toy_data, "--user-dir", USER_DIR, "--arch", "transformer_preln", "--cpu", *TINY_DIMS,
               "--optimizer", "adam", "--lr", "1e-3", "--max-tokens", 500, "--no-save"]
    with pytest.raises(subprocess.TimeoutExpired):
        FORK_SERVER.run([console_script("fairseq-train"), *endless], timeout=5)
    assert "done training" in fairseq_cli("fairseq-train", *endless, "--max-update", 1).stdout
