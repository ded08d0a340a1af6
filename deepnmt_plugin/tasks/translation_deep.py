"""``--task translation_deep``: fairseq's translation task plus what the deep recipes need.

Admin's one-time omega initialisation (a no-op for the other archs): on a fresh ``fairseq-train``
start, when fairseq first asks for the training batch iterator, the task sets every omega of a
``transformer_admin`` model (profiling forward pass, analytic formula, or a Transformer-Clinic
profile file) and marks the model initialised. That moment is after the model is
built (and, with ``--fp16``, halved) and before the optimizer exists, so fp16 master weights and every
optimizer copy start from the initialised omega. The flag is a buffer saved in every checkpoint:
resuming never re-initialises, and ``fairseq-generate`` needs nothing but the checkpoint.

The divergence guard (opt-in, ``--divergence-guard``; see ``divergence_guard.py``) stops a run whose
loss or gradients blow up with one line, before anything is saved.

Training-dynamics diagnostics (opt-in, ``--diagnostics-interval K``; see ``diagnostics.py``): model
update norm, per-layer gradient norms, LayerNorm input norms, Admin's beta and omega, measured every K
updates around the optimizer step and logged as fairseq training stats.
"""

import json
import logging
import os
from dataclasses import dataclass, field
from typing import Optional

import torch
import torch.distributed as dist
from fairseq import utils
from fairseq.data import data_utils
from fairseq.dataclass import ChoiceEnum
from fairseq.tasks import register_task
from fairseq.tasks.translation import TranslationConfig, TranslationTask
from omegaconf import II

from deepnmt_plugin import compat
from deepnmt_plugin.diagnostics import GROUPS, REFERENCE_FILE, Diagnostics, parse_groups
from deepnmt_plugin.models.admin import profile_admin, set_analytic_omega, set_omega_from_file
from deepnmt_plugin.tasks.divergence_guard import DivergenceGuard

logger = logging.getLogger(__name__)

PROFILE_JSON = "admin_profile.json"


@dataclass
class TranslationDeepConfig(TranslationConfig):
    admin_init: ChoiceEnum(["profile", "analytic"]) = field(
        default="profile",
        metadata={"help": "how to set Admin's omega on a fresh start: profile a forward pass on "
                          "training batches, or the O(log n) formula without data"},
    )
    admin_profile_batches: int = field(
        default=1, metadata={"help": "training batches (per GPU) the profiling pass runs on"}
    )
    admin_profile_file: Optional[str] = field(
        default=None,
        metadata={"help": "read omega from a Transformer-Clinic profile.ratio.init instead of profiling"},
    )
    divergence_guard: bool = field(
        default=False,
        metadata={"help": "stop with one line and exit status 1, saving nothing more, when the training "
                          "loss or gradient norm is NaN/inf, the loss exceeds --divergence-max-loss, or "
                          "fp16/AMP gradients overflow --divergence-overflow-patience times in a row"},
    )
    divergence_max_loss: Optional[float] = field(
        default=None,
        metadata={"help": "with --divergence-guard: stop when an update's training loss (base 2, as "
                          "logged) exceeds this"},
    )
    divergence_overflow_patience: int = field(
        default=10,
        metadata={"help": "with --divergence-guard: stop after this many fp16/AMP gradient overflows in a "
                          "row, each skipped by the loss scaler (fairseq itself stops only at --min-loss-scale)"},
    )
    diagnostics_interval: int = field(
        default=0,
        metadata={"help": "measure training-dynamics diagnostics every K updates (0: off, no cost); they "
                          "appear in the train_inner lines at multiples of K, so use a multiple of --log-interval"},
    )
    diagnostics_groups: str = field(
        default=",".join(GROUPS),
        metadata={"help": "with --diagnostics-interval: comma-separated subset of " + ",".join(GROUPS)},
    )
    diagnostics_sentences: int = field(
        default=16,
        metadata={"help": "with --diagnostics-interval: the fixed held-out batch is the first N sentences "
                          "of the first --valid-subset"},
    )
    flush_denormal: bool = field(
        default=False,
        metadata={"help": "flush subnormal floats to zero on the CPU (torch.set_flush_denormal): a very deep "
                          "Post-LN stack's vanishing gradients underflow into subnormals, which the CPU computes "
                          "several times slower (Post-LN 500L-500L: 42 s an update without, 9.8 s with, the same "
                          "logged losses)"},
    )
    save_dir: str = II("checkpoint.save_dir")
    no_save: bool = II("checkpoint.no_save")
    valid_subset: str = II("dataset.valid_subset")
    ddp_backend: str = II("distributed_training.ddp_backend")


