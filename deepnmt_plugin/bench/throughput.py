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

Model FLOPs utilisation: the model's matmul FLOPs of the timed updates (``bench/flops.py``: 3 x the forward's,
from each batch's shapes) per second, over the device's peak: on CUDA the card's dense datasheet peak at the
training's precision (``PEAK_TFLOPS``), on the CPU the rate of a 2048 x 2048 fp32 matmul measured at the start on the
training's threads and clock; ``--peak-tflops`` overrides either.

Two one-off costs are reported as a share of training, since neither runs per update: Admin's
omega profiling (one forward pass on ``--admin-profile-batches`` 1 batch, at the start of a fresh
run) against a 1000-update run, and one diagnostics measurement (all groups) against
``--diagnostics-interval 100`` updates.
"""

import argparse
import re
import statistics
import sys
import time
from typing import Dict, List, Optional, Tuple

import torch
from fairseq import options, tasks, utils
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from fairseq.trainer import Trainer
from torch.utils._python_dispatch import TorchDispatchMode

from deepnmt_plugin.bench.depth import positive_float, positive_int
from deepnmt_plugin.bench.flops import update_flops
from deepnmt_plugin.compat import bf16_off_tpu
from deepnmt_plugin.diagnostics import GROUPS, Diagnostics
from deepnmt_plugin.models.admin import profile_admin, set_omega_without_data
from deepnmt_plugin.reproduce import USER_DIR, OneLineParser, data_bin

ARCHS = ["transformer", "transformer_preln", "transformer_deepnorm", "transformer_tfixup", "transformer_admin"]
DIMS = {  # embed, ffn, heads
    "tiny": (64, 128, 2),
    "iwslt": (512, 1024, 4),
    "base": (512, 2048, 8),
}
# Dense peak TFLOP/s by precision ("tf32": fp32 matmuls on tensor cores, torch.backends.cuda.matmul.allow_tf32), from
# NVIDIA's datasheets, which print tensor-core rates with 2:4 sparsity: those halved here. fp16 is with fp32
# accumulation, as PyTorch's matmuls run. A card matches as a whole word of the CUDA device name ("A10" is not
# "A100", "L4" not "L40S"), the first that matches: the PCIe and NVL variants before the SXM ones.
PEAK_TFLOPS = {
    "H100 PCIe": {"fp32": 51, "tf32": 378, "fp16": 756.5, "bf16": 756.5},  # H100 datasheet
    "H100 NVL": {"fp32": 60, "tf32": 417.5, "fp16": 835.5, "bf16": 835.5},  # H100 datasheet
    "H100": {"fp32": 67, "tf32": 494.5, "fp16": 989.5, "bf16": 989.5},  # H100 datasheet, SXM
    "H200 NVL": {"fp32": 60, "tf32": 417.5, "fp16": 835.5, "bf16": 835.5},  # H200 datasheet
    "H200": {"fp32": 67, "tf32": 494.5, "fp16": 989.5, "bf16": 989.5},  # H200 datasheet, SXM
    "A100": {"fp32": 19.5, "tf32": 156, "fp16": 312, "bf16": 312},  # A100 datasheet, SXM and PCIe
    "A10": {"fp32": 31.2, "tf32": 62.5, "fp16": 125, "bf16": 125},  # A10 datasheet
    "L4": {"fp32": 30.3, "tf32": 60, "fp16": 121, "bf16": 121},  # L4 datasheet
    "RTX 4090": {"fp32": 82.6, "tf32": 82.6, "fp16": 165.2, "bf16": 165.2},  # Ada Lovelace architecture whitepaper
    "V100-PCIE": {"fp32": 14, "tf32": 14, "fp16": 112},  # V100 datasheet; Volta has no TF32 (fp32 runs) nor bf16
    "V100S": {"fp32": 16.4, "tf32": 16.4, "fp16": 130},  # V100S datasheet
    "V100": {"fp32": 15.7, "tf32": 15.7, "fp16": 125},  # V100 datasheet, SXM2
}
CPU_MATMUL_SIZE = 2048


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
    bf16_off_tpu(cfg)
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
    on a shared machine do not inflate with one thread (``OMP_NUM_THREADS=1``; it is then wall time on an idle
    machine). With several threads on shared cores it does: each thread's wait for the others at the end of a
    parallel operator counts as CPU time."""
    synchronize()
    return time.perf_counter() if torch.cuda.is_available() else time.process_time()


