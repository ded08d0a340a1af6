"""inverse_sqrt_nowarmup: lr * sqrt(d / (d + t)), driven through fairseq's own scheduler factory."""

import pytest
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
