"""The tests' scheduling on pytest-xdist workers (xdist_scheduling.py), on a run of stand-in test modules."""

import os
import subprocess
import sys
from pathlib import Path

SHARED = """
import os, pytest

@pytest.fixture(scope="module")
def built():
    with open(os.environ["LOG"], "a") as log:
        log.write("built\\n")

@pytest.mark.parametrize("i", range(6))
def test_reads(built, i):
    with open(os.environ["LOG"], "a") as log:
        log.write(f"shared {os.environ['PYTEST_XDIST_WORKER']}\\n")
"""
SLOW = """
import os, pytest

pytestmark = pytest.mark.slow

@pytest.mark.parametrize("i", range(4))
def test_slow(i):
    with open(os.environ["LOG"], "a") as log:
        log.write(f"slow {os.environ['PYTEST_XDIST_WORKER']}\\n")
"""
ALONE = """
import os, time, pytest

@pytest.mark.parametrize("i", range(12))
def test_alone(i):
    time.sleep(0.2)
    with open(os.environ["LOG"], "a") as log:
        log.write(f"alone {os.environ['PYTEST_XDIST_WORKER']}\\n")
"""


def test_a_modules_fixture_is_built_once_the_other_tests_spread_and_slow_ones_start_first(tmp_path):
    (tmp_path / "conftest.py").write_text(f"import sys\nsys.path.insert(0, {str(Path(__file__).parent)!r})\n"
                                          "from xdist_scheduling import pytest_xdist_make_scheduler\n")
    (tmp_path / "test_shared.py").write_text(SHARED)
    (tmp_path / "test_alone.py").write_text(ALONE)
    (tmp_path / "test_zzz_slow.py").write_text(SLOW)  # collected last
    log = tmp_path / "log"
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "2", "--dist", "loadscope", "-p",
                             "no:cacheprovider", "-c", os.devnull, "--rootdir", tmp_path, tmp_path],
                            env=dict(os.environ, LOG=str(log), PYTEST_ADDOPTS=""), capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stdout[-3000:]
    lines = log.read_text().splitlines()
    assert lines.count("built") == 1
    assert len({line for line in lines if line.startswith("shared")}) == 1  # one worker
    assert {line for line in lines if line.startswith("alone")} == {"alone gw0", "alone gw1"}
    for worker in ("gw0", "gw1"):  # each worker runs its slow tests before any other
        ran = [line.split()[0] for line in lines if line.endswith(worker)]
        assert ran.index("slow") == 0 and "slow" not in ran[ran.count("slow"):], ran
