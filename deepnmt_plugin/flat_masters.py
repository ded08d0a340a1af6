"""bf16 training with one flat fp32 master, as fairseq's fp16 training has.

fairseq 0.12's ``FP16Optimizer.build_optimizer`` keeps one flat fp32 copy of all parameters (and one flat gradient)
for ``--fp16``, but turns flattening off for ``--bf16`` ("mixed precision is faster on TPUs without flat grads"): on a
GPU the optimizer then steps every parameter tensor apart, 2.5 times the operators of an fp16 update. Under the
plugin ``--bf16`` keeps one flat master too; fairseq's ``--fp16-no-flatten-grads`` restores the per-tensor path for
either precision.

The flat master lives on the parameters' device (fairseq puts its fp16 one on the current CUDA device, so a CPU run
could not build one). A checkpoint's optimizer state is restated in the layout of the optimizer that loads it, so a
run resumes across the two paths.

fairseq copies each parameter's gradient into the flat master, and each master slice back into its parameter, one
tensor at a time: two operators per parameter tensor and update, about 500 kernel launches for a 6L-6L model and more
for a recipe with many small tensors (LayerNorm weights, scalars). ``flat_grads_synced`` and ``flat_params_synced``
copy each way in one ``torch._foreach_copy_`` (on CUDA a multi-tensor kernel, launched once per chunk of tensors;
bf16/fp16 to fp32 and back).

fairseq saves a half-precision run's model in half precision and, on resume, rebuilds the fp32 master from it: the
master's low bits are lost and the resumed run drifts from the uninterrupted one (by a bf16 rounding of the weights
within 4 updates on a tiny model). The master is saved with the optimizer state and restored from it, so a resumed
fp16 or bf16 run repeats the uninterrupted one.
"""

import functools
import logging
from typing import Dict, List, Optional

import torch
from fairseq import optim

logger = logging.getLogger(__name__)


def flat_fp32_master(params: List[torch.Tensor]) -> Dict[Optional[int], torch.nn.Parameter]:
    """One fp32 tensor holding every parameter's elements in order, with a gradient of the same size, keyed by the
    parameters' device index (None on the CPU) as fairseq's ``_FP16OptimizerMixin`` reads it."""
    master = torch.cat([p.detach().reshape(-1).float() for p in params])
    master = torch.nn.Parameter(master)
    master.grad = torch.zeros_like(master)
    return {params[0].device.index: master}


def flat_bf16_masters(build_optimizer):
    """Wrap ``FP16Optimizer.build_optimizer`` (the function of the classmethod): a flat master for ``--bf16``."""

    @functools.wraps(build_optimizer)
    def build(cls, cfg, params, **kwargs):
        common = cfg.common
        per_tensor = (
            not getattr(common, "bf16", False)
            or getattr(common, "fp16_no_flatten_grads", False)
            or getattr(cfg.distributed_training, "pipeline_model_parallel", False)  # masters on several devices
        )
        if per_tensor:
            return build_optimizer(cls, cfg, params, **kwargs)
        master = flat_fp32_master(params)
        fp32_optimizer = optim.build_optimizer(cfg.optimizer, list(master.values()))
        if not fp32_optimizer.supports_flat_params:
            logger.info(f"--bf16: {type(fp32_optimizer).__name__} steps one tensor at a time (it has no flat form)")
            return build_optimizer(cls, cfg, params, **kwargs)
        return cls(cfg, params, fp32_optimizer, master, **kwargs)

    return build


def _on(device: Optional[int], params: List[torch.Tensor]) -> List[torch.Tensor]:
    return [p for p in params if p.device.index == device]


def _shaped_slices(flat: torch.Tensor, params: List[torch.Tensor]) -> List[torch.Tensor]:
    """``flat``'s consecutive slices, shaped as ``params`` (fairseq's order of the flat master)."""
    return [piece.view_as(p) for piece, p in zip(flat.split([p.numel() for p in params]), params)]


def flat_grads_synced(sync):
    """Wrap ``_FP16OptimizerMixin._sync_fp16_grads_to_fp32``: the flat master's gradient filled in one copy."""

    @functools.wraps(sync)
    def synced(self):
        if not (self.has_flat_params and self._needs_sync):
            return sync(self)
        trainable = [p for p in self.fp16_params if p.requires_grad]
        for device, master in self.fp32_params.items():
            params = _on(device, trainable)
            grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
            torch._foreach_copy_(_shaped_slices(master.grad, params), grads)
        self._needs_sync = False

    return synced


