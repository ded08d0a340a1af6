"""Divergence guard: stop a diverging ``fairseq-train`` with one line, before it saves anything.

What fairseq 0.12 does on its own (``fairseq/trainer.py``): a non-finite gradient norm in fp32/bf16
raises ``FloatingPointError``, which writes ``crash.pt``, re-runs the batch under ``NanDetector`` and
ends in a traceback; in fp16/AMP an overflow only skips the update and halves the loss scale, and
reaching ``--min-loss-scale`` raises the same ``FloatingPointError``; with ``--threshold-loss-scale``
the scale never reaches the minimum and overflowing updates are skipped forever; a finite but
exploded loss is never noticed.

The guard checks at two points of fairseq's own control flow, both on values every data-parallel rank
shares, so all ranks stop at the same update:

* the gradient-norm step (``optimizer.clip_grad_norm``, after gradients are all-reduced and before
  the update): a non-finite norm without a loss scaler, fairseq's minimum-loss-scale error, or
  ``overflow_patience`` gradient overflows in a row in fp16/AMP (each one skipped by fairseq; a good
  step resets the count);
* the training metrics of an update (``task.reduce_metrics``, logging outputs summed over ranks and
  accumulated batches, before fairseq's save step): a NaN/inf loss, or a loss above ``max_loss``.

Either raises :class:`DivergenceError`, a ``SystemExit``: it passes fairseq's handlers (they catch
``FloatingPointError`` and ``Exception`` and write ``crash.pt``), no checkpoint is written after the
diverged update, and the process prints one line and exits with status 1 (fairseq-train ends right
there, see :func:`diverged`). The last checkpoint saved stays as it was.
"""

import functools
import logging
import math
import multiprocessing
import os
import sys
from typing import List, Optional

import torch
from fairseq import utils


class DivergenceError(SystemExit):
    """Training diverged: one line (``deepnmt: diverged at update N: ...``), exit status 1."""

    def __init__(self, update: int, reason: str):
        super().__init__(
            f"deepnmt: diverged at update {update}: {reason}; stopped before saving, "
            "the last checkpoint written is left as it was"
        )


def diverged(update: int, reason: str) -> DivergenceError:
    """The error to raise; in fairseq-train itself, the process ends here instead, with the error's line and status 1.

    Stopped mid-epoch, fairseq-train still runs its background batch thread (``BufferedIterator``), and the
    interpreter's exit can then abort the process (SIGABRT, "terminate called without an active exception") after
    the line. So it stops its DataLoader workers, flushes the logs and leaves by ``os._exit(1)``. A Python program
    that called fairseq's ``main`` gets the error and may go on."""
    error = DivergenceError(update, reason)
    if running_fairseq_train():
        workers = multiprocessing.active_children()  # the DataLoader's: they would report the vanished parent
        for worker in workers:
            worker.terminate()
        for worker in workers:
            worker.join(timeout=10)
        logging.shutdown()  # flushes every log handler
        sys.stdout.flush()
        sys.stderr.write(f"{error.code}\n")
        sys.stderr.flush()
        os._exit(1)
    return error


def running_fairseq_train() -> bool:
    """This process is ``fairseq-train`` (its console script, or ``python -m fairseq_cli.train``)."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    return (spec is not None and spec.name == "fairseq_cli.train") or (
        os.path.basename(getattr(main, "__file__", None) or "") == "fairseq-train"
    )


def logged_loss(logging_outputs: List[dict]) -> Optional[float]:
    """The update's training loss as fairseq logs it: summed loss / sample size, in bits (base 2)."""
    sample_size = utils.item(sum(log.get("sample_size", 0) for log in logging_outputs))
    if not sample_size:
        return None
    loss = utils.item(sum(log.get("loss", 0) for log in logging_outputs))
    return loss / sample_size / math.log(2)


class DivergenceGuard:
    """The checks of one training run; the task calls ``watch`` and ``check_training_loss``."""

    def __init__(self, max_loss: Optional[float], overflow_patience: int):
        self.max_loss = max_loss
        self.overflow_patience = overflow_patience
        self.update = 0  # the update being computed, 1-based as fairseq logs it
        self.overflows = 0  # gradient overflows in a row (fp16/AMP), AMP's retries of a batch included

    def watch(self, optimizer, update_num: int) -> None:
        """Called by the task's ``train_step``; guards the optimizer's gradient-norm step once."""
        self.update = update_num + 1
        if not getattr(optimizer, "deepnmt_guarded", False):
            optimizer.clip_grad_norm = self.guarded_clip_grad_norm(optimizer.clip_grad_norm, optimizer)
            optimizer.deepnmt_guarded = True

    def guarded_clip_grad_norm(self, clip_grad_norm, optimizer):
        # fp16 (DynamicLossScaler) and AMP (GradScaler) optimizers have a loss scaler, for which a
        # non-finite norm is an overflow; bf16's FP16Optimizer has scaler None, like fp32.
        loss_scaled = getattr(optimizer, "scaler", None) is not None

        @functools.wraps(clip_grad_norm)
        def guarded(*args, **kwargs):
            try:
                grad_norm = clip_grad_norm(*args, **kwargs)
            except OverflowError:  # fp16: fairseq skips this batch and lowers the loss scale
                self.overflowed()
                raise
            except FloatingPointError as error:  # fp16/AMP: the loss scale hit --min-loss-scale
                raise diverged(self.update, str(error).split(". ")[0]) from None
            if torch.isfinite(grad_norm).all():
                self.overflows = 0
            elif loss_scaled:  # AMP: fairseq retries or skips this batch and lowers the loss scale
                self.overflowed()
            else:
                raise diverged(self.update, f"gradient norm is {utils.item(grad_norm)}")
            return grad_norm

        return guarded

    def overflowed(self) -> None:
        self.overflows += 1
        if self.overflows >= self.overflow_patience:
            raise diverged(
                self.update,
                f"{self.overflows} gradient overflows in a row in fp16/AMP, each one skipped "
                f"(--divergence-overflow-patience {self.overflow_patience})",
            )

    def check_training_loss(self, logging_outputs: List[dict]) -> None:
        """Called by the task's ``reduce_metrics`` on a training update's aggregated logging outputs."""
        loss = logged_loss(logging_outputs)
        if loss is None:
            return
        if not math.isfinite(loss):
            raise diverged(self.update, f"training loss is {loss}")
        if self.max_loss is not None and loss > self.max_loss:
            raise diverged(self.update, f"training loss {loss:.3f} > --divergence-max-loss {self.max_loss:g}")