class TaskFlagError(SystemExit):
    """An Admin, divergence-guard or diagnostics flag out of range: one line naming it, exit status 1, nothing run."""

    def __init__(self, message: str):
        super().__init__(f"deepnmt: error: {message}")


def check_task_flags(cfg: TranslationDeepConfig) -> None:
    """Every Admin, guard and diagnostics flag is checked, used or not: a typo is never silently ignored."""
    if cfg.admin_profile_file and cfg.admin_init != "profile":
        raise TaskFlagError("--admin-profile-file replaces profiling; it cannot be combined with --admin-init analytic")
    if cfg.admin_profile_batches < 1:
        raise TaskFlagError(f"--admin-profile-batches must be at least 1, got {cfg.admin_profile_batches}")
    if cfg.divergence_max_loss is not None:
        if not cfg.divergence_guard:
            raise TaskFlagError("--divergence-max-loss needs --divergence-guard")
        if not cfg.divergence_max_loss > 0:  # a logged loss is never below 0: the guard would stop update 1
            raise TaskFlagError(f"--divergence-max-loss must be above 0, got {cfg.divergence_max_loss:g}")
    if cfg.divergence_overflow_patience < 1:
        raise TaskFlagError(
            f"--divergence-overflow-patience must be at least 1, got {cfg.divergence_overflow_patience}")
    if cfg.diagnostics_interval < 0:
        raise TaskFlagError(f"--diagnostics-interval must be 0 (off) or positive, got {cfg.diagnostics_interval}")
    if cfg.diagnostics_sentences < 1:
        raise TaskFlagError(f"--diagnostics-sentences must be at least 1, got {cfg.diagnostics_sentences}")
    try:
        parse_groups(cfg.diagnostics_groups)
    except ValueError as error:
        raise TaskFlagError(str(error)) from None
    if cfg.diagnostics_interval and cfg.ddp_backend == "fully_sharded":  # the probe pass needs every parameter
        raise TaskFlagError("--diagnostics-interval does not support --ddp-backend fully_sharded")


def flush_subnormals_to_zero() -> None:
    """Subnormal floats (below 1.2e-38) become 0 in every CPU operation of this process, or a one-line refusal where
    the CPU has no flush-to-zero mode. Their gradients are already far below Adam's eps, so training loses nothing."""
    if not torch.set_flush_denormal(True):
        raise TaskFlagError("--flush-denormal: this CPU has no flush-to-zero mode (needs SSE3)")
    logger.info("--flush-denormal: subnormal floats are flushed to zero on the CPU")


def concatenate_batches(samples, pad, left_pad_source, left_pad_target):
    """One net_input holding every sentence of ``samples``, re-padded to the longest."""

    def rows(key):
        return [row[row.ne(pad)] for sample in samples for row in sample["net_input"][key]]

    return {
        "src_tokens": data_utils.collate_tokens(rows("src_tokens"), pad, left_pad=left_pad_source),
        "src_lengths": torch.cat([s["net_input"]["src_lengths"] for s in samples]),
        "prev_output_tokens": data_utils.collate_tokens(rows("prev_output_tokens"), pad, left_pad=left_pad_target),
    }


