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


QUICKSTART_LOG = """\
== quickstart 2/2: Post-LN and DeepNorm 18L-18L, trained side by side, then test sacreBLEU (runs in runs/depth_study)
[1/2] postln_18L-18L: stalled at the unigram plateau after 2000 updates, test sacreBLEU 0.00, 0.211 s/update, peak RSS 0.7 GiB (log: l)
[2/2] deepnorm_18L-18L: still learning after 2000 updates, test sacreBLEU 18.20, 0.217 s/update, peak RSS 0.7 GiB (log: l)
CI: quickstart (command 1) in 681 s
"""


def test_the_readme_states_the_recorded_quickstart_time():
    record = json.loads(times.QUICKSTART_RECORD.read_text())
    assert times.rewrite_quickstart(times.PAGES[0], record) == times.PAGES[0].read_text()


def test_a_quickstart_log_becomes_the_stated_sentence_and_its_command_is_the_readmes():
    record = {"commit": "abc1234", "cores": 2, **times.read_quickstart_log(QUICKSTART_LOG)}
    assert times.render_quickstart(record) == (
        "Times, measured from a fresh clone of `main` (abc1234) on 2 idle cores with pip's cache empty: command 1 took "
        "**11 min 21 s** (install, the corpus with its `.deb`s fetched from Debian, two 18L-18L trainings of 2,000 "
        "updates side by side at 0.21–0.22 s/update, generation and scoring) and printed Post-LN 0.00 against DeepNorm "
        "18.20 test sacreBLEU ([record](.ci/quickstart.json)).")
    readme = times.PAGES[0].read_text()
    command = next(line for line in (REPO / ".ci" / "quickstart").read_text().splitlines() if "quickstart.sh" in line)
    assert command in readme.split("# 2. run the tests")[0]  # README's command 1, as .ci/quickstart times it
    for broken in (QUICKSTART_LOG.replace("CI: quickstart (command 1) in 681 s\n", ""),
                   "\n".join(line for line in QUICKSTART_LOG.splitlines() if "deepnorm" not in line)):
        with pytest.raises(SystemExit, match="lacks the quickstart's total or one of its two cells"):
            times.read_quickstart_log(broken)
