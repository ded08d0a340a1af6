"""The no-warmup schedule T-Fixup trains with (layer6ai-labs/T-Fixup ``inverse_sqrt_nowarmup``).

``lr_t = lr * sqrt(d / (d + t))`` for update ``t`` and decay period ``d``: the full lr from the
first update (no warmup), 1/sqrt(2) of it after ``d`` updates, inverse-square-root decay after.
"""

from collections.abc import Collection
from dataclasses import dataclass, field
from typing import List

from fairseq.dataclass import FairseqDataclass
from fairseq.optim.lr_scheduler import FairseqLRScheduler, register_lr_scheduler
from omegaconf import II


@dataclass
class InverseSqrtNoWarmupConfig(FairseqDataclass):
    decay_period: int = field(
        default=4000,
        metadata={"help": "updates after which the lr has decayed by 1/sqrt(2): lr*sqrt(d/(d+t))"},
    )
    lr: List[float] = II("optimization.lr")


def inverse_sqrt_nowarmup_lr(peak_lr: float, decay_period: int, num_updates: int) -> float:
    return peak_lr * (decay_period / (decay_period + num_updates)) ** 0.5


@register_lr_scheduler("inverse_sqrt_nowarmup", dataclass=InverseSqrtNoWarmupConfig)
class InverseSqrtNoWarmupSchedule(FairseqLRScheduler):
    def __init__(self, cfg: InverseSqrtNoWarmupConfig, optimizer):
        super().__init__(cfg, optimizer)
        if isinstance(cfg.lr, Collection) and len(cfg.lr) > 1:
            raise ValueError("inverse_sqrt_nowarmup takes a single --lr")
        if cfg.decay_period <= 0:
            raise ValueError(f"--decay-period must be positive, got {cfg.decay_period}")
        self.peak_lr = cfg.lr[0] if isinstance(cfg.lr, Collection) else cfg.lr
        self.optimizer.set_lr(self.peak_lr)

    def step(self, epoch, val_loss=None):
        super().step(epoch, val_loss)
        return self.optimizer.get_lr()  # the lr changes per update, not per epoch

    def step_update(self, num_updates):
        lr = inverse_sqrt_nowarmup_lr(self.peak_lr, self.cfg.decay_period, num_updates)
        self.optimizer.set_lr(lr)
        return lr
