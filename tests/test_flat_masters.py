"""bf16 training keeps one flat fp32 master, as fp16 training does (``deepnmt_plugin/flat_masters.py``): the same
updates as fairseq's per-tensor path to bf16 rounding, a checkpoint resumes across the two, and an update's optimizer
launches no more operators than an fp16 one."""

import torch
from fairseq import options, tasks, utils
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from fairseq.optim import fp16_optimizer
from fairseq.trainer import Trainer

from conftest import USER_DIR
from deepnmt_plugin.bench.throughput import OperatorCounter
from deepnmt_plugin.compat import bf16_off_tpu
from deepnmt_plugin.flat_masters import flat_fp32_master, optimizer_state_in_layout

SMALL = [
    "--encoder-layers", "1", "--decoder-layers", "1", "--encoder-embed-dim", "32", "--decoder-embed-dim", "32",
    "--encoder-ffn-embed-dim", "64", "--decoder-ffn-embed-dim", "64",
    "--encoder-attention-heads", "2", "--decoder-attention-heads", "2", "--share-all-embeddings",
    "--optimizer", "adam", "--adam-betas", "(0.9, 0.98)", "--lr", "2e-3", "--lr-scheduler", "inverse_sqrt",
    "--warmup-updates", "20", "--clip-norm", "0.5", "--criterion", "label_smoothed_cross_entropy",
    "--label-smoothing", "0.1", "--max-tokens", "400", "--seed", "1", "--cpu", "--bf16",
]


def bf16_trainer(data, *flags) -> Trainer:
    parser = options.get_training_parser()
    args = options.parse_args_and_arch(
        parser, [str(data), "--user-dir", USER_DIR, "--arch", "transformer_preln_iwslt_de_en", *SMALL, *flags])
    cfg = convert_namespace_to_omegaconf(args)
    bf16_off_tpu(cfg)  # as fairseq-train's start does
    task = tasks.setup_task(cfg.task)
    utils.set_torch_seed(cfg.common.seed)  # as fairseq-train does before it builds the model
    model = task.build_model(cfg.model)
    return Trainer(cfg, task, model, task.build_criterion(cfg.criterion))


def batches(trainer, count):
    task = trainer.task
    task.load_dataset("train")
    iterator = task.get_batch_iterator(
        dataset=task.dataset("train"), max_tokens=400, required_batch_size_multiple=8, seed=1,
        max_positions=utils.resolve_max_positions(task.max_positions(), trainer.model.max_positions()))
    epoch = list(iterator.next_epoch_itr(shuffle=True))
    return [epoch[i % len(epoch)] for i in range(count)]


def losses(trainer, samples):
    return [trainer.train_step([sample])["loss"] for sample in samples]


def weights(trainer) -> torch.Tensor:
    return torch.cat([p.float().reshape(-1) for p in trainer.model.parameters()])


def test_bf16_steps_one_flat_master_and_follows_the_per_tensor_path_over_300_updates(toy_data):
    flat, per_tensor = bf16_trainer(toy_data), bf16_trainer(toy_data, "--fp16-no-flatten-grads")
    assert all(p.dtype == torch.bfloat16 for p in flat.model.parameters())
    assert flat.optimizer.has_flat_params and not per_tensor.optimizer.has_flat_params
    (master,) = flat.optimizer.fp32_params.values()
    assert master.dtype == torch.float32 and master.numel() == sum(p.numel() for p in flat.model.parameters())
    samples = batches(flat, 300)
    flat_losses, per_tensor_losses = losses(flat, samples), losses(per_tensor, samples)
    assert flat_losses[-1] < 0.5 * flat_losses[0]  # it trains
    # --clip-norm sums the gradient norm in another order: float rounding, which bf16 weights round on
    assert max(abs(a - b) / b for a, b in zip(flat_losses, per_tensor_losses)) < 0.01
    assert (weights(flat) - weights(per_tensor)).norm() / weights(per_tensor).norm() < 0.01


def test_without_clipping_the_flat_and_per_tensor_paths_are_bit_identical(toy_data):
    flat = bf16_trainer(toy_data, "--clip-norm", "0")
    per_tensor = bf16_trainer(toy_data, "--clip-norm", "0", "--fp16-no-flatten-grads")
    samples = batches(flat, 50)
    assert losses(flat, samples) == losses(per_tensor, samples)
    assert torch.equal(weights(flat), weights(per_tensor))