def cpu_matmul_tflops(repeats: int = 5) -> float:
    """The CPU's peak: the best of ``repeats`` fp32 matmuls of two 2048 x 2048 matrices, on the threads the training
    uses (``torch.get_num_threads()``) and timed by its clock (process CPU time)."""
    a, b = torch.randn(CPU_MATMUL_SIZE, CPU_MATMUL_SIZE), torch.randn(CPU_MATMUL_SIZE, CPU_MATMUL_SIZE)
    torch.mm(a, b)  # the first call allocates and starts the thread pool
    times = []
    for _ in range(repeats):
        started = clock()
        torch.mm(a, b)
        times.append(clock() - started)
    return 2 * CPU_MATMUL_SIZE ** 3 / min(times) / 1e12


def cuda_precision(args) -> str:
    if args.precision == "fp32" and torch.backends.cuda.matmul.allow_tf32:
        return "tf32"
    return args.precision


def peak_tflops(args) -> Tuple[Optional[float], str]:
    """The peak MFU divides by (None when the card is not in ``PEAK_TFLOPS``), and a line saying where it is from."""
    if args.peak_tflops:
        return args.peak_tflops, f"Peak {args.peak_tflops:g} TFLOP/s (--peak-tflops)"
    if args.cpu:
        peak = cpu_matmul_tflops()
        return peak, (f"CPU peak measured by a {CPU_MATMUL_SIZE}² fp32 matmul: {1000 * peak:.1f} GFLOP/s "
                      f"(torch threads: {torch.get_num_threads()}, process CPU time)")
    name, precision = torch.cuda.get_device_name(), cuda_precision(args)
    card = next((card for card in PEAK_TFLOPS if re.search(rf"\b{re.escape(card)}\b", name, re.IGNORECASE)), None)
    if card is None or precision not in PEAK_TFLOPS[card]:
        return None, f"MFU: no {precision} peak known for {name}: pass --peak-tflops"
    peak = PEAK_TFLOPS[card][precision]
    return peak, f"Peak {peak:g} TFLOP/s ({card} {precision} dense, datasheet)"


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


def batches_flops(trainer, batches: list) -> int:
    model, vocab = trainer.cfg.model, len(trainer.task.target_dictionary)
    # training_flags gives the encoder and the decoder the same dims
    return sum(update_flops(model.encoder_layers, model.decoder_layers, model.encoder_embed_dim,
                            model.encoder_ffn_embed_dim, vocab, batch) for batch in batches)


def measure(args) -> Dict[str, dict]:
    trainers = {arch: build_trainer(args, arch) for arch in args.archs}
    for trainer in trainers.values():
        set_omega_without_data(trainer.model)  # Admin's profiling is timed separately
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
                         "update_flops": batches_flops(trainers[arch], batches) / len(batches),
                         "operators": operators_per_update(trainers[arch], batches[0])}
    admin = next((a for a in args.archs if "admin" in a), None)
    if admin:
        results[admin]["profiling_seconds"] = admin_profiling_seconds(trainers[admin], batches[0])
        results[admin]["diagnostics_seconds"] = diagnostics_seconds(trainers[admin])
    return results


