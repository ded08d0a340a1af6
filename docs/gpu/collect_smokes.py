"""One row per smoke run of docs/gpu/smoke_all.sh: which steps finished, how fp16 went, what it generated.

python docs/gpu/collect_smokes.py WORKDIR > smokes.csv
"""

import csv
import json
import re
import sys
from pathlib import Path

STEPS = ("train", "average", "generate", "score")


def last_train_stats(train_log):
    """The last 'train' summary fairseq logged for the epoch: loss, loss scale, train_wall."""
    summaries = [line for line in train_log.read_text().splitlines() if "| train |" in line]
    if not summaries:
        return {}
    fields = dict(re.findall(r"\| (\w+) ([0-9.e+-]+)", summaries[-1]))
    return {"train_loss": fields.get("loss"), "loss_scale": fields.get("loss_scale"),
            "train_wall_s": fields.get("train_wall")}


def step_reached(run, step):
    logged = (run / "average.log").read_text() if (run / "average.log").exists() else ""
    return {"train": (run / "train.done").exists(), "average": logged.startswith("averaged ") or "\naveraged " in logged,
            "generate": (run / "generate.done").exists(), "score": (run / "scores.json").exists()}[step]


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
                log = run / "train.log"
                hypotheses = [line.split("\t")[2] for line in (run / "generate.txt").read_text().splitlines()
                              if line.startswith("H-")] if (run / "generate.txt").exists() else []
                stats = last_train_stats(log)
                writer.writerow([table, method, row["depth"], *(int(step_reached(run, s)) for s in STEPS),
                                 log.read_text().count("gradient overflow"), stats.get("loss_scale"),
                                 stats.get("train_loss"), stats.get("train_wall_s"), len(set(hypotheses)),
                                 len(hypotheses), row["bleu"], *seconds[(table, method)]])


if __name__ == "__main__":
    main(sys.argv[1])
