"""Operators per training update of every arch against stock fairseq ``transformer``:
``python -m deepnmt_plugin.bench.operators --data DIR [--csv FILE]``.

One update (forward, backward, optimizer) of each arch on the same batch, in bf16 with one flat fp32 master as a GPU
trains (``--precision fp32`` for fairseq's fp32 path), counted by the throughput tool's
``OperatorCounter`` (ATen operators that launch a kernel; views left out). On a GPU each is a kernel launch, and a
small or deep model's step is bound by launches, so the ratio to stock says what its words/s can be. The count does
not depend on the machine, so CI keeps it (tests/test_operator_ratios.py against ``docs/bench_operators/``).
"""

import argparse
import csv
import sys
from pathlib import Path
from typing import Dict, List

from deepnmt_plugin.bench.runs import METHODS
from deepnmt_plugin.bench.throughput import build_trainer, fixed_batches, operators_per_update, parse_arguments
from deepnmt_plugin.models.admin import set_omega_without_data
from deepnmt_plugin.reproduce import data_bin

ARCHS = ["transformer", *(arch for arch in dict.fromkeys(METHODS.values()) if arch != "transformer")]
COLUMNS = ["arch", "layers", "dims", "max_tokens", "precision", "operators", "ratio"]


def count(data: str, archs: List[str], layers: int = 6, dims: str = "tiny", max_tokens: int = 1024,
          precision: str = "fp32") -> Dict[str, int]:
    """Operators of one update per arch, all on the first batch of the same shuffled epoch, after one warm update
    (the first builds optimizer state)."""
    args = parse_arguments(["--data", data, "--cpu", "--dims", dims, "--layers", str(layers),
                            "--max-tokens", str(max_tokens), "--precision", precision, "--archs", *archs])
    args.data_bin = data_bin(args.data)
    counts, batch = {}, None
    for arch in archs:
        trainer = build_trainer(args, arch)
        set_omega_without_data(trainer.model)  # Admin's profiling runs once, not per update
        batch = batch or fixed_batches(trainer, 1)[0]
        trainer.train_step([batch])
        counts[arch] = operators_per_update(trainer, batch)
    return counts


def rows(counts: Dict[str, int], layers: int, dims: str, max_tokens: int, precision: str) -> List[dict]:
    stock = counts["transformer"]
    return [{"arch": arch, "layers": layers, "dims": dims, "max_tokens": max_tokens, "precision": precision,
             "operators": operators, "ratio": f"{operators / stock:.3f}"} for arch, operators in counts.items()]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser("python -m deepnmt_plugin.bench.operators", description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", required=True, help="a data-prep output (holding data-bin/) or a data-bin folder")
    parser.add_argument("--archs", nargs="+", default=ARCHS, help="stock transformer first (the ratios' baseline)")
    parser.add_argument("--layers", type=int, default=6, help="encoder and decoder layers")
    parser.add_argument("--dims", choices=["tiny", "iwslt", "base"], default="tiny")
    parser.add_argument("--max-tokens", type=int, default=1024)
    parser.add_argument("--precision", choices=["bf16", "fp32"], default="bf16",
                        help="bf16 (default): mixed precision with one flat fp32 master, as a GPU trains in fp16 or "
                             "bf16; fp32: fairseq's fp32 path, whose Adam steps every parameter tensor apart")
    parser.add_argument("--csv", type=Path, help="also write the table here")
    args = parser.parse_args(argv)
    if args.archs[0] != "transformer":
        parser.error("the first arch is the baseline: transformer")
    table = rows(count(args.data, args.archs, args.layers, args.dims, args.max_tokens, args.precision), args.layers,
                 args.dims, args.max_tokens, args.precision)
    print("| arch | operators per update | ratio to transformer |\n|---|---|---|")
    for row in table:
        print(f"| {row['arch']} | {row['operators']} | {row['ratio']} |")
    if args.csv:
        with open(args.csv, "w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=COLUMNS, lineterminator="\n")
            writer.writeheader()
            writer.writerows(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
