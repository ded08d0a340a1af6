"""The CI times and test counts that README.md and docs/install.md state, written from a real run of ``.ci/run``.

    bash .ci/run 2>&1 | tee ci.log                       # from a fresh clone, pip's cache empty, idle cores
    python .ci/times.py ci.log --commit "$(git rev-parse --short HEAD)" --cores 2

reads the stage lines ``.ci/run`` prints ("CI: Python 3.11.7 installed in 190 s") and pytest's summaries, writes
``.ci/times.json``, and rewrites the text between TIMES_START and TIMES_END in README.md and docs/install.md from it.
tests/test_ci_times.py fails when that text differs from what the record renders.
"""

import argparse
import json
import re
import sys
from pathlib import Path

from deepnmt_plugin.bench.choosing import splice

REPO = Path(__file__).resolve().parent.parent
RECORD = REPO / ".ci" / "times.json"
PAGES = (REPO / "README.md", REPO / "docs" / "install.md")
TIMES_START = "<!-- CI times: written by .ci/times.py from .ci/times.json -->"
TIMES_END = "<!-- end of CI times -->"
STAGE = re.compile(r"^CI: Python (\S+) (installed|full suite|fast loop) in (\d+) s$")
TOTAL = re.compile(r"^CI: all stages in (\d+) s$")
PYTEST_SUMMARY = re.compile(r"^=*\s*(?:(\d+) failed, )?(\d+) passed(?:, (\d+) skipped)?(?:, \d+ \w+)* in [\d.]+s")


def read_log(text: str) -> dict:
    """{"stages": [{python, stage, seconds, passed?}], "total_seconds"}; a failed test or a missing stage is refused."""
    stages, summaries, totals = [], [], []
    for line in text.splitlines():
        stage, summary, total = STAGE.match(line.strip()), PYTEST_SUMMARY.match(line.strip()), TOTAL.match(line.strip())
        if total:
            totals.append(int(total.group(1)))
        elif summary:
            if summary.group(1):
                raise SystemExit(f"times.py: error: the log has {summary.group(1)} failed tests: not a record")
            summaries.append(int(summary.group(2)))
        elif stage:
            python, name, seconds = stage.group(1), stage.group(2), int(stage.group(3))
            entry = {"python": python, "stage": name, "seconds": seconds}
            if name in ("full suite", "fast loop"):
                if not summaries:
                    raise SystemExit(f"times.py: error: no pytest summary before the {name} on Python {python}")
                entry["passed"] = summaries.pop()
            stages.append(entry)
    if not totals or not any(s["stage"] == "full suite" for s in stages):
        raise SystemExit("times.py: error: the log lacks the full suite or the total: run the whole of .ci/run")
    return {"stages": stages, "total_seconds": totals[-1]}


def minutes(seconds: int) -> str:
    return f"{seconds // 60} min {seconds % 60} s" if seconds >= 60 else f"{seconds} s"


def render(record: dict) -> str:
    """The paragraph both pages carry."""
    parts = []
    for python in dict.fromkeys(s["python"] for s in record["stages"]):
        stages = {s["stage"]: s for s in record["stages"] if s["python"] == python}
        tests = stages.get("full suite") or stages.get("fast loop")
        kind = "tests" if "full suite" in stages else "fast-loop tests"
        parts.append(f"on Python {python}, `scripts/install.sh` {minutes(stages['installed']['seconds'])} and the "
                     f"{tests['passed']:,} {kind} {minutes(tests['seconds'])}")
    return (f"CI's script (`bash .ci/run`) took {minutes(record['total_seconds'])} from a fresh clone of "
            f"{record['commit']} on {record['cores']} idle cores with pip's cache empty: " + "; ".join(parts) + ".")


def rewrite(page: Path, record: dict) -> str:
    """``page``'s text with the paragraph between TIMES_START and TIMES_END rendered from ``record``."""
    return splice(page.read_text(), TIMES_START, [render(record)], end=TIMES_END)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("log", type=Path, help="the output of bash .ci/run")
    parser.add_argument("--commit", required=True, help="the commit the fresh clone was made from")
    parser.add_argument("--cores", type=int, required=True, help="the idle cores it ran on")
    args = parser.parse_args(argv)
    record = {"commit": args.commit, "cores": args.cores, **read_log(args.log.read_text())}
    RECORD.write_text(json.dumps(record, indent=1) + "\n")
    for page in PAGES:
        page.write_text(rewrite(page, record))
    print(render(record))


if __name__ == "__main__":
    sys.exit(main())
