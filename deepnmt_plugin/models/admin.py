"""Admin (Liu et al. 2020, "Understanding the Difficulty of Training Transformers").

Post-LN with a trainable per-dimension residual weight omega_i on every sublayer (Eq. 5):
``x_i = LN(omega_i * x_{i-1} + f_i(x_{i-1}))``. omega is set once, before training, so that the
model's output change grows O(log N) rather than O(N) with depth. Three ways to set it:

* ``profile`` (default): a training-mode forward pass at omega = 1, sublayer by sublayer, keeping a
  running scalar per stack as the reference code does (Transformer-Clinic, ``adaptive-profiling``):
  ``omega_i = ratio;  ratio = sqrt(Var(omega_i * x_{i-1}) + Var(f_i(x_{i-1})))``, ratio starting at 1,
  variances over the whole T x B x C tensor. The paper writes ``omega_i = sqrt(sum_{j<i} Var f_j)``
  (Algorithm 1); the code's running form adds the variance of the residual stream itself (about 1
  after each LayerNorm) and is what produced the published BLEU, so we follow the code.
* ``analytic``: no data; omega = sqrt((n+1)/ln(n+1) - 1) for every sublayer of a stack of n residual
  sublayers (2N encoder, 3M decoder), the O(log n) setting of the authors' admin-torch.
* a Clinic-format ``profile.ratio.init`` file (``<index> <value>`` lines, encoder then decoder).

The projections are initialised as the Clinic's fairseq built them (``--admin-linear-init``, ``legacy_init.py``):
Xavier-uniform fc1/fc2 with zero biases, zero q/k/v biases.
"""

import math
from contextlib import contextmanager
from typing import Dict, List

import torch
import torch.distributed as dist
import torch.nn as nn
from torch import Tensor

from deepnmt_plugin.models.legacy_init import add_linear_init_flag, apply_linear_init, chosen_linear_init
from deepnmt_plugin.models.method import DeepMethod, Residual, all_layers, register_method, scaled_residual_sum

OMEGA_UNSET = (
    "transformer_admin trains with --task translation_deep, which sets omega before the first update; "
    "this model's omega is still 1 (plain Post-LN)"
)


class AdminResidual(Residual):
    """``omega_i * x_{i-1} + f_i(x_{i-1})`` with a trainable ``omega`` of size ``embed_dim``; the layer then
    normalises it (Post-LN): ``x_i = LN(omega_i * x_{i-1} + f_i(x_{i-1}))``."""

    def __init__(self, embed_dim: int):
        super().__init__()
        self.omega = nn.Parameter(torch.ones(embed_dim))

    def forward(self, x: Tensor, f: Tensor, layer_input: Tensor) -> Tensor:
        return scaled_residual_sum(f, x, self.omega)


def global_variance(t: Tensor) -> float:
    """Population variance of every element of ``t``, pooled over all ranks (float64 sums)."""
    t = t.detach().double()
    moments = torch.stack([t.sum(), (t * t).sum(), torch.tensor(float(t.numel()), dtype=torch.float64, device=t.device)])
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(moments)
    total, total_sq, count = moments.tolist()
    return total_sq / count - (total / count) ** 2


class AdminProfiler:
    """The running ``ratio`` of one stack during the profiling pass (Transformer-Clinic's form)."""

    def __init__(self):
        self.ratio = 1.0
        self.records: List[Dict[str, float]] = []

    def set_omega(self, residual: AdminResidual, x: Tensor, f: Tensor) -> None:
        """Sublayer i's omega from the running ratio, before its residual sum is computed."""
        omega = self.ratio
        with torch.no_grad():
            residual.omega.fill_(omega)
        residual_variance = global_variance(omega * x)
        branch_variance = global_variance(f)
        self.ratio = math.sqrt(residual_variance + branch_variance)
        self.records.append(
            {"omega": omega, "residual_variance": residual_variance, "branch_variance": branch_variance}
        )

    def before_residual(self, residual: AdminResidual, inputs) -> None:
        """Forward pre-hook of an AdminResidual, whose inputs are (x_{i-1}, f_i(x_{i-1}), the layer's input)."""
        self.set_omega(residual, inputs[0], inputs[1])


def admin_residuals(stack: nn.Module) -> List[AdminResidual]:
    """The stack's AdminResiduals in forward order (Clinic indices 1, 2, ... of that stack)."""
    return [m for layer in all_layers(stack) for m in layer.modules() if isinstance(m, AdminResidual)]


@contextmanager
def admin_profiling(model: nn.Module):
    """Attach one profiler per stack; the next forward pass sets omega sublayer by sublayer, every
    sublayer once: LayerDrop is off while it lasts, and the profilers are gone after it."""
    profilers = {"encoder": AdminProfiler(), "decoder": AdminProfiler()}
    handles = [
        residual.register_forward_pre_hook(profiler.before_residual)
        for side, profiler in profilers.items()
        for residual in admin_residuals(getattr(model, side))
    ]
    layer_lists = [model.encoder.layers, model.decoder.layers]
    list_modes = [layers.training for layers in layer_lists]
    for layers in layer_lists:
        layers.training = False  # a LayerDropModuleList skips layers only in training mode; the layers stay in it
    try:
        yield profilers
    finally:
        for handle in handles:
            handle.remove()
        for layers, mode in zip(layer_lists, list_modes):
            layers.training = mode


