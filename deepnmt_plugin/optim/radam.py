"""``--optimizer radam``: RAdam (Liu et al. 2020, "On the Variance of the Adaptive Learning Rate and
Beyond"), which the Admin recipes train with; fairseq 0.12 ships none.

Wraps ``torch.optim.RAdam`` with fairseq's Adam flags (``--adam-betas``, ``--adam-eps``,
``--weight-decay``), as Transformer-Clinic's ``radam`` did. Weight decay is decoupled
(``p -= lr * wd * p``), as in Clinic's RAdam and fairseq's own Adam.
"""

from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any, List

import torch
from fairseq.dataclass import FairseqDataclass
from fairseq.optim import FairseqOptimizer, register_optimizer
from omegaconf import II, OmegaConf


@dataclass
class FairseqRAdamConfig(FairseqDataclass):
    adam_betas: Any = field(default=(0.9, 0.999), metadata={"help": "betas for RAdam"})
    adam_eps: float = field(default=1e-8, metadata={"help": "epsilon for RAdam"})
    weight_decay: float = field(default=0.0, metadata={"help": "decoupled weight decay"})
    lr: List[float] = II("optimization.lr")


@register_optimizer("radam", dataclass=FairseqRAdamConfig)
class FairseqRAdam(FairseqOptimizer):
    def __init__(self, cfg: FairseqRAdamConfig, params):
        super().__init__(cfg)
        self._optimizer = torch.optim.RAdam(params, decoupled_weight_decay=True, **self.optimizer_config)

    @property
    def supports_flat_params(self):
        """RAdam's update is elementwise, so ``--fp16`` may step one flat fp32 copy of all parameters (fairseq's
        FP16Optimizer refuses an optimizer that does not say so)."""
        return True

    @property
    def optimizer_config(self):
        betas = self.cfg.adam_betas
        return {
            "lr": self.cfg.lr[0] if isinstance(self.cfg.lr, Collection) else self.cfg.lr,
            "betas": eval(betas) if isinstance(betas, str) else tuple(OmegaConf.to_container(betas)),
            "eps": self.cfg.adam_eps,
            "weight_decay": self.cfg.weight_decay,
        }