def report(args, results: Dict[str, dict], peak: Optional[float], peak_line: str) -> str:
    embed, ffn, heads = DIMS[args.dims]
    baseline = results[args.archs[0]]
    lines = [f"Throughput, {args.layers}L-{args.layers}L {embed}-{ffn}-{heads}, {args.max_tokens} tokens per update, "
             f"{args.rounds} interleaved rounds x {args.updates} updates, {args.precision}, "
             + ("CPU (process CPU time)" if args.cpu else f"{torch.cuda.get_device_name()} (wall time)"),
             f"Model FLOPs per update: {baseline['update_flops'] / 1e9:.3f} GFLOP (matmuls, forward and backward, "
             "mean over the timed batches)", peak_line, "",
             f"| arch | words/s | ratio to {args.archs[0]} (median) | min .. max over rounds | operators per update "
             "| TFLOP/s | MFU |",
             "|---|---|---|---|---|---|---|"]
    for arch, result in results.items():
        tflops = result["update_flops"] / result["update_seconds"] / 1e12
        mfu = f"{tflops / peak:.2%}" if peak else "–"
        lines.append(f"| {arch} | {result['wps']:.0f} | {result['ratio']:.3f} | {result['min']:.3f} .. {result['max']:.3f} "
                     f"| {result['operators']} ({result['operators'] / baseline['operators']:.3f}) "
                     f"| {tflops:.3g} | {mfu} |")
    for arch, result in results.items():
        if "profiling_seconds" in result:
            run = 1000 * result["update_seconds"]
            lines += ["", f"Admin omega profiling: {result['profiling_seconds']:.3f} s once = "
                          f"{100 * result['profiling_seconds'] / run:.3f} % of a 1000-update run ({run:.0f} s)",
                      f"Diagnostics, all groups: {result['diagnostics_seconds']:.3f} s per measurement = "
                      f"{100 * result['diagnostics_seconds'] / (100 * result['update_seconds']):.2f} % at --diagnostics-interval 100"]
    return "\n".join(lines)


def refuse_unknown_archs(parser: argparse.ArgumentParser, archs: List[str]) -> None:
    """``parser.error`` naming the archs that neither fairseq nor the plugin registers, before anything is built."""
    utils.import_user_module(argparse.Namespace(user_dir=USER_DIR))
    from fairseq.models import ARCH_MODEL_REGISTRY

    if unknown := [arch for arch in archs if arch not in ARCH_MODEL_REGISTRY]:
        parser.error(f"--archs: {', '.join(unknown)}: not an arch of fairseq or the plugin")


def parse_arguments(argv=None):
    parser = OneLineParser("python -m deepnmt_plugin.bench.throughput", description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", required=True, help="a data-prep output (holding data-bin/) or a data-bin folder")
    parser.add_argument("--archs", nargs="+", default=ARCHS, help="the first is the baseline (default: transformer)")
    parser.add_argument("--dims", choices=list(DIMS), default="base", help="embed-ffn-heads, the same for every arch")
    parser.add_argument("--layers", type=positive_int, default=6, help="encoder and decoder layers")
    parser.add_argument("--max-tokens", type=positive_int, default=4096, help="tokens per update")
    parser.add_argument("--rounds", type=positive_int, default=30, help="rounds; each runs every arch on the same batches")
    parser.add_argument("--updates", type=positive_int, default=2, help="batches, trained by every arch in every round (short rounds cancel noise better)")
    parser.add_argument("--cpu", action="store_true", help="on the CPU even when CUDA is available")
    parser.add_argument("--precision", choices=["fp32", "fp16", "bf16"], default="fp32",
                        help="fairseq's --fp16 / --bf16 (CUDA only), as the reproduction scripts train")
    parser.add_argument("--peak-tflops", type=positive_float,
                        help="the device's peak, for MFU (default: the card's datasheet peak; measured on the CPU)")
    args = parser.parse_args(argv)
    refuse_unknown_archs(parser, args.archs)
    return args


def main(argv=None) -> int:
    args = parse_arguments(argv)
    args.data_bin = data_bin(args.data)
    args.cpu = args.cpu or not torch.cuda.is_available()
    if args.cpu and args.precision != "fp32":
        raise SystemExit(f"deepnmt: error: --precision {args.precision} needs a CUDA device")
    peak, peak_line = peak_tflops(args)  # before the trainers: the CPU's matmul runs on an otherwise idle process
    print(report(args, measure(args), peak, peak_line), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
