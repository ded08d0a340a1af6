"""Training throughput of every arch relative to stock fairseq ``transformer``:
``python -m deepnmt_plugin.bench.throughput --data DIR``.

One process builds a fairseq ``Trainer`` per arch with identical dims, depth, optimizer and
criterion, and feeds every one the same training batches, interleaved: each round runs ``--updates``
updates of every arch in turn, rotating the order, so machine noise (other jobs, frequency scaling)
falls on all archs alike. Every round uses the same batches, which each arch first trains on once,
untimed. A round's ratio is that arch's target words per second over the baseline's in the same
round; the median over rounds is reported. The recipes add one elementwise scale per sublayer
(Admin's omega, DeepNorm's alpha) or remove LayerNorms (T-Fixup); the target is a ratio of at least
0.97 for every arch.

Next to the time, the ATen operators one update runs (forward, backward, optimizer; view operators,
which launch nothing, left out): on a GPU each is a kernel launch, and a small model's step is bound
by launches, so this count says what a ratio on a GPU can be without one.

Two one-off costs are reported as a share of training, since neither runs per update: Admin's
omega profiling (one forward pass on ``--admin-profile-batches`` 1 batch, at the start of a fresh
run) against a 1000-update run, and one diagnostics measurement (all groups) against
``--diagnostics-interval 100`` updates.
"""

import argparse
import statistics
import sys
import time
from typing import Dict, List

import torch
from fairseq import options, tasks, utils
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from fairseq.trainer import Trainer
from torch.utils._python_dispatch import TorchDispatchMode

from deepnmt_plugin.compat import bf16_on_cuda
from deepnmt_plugin.diagnostics import GROUPS, Diagnostics
from deepnmt_plugin.models.admin import profile_admin, set_analytic_omega
from deepnmt_plugin.reproduce import USER_DIR, data_bin

ARCHS = ["transformer", "transformer_preln", "transformer_deepnorm", "transformer_tfixup", "transformer_admin"]
DIMS = {  # embed, ffn, heads
    "tiny": (64, 128, 2),
    "iwslt": (512, 1024, 4),
    "base": (512, 2048, 8),
}


def training_flags(args) -> List[str]:
    embed, ffn, heads = DIMS[args.dims]
    return [
        "--encoder-layers", str(args.layers), "--decoder-layers", str(args.layers),
        "--encoder-embed-dim", str(embed), "--decoder-embed-dim", str(embed),
        "--encoder-ffn-embed-dim", str(ffn), "--decoder-ffn-embed-dim", str(ffn),
        "--encoder-attention-heads", str(heads), "--decoder-attention-heads", str(heads),
        "--share-all-embeddings", "--optimizer", "adam", "--lr", "5e-4", "--dropout", "0.1",
        "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1",
        "--max-tokens", str(args.max_tokens), "--seed", "1", *(["--cpu"] if args.cpu else []),
        *([f"--{args.precision}"] if args.precision != "fp32" else []),
    ]


def build_trainer(args, arch: str) -> Trainer:
    parser = options.get_training_parser()
    namespace = options.parse_args_and_arch(
        parser, [args.data_bin, "--user-dir", USER_DIR, "--task", "translation_deep", "--arch", arch, *training_flags(args)]
    )
    cfg = convert_namespace_to_omegaconf(namespace)
    bf16_on_cuda(cfg)
    task = tasks.setup_task(cfg.task)
    model = task.build_model(cfg.model)
    return Trainer(cfg, task, model, task.build_criterion(cfg.criterion))


def fixed_batches(trainer, count: int) -> list:
    """The first ``count`` training batches of a shuffled epoch, the same for every arch."""
    task = trainer.task
    task.load_dataset(task.cfg.train_subset)
    iterator = task.get_batch_iterator(
        dataset=task.dataset(task.cfg.train_subset), max_tokens=trainer.cfg.dataset.max_tokens,
        max_positions=utils.resolve_max_positions(task.max_positions(), trainer.model.max_positions()),
        ignore_invalid_inputs=True, required_batch_size_multiple=8, seed=1,
    )
    batches = iterator.next_epoch_itr(shuffle=True)
    return [batch for _, batch in zip(range(count), batches)]


def synchronize() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def clock() -> float:
    """Wall time on CUDA (after synchronising); on the CPU, this process's CPU time, which other jobs
    on a shared machine do not inflate (with one thread, as with ``OMP_NUM_THREADS=1``, it is wall time
    on an idle machine)."""
    synchronize()
    return time.perf_counter() if torch.cuda.is_available() else time.process_time()


def timed_updates(trainer, batches: list) -> float:
    started = clock()
    for batch in batches:
        trainer.train_step([batch])
    return clock() - started


