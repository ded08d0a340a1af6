"""Diagnostics: every statistic against an independent recomputation, and through fairseq-train."""

import json
import logging
import math
import re
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn as nn
from fairseq import checkpoint_utils, options, tasks
from fairseq.logging import metrics

from conftest import TINY_DIMS, USER_DIR, fairseq_cli
from deepnmt_plugin.bench.layers import layer_values
from deepnmt_plugin.diagnostics import REFERENCE_FILE, Diagnostics, Probe, gradient_norms
from deepnmt_plugin.tasks.translation_deep import TaskFlagError

NO_DROPOUT = ["--dropout", 0, "--attention-dropout", 0, "--activation-dropout", 0]


def tiny_model(build_model, arch, *flags):
    torch.manual_seed(0)
    model, _ = build_model(arch, "--encoder-layers", 2, "--decoder-layers", 2, *TINY_DIMS, *NO_DROPOUT, *flags)
    return model


def padded_batch(model):
    """Source left-padded and target right-padded, as fairseq collates, so padding must be skipped."""
    generator = torch.Generator().manual_seed(3)
    pad, vocab = model.encoder.padding_idx, len(model.encoder.dictionary)
    src = torch.randint(4, vocab, (3, 7), generator=generator)
    src[0, :2] = pad
    prev = torch.randint(4, vocab, (3, 5), generator=generator)
    prev[2, 3:] = pad
    return {"src_tokens": src, "src_lengths": src.ne(pad).sum(1), "prev_output_tokens": prev}


class Recorder(nn.Module):
    """Stands in for a module and keeps its first input or its (first) output: no hooks involved."""

    def __init__(self, module, store, key, keep):
        super().__init__()
        self.module, self.store, self.key, self.keep = module, store, key, keep

    def forward(self, *args, **kwargs):
        output = self.module(*args, **kwargs)
        kept = args[0] if self.keep == "input" else (output[0] if isinstance(output, tuple) else output)
        self.store[self.key] = kept.detach().numpy().astype(np.float64)
        return output

    def __getattr__(self, name):  # fairseq's decoder layer also reads attributes of its attention
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self.module, name)


def recorded_activations(model, net_input):
    """LayerNorm inputs and branch outputs of every sublayer, recorded by substituted modules."""
    store, names = {}, {"attn": ("self_attn", "self_attn_layer_norm"), "cross": ("encoder_attn", "encoder_attn_layer_norm"),
                        "ffn": ("fc2", "final_layer_norm")}
    for side, short in (("encoder", "enc"), ("decoder", "dec")):
        for index, layer in enumerate(getattr(model, side).layers):
            for sublayer, (branch, norm) in names.items():
                name = f"{short}.{index}.{sublayer}"
                if getattr(layer, branch, None) is not None:
                    setattr(layer, branch, Recorder(getattr(layer, branch), store, ("f", name), "output"))
                if getattr(layer, norm, None) is not None:
                    setattr(layer, norm, Recorder(getattr(layer, norm), store, ("b", name), "input"))
    model.eval()
    with torch.no_grad():
        model(**net_input)
    return store


def token_rows(activation, tokens, pad):
    """Non-padding rows of a T x B x C activation; ``tokens`` is the B x T batch it came from."""
    return activation[tokens.ne(pad).t().numpy()]


