"""Average the parameters of several checkpoints, as fairseq's ``scripts/average_checkpoints.py`` does.

``python -m deepnmt_plugin.average_checkpoints --inputs a.pt b.pt --output avg.pt``, or
``--inputs SAVE_DIR --num-epoch-checkpoints N`` (the last N ``checkpointE.pt``) /
``--num-update-checkpoints N`` (the last N ``checkpoint_E_U.pt``), optionally up to
``--checkpoint-upper-bound``. fairseq's script is not in its wheel; this is the same algorithm: every
floating-point tensor of ``model`` is averaged (fp16 accumulated in fp32) and the rest of the first
(newest) checkpoint is kept, so the result trains on or generates like any fairseq checkpoint.

Two differences, both for checkpoints fairseq's script would mishandle: inputs are read through the
plugin's weights-only loader (torch >= 2.6 refuses fairseq checkpoints otherwise), and non-float
tensors (Admin's ``admin_initialized`` flag) must be equal in every input and are kept, where fairseq
floor-divides their sum (which fails on a bool). The output is written atomically (a temporary file,
fsynced, renamed): a failure leaves no file, and an output that is one of the inputs is refused, as is an output
named as fairseq-train names its checkpoints (``checkpoint_last.pt`` is where a training resumes; the others are
where it resumes when that one is unreadable, and what ``--num-*-checkpoints`` averages).
"""

import argparse
import os
import re
from collections import OrderedDict
from typing import List, Optional

import torch

from deepnmt_plugin import compat
from deepnmt_plugin.model_flags import as_dict, differing_model_flags

# The names fairseq-train gives its checkpoints: checkpoint_last.pt, its resume point, and the others (compat).
TRAINING_CHECKPOINT = re.compile(r"checkpoint_last\.pt|" + compat.SAVED_CHECKPOINT.format(suffix=""))


class AverageError(SystemExit):
    """Checkpoints cannot be averaged: one line, exit status 1, nothing written."""

    def __init__(self, message: str):
        super().__init__(f"deepnmt: error: {message}")


def model_config(state: dict):
    """A checkpoint's model flags: ``cfg['model']``, or a legacy checkpoint's ``args``."""
    return state["cfg"].get("model") if state.get("cfg") else state.get("args")


def average_checkpoints(inputs: List[str]) -> dict:
    """The first checkpoint's state with ``model`` replaced by the element-wise mean over ``inputs``."""
    new_state, sums = None, OrderedDict()
    for path in inputs:
        state = compat.read_checkpoint(path)
        if new_state is None:
            new_state = state
        model = state["model"]
        if sums and list(model) != list(sums):
            raise AverageError(f"{path} has other parameters than {inputs[0]}; average checkpoints of one model")
        first_cfg, cfg = as_dict(model_config(new_state)), as_dict(model_config(state))
        differences = [f"{name} {first_cfg[name]} vs {cfg[name]}" for name in differing_model_flags(first_cfg, cfg)]
        if differences:  # the same parameter names: the result would compute neither model, under the first's arch
            raise AverageError(f"{inputs[0]} and {path} are checkpoints of different models "
                               f"({', '.join(differences)}); average checkpoints of one model")
        for name, tensor in model.items():
            if name in sums and sums[name].shape != tensor.shape:  # e.g. the same flags over another dictionary
                raise AverageError(f"{name} is {tuple(sums[name].shape)} in {inputs[0]} but {tuple(tensor.shape)} in "
                                   f"{path}: checkpoints of different models; average checkpoints of one model")
            if not tensor.is_floating_point():
                if name in sums and not torch.equal(sums[name], tensor):
                    raise AverageError(f"{name} differs between {inputs[0]} and {path}; a non-float cannot be averaged")
                sums[name] = tensor
            elif name in sums:
                sums[name] += tensor
            else:
                sums[name] = tensor.float() if tensor.dtype == torch.half else tensor.clone()  # clone: tied tensors
    new_state["model"] = OrderedDict(
        (name, total / len(inputs) if total.is_floating_point() else total) for name, total in sums.items()
    )
    return new_state