def test_an_optimizer_state_moves_between_the_layouts_and_back():
    params = [torch.randn(3, 4), torch.randn(5), torch.randn(())]  # a 0-dim parameter, as DyT's alpha
    per_tensor = {
        "state": {i: {"step": 7, "exp_avg": torch.randn(p.shape), "exp_avg_sq": torch.rand(p.shape)}
                  for i, p in enumerate(params)},
        "param_groups": [{"lr": 0.1, "betas": (0.9, 0.98), "params": [0, 1, 2]}],
    }
    flat = optimizer_state_in_layout(per_tensor, params, flat=True)
    assert flat["param_groups"] == [{"lr": 0.1, "betas": (0.9, 0.98), "params": [0]}]
    assert flat["state"][0]["step"] == 7 and flat["state"][0]["exp_avg"].shape == (18,)
    back = optimizer_state_in_layout(flat, params, flat=False)
    assert back["param_groups"] == per_tensor["param_groups"]
    for i in range(3):
        assert back["state"][i]["step"] == 7
        for key in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(back["state"][i][key], per_tensor["state"][i][key])
    assert optimizer_state_in_layout(flat, params, flat=True) is flat  # already in the layout: untouched
    fresh = {"state": {}, "param_groups": [{"lr": 0.1, "params": [0, 1, 2]}]}  # saved before a first update
    assert optimizer_state_in_layout(fresh, params, flat=True)["state"] == {}


def optimizer_operators(precision: str, flat: bool) -> int:
    """ATen operators (views left out) of what an update runs after the backward pass: the optimizer's
    gradient norm, step and zeroing, over a model of 40 parameter tensors."""
    from omegaconf import OmegaConf

    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[precision]
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(8, 8, dtype=dtype)) for _ in range(40)]
    cfg = OmegaConf.create({
        "common": {"fp16": precision == "fp16", "bf16": precision == "bf16", "fp16_no_flatten_grads": not flat,
                   "fp16_init_scale": 128, "fp16_scale_window": None, "fp16_scale_tolerance": 0.0,
                   "threshold_loss_scale": None, "min_loss_scale": 1e-4},
        "optimization": {"update_freq": [1]}, "distributed_training": {"distributed_world_size": 1},
        "optimizer": {"_name": "adam", "lr": [1e-3], "adam_betas": "(0.9, 0.98)", "adam_eps": 1e-8,
                      "weight_decay": 0.0, "use_old_adam": False, "fp16_adam_stats": False, "tpu": False},
    })
    cfg.common.model_parallel_size = 1
    if precision == "fp16":  # fairseq builds fp16's flat master on the current CUDA device; the same one here
        master = flat_fp32_master(params)
        from fairseq import optim
        optimizer = fp16_optimizer.FP16Optimizer(cfg, params, optim.build_optimizer(cfg.optimizer, list(master.values())), master)
    else:
        optimizer = fp16_optimizer.FP16Optimizer.build_optimizer(cfg, params)
    optimizer.backward(sum((p.float() ** 2).sum() for p in params))
    with OperatorCounter() as counter:
        optimizer.clip_grad_norm(0.0)
        optimizer.step()
        optimizer.zero_grad()
    return counter.count


def test_a_bf16_update_launches_no_more_optimizer_operators_than_an_fp16_one():
    fp16, bf16 = optimizer_operators("fp16", flat=True), optimizer_operators("bf16", flat=True)
    bf16_per_tensor = optimizer_operators("bf16", flat=False)
    print(f"optimizer operators of an update, 40 tensors: fp16 {fp16}, bf16 {bf16}, bf16 per tensor {bf16_per_tensor}")
    assert bf16 <= 1.1 * fp16, (bf16, fp16)
    assert bf16_per_tensor > 2 * bf16, (bf16_per_tensor, bf16)  # fairseq's bf16 path, stepping 40 tensors apart


PRELN = "transformer_preln_iwslt_de_en"


def trained_weights(save_dir) -> dict:
    return torch.load(save_dir / "checkpoint_last.pt", weights_only=False)["model"]


def optimizer_tensors(save_dir) -> int:
    return len(torch.load(save_dir / "checkpoint_last.pt", weights_only=False)["last_optimizer_state"]["state"])


def test_a_bf16_checkpoint_resumes_across_the_flat_and_per_tensor_paths(toy_data, tmp_path):
    """fairseq-train --bf16 to 8 updates on one path, resumed to 12 on the other: the same weights as 12 updates on
    one path (bit for bit, as without --clip-norm the two paths are), so the Adam moments were carried over."""
    from tiny_training import train

    per_tensor = ["--fp16-no-flatten-grads"]
    train(toy_data, tmp_path / "straight", PRELN, 12, "--bf16")
    straight = trained_weights(tmp_path / "straight")
    assert optimizer_tensors(tmp_path / "straight") == 1
    for first, then in ((per_tensor, []), ([], per_tensor)):
        save_dir = tmp_path / ("to_flat" if not then else "to_per_tensor")
        train(toy_data, save_dir, PRELN, 8, "--bf16", *first)
        train(toy_data, save_dir, PRELN, 12, "--bf16", *then)
        assert (optimizer_tensors(save_dir) == 1) == (not then)  # saved in the layout it ended in
        resumed = trained_weights(save_dir)
        assert all(torch.equal(resumed[name], straight[name]) for name in straight), save_dir.name