@pytest.mark.parametrize("arch, expected_keys", [
    ("transformer_admin_iwslt_de_en", {"ln_input": 10, "beta": 10, "omega": 10, "omega_std": 10}),
    ("transformer", {"ln_input": 10, "beta": 10}),  # stock Post-LN: same submodule names
    ("transformer_deepnorm", {"ln_input": 10, "beta": 10}),
    ("transformer_preln", {"ln_input": 10}),  # the LayerNorm input is not the residual sum: no beta
    ("transformer_tfixup", {}),  # no LayerNorm, no omega
])
def test_probe_equals_recomputation_from_recorded_activations(build_model, arch, expected_keys):
    model = tiny_model(build_model, arch)
    omegas = [m.omega for m in model.modules() if hasattr(m, "omega")]
    with torch.no_grad():  # distinct, non-constant omega per sublayer, as after some training
        for i, omega in enumerate(omegas):
            omega.copy_(1 + 0.1 * i + 0.01 * torch.arange(omega.numel()) / omega.numel())
    net_input = padded_batch(model)
    features, values = Probe(model, net_input, ["ln_input", "beta", "omega"]).run()

    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())  # probes removed
    groups = {}
    for key in values:
        groups[key.split("/")[0]] = groups.get(key.split("/")[0], 0) + 1
    assert groups == expected_keys

    pad = model.encoder.padding_idx
    store = recorded_activations(model, net_input)
    for key, value in values.items():
        group, name = key.split("/")
        tokens = net_input["src_tokens" if name.startswith("enc") else "prev_output_tokens"]
        if group == "ln_input":
            rows = token_rows(store[("b", name)], tokens, pad)
            assert value == pytest.approx(np.linalg.norm(rows, axis=1).mean(), rel=1e-9)
        elif group == "beta":
            f, b = (token_rows(store[(kind, name)], tokens, pad) for kind in ("f", "b"))
            assert value == pytest.approx(math.sqrt(f.var() / b.var()), rel=1e-9)
    names = [k.split("/")[1] for k in values if k.startswith("omega/")]  # forward order, as ``omegas``
    for name, omega in zip(names, omegas):
        expected = omega.detach().double().numpy()
        assert values[f"omega/{name}"] == pytest.approx(expected.mean(), rel=1e-12)
        assert values[f"omega_std/{name}"] == pytest.approx(expected.std(), rel=1e-9)
    if arch.startswith("transformer_admin"):
        assert names == ["enc.0.attn", "enc.0.ffn", "enc.1.attn", "enc.1.ffn", "dec.0.attn", "dec.0.cross",
                         "dec.0.ffn", "dec.1.attn", "dec.1.cross", "dec.1.ffn"]
        assert values["omega/dec.1.ffn"] == pytest.approx(1.9 + 0.01 * 31.5 / 64, rel=1e-7)  # omega is float32


def logged(callback):
    """What ``callback`` logs through fairseq's metrics, in an aggregator of its own."""
    with metrics.aggregate(new_root=True) as aggregator:
        callback()
    return aggregator.get_smoothed_values()


def test_update_norm_is_mean_token_distance_to_theta_0(build_model, tmp_path):
    model = tiny_model(build_model, "transformer_deepnorm")
    net_input = padded_batch(model)
    diagnostics = Diagnostics(2, ["update"], lambda: net_input, str(tmp_path / REFERENCE_FILE))
    optimizer = SimpleNamespace()

    def features():
        model.eval()
        with torch.no_grad():
            return model(**net_input, features_only=True)[0].double().numpy()

    theta_0 = features()
    assert logged(lambda: diagnostics.before_step(model, optimizer, 0)) == {}  # captures theta_0's output
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.01 * torch.randn_like(p))
    model.train()
    assert logged(lambda: diagnostics.after_step(model, 0)) == {}  # update 1: not a multiple of 2
    values = logged(lambda: diagnostics.after_step(model, 1))  # update 2
    assert model.training  # the probe's eval mode is undone

    distances = np.linalg.norm(features() - theta_0, axis=-1)  # B x T
    target = net_input["prev_output_tokens"].ne(model.encoder.padding_idx).numpy()
    assert values == {"update_norm": pytest.approx(distances[target].mean(), rel=1e-9)}
    assert values["update_norm"] > 0 and target.sum() == 13  # two padding positions skipped

    resumed = Diagnostics(2, ["update"], lambda: pytest.fail("a resumed run reuses the saved batch"),
                          str(tmp_path / REFERENCE_FILE))
    assert logged(lambda: resumed.before_step(model, optimizer, 7)) == {}
    assert torch.equal(resumed.reference.double(), torch.from_numpy(theta_0))


