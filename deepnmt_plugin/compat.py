"""Shims that make fairseq 0.12 (``fairseq-fixed``) work on torch >= 2.6 / Python 3.11.

Every shim names the upstream problem it works around. Importing the plugin installs them
(``fairseq-train --user-dir deepnmt_plugin`` imports it before any checkpoint is read).
"""

import argparse
import functools
import pickle
import re

import torch
from fairseq import checkpoint_utils
from fairseq.distributed import utils as distributed_utils

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


def _refuse_unknown_globals(load_checkpoint_to_cpu):
    """Turn torch's multi-paragraph weights-only error into one line naming file and global."""

    @functools.wraps(load_checkpoint_to_cpu)
    def load(path, *args, **kwargs):
        try:
            return load_checkpoint_to_cpu(path, *args, **kwargs)
        except pickle.UnpicklingError as error:
            if isinstance(error, UnsafeCheckpointError):
                raise
            found = re.search(r"GLOBAL (\S+)", str(error))
            culprit = found.group(1) if found else "an unsupported object"
            allowed = ", ".join(f"{g.__module__}.{g.__qualname__}" for g in FAIRSEQ_CHECKPOINT_GLOBALS)
            raise UnsafeCheckpointError(
                f"refusing to load checkpoint {path}: it references {culprit}, which is not one "
                f"of the types fairseq checkpoints contain ({allowed}); "
                "load it with torch.load(..., weights_only=False) only if you trust its source"
            ) from None

    load.deepnmt_wrapped = True
    return load


def install():
    if hasattr(torch.serialization, "add_safe_globals"):  # torch >= 2.4; older torch loads unrestricted
        torch.serialization.add_safe_globals(list(FAIRSEQ_CHECKPOINT_GLOBALS))
    if not getattr(checkpoint_utils.load_checkpoint_to_cpu, "deepnmt_wrapped", False):
        checkpoint_utils.load_checkpoint_to_cpu = _refuse_unknown_globals(
            checkpoint_utils.load_checkpoint_to_cpu
        )
