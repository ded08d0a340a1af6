"""Where the suite's time goes, printed at the end of every run (conftest.py imports the hooks): the test time of each
module, summed over setup, call and teardown, with the suite's total against the README's budget, and
every quick test (not marked ``slow``) that took longer than a quick test should. The README's test command must keep
within SUITE_BUDGET_S on 2 cores; printing where the time goes keeps each new test's cost in sight."""

from collections import defaultdict

SUITE_BUDGET_S = 12 * 60  # the README's test command on 2 idle cores, wall clock
BUDGET_CORES = 2
QUICK_TEST_LIMIT_S = 5.0  # a test above this belongs in the slow set (`-m "not slow"` is the fast loop)
MODULES_SHOWN = 10

_seconds_by_module = defaultdict(float)
_tests_by_module = defaultdict(set)
_slow_quick_tests = {}


def pytest_runtest_logreport(report):
    """Every phase of every test, on the controller as xdist's workers send their reports."""
    module = report.nodeid.split("::", 1)[0]
    _seconds_by_module[module] += report.duration
    _tests_by_module[module].add(report.nodeid)
    if report.when == "call" and "slow" not in report.keywords and report.duration > QUICK_TEST_LIMIT_S:
        _slow_quick_tests[report.nodeid] = report.duration


def pytest_terminal_summary(terminalreporter):
    total = sum(_seconds_by_module.values())
    if not total:
        return
    write = terminalreporter.write_line
    terminalreporter.section("test time by module")
    budget = SUITE_BUDGET_S * BUDGET_CORES
    write(f"{total:.0f} s of test time in all, {100 * total / budget:.0f} % of the budget's {budget} core-seconds "
          f"({SUITE_BUDGET_S // 60} min on {BUDGET_CORES} cores; process start-up and the last worker's idle tail "
          f"come on top)")
    for module, seconds in sorted(_seconds_by_module.items(), key=lambda item: -item[1])[:MODULES_SHOWN]:
        write(f"{seconds:7.1f} s  {100 * seconds / total:4.1f} %  {len(_tests_by_module[module]):4d} tests  {module}")
    for nodeid, seconds in sorted(_slow_quick_tests.items(), key=lambda item: -item[1]):
        write(f"not marked slow but took {seconds:.1f} s (over {QUICK_TEST_LIMIT_S:.0f} s): {nodeid}")