def last_n_checkpoints(directory: str, n: int, update_based: bool, upper_bound: Optional[int] = None) -> List[str]:
    """The ``n`` newest epoch (``checkpointE.pt``) or update (``checkpoint_E_U.pt``) checkpoints, newest first."""
    pattern = re.compile(r"checkpoint_\d+_(\d+)\.pt" if update_based else r"checkpoint(\d+)\.pt")
    entries = []
    for name in os.listdir(directory):
        found = pattern.fullmatch(name)
        if found and (upper_bound is None or int(found.group(1)) <= upper_bound):
            entries.append((int(found.group(1)), name))
    if len(entries) < n:
        kind = "update" if update_based else "epoch"
        raise AverageError(f"found {len(entries)} {kind} checkpoints in {directory}, need {n}")
    return [os.path.join(directory, name) for _, name in sorted(entries, reverse=True)[:n]]


def check_output(output: str, inputs: List[str]) -> None:
    """Refuse, before reading anything, an output that is one of the inputs, a training's checkpoint name, or lies in a
    missing directory."""
    for path in inputs:
        if os.path.exists(output) and os.path.exists(path) and os.path.samefile(path, output):
            raise AverageError(f"refusing to overwrite {path}, one of the checkpoints being averaged; "
                               "choose another --output")
    if TRAINING_CHECKPOINT.fullmatch(os.path.basename(output)):
        raise AverageError(f"refusing to write --output {output}: fairseq-train saves and resumes from checkpoints of "
                           "that name; choose another name, e.g. checkpoint_averaged.pt")
    directory = os.path.dirname(output) or "."
    if not os.path.isdir(directory):
        raise AverageError(f"cannot write --output {output}: directory {directory} does not exist")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m deepnmt_plugin.average_checkpoints",
        description="Average the parameters of several checkpoints (fairseq's scripts/average_checkpoints.py).",
    )
    parser.add_argument("--inputs", required=True, nargs="+",
                        help="checkpoint files, or one directory with --num-epoch/update-checkpoints")
    parser.add_argument("--output", required=True, help="where to write the averaged checkpoint")
    count = parser.add_mutually_exclusive_group()
    count.add_argument("--num-epoch-checkpoints", type=int, help="the last N checkpointE.pt of --inputs DIR")
    count.add_argument("--num-update-checkpoints", type=int, help="the last N checkpoint_E_U.pt of --inputs DIR")
    parser.add_argument("--checkpoint-upper-bound", type=int,
                        help="with --num-*-checkpoints: ignore checkpoints after this epoch/update")
    args = parser.parse_args(argv)

    number = args.num_update_checkpoints if args.num_epoch_checkpoints is None else args.num_epoch_checkpoints
    if number is not None and number < 1:
        flag = "--num-epoch-checkpoints" if args.num_update_checkpoints is None else "--num-update-checkpoints"
        raise AverageError(f"{flag} must be at least 1, got {number}")
    if args.checkpoint_upper_bound is not None and number is None:
        parser.error("--checkpoint-upper-bound needs --num-epoch-checkpoints or --num-update-checkpoints")
    inputs = args.inputs
    if number is not None:
        if len(inputs) != 1 or not os.path.isdir(inputs[0]):
            parser.error("--num-epoch/update-checkpoints takes one directory in --inputs")
        update_based = args.num_update_checkpoints is not None
        inputs = last_n_checkpoints(inputs[0], number, update_based, args.checkpoint_upper_bound)
    check_output(args.output, inputs)
    compat.save_atomically(average_checkpoints(inputs), args.output)
    print(f"averaged {len(inputs)} checkpoints into {args.output}: {', '.join(inputs)}")


if __name__ == "__main__":
    main()