def test_resume_without_reference_measures_from_the_resumed_update(build_model, tmp_path, caplog):
    model = tiny_model(build_model, "transformer_admin_iwslt_de_en")
    net_input = padded_batch(model)
    diagnostics = Diagnostics(1, ["update"], lambda: net_input, str(tmp_path / REFERENCE_FILE))
    with caplog.at_level(logging.INFO):
        diagnostics.before_step(model, SimpleNamespace(), 5)
    assert "no diagnostics_reference.pt from update 0 in the save dir; update_norm is measured from update 5" in caplog.text
    assert logged(lambda: diagnostics.after_step(model, 5)) == {"update_norm": 0.0}  # unchanged since update 5
    assert torch.load(tmp_path / REFERENCE_FILE)["update"] == 5


def test_gradient_norms_per_layer(build_model):
    model = tiny_model(build_model, "transformer_deepnorm", "--share-all-embeddings")
    model.train()
    logits, _ = model(**padded_batch(model))
    torch.log_softmax(logits, dim=-1)[..., 5].sum().backward()

    squares = {}
    for name, p in model.named_parameters():
        match = re.match(r"(encoder|decoder)\.layers\.(\d+)\.", name)
        group = f"{match.group(1)[:3]}.{match.group(2)}" if match else "other"
        squares[group] = squares.get(group, 0.0) + float((p.grad.double() ** 2).sum())
    expected = {group: math.sqrt(total) for group, total in squares.items()}
    assert set(expected) == {"enc.0", "enc.1", "dec.0", "dec.1", "other"}

    assert gradient_norms(model) == pytest.approx(expected, rel=1e-12)
    total = torch.nn.utils.clip_grad_norm_(model.parameters(), float("inf")).item()
    assert math.sqrt(sum(v * v for v in gradient_norms(model).values())) == pytest.approx(total, rel=1e-6)

    # fp16 optimizers keep 1/loss-scale, 1/sample-size and clipping in _multiply_factor until step()
    diagnostics = Diagnostics(3, ["gnorm"], lambda: padded_batch(model), None)
    fp16_optimizer = SimpleNamespace(_multiply_factor=torch.tensor(0.25))
    assert logged(lambda: diagnostics.before_step(model, fp16_optimizer, 1)) == {}  # update 2: not due
    values = logged(lambda: diagnostics.before_step(model, fp16_optimizer, 2))
    assert values == pytest.approx({f"gnorm/{k}": 0.25 * v for k, v in expected.items()}, rel=1e-6)


def setup_task(toy_data, *flags):
    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, [str(toy_data), "--user-dir", USER_DIR, "--task", "translation_deep",
                                                "--arch", "transformer", "--cpu", *map(str, flags)])
    return tasks.setup_task(args)


def test_off_by_default_and_flag_errors(toy_data):
    assert setup_task(toy_data).diagnostics is None
    assert setup_task(toy_data, "--diagnostics-interval", 5).diagnostics.groups == ["update", "gnorm", "ln_input", "beta", "omega"]
    with pytest.raises(TaskFlagError, match=r"--diagnostics-groups: unknown \['gnrom'\]; choose from update,gnorm"):
        setup_task(toy_data, "--diagnostics-interval", 5, "--diagnostics-groups", "update,gnrom")
    with pytest.raises(TaskFlagError, match="--diagnostics-interval must be 0 \\(off\\) or positive, got -1"):
        setup_task(toy_data, "--diagnostics-interval", -1)


TRAIN = ["--user-dir", USER_DIR, "--task", "translation_deep", "--arch", "transformer_admin_iwslt_de_en",
         "--encoder-layers", 2, "--decoder-layers", 2, "--cpu", *TINY_DIMS, "--share-all-embeddings",
         "--optimizer", "adam", "--lr", "2e-3", "--max-tokens", 400, "--update-freq", 2, "--seed", 1,
         "--log-format", "json", "--log-interval", 1, "--diagnostics-interval", 1, "--no-epoch-checkpoints",
         "--disable-validation"]