class OperatorCounter(TorchDispatchMode):
    """Counts the ATen operators that reach a device kernel (autograd's backward ones included)."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += not func.is_view
        return func(*args, **(kwargs or {}))


def operators_per_update(trainer, batch) -> int:
    with OperatorCounter() as counter:
        trainer.train_step([batch])
    return counter.count


def admin_profiling_seconds(trainer, batch, repeats: int = 3) -> float:
    """Median time of the profiling forward pass the task runs once at the start of a fresh run."""
    net_input = {k: v.to(trainer.device) for k, v in batch["net_input"].items()}
    times = []
    for _ in range(repeats):
        started = clock()
        profile_admin(trainer.model, net_input)
        times.append(clock() - started)
    return statistics.median(times)


def diagnostics_seconds(trainer, repeats: int = 3) -> float:
    """Median time of one measurement of every diagnostics group (gradients from the last update)."""
    diagnostics = Diagnostics(1, list(GROUPS), trainer.task.diagnostics_batch, None)
    diagnostics.before_step(trainer.model, trainer.optimizer, 0)  # fixes the batch and theta_0's output
    times = []
    for _ in range(repeats):
        started = clock()
        diagnostics.before_step(trainer.model, trainer.optimizer, 0)
        diagnostics.after_step(trainer.model, 0)
        times.append(clock() - started)
    return statistics.median(times)


def measure(args) -> Dict[str, dict]:
    trainers = {arch: build_trainer(args, arch) for arch in args.archs}
    for trainer in trainers.values():
        if hasattr(trainer.model, "admin_initialized"):  # omega set without data: profiling is timed separately
            set_analytic_omega(trainer.model)
            trainer.model.admin_initialized.fill_(True)
    # every round trains on the same batches: a batch shape seen for the first time costs extra (CUDA
    # kernel selection, allocator growth), so each arch first sees them all untimed
    batches = fixed_batches(trainers[args.archs[0]], args.updates)
    for trainer in trainers.values():
        timed_updates(trainer, batches)
    seconds = {arch: [] for arch in args.archs}
    tokens = sum(batch["ntokens"] for batch in batches)
    for round_ in range(args.rounds):
        order = args.archs[round_ % len(args.archs):] + args.archs[:round_ % len(args.archs)]
        for arch in order:
            seconds[arch].append(timed_updates(trainers[arch], batches))
        print(f"round {round_ + 1}/{args.rounds}: " + ", ".join(f"{a} {tokens / seconds[a][-1]:.0f}" for a in args.archs)
              + " words/s", flush=True)
    baseline = args.archs[0]
    results = {}
    for arch in args.archs:
        ratios = [base / own for base, own in zip(seconds[baseline], seconds[arch])]  # same batches: wps ratio
        results[arch] = {"wps": tokens * args.rounds / sum(seconds[arch]), "ratio": statistics.median(ratios),
                         "min": min(ratios), "max": max(ratios),
                         "update_seconds": sum(seconds[arch]) / (args.rounds * len(batches)),
                         "operators": operators_per_update(trainers[arch], batches[0])}
    admin = next((a for a in args.archs if "admin" in a), None)
    if admin:
        results[admin]["profiling_seconds"] = admin_profiling_seconds(trainers[admin], batches[0])
        results[admin]["diagnostics_seconds"] = diagnostics_seconds(trainers[admin])
    return results


def report(args, results: Dict[str, dict]) -> str:
    embed, ffn, heads = DIMS[args.dims]
    lines = [f"Throughput, {args.layers}L-{args.layers}L {embed}-{ffn}-{heads}, {args.max_tokens} tokens per update, "
             f"{args.rounds} interleaved rounds x {args.updates} updates, {args.precision}, "
             + ("CPU (process CPU time)" if args.cpu else f"{torch.cuda.get_device_name()} (wall time)"), "",
             f"| arch | words/s | ratio to {args.archs[0]} (median) | min .. max over rounds | operators per update |",
             "|---|---|---|---|---|"]
    base_operators = results[args.archs[0]]["operators"]
    for arch, result in results.items():
        lines.append(f"| {arch} | {result['wps']:.0f} | {result['ratio']:.3f} | {result['min']:.3f} .. {result['max']:.3f} "
                     f"| {result['operators']} ({result['operators'] / base_operators:.3f}) |")
    for arch, result in results.items():
        if "profiling_seconds" in result:
            run = 1000 * result["update_seconds"]
            lines += ["", f"Admin omega profiling: {result['profiling_seconds']:.3f} s once = "
                          f"{100 * result['profiling_seconds'] / run:.3f} % of a 1000-update run ({run:.0f} s)",
                      f"Diagnostics, all groups: {result['diagnostics_seconds']:.3f} s per measurement = "
                      f"{100 * result['diagnostics_seconds'] / (100 * result['update_seconds']):.2f} % at --diagnostics-interval 100"]
    return "\n".join(lines)


def parse_arguments(argv=None):
    parser = argparse.ArgumentParser("python -m deepnmt_plugin.bench.throughput", description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", required=True, help="a data-prep output (holding data-bin/) or a data-bin folder")
    parser.add_argument("--archs", nargs="+", default=ARCHS, help="the first is the baseline (default: transformer)")
    parser.add_argument("--dims", choices=list(DIMS), default="base", help="embed-ffn-heads, the same for every arch")
    parser.add_argument("--layers", type=int, default=6, help="encoder and decoder layers")
    parser.add_argument("--max-tokens", type=int, default=4096, help="tokens per update")
    parser.add_argument("--rounds", type=int, default=30, help="rounds; each runs every arch on the same batches")
    parser.add_argument("--updates", type=int, default=2, help="batches, trained by every arch in every round (short rounds cancel noise better)")
    parser.add_argument("--cpu", action="store_true", help="on the CPU even when CUDA is available")
    parser.add_argument("--precision", choices=["fp32", "fp16", "bf16"], default="fp32",
                        help="fairseq's --fp16 / --bf16 (CUDA only), as the reproduction scripts train")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_arguments(argv)
    args.data_bin = data_bin(args.data)
    args.cpu = args.cpu or not torch.cuda.is_available()
    if args.cpu and args.precision != "fp32":
        raise SystemExit(f"deepnmt: error: --precision {args.precision} needs a CUDA device")
    print(report(args, measure(args)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
