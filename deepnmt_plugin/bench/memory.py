"""Peak memory of one training step of each arch: ``python -m deepnmt_plugin.bench.memory --data DIR``.

Each arch runs in a fresh process (the peak resident set only grows, so one process per arch keeps them apart): it
builds the model, records its resident set, then runs one forward and backward pass of the same fixed batch (label-
smoothed loss of random tokens) and records the peak again. Reported: the step's peak above the built model, in MiB,
and its ratio to the first arch's. On the CPU, the peak RSS is what the allocator took from the system, so a recipe
that fragments the heap (many short-lived tensors) shows here where a count of live tensors would not.
"""

import argparse
import csv
import json
import resource
import subprocess
import sys
from typing import List

from deepnmt_plugin.bench.depth import positive_int
from deepnmt_plugin.bench.throughput import DIMS, refuse_unknown_archs
from deepnmt_plugin.models.admin import set_omega_without_data
from deepnmt_plugin.reproduce import USER_DIR, OneLineParser, data_bin

ARCHS = ["transformer_preln", "transformer_dlcl", "transformer_denseformer", "transformer_hyper"]


def peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def one_step(data: str, arch: str, layers: int, dims: str, tokens: int) -> dict:
    """The measurement, in this process (``--worker``)."""
    import torch
    from fairseq import options, tasks

    embed, ffn, heads = DIMS[dims]
    torch.set_num_threads(1)
    flags = [f"--{side}-{name}" for side in ("encoder", "decoder") for name in ("embed-dim", "ffn-embed-dim",
                                                                               "attention-heads")]
    values = [embed, ffn, heads] * 2
    args = options.parse_args_and_arch(options.get_training_parser(), [
        data, "--user-dir", USER_DIR, "--arch", arch, "--cpu", "--encoder-layers", str(layers),
        "--decoder-layers", str(layers), "--share-all-embeddings", "--dropout", "0",
        *[str(x) for pair in zip(flags, values) for x in pair]])
    task = tasks.setup_task(args)
    model = task.build_model(args)
    set_omega_without_data(model)  # Admin refuses to train with omega unset
    torch.manual_seed(0)
    side = int(tokens**0.5)  # side x side tokens a side of the batch
    vocabulary = len(task.source_dictionary)
    src, prev = torch.randint(4, vocabulary, (side, side)), torch.randint(4, vocabulary, (side, side))
    built = peak_mib()
    logits = model(src, torch.full((side,), side), prev)[0]
    torch.nn.functional.cross_entropy(logits.flatten(0, 1), prev.flatten(), label_smoothing=0.1).backward()
    return {"arch": arch, "layers": layers, "dims": dims, "tokens": side * side,
            "step_peak_mib": round(peak_mib() - built, 1)}


def measure(args) -> List[dict]:
    rows = []
    for arch in args.archs:
        result = subprocess.run([sys.executable, "-m", "deepnmt_plugin.bench.memory", "--worker", "--data", args.data,
                                 "--archs", arch, "--layers", str(args.layers), "--dims", args.dims,
                                 "--tokens", str(args.tokens)], capture_output=True, text=True)
        if result.returncode:  # the worker's own last line (its exception), not a traceback of this process
            reason = (result.stderr.strip().splitlines() or ["no output"])[-1].removeprefix("deepnmt: error: ")
            raise SystemExit(f"deepnmt: error: {arch}'s step failed in its worker: {reason}")
        rows.append(json.loads(result.stdout.strip().splitlines()[-1]))
        print(f"{arch}: {rows[-1]['step_peak_mib']} MiB", file=sys.stderr, flush=True)
    for row in rows:
        row["ratio"] = round(row["step_peak_mib"] / rows[0]["step_peak_mib"], 3) if rows[0]["step_peak_mib"] else None
    return rows


def main(argv=None) -> int:
    parser = OneLineParser("python -m deepnmt_plugin.bench.memory", description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", required=True, help="a data-prep output (holding data-bin/) or a data-bin folder")
    parser.add_argument("--archs", nargs="+", default=ARCHS, help="the first is the reference (default: Pre-LN)")
    parser.add_argument("--layers", type=positive_int, default=50, help="encoder and decoder layers (default 50)")
    parser.add_argument("--dims", choices=list(DIMS), default="tiny", help="embed-ffn-heads (default tiny: the study's)")
    parser.add_argument("--tokens", type=positive_int, default=1024, help="tokens a side of the batch (default 1024)")
    parser.add_argument("--csv", help="also write the rows here")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    data = data_bin(args.data)
    if args.worker:
        print(json.dumps(one_step(data, args.archs[0], args.layers, args.dims, args.tokens)))
        return 0
    refuse_unknown_archs(parser, args.archs)
    args.data = data
    rows = measure(args)
    print(f"| arch | layers | step peak above the built model (MiB) | vs {rows[0]['arch']} |\n|---|---|---|---|")
    for row in rows:
        print(f"| {row['arch']} | {row['layers']}L-{row['layers']}L | {row['step_peak_mib']} | {row['ratio']} |")
    if args.csv:
        with open(args.csv, "w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
