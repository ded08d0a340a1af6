"""Shims that make fairseq 0.12 (``fairseq-fixed``) work on torch >= 2.6 / Python 3.11.

Every shim names the upstream problem it works around. Importing the plugin installs them
(``fairseq-train --user-dir deepnmt_plugin`` imports it before any checkpoint is read).
"""

import argparse
import functools
import glob
import os
import pickle
import re

import torch
from fairseq import checkpoint_utils, utils
from fairseq.distributed import utils as distributed_utils
from fairseq.tasks.translation import TranslationTask

# torch >= 2.6 defaults ``torch.load(weights_only=True)``, whose unpickler refuses every global
# that is not allowlisted; fairseq 0.12 calls ``torch.load`` without ``weights_only`` and its
# checkpoints hold ``argparse.Namespace`` (legacy ``args`` and ``cfg.model``), and the state
# fairseq broadcasts from rank 0 on a distributed resume holds ``_TensorPlaceholder``.
# We allowlist exactly these instead of turning weights-only loading off for the process.
FAIRSEQ_CHECKPOINT_GLOBALS = (
    argparse.Namespace,
    distributed_utils._TensorPlaceholder,
)


class UnsafeCheckpointError(pickle.UnpicklingError):
    """A checkpoint references a Python global outside the fairseq allowlist."""


class CorruptCheckpointError(SystemExit):
    """A checkpoint file cannot be read: one line naming it, exit status 1 (no traceback).

    torch reports a truncated file as a multi-line ``RuntimeError`` about miniz, an empty one as a bare
    ``EOFError`` and a damaged legacy pickle as a ``KeyError``; a file that reads but holds no fairseq
    checkpoint fails inside fairseq's upgrade code with a ``KeyError``. All name neither file nor cause.
    """

    def __init__(self, path, error: BaseException):
        # torch's weights-only unpickler puts the actual cause after a paragraph about weights_only
        detail = re.search(r"WeightsUnpickler error:\s*(.+)", str(error))
        reason = detail.group(1) if detail else str(error).strip().split("\n")[0].split(". ")[0]
        super().__init__(
            f"deepnmt: error: cannot read checkpoint {path}: the file is truncated, corrupt or not a "
            f"fairseq checkpoint ({type(error).__name__}{': ' + reason if reason else ''})"
        )


# What torch.load and fairseq's upgrade of the loaded dict raise for an unreadable file.
UNREADABLE_CHECKPOINT_ERRORS = (RuntimeError, EOFError, KeyError, pickle.UnpicklingError)


def _checkpoint_error(path, error: BaseException) -> BaseException:
    """The one-line error for a checkpoint that failed to load: unsafe global, or unreadable file."""
    found = re.search(r"GLOBAL (\S+)", str(error))
    if isinstance(error, pickle.UnpicklingError) and found:
        allowed = ", ".join(f"{g.__module__}.{g.__qualname__}" for g in FAIRSEQ_CHECKPOINT_GLOBALS)
        return UnsafeCheckpointError(
            f"refusing to load checkpoint {path}: it references {found.group(1)}, which is not one "
            f"of the types fairseq checkpoints contain ({allowed}); "
            "load it with torch.load(..., weights_only=False) only if you trust its source"
        )
    return CorruptCheckpointError(path, error)


def _refuse_unreadable(load_checkpoint_to_cpu):
    """Turn torch's multi-paragraph load errors into one line naming the file and the cause."""

    @functools.wraps(load_checkpoint_to_cpu)
    def load(path, *args, **kwargs):
        try:
            return load_checkpoint_to_cpu(path, *args, **kwargs)
        except UNREADABLE_CHECKPOINT_ERRORS as error:
            raise _checkpoint_error(path, error) from None

    load.deepnmt_wrapped = True
    return load


def read_checkpoint(path) -> dict:
    """A checkpoint's dict exactly as saved (no fairseq upgrade), weights-only, with the same errors.

    For tools that rewrite checkpoints (averaging, export): what they save keeps the saved structure.
    """
    try:
        with open(path, "rb") as handle:
            state = torch.load(handle, map_location="cpu")
    except UNREADABLE_CHECKPOINT_ERRORS as error:
        raise _checkpoint_error(path, error) from None
    if not isinstance(state, dict) or "model" not in state:
        raise CorruptCheckpointError(path, KeyError("model"))
    return state


class DataDirectoryError(SystemExit):
    """``fairseq-train DATA`` without a usable DATA: one line naming it, exit status 1 (no traceback)."""

    def __init__(self, message: str):
        super().__init__(f"deepnmt: error: {message}")


def _check_data_directories(setup_task):
    """fairseq's translation tasks answer a missing or empty data directory with a FileNotFoundError
    traceback from deep inside ``setup_task``; check first and say which directory is wrong."""

    @functools.wraps(setup_task)
    def setup(cls, cfg, **kwargs):
        for path in utils.split_paths(cfg.data):
            if not os.path.isdir(path):
                raise DataDirectoryError(f"data directory {path} does not exist")
            if not glob.glob(os.path.join(path, "dict.*.txt")):
                raise DataDirectoryError(
                    f"data directory {path} holds no fairseq-preprocess output (no dict.*.txt)"
                )
        return setup_task(cls, cfg, **kwargs)

    setup.deepnmt_wrapped = True
    return setup


def bf16_on_cuda(cfg) -> None:
    """fairseq 0.12 reads ``--bf16`` as "bfloat16 on a TPU" (``options.py`` sets ``--tpu`` with it), so on a
    GPU it crashes in ``torch_xla``. Where CUDA is there and ``torch_xla`` is not, train in bf16 on CUDA:
    fairseq's Trainer then halves the model to bfloat16 and its FP16Optimizer keeps fp32 master weights
    without loss scaling, as in later fairseq versions."""
    common = cfg.common
    if common.bf16 and common.tpu and not common.cpu and torch.cuda.is_available() and not _has_torch_xla():
        common.tpu = False


def _has_torch_xla() -> bool:
    import importlib.util

    return importlib.util.find_spec("torch_xla") is not None


def _bf16_on_cuda_first(call_main):
    @functools.wraps(call_main)
    def call(cfg, main, **kwargs):
        bf16_on_cuda(cfg)
        return call_main(cfg, main, **kwargs)

    call.deepnmt_wrapped = True
    return call


def install():
    if hasattr(torch.serialization, "add_safe_globals"):  # torch >= 2.4; older torch loads unrestricted
        torch.serialization.add_safe_globals(list(FAIRSEQ_CHECKPOINT_GLOBALS))
    if not getattr(checkpoint_utils.load_checkpoint_to_cpu, "deepnmt_wrapped", False):
        checkpoint_utils.load_checkpoint_to_cpu = _refuse_unreadable(checkpoint_utils.load_checkpoint_to_cpu)
    if not getattr(TranslationTask.setup_task, "deepnmt_wrapped", False):
        unwrapped = TranslationTask.__dict__["setup_task"].__func__  # called with cls, so subclasses stay themselves
        TranslationTask.setup_task = classmethod(_check_data_directories(unwrapped))
    if not getattr(distributed_utils.call_main, "deepnmt_wrapped", False):  # fairseq-train's way into training
        distributed_utils.call_main = _bf16_on_cuda_first(distributed_utils.call_main)
