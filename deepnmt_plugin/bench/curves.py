"""Validation loss against update for runs side by side: ``python -m deepnmt_plugin.bench.curves
--curve LABEL FILE [FILE ...] [--curve ...] --out F.png``.

A curve is read from ``fairseq-train`` logs (their ``valid`` lines) or from the depth study's ``result.json``
(its ``valid_loss_curve``); several files make one curve, e.g. a study cell and the run that trained it on from
its last checkpoint. This compares one cell under other schedules (peak lr, warmup), which the study's own
``valid_loss_vs_update.png`` (one preset, one curve per method) cannot.
"""

import argparse
import json
import sys
from pathlib import Path
from typing import Dict, List

from deepnmt_plugin.bench import pyplot
from deepnmt_plugin.bench.runs import valid_loss_curve


def read_curve(paths: List[Path]) -> List[List[float]]:
    """[[update, loss], ...] over all files, by update; a later file's value for an update replaces an earlier's."""
    points = {}
    for path in paths:
        if path.suffix == ".json":
            curve = json.loads(path.read_text()).get("valid_loss_curve") or []
        else:
            curve = valid_loss_curve(path.read_text(errors="replace"))
        points.update({int(update): loss for update, loss in curve})
    return [[update, points[update]] for update in sorted(points)]


def plot(curves: Dict[str, List[List[float]]], title: str, path: Path) -> None:
    plt = pyplot()

    figure, axes = plt.subplots(figsize=(7, 4.5))
    for label, curve in curves.items():
        axes.plot(*zip(*curve), marker="." if len(curve) < 15 else None, label=label)
    axes.set(title=title, xlabel="update", ylabel="validation loss (label-smoothed, bits)")
    axes.grid(alpha=0.3)
    axes.legend(fontsize="small")
    figure.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(figure)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser("python -m deepnmt_plugin.bench.curves", description=__doc__.split("\n\n")[0])
    parser.add_argument("--curve", nargs="+", action="append", required=True, metavar=("LABEL", "FILE"),
                        help="a label, then the fairseq-train logs or result.json files of one run")
    parser.add_argument("--title", default="Validation loss vs update")
    parser.add_argument("--out", type=Path, required=True, help="the PNG to write")
    args = parser.parse_args(argv)
    curves = {}
    for label, *files in args.curve:
        if not files:
            parser.error(f"--curve {label}: name the logs or result.json files after the label")
        missing = [f for f in files if not Path(f).is_file()]
        if missing:
            parser.error(f"--curve {label}: no such file: {', '.join(missing)}")
        curves[label] = read_curve([Path(f) for f in files])
        if not curves[label]:
            parser.error(f"--curve {label}: no validation loss in {', '.join(files)} (fairseq 'valid' lines, or "
                         "a result.json with valid_loss_curve)")
    plot(curves, args.title, args.out)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