def flat_params_synced(sync):
    """Wrap ``_FP16OptimizerMixin._sync_fp32_params_to_fp16``: the parameters refreshed from the master in one copy."""

    @functools.wraps(sync)
    def synced(self):
        if not self.has_flat_params:
            return sync(self)
        for device, master in self.fp32_params.items():
            params = _on(device, self.fp16_params)
            with torch.no_grad():
                torch._foreach_copy_(params, _shaped_slices(master, params))

    return synced


def optimizer_state_in_layout(state_dict: dict, params: List[torch.Tensor], flat: bool) -> dict:
    """A saved optimizer state restated for ``params`` stepped as one flat tensor (``flat``) or one by one.

    A flat state holds, for each per-element entry (Adam's moments), one tensor of every parameter's elements in
    order; a per-tensor state holds one entry per parameter. Entries that are not per-element (a step count) are the
    same for every parameter: the per-tensor path gives every parameter a gradient, zero where it has none. States of
    several parameter groups, or of another number of parameters, are returned as they are (torch's loader names
    the mismatch)."""
    groups = state_dict["param_groups"]
    if len(groups) != 1:
        return state_dict
    saved_ids = groups[0]["params"]
    saved_flat = len(saved_ids) == 1 and len(params) > 1
    saved_per_tensor = len(saved_ids) == len(params) and len(params) > 1
    states = [state_dict["state"].get(i) for i in saved_ids]
    if flat and saved_per_tensor:
        restated = _flattened(states, params) if all(states) else {}
        ids = [0]
    elif not flat and saved_flat:
        restated = _split(states[0], params) if states[0] else {}
        ids = list(range(len(params)))
    else:
        return state_dict
    return {**state_dict, "state": restated, "param_groups": [{**groups[0], "params": ids}]}


def _flattened(states: List[dict], params: List[torch.Tensor]) -> dict:
    entry = {}
    for key, first in states[0].items():
        values = [state[key] for state in states]
        per_element = all(torch.is_tensor(v) and v.shape == p.shape for v, p in zip(values, params))
        entry[key] = torch.cat([v.reshape(-1) for v in values]) if per_element else first
    return {0: entry}


def _split(state: dict, params: List[torch.Tensor]) -> dict:
    total = sum(p.numel() for p in params)
    restated = {}
    offset = 0
    for index, p in enumerate(params):
        entry = {}
        for key, value in state.items():
            if torch.is_tensor(value) and value.dim() == 1 and value.numel() == total:
                entry[key] = value[offset:offset + p.numel()].view(p.shape).clone()
            else:
                entry[key] = value.clone() if torch.is_tensor(value) else value
        restated[index] = entry
        offset += p.numel()
    return restated


def _masters(optimizer) -> List[torch.Tensor]:
    """An ``_FP16OptimizerMixin``'s fp32 masters: one flat tensor (per device), or one per parameter."""
    masters = optimizer.fp32_params
    return list(masters.values()) if isinstance(masters, dict) else list(masters)


def master_saved(state_dict):
    """Wrap ``_FP16OptimizerMixin.state_dict``: the fp32 master, as one flat tensor, beside the optimizer state."""

    @functools.wraps(state_dict)
    def saved(self):
        state = state_dict(self)
        masters = [m.detach().reshape(-1) for m in _masters(self)]
        state["fp32_master"] = masters[0] if len(masters) == 1 else torch.cat(masters)
        return state

    return saved


def master_and_state_restored(load_state_dict):
    """Wrap ``_FP16OptimizerMixin.load_state_dict``: the saved state restated for this optimizer's layout, and the
    fp32 master restored where the checkpoint holds one (checkpoints of fairseq without the plugin hold none)."""

    @functools.wraps(load_state_dict)
    def load(self, state_dict, optimizer_overrides=None):
        master = state_dict.get("fp32_master")
        state_dict = {key: value for key, value in state_dict.items() if key != "fp32_master"}
        restated = optimizer_state_in_layout(state_dict, self.fp16_params, flat=self.has_flat_params)
        load_state_dict(self, restated, optimizer_overrides)
        masters = _masters(self)
        if master is not None and master.numel() == sum(m.numel() for m in masters):
            with torch.no_grad():
                offset = 0
                for m in masters:
                    m.copy_(master[offset:offset + m.numel()].view_as(m))
                    offset += m.numel()

    return load