def profile_admin(model: nn.Module, net_input: Dict[str, Tensor]) -> Dict[str, List[Dict[str, float]]]:
    """Set every omega by one training-mode forward pass (dropout on, fp32, no gradient).

    A half-precision model is profiled in fp32 and cast back: the same Parameter objects, so
    optimizers built later see the profiled omega.
    """
    was_training, dtype = model.training, next(model.parameters()).dtype
    model.train()
    model.float()
    try:
        with torch.no_grad(), admin_profiling(model) as profilers:
            encoder_out = model.encoder(net_input["src_tokens"], src_lengths=net_input["src_lengths"])
            model.decoder(net_input["prev_output_tokens"], encoder_out=encoder_out)
    finally:
        model.to(dtype)
        model.train(was_training)
    return {side: profiler.records for side, profiler in profilers.items()}


def admin_analytic_omega(num_residual_sublayers: int) -> float:
    """O(log n) output change without profiling (admin-torch): sqrt((n+1)/ln(n+1) - 1)."""
    n = num_residual_sublayers
    return math.sqrt((n + 1) / math.log(n + 1) - 1)


def set_analytic_omega(model: nn.Module) -> Dict[str, float]:
    values = {}
    for side in ("encoder", "decoder"):
        residuals = admin_residuals(getattr(model, side))
        if residuals:
            values[side] = admin_analytic_omega(len(residuals))
            with torch.no_grad():
                for residual in residuals:
                    residual.omega.fill_(values[side])
    return values


def set_omega_without_data(model: nn.Module) -> None:
    """For the bench tools that train a step outside the task: an Admin model gets its analytic omega and counts as
    initialised (the task's profiling, which needs data, is timed apart); any other model is left as it is."""
    if hasattr(model, "admin_initialized"):
        set_analytic_omega(model)
        model.admin_initialized.fill_(True)


class ProfileFileError(ValueError):
    pass


def read_clinic_profile(path: str, num_encoder_sublayers: int, num_decoder_sublayers: int) -> Dict[str, List[float]]:
    """Parse a Transformer-Clinic ``profile.ratio.init``: ``<index> <value>`` per line, indices
    1..2N for the encoder, then 1..3M for the decoder."""
    expected = [("encoder", i) for i in range(1, num_encoder_sublayers + 1)]
    expected += [("decoder", i) for i in range(1, num_decoder_sublayers + 1)]
    values: Dict[str, List[float]] = {"encoder": [], "decoder": []}
    try:
        with open(path, encoding="utf-8") as handle:
            lines = [(number, line) for number, line in enumerate(handle, 1) if line.strip()]
    except UnicodeDecodeError:  # a binary file (a checkpoint given by mistake)
        raise ProfileFileError(f"{path}: not a text file; expected '<index> <value>' lines") from None
    for (number, line), (side, index) in zip(lines, expected):
        fields = line.split()
        try:
            if len(fields) != 2:
                raise ValueError
            found_index, value = int(float(fields[0])), float(fields[1])
        except ValueError:
            raise ProfileFileError(f"{path}:{number}: expected '<index> <value>', got {line.strip()!r}") from None
        if found_index != index:
            raise ProfileFileError(f"{path}:{number}: expected {side} sublayer index {index}, got {found_index}")
        if not math.isfinite(value) or value <= 0:
            raise ProfileFileError(f"{path}:{number}: omega must be a positive number, got {fields[1]}")
        values[side].append(value)
    if len(lines) != len(expected):
        raise ProfileFileError(
            f"{path}: {len(lines)} lines, but this model has {num_encoder_sublayers} encoder and "
            f"{num_decoder_sublayers} decoder sublayers ({len(expected)} lines expected)"
        )
    return values


def set_omega_from_file(model: nn.Module, path: str) -> Dict[str, List[float]]:
    encoder, decoder = admin_residuals(model.encoder), admin_residuals(model.decoder)
    values = read_clinic_profile(path, len(encoder), len(decoder))
    with torch.no_grad():
        for residuals, side in ((encoder, "encoder"), (decoder, "decoder")):
            for residual, value in zip(residuals, values[side]):
                residual.omega.fill_(value)
    return values


@register_method
class Admin(DeepMethod):
    name = "admin"
    flag_names = ("admin_linear_init",)
    linear_init = "authors"

    @classmethod
    def add_args(cls, parser) -> None:
        add_linear_init_flag(parser, "transformer_admin")

    @classmethod
    def from_config(cls, cfg) -> "Admin":
        method = super().from_config(cfg)
        method.linear_init = chosen_linear_init(cfg, "admin")
        return method

    def residual(self, side: str, embed_dim: int) -> nn.Module:
        return AdminResidual(embed_dim)

    def initialize(self, model: nn.Module) -> None:
        apply_linear_init(model, self.linear_init)
        # Saved with the checkpoint: a resumed run never re-profiles, generation needs no side file.
        model.register_buffer("admin_initialized", torch.tensor(False))
