"""The CI times and test counts that README.md and docs/install.md state, written from a real run of ``.ci/run``,
and the README's time of its command 1, from a real run of ``.ci/quickstart``.

    bash .ci/run 2>&1 | tee ci.log                       # from a fresh clone, pip's cache empty, idle cores
    python .ci/times.py ci.log --commit "$(git rev-parse --short HEAD)" --cores 2

reads the stage lines ``.ci/run`` prints ("CI: Python 3.11.7 installed in 190 s") and pytest's summaries, writes
``.ci/times.json``, and rewrites the text between TIMES_START and TIMES_END in README.md and docs/install.md from it.

    bash .ci/quickstart 2>&1 | tee quickstart.log        # the same way
    python .ci/times.py --quickstart quickstart.log --commit "$(git rev-parse --short HEAD)" --cores 2

reads its time and the depth-study driver's line for each of the two cells, writes ``.ci/quickstart.json`` and
rewrites the sentence between QUICKSTART_START and QUICKSTART_END in README.md.
tests/test_ci_times.py fails when either text differs from what its record renders.
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
QUICKSTART_RECORD = REPO / ".ci" / "quickstart.json"
QUICKSTART_START = "<!-- quickstart time: written by .ci/times.py from .ci/quickstart.json -->"
QUICKSTART_END = "<!-- end of quickstart time -->"
QUICKSTART_TOTAL = re.compile(r"^CI: quickstart \(command 1\) in (\d+) s$")
# the depth-study driver's line for a finished cell (bench/study.py)
CELL_LINE = re.compile(r"^\[\d+/\d+\] (?P<method>\w+)_18L-18L: (?P<verdict>.+?) after (?P<updates>\d+) updates, "
                       r"test sacreBLEU (?P<bleu>[\d.]+), (?P<seconds>[\d.]+) s/update")
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


def read_quickstart_log(text: str) -> dict:
    """{"seconds", "cells": {method: {verdict, updates, test_bleu, seconds_per_update}}}; a log without the total or
    without both cells is refused."""
    lines = [line.strip() for line in text.splitlines()]
    totals = [int(m.group(1)) for m in map(QUICKSTART_TOTAL.match, lines) if m]
    cells = {m["method"]: {"verdict": m["verdict"], "updates": int(m["updates"]), "test_bleu": float(m["bleu"]),
                           "seconds_per_update": float(m["seconds"])} for m in map(CELL_LINE.match, lines) if m}
    if not totals or set(cells) != {"postln", "deepnorm"}:
        raise SystemExit("times.py: error: the log lacks the quickstart's total or one of its two cells: run the "
                         "whole of .ci/quickstart")
    return {"seconds": totals[-1], "cells": cells}


def render_quickstart(record: dict) -> str:
    """The README's sentence on its command 1."""
    cells = record["cells"]
    paces = sorted(f"{cell['seconds_per_update']:.2f}" for cell in cells.values())
    pace = paces[0] if paces[0] == paces[-1] else f"{paces[0]}–{paces[-1]}"
    return (f"Times, measured from a fresh clone of `main` ({record['commit']}) on {record['cores']} idle cores with "
            f"pip's cache empty: command 1 took **{minutes(record['seconds'])}** (install, the corpus with its `.deb`s "
            f"fetched from Debian, two 18L-18L trainings of {cells['postln']['updates']:,} updates side by side at "
            f"{pace} s/update, generation and scoring) and printed Post-LN {cells['postln']['test_bleu']:.2f} against "
            f"DeepNorm {cells['deepnorm']['test_bleu']:.2f} test sacreBLEU ([record](.ci/quickstart.json)).")


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


def rewrite_quickstart(page: Path, record: dict) -> str:
    return splice(page.read_text(), QUICKSTART_START, [render_quickstart(record)], end=QUICKSTART_END)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("log", type=Path, help="the output of bash .ci/run (or of bash .ci/quickstart, --quickstart)")
    parser.add_argument("--quickstart", action="store_true", help="LOG is .ci/quickstart's: write the README's "
                                                                    "command-1 time")
    parser.add_argument("--commit", required=True, help="the commit the fresh clone was made from")
    parser.add_argument("--cores", type=int, required=True, help="the idle cores it ran on")
    args = parser.parse_args(argv)
    if args.quickstart:
        record = {"commit": args.commit, "cores": args.cores, **read_quickstart_log(args.log.read_text())}
        QUICKSTART_RECORD.write_text(json.dumps(record, indent=1) + "\n")
        PAGES[0].write_text(rewrite_quickstart(PAGES[0], record))
        print(render_quickstart(record))
        return
    record = {"commit": args.commit, "cores": args.cores, **read_log(args.log.read_text())}
    RECORD.write_text(json.dumps(record, indent=1) + "\n")
    for page in PAGES:
        page.write_text(rewrite(page, record))
    print(render(record))


if __name__ == "__main__":
    sys.exit(main())