def train(toy_data, save_dir, max_update, *extra):
    result = fairseq_cli("fairseq-train", toy_data, *TRAIN, "--max-update", max_update, "--save-dir", save_dir, *extra)
    return result.stdout + result.stderr


def train_inner_lines(log):
    return [json.loads(line.split("| train_inner | ", 1)[1]) for line in log.splitlines() if "| train_inner | " in line]


@pytest.mark.slow
def test_fairseq_train_logs_diagnostics_once_per_update(toy_data, tmp_path):
    save_dir = tmp_path / "checkpoints"
    log = train(toy_data, save_dir, 3, "--tensorboard-logdir", tmp_path / "tensorboard")
    lines = train_inner_lines(log)
    assert [int(line["num_updates"]) for line in lines] == [1, 2, 3]
    for line in lines:
        # fairseq's gnorm is of the whole update (both --update-freq micro-batches, all ranks)
        layers = [float(v) for k, v in line.items() if k.startswith("gnorm/")]
        assert len(layers) == 5 and math.sqrt(sum(v * v for v in layers)) == pytest.approx(float(line["gnorm"]), abs=1e-3)
        assert len([k for k in line if k.startswith(("ln_input/", "beta/", "omega/", "omega_std/"))]) == 40
    # the per-layer plot reads the same values from the JSON log
    assert layer_values(log, "gnorm")[3] == {stack: [float(lines[-1][f"gnorm/{stack}.{i}"]) for i in range(2)] for stack in ("enc", "dec")}
    assert layer_values(log, "beta", "cross")[3] == {"dec": [float(lines[-1][f"beta/dec.{i}.cross"]) for i in range(2)]}

    events = b"".join(path.read_bytes() for path in (tmp_path / "tensorboard" / "train_inner").iterdir())
    assert all(tag in events for tag in (b"update_norm", b"gnorm/enc.1", b"ln_input/dec.1.cross", b"beta/enc.0.ffn", b"omega_std/dec.0.attn"))

    # update_norm at update 3, recomputed from checkpoint_last.pt (theta_3) and the saved theta_0 output
    reference = torch.load(save_dir / REFERENCE_FILE)
    assert reference["update"] == 0 and len(reference["net_input"]["src_lengths"]) == 16
    [model], _ = checkpoint_utils.load_model_ensemble([str(save_dir / "checkpoint_last.pt")])
    with torch.no_grad():
        theta_3 = model.eval()(**reference["net_input"], features_only=True)[0]
    distances = (theta_3.double() - reference["features"].double()).norm(dim=-1)
    expected = distances[reference["net_input"]["prev_output_tokens"].ne(model.encoder.padding_idx)].mean().item()
    assert float(lines[-1]["update_norm"]) == pytest.approx(expected, rel=1e-5)

    resumed = train(toy_data, save_dir, 4)
    assert "update_norm measured from update 0" in resumed
    assert [int(line["num_updates"]) for line in train_inner_lines(resumed)] == [4]


def test_measures_the_model_inside_fairseq_ddp_wrappers(build_model, tmp_path):
    from fairseq.distributed import ModuleProxyWrapper

    model = tiny_model(build_model, "transformer_deepnorm")
    net_input = padded_batch(model)
    torch.distributed.init_process_group("gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=1)
    try:  # as fairseq wraps it for --distributed-world-size > 1 with --ddp-backend pytorch_ddp
        wrapped = ModuleProxyWrapper(torch.nn.parallel.DistributedDataParallel(model))
        diagnostics = Diagnostics(1, ["update", "ln_input"], lambda: net_input, None)
        diagnostics.before_step(wrapped, SimpleNamespace(), 0)
        values = logged(lambda: diagnostics.after_step(wrapped, 0))
    finally:
        torch.distributed.destroy_process_group()
    assert values == pytest.approx({"update_norm": 0.0, **Probe(model, net_input, ["ln_input"]).run()[1]}, rel=1e-12)
    assert len(values) == 11