@register_task("translation_deep", dataclass=TranslationDeepConfig)
class TranslationDeepTask(TranslationTask):
    cfg: TranslationDeepConfig

    def __init__(self, cfg: TranslationDeepConfig, src_dict, tgt_dict):
        super().__init__(cfg, src_dict, tgt_dict)
        self.admin_model = None
        check_task_flags(cfg)
        self.divergence_guard = (
            DivergenceGuard(cfg.divergence_max_loss, cfg.divergence_overflow_patience) if cfg.divergence_guard else None
        )
        self.diagnostics = self.build_diagnostics(cfg) if cfg.diagnostics_interval else None
        if cfg.flush_denormal:
            flush_subnormals_to_zero()

    def build_diagnostics(self, cfg):
        reference_path = None if cfg.no_save else os.path.join(cfg.save_dir, REFERENCE_FILE)
        return Diagnostics(cfg.diagnostics_interval, parse_groups(cfg.diagnostics_groups),
                           self.diagnostics_batch, reference_path)

    def diagnostics_batch(self):
        """The first ``--diagnostics-sentences`` sentences of the first validation subset, in file order."""
        subset = self.cfg.valid_subset.split(",")[0]
        if subset not in self.datasets:
            self.load_dataset(subset)
        dataset = self.datasets[subset]
        samples = [dataset[i] for i in range(min(self.cfg.diagnostics_sentences, len(dataset)))]
        return dataset.collater(samples)["net_input"]

    def build_model(self, cfg, from_checkpoint=False):
        model = super().build_model(cfg, from_checkpoint)
        # Kept so the train iterator request below can initialise omega before the optimizer exists.
        self.admin_model = model if hasattr(model, "admin_initialized") else None
        if self.admin_model is not None:
            model.omega_set_by_task = True
        return model

    def train_step(self, sample, model, criterion, optimizer, update_num, ignore_grad=False):
        if self.divergence_guard is not None:
            self.divergence_guard.watch(optimizer, update_num)
        return super().train_step(sample, model, criterion, optimizer, update_num, ignore_grad)

    def reduce_metrics(self, logging_outputs, criterion):
        super().reduce_metrics(logging_outputs, criterion)
        if self.divergence_guard is not None and criterion.training:  # the trainer sets eval() to validate
            self.divergence_guard.check_training_loss(logging_outputs)

    def optimizer_step(self, optimizer, model, update_num):
        # called once per update (not per --update-freq micro-batch), with gradients all-reduced
        if self.diagnostics is None:
            return super().optimizer_step(optimizer, model, update_num)
        self.diagnostics.before_step(model, optimizer, update_num)
        super().optimizer_step(optimizer, model, update_num)
        self.diagnostics.after_step(model, update_num)

    def get_batch_iterator(self, dataset, **kwargs):
        model = self.admin_model
        if model is not None and dataset is self.datasets.get(self.cfg.train_subset) and not model.admin_initialized:
            self.initialize_admin(model, dataset, kwargs)
        return super().get_batch_iterator(dataset, **kwargs)

    def initialize_admin(self, model, dataset, iterator_kwargs):
        if self.cfg.admin_profile_file:
            report = {"mode": "file", "file": self.cfg.admin_profile_file,
                      "omega": set_omega_from_file(model, self.cfg.admin_profile_file)}
        elif self.cfg.admin_init == "analytic":
            report = {"mode": "analytic", "omega": set_analytic_omega(model)}
        else:
            net_input = self.profiling_input(model, dataset, iterator_kwargs)
            report = {"mode": "profile", "batches": self.cfg.admin_profile_batches,
                      "sentences": len(net_input["src_lengths"]), "sublayers": profile_admin(model, net_input)}
            report["omega"] = {side: [r["omega"] for r in records] for side, records in report["sublayers"].items()}
        model.admin_initialized.fill_(True)
        self.report_admin(report)

    def profiling_input(self, model, dataset, iterator_kwargs):
        """The first ``--admin-profile-batches`` batches of this rank's shard, as training will see them."""
        kwargs = dict(iterator_kwargs, disable_iterator_cache=True)  # leave the trainer's cached iterator alone
        batches = super().get_batch_iterator(dataset, **kwargs).next_epoch_itr(shuffle=True)
        samples = [sample for _, sample in zip(range(self.cfg.admin_profile_batches), batches)]
        net_input = concatenate_batches(samples, self.src_dict.pad(), self.cfg.left_pad_source, self.cfg.left_pad_target)
        device = next(model.parameters()).device
        return utils.apply_to_sample(lambda t: t.to(device), net_input)

    def report_admin(self, report):
        omega = report["omega"]
        summary = ", ".join(
            f"{side} {v[0]:.3f} .. {v[-1]:.3f}" if isinstance(v, list) else f"{side} {v:.3f}"
            for side, v in omega.items()
        )
        logger.info(f"admin: omega initialised once by {report['mode']} ({summary})")
        if not self.cfg.no_save and (not dist.is_initialized() or dist.get_rank() == 0):  # ranks agree
            os.makedirs(self.cfg.save_dir, exist_ok=True)
            path = os.path.join(self.cfg.save_dir, PROFILE_JSON)
            with compat.atomic_write(path) as partial, open(partial, "w") as handle:
                json.dump(report, handle, indent=1)
            logger.info(f"admin: profile written to {path}")

