"""The CI times and test counts in README.md and docs/install.md are the ones .ci/times.py renders from its record."""

import importlib.util
import json

import pytest

from conftest import REPO

spec = importlib.util.spec_from_file_location("ci_times", REPO / ".ci" / "times.py")
times = importlib.util.module_from_spec(spec)
spec.loader.exec_module(times)

CI_LOG = """\
[1/4] installing torch==2.13.0
CI: Python 3.11.7 installed in 190 s
........................................................................ [100%]
1078 passed in 751.20s (0:12:31)
CI: Python 3.11.7 full suite in 752 s
CI: Python 3.13.0 installed in 301 s
847 passed, 2 warnings in 181.02s (0:03:01)
CI: Python 3.13.0 fast loop in 182 s
CI: all stages in 1430 s
"""


@pytest.mark.parametrize("page", times.PAGES, ids=lambda page: page.name)
def test_the_pages_state_the_recorded_times(page):
    record = json.loads(times.RECORD.read_text())
    assert times.rewrite(page, record) == page.read_text()
    assert times.render(record) in page.read_text()


def test_a_ci_log_becomes_the_stated_sentence():
    record = {"commit": "abc1234", "cores": 2, **times.read_log(CI_LOG)}
    assert times.render(record) == (
        "CI's script (`bash .ci/run`) took 23 min 50 s from a fresh clone of abc1234 on 2 idle cores with pip's cache "
        "empty: on Python 3.11.7, `scripts/install.sh` 3 min 10 s and the 1,078 tests 12 min 32 s; on Python 3.13.0, "
        "`scripts/install.sh` 5 min 1 s and the 847 fast-loop tests 3 min 2 s.")


@pytest.mark.parametrize("log, refusal", [
    (CI_LOG.replace("1078 passed", "2 failed, 1076 passed"), "2 failed tests: not a record"),
    (CI_LOG.replace("CI: all stages in 1430 s\n", ""), "lacks the full suite or the total"),
    (CI_LOG.replace("847 passed, 2 warnings in 181.02s (0:03:01)\n", "").replace("1078 passed in 751.20s (0:12:31)\n",
                                                                              ""), "no pytest summary before"),
])
def test_a_log_that_is_no_record_is_refused_in_one_line(log, refusal):
    with pytest.raises(SystemExit, match=refusal):
        times.read_log(log)
