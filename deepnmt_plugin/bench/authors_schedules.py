"""The authors' own optimiser and learning-rate schedule of the recipes that stall under the depth study's
(``python -m deepnmt_plugin.bench.depth --preset study --schedule authors``), for the variant cells beside them.

Each is read from the file named in ``source`` and scaled to the study's update budget by its share of the authors'
run: a linear warmup over the same fraction of the updates, then a cosine decay to the same fraction of the peak at
the last update (fairseq's ``cosine`` scheduler computes the authors' warmup-then-cosine curve). fairseq's ``adam``
decays the weights decoupled from the gradient, as AdamW does; it decays every parameter, embeddings included.
"""

from dataclasses import dataclass
from typing import List, Tuple


@dataclass(frozen=True)
class AuthorsSchedule:
    source: str  # the authors' file the values are read from
    lr: float  # the peak
    warmup_fraction: float  # of the run's updates, linear from 0 to the peak
    min_lr_ratio: float  # where the cosine ends, a fraction of the peak
    betas: Tuple[float, float]
    weight_decay: float
    clip_norm: float  # 0: gradients not clipped

    def warmup_updates(self, max_update: int) -> int:
        return max(1, round(self.warmup_fraction * max_update))


# lmsdss/LayerNorm-Scaling run_130m.sh with torchrun_main.py's defaults (the training code Mix-LN's pixeli99/MixLN
# shares, `norm_type` post_pre and LNS): torch.optim.Adam, lr 1e-3, 2,000 of 20,000 steps warmup, cosine to 0.1 of
# the peak (min_lr_ratio), weight decay 0, --grad_clipping 0.0.
_LAYERNORM_SCALING_CODE = AuthorsSchedule(
    source="lmsdss/LayerNorm-Scaling run_130m.sh, torchrun_main.py", lr=1e-3, warmup_fraction=2_000 / 20_000,
    min_lr_ratio=0.1, betas=(0.9, 0.999), weight_decay=0.0, clip_norm=0.0)

SCHEDULES = {
    "mixln": _LAYERNORM_SCALING_CODE,
    "lns": _LAYERNORM_SCALING_CODE,
    # OLMo's cosine_with_warmup: t_warmup 8,388,608,000 of t_max 1e12 tokens, alpha_f 0.1; AdamW (0.9, 0.95),
    # lr 3e-4, weight decay 0.1, max_grad_norm 1.0
    "hybridnorm": AuthorsSchedule(
        source="BryceZhuo/HybridNorm dense_model/configs/exps/1.2B-dense-HybriedNorm.yaml", lr=3e-4,
        warmup_fraction=8_388_608_000 / 1e12, min_lr_ratio=0.1, betas=(0.9, 0.95), weight_decay=0.1, clip_norm=1.0),
    # DyT's LLaMA 7B run (its README's command, lr 3e-4; the only sequence model its authors trained): AdamW (0.9,
    # 0.95), weight decay 0.1, grad_clip_thresh 1.0; warmup min(2,000, num_steps // 20) of num_steps 1,000,000 (the
    # config's default, which the command keeps), then a cosine to 0.1 of the peak. Their warmup rises as
    # 1 - (1 - t)^2 where fairseq's is linear: over the 4 updates it scales to, at most a quarter of the peak apart.
    # alpha_0 stays the arch's (0.5, the paper's for non-LLMs): the command's 0.8 / 0.2 are for width 4,096.
    "dyt": AuthorsSchedule(
        source="jiachenzhu/DyT other_tasks/LLaMA main_training_llama.py, fms_fsdp/config/training.py", lr=3e-4,
        warmup_fraction=2_000 / 1_000_000, min_lr_ratio=0.1, betas=(0.9, 0.95), weight_decay=0.1, clip_norm=1.0),
}


def fairseq_flags(method: str, max_update: int) -> List[str]:
    """``fairseq-train``'s optimiser and schedule flags for METHOD's authors' schedule over MAX_UPDATE updates."""
    schedule = SCHEDULES[method]
    return ["--optimizer", "adam", "--adam-betas", str(schedule.betas), "--weight-decay", f"{schedule.weight_decay:g}",
            "--clip-norm", f"{schedule.clip_norm:g}", "--lr", f"{schedule.lr:g}", "--lr-scheduler", "cosine",
            "--warmup-updates", str(schedule.warmup_updates(max_update)), "--warmup-init-lr", "0",
            "--min-lr", f"{schedule.lr * schedule.min_lr_ratio:g}"]


def describe(method: str, max_update: int) -> str:
    schedule = SCHEDULES[method]
    return (f"{method}: lr {schedule.lr:g}, warmup {schedule.warmup_updates(max_update)}, cosine to "
            f"{schedule.lr * schedule.min_lr_ratio:g}, betas {schedule.betas}, weight decay {schedule.weight_decay:g}, "
            f"clip {schedule.clip_norm:g} ({schedule.source})")
