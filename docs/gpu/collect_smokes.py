"""One row per smoke run of docs/gpu/smoke_all.sh: which steps finished, how fp16 went, what it generated.

python docs/gpu/collect_smokes.py WORKDIR > smokes.csv
"""

import csv
import json
import re
import sys
from pathlib import Path

STEPS = ("train", "average", "generate", "score")


def last_train_stats(train_log: str):
    """The last 'train' summary fairseq logged for the epoch: loss, loss scale, train_wall."""
    summaries = [line for line in train_log.splitlines() if "| train |" in line]
    if not summaries:
        return {}
    fields = dict(re.findall(r"\| (\w+) ([0-9.e+-]+)", summaries[-1]))
    return {"train_loss": fields.get("loss"), "loss_scale": fields.get("loss_scale"),
            "train_wall_s": fields.get("train_wall")}


def steps_reached(run):
    """Whether each of STEPS finished: its marker, the averaging's log line or the scores it wrote."""
    averaged = (run / "average.log").exists() and any(
        line.startswith("averaged ") for line in (run / "average.log").read_text().splitlines())
    return [(run / "train.done").exists(), averaged, (run / "generate.done").exists(), (run / "scores.json").exists()]


def main(workdir):
    workdir = Path(workdir)
    seconds = {}
    for line in (workdir / "status.txt").read_text().splitlines():
        table, method, depth, rc, took = line.split()
        seconds[(table, method)] = (rc.removeprefix("rc="), took.removesuffix("s"))
    writer = csv.writer(sys.stdout, lineterminator="\n")
    writer.writerow(["table", "method", "depth", *STEPS, "overflows", "loss_scale", "train_loss", "train_wall_s",
                     "distinct_hypotheses", "test_sentences", "bleu", "exit_status", "job_seconds"])
    for table, method in sorted(seconds):
        for runs_csv in sorted((workdir / f"{table}_{method}").glob("*/runs.csv")):
            for row in csv.DictReader(runs_csv.open()):
                run = next(runs_csv.parent.glob(f"{row['method']}_*_seed{row['seed']}"))
                train_log = (run / "train.log").read_text()
                stats = last_train_stats(train_log)
                # deepnmt_plugin.scoring counts the hypotheses it scored
                scores = json.loads((run / "scores.json").read_text()) if (run / "scores.json").exists() else {}
                writer.writerow([table, method, row["depth"], *map(int, steps_reached(run)),
                                 train_log.count("gradient overflow"), stats.get("loss_scale"), stats.get("train_loss"),
                                 stats.get("train_wall_s"), scores.get("distinct_hypotheses"), scores.get("sentences"),
                                 row["bleu"], *seconds[(table, method)]])


if __name__ == "__main__":
    main(sys.argv[1])
