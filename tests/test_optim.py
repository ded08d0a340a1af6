"""Optimisation extras: inverse_sqrt_nowarmup (lr * sqrt(d / (d + t))) and radam, through fairseq's factories."""

import pytest
import torch
from fairseq import optim
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from fairseq.optim import lr_scheduler


def build_scheduler(build_model, *flags):
    model, args = build_model("transformer_tfixup_iwslt_de_en", "--encoder-layers", 1, "--decoder-layers", 1,
                              "--optimizer", "adam", "--lr", "5e-4", "--lr-scheduler", "inverse_sqrt_nowarmup", *flags)
    cfg = convert_namespace_to_omegaconf(args)
    optimizer = optim.build_optimizer(cfg.optimizer, list(model.parameters()))
    return lr_scheduler.build_lr_scheduler(cfg.lr_scheduler, optimizer), optimizer


def test_schedule_values(build_model):
    scheduler, optimizer = build_scheduler(build_model)
    assert optimizer.get_lr() == pytest.approx(5e-4)  # no warmup: full lr before the first update
    assert scheduler.step_update(0) == pytest.approx(5e-4)
    assert scheduler.step_update(4000) == pytest.approx(5e-4 / 2 ** 0.5)  # default decay period 4000
    assert scheduler.step_update(12000) == pytest.approx(5e-4 / 2)
    assert optimizer.get_lr() == pytest.approx(5e-4 / 2)
    scheduler.step(epoch=3)
    assert optimizer.get_lr() == pytest.approx(5e-4 / 2)  # epoch ends do not change it


def test_decay_period_flag(build_model):
    scheduler, _ = build_scheduler(build_model, "--decay-period", "100")
    assert scheduler.step_update(300) == pytest.approx(5e-4 * 0.5)


def test_radam_is_registered_with_fairseq_adam_flags(build_model):
    model, args = build_model("transformer_admin_iwslt_de_en", "--encoder-layers", 1, "--decoder-layers", 1,
                              "--optimizer", "radam", "--adam-betas", "(0.9, 0.98)", "--adam-eps", "1e-9",
                              "--weight-decay", "1e-4", "--lr", "7e-4")
    cfg = convert_namespace_to_omegaconf(args)
    optimizer = optim.build_optimizer(cfg.optimizer, list(model.parameters()))
    group = optimizer.optimizer.param_groups[0]
    assert type(optimizer.optimizer).__name__ == "RAdam"
    assert (group["lr"], group["betas"], group["eps"], group["weight_decay"]) == (7e-4, (0.9, 0.98), 1e-9, 1e-4)
    assert group["decoupled_weight_decay"]


def test_radam_steps_fairseq_fp16_flat_copy_as_it_steps_each_parameter(build_model, monkeypatch):
    """--fp16 flattens the fp32 master parameters into one tensor; RAdam's update on it is the per-parameter one."""
    monkeypatch.setattr(torch.cuda, "current_device", lambda: None)  # the key fairseq gives a CPU flat copy
    model, args = build_model("transformer_admin_iwslt_de_en", "--encoder-layers", 1, "--decoder-layers", 1,
                              "--optimizer", "radam", "--adam-betas", "(0.9, 0.98)", "--weight-decay", "1e-4",
                              "--lr", "7e-4", "--fp16", "--fp16-init-scale", "1")
    cfg = convert_namespace_to_omegaconf(args)
    half = [p.detach().half().requires_grad_() for p in model.parameters()]
    full = [p.detach().float().clone().requires_grad_() for p in half]
    initial = [p.detach().clone() for p in half]
    flat = optim.FP16Optimizer.build_optimizer(cfg, half)  # raised "does not support flat params" before
    each = optim.build_optimizer(cfg.optimizer, full)
    generator = torch.Generator().manual_seed(0)
    for _ in range(3):
        grads = [torch.randn(p.shape, generator=generator).half().float() for p in half]  # exact in fp16 too
        flat.zero_grad()
        each.zero_grad()
        flat.backward(sum((h.float() * g).sum() for h, g in zip(half, grads)))  # the trainer's path
        sum((f * g).sum() for f, g in zip(full, grads)).backward()
        flat.step()
        each.step()
    (master,) = flat.fp32_params.values()
    assert master.dim() == 1  # one flat fp32 copy (the --fp16 default), the weights the fp16 model is rounded from
    torch.testing.assert_close(master.detach(), torch.cat([f.detach().view(-1) for f in full]), rtol=0, atol=0)
    assert not torch.equal(master.detach(), torch.cat([h.detach().float().view(-1) for h in initial]))  # it moved
