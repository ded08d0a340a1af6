"""Depth sweep: ``python -m deepnmt_plugin.bench.depth --data DIR [--quick | --micro]``.

Every method (Post-LN, Pre-LN, Admin, DeepNorm, T-Fixup) at every depth (encoder = decoder layers)
trains a 64-128-2 model with the same fixed learning rate, no warmup and the same token budget, as
in DeepNet Fig. 5 (model update of 6L-6L to 100L-100L tiny models early in training) and T-Fixup
Fig. 4b (200L-200L without warmup or LayerNorm). Each run is a ``fairseq-train`` with
``--diagnostics-interval K --diagnostics-groups update`` and records: finished or diverged (NaN/inf
loss or gradients, or a training loss that ended above where it started: ``reproduce.diverged_log``),
the final validation loss, the verdict against the corpus's unigram plateau (``bench.runs``) and the
update-norm curve ||F(x, theta_t) - F(x, theta_0)||.
``--warmup-updates N`` reruns the same budget with N inverse_sqrt warmup updates, to see what warmup
changes (T-Fixup and Pre-LN claim to need none; Admin's and DeepNet's recipes warm up).

Outputs in ``--workdir``: ``bench_depth.json`` (every run), ``bench_depth.md`` (tables),
``update_norm_<depth>L.png`` (update norm vs update, one line per method) and
``final_loss_vs_depth.png``. A run whose ``result.json`` exists is not run again, so an interrupted
sweep resumes; its log is ``<workdir>/<method>_<depth>L/train.log``. A run that crashed (not a divergence) keeps no
``result.json``: the sweep names it, exits 1, and the next invocation retries it. A run is locked while it trains: a
second sweep on the same ``--workdir`` skips it, saying so. Its trainer dies with the sweep, kill -9 included.
``--jobs N`` trains N runs at once, deepest first so the workers finish together: on the CPU each gets an equal share
of the cores as OMP threads (a 64-dim model uses a second thread poorly, so 2 runs x 1 thread beat 1 run x 2); on
CUDA they share the GPU, whose tiny-model steps are bound by kernel launches, not arithmetic.
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import List, Optional

from deepnmt_plugin.bench import authors_schedules, pyplot, study
from deepnmt_plugin.bench.runs import (FAILED, FINISHED, LABEL_SMOOTHING, METHODS, CellBusy, arch_flags, cell_lock, classify,
                                       final_valid_loss, plot_vs_depth, say, unfinished, unigram_plateau,
                                       update_norm_curve, verdict)
from deepnmt_plugin.compat import atomic_write, writing
from deepnmt_plugin.processes import children_stop_with_driver, run_owned, stop_on_ctrl_c
from deepnmt_plugin.reproduce import USER_DIR, OneLineParser, data_bin

TINY = [  # 64-128-2
    "--encoder-embed-dim", "64", "--decoder-embed-dim", "64", "--encoder-ffn-embed-dim", "128",
    "--decoder-ffn-embed-dim", "128", "--encoder-attention-heads", "2", "--decoder-attention-heads", "2",
]


@dataclass(frozen=True)
class Preset:
    depths: tuple
    max_update: int
    max_tokens: int
    # updates between update-norm measurements (and train_inner lines): 1 in the real presets, since
    # the first update already separates the methods (18L: Post-LN 9.0, DeepNorm 1.3 after update 1)
    interval: int = 1
    lr: float = 5e-4  # the same for every method, constant unless --warmup-updates
    # 0: no warmup (T-Fixup's and Pre-LN's claim); N: inverse_sqrt from 1e-7 over N updates, to see what warmup changes
    warmup_updates: int = 0


PRESETS = {  # one budget for both, so a --quick sweep's runs are reused by a full one in the same --workdir
    "full": Preset(depths=(6, 18, 50, 100, 200), max_update=200, max_tokens=1024),
    "quick": Preset(depths=(6, 18, 50), max_update=200, max_tokens=1024),
    "micro": Preset(depths=(1, 2), max_update=4, max_tokens=512, interval=2),  # checks the pipeline
}


def budget(preset: Preset) -> dict:
    """What a run's result depends on besides its method and depth: a kept run is reused only under the same."""
    return {key: value for key, value in asdict(preset).items() if key != "depths"}


def check_kept_runs(workdir: Path, plan, preset: Preset, corpus: Optional[dict]) -> int:
    """How many runs of the plan an earlier invocation finished; stops before training if one had another budget or
    another corpus."""
    kept = [(path, study.read_record(path)) for path in (workdir / f"{m}_{d}L" / "result.json" for m, d in plan)]
    kept = [(path, record) for path, record in kept if record is not None]
    for path, record in kept:
        if record.get("budget") != budget(preset):
            raise SystemExit(f"deepnmt: error: {path} was trained with another budget than {budget(preset)}; "
                             "give this sweep another --workdir")
        if "corpus" in record and (record["corpus"] or {}).get("checksum") != (corpus or {}).get("checksum"):
            raise SystemExit(f"deepnmt: error: {path} was trained on another corpus (checksum "
                             f"{(record['corpus'] or {}).get('checksum')}) than this sweep's "
                             f"({(corpus or {}).get('checksum')}); give this sweep another --workdir")
    return len(kept)


def train_command(data: str, method: str, depth: int, preset: Preset, save_dir: Path, cpu: bool) -> List[str]:
    return [
        sys.executable, "-m", "fairseq_cli.train", data, "--user-dir", USER_DIR, "--task", "translation_deep",
        *arch_flags(method), "--encoder-layers", str(depth), "--decoder-layers", str(depth), *TINY, "--share-all-embeddings",
        "--optimizer", "adam", "--adam-betas", "(0.9, 0.98)", "--lr", str(preset.lr), *lr_schedule(preset),
        "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", str(LABEL_SMOOTHING), "--dropout", "0.1",
        "--max-tokens", str(preset.max_tokens), "--max-update", str(preset.max_update), "--seed", "1",
        "--log-format", "simple", "--log-interval", str(preset.interval),
        "--diagnostics-interval", str(preset.interval), "--diagnostics-groups", "update",
        # validate once, when max-update is reached, not at every epoch end
        "--validate-interval", str(10**6), "--no-save", "--save-dir", str(save_dir), *(["--cpu"] if cpu else []),
    ]


def lr_schedule(preset: Preset) -> List[str]:
    if not preset.warmup_updates:
        return ["--lr-scheduler", "fixed"]
    return ["--lr-scheduler", "inverse_sqrt", "--warmup-updates", str(preset.warmup_updates), "--warmup-init-lr", "1e-7"]


def describe_schedule(preset: Preset) -> str:
    if not preset.warmup_updates:
        return f"lr {preset.lr:g} constant (no warmup)"
    return f"lr {preset.lr:g} after {preset.warmup_updates} warmup updates, inverse_sqrt"


def run_one(args, method: str, depth: int, preset: Preset, threads: Optional[int] = None) -> dict:
    """The run's record, trained now unless an earlier invocation kept it; CellBusy where another driver trains it."""
    directory = Path(args.workdir) / f"{method}_{depth}L"
    directory.mkdir(parents=True, exist_ok=True)
    with cell_lock(directory):
        result_path = directory / "result.json"
        kept = study.read_record(result_path)  # read under the lock: a driver that held it may have just written it
        if kept is not None:
            return kept
        save_dir, log_path = directory / "checkpoints", directory / "train.log"
        command = train_command(args.data_bin, method, depth, preset, save_dir, cpu=args.cpu)
        environment = {**os.environ, **({"OMP_NUM_THREADS": str(threads)} if threads else {})}
        started = time.time()
        with open(log_path, "w") as log_file:
            returncode = run_owned(command, stdout=log_file, stderr=subprocess.STDOUT, env=environment)
        seconds = round(time.time() - started, 1)
        shutil.rmtree(save_dir, ignore_errors=True)  # --no-save; only fairseq's crash.pt can be there
        log = log_path.read_text()
        losses = re.findall(r"\| train_inner \|.*?loss=([^,\s]+)", log)
        result = {
            "method": method, "depth": depth, "budget": budget(preset), "status": classify(log, returncode),
            "returncode": returncode, "final_valid_loss": final_valid_loss(log),
            "final_train_loss": float(losses[-1]) if losses else None,
            "update_norm": update_norm_curve(log), "seconds": seconds, "log": str(log_path), "corpus": args.corpus,
        }
        if result["status"] != FAILED:  # a crash (out of memory, a bad flag) is no result: the next invocation retries it
            with atomic_write(result_path) as partial:  # a kill or a full disk mid-write leaves no torn record
                Path(partial).write_text(json.dumps(result, indent=1))
    return result


def cell(run: Optional[dict], key: str) -> str:
    if run is None:
        return "–"
    if key == "verdict" or run["status"] != FINISHED:
        return run["verdict"]
    value = run[key] if key != "peak_update_norm" else max((v for _, v in run["update_norm"]), default=None)
    return "–" if value is None else f"{value:.3f}"


def write_markdown(runs: List[dict], path: Path, title: str, footer: str) -> None:
    methods = [m for m in METHODS if any(r["method"] == m for r in runs)]
    depths = sorted({r["depth"] for r in runs})
    by_key = {(r["method"], r["depth"]): r for r in runs}
    header = "| method | " + " | ".join(f"{d}L-{d}L" for d in depths) + " |"
    rule = "|---|" + "---|" * len(depths)
    lines = [f"### {title}", ""]
    for caption, key in (("Final validation loss", "final_valid_loss"),
                         ("Peak update norm ||F(x, θ_t) − F(x, θ_0)||", "peak_update_norm")):
        lines += [f"{caption}:", "", header, rule]
        lines += [f"| {m} | " + " | ".join(cell(by_key.get((m, d)), key) for d in depths) + " |" for m in methods]
        lines.append("")
    lines += ["Verdict (the unigram plateau: validation loss "
              f"{runs[0]['unigram_plateau']:.3f}):", "", header, rule]
    lines += [f"| {m} | " + " | ".join(cell(by_key.get((m, d)), "verdict") for d in depths) + " |" for m in methods]
    lines.append("")
    minutes = sum(r["seconds"] for r in runs) / 60
    lines.append(f"{len(runs)} runs, {minutes:.1f} minutes of training in all. {footer}")
    path.write_text("\n".join(lines) + "\n")


def write_plots(runs: List[dict], workdir: Path) -> List[Path]:
    plt = pyplot()

    written = []
    for depth in sorted({r["depth"] for r in runs}):
        figure, axes = plt.subplots(figsize=(6, 4))
        for run in (r for r in runs if r["depth"] == depth and r["update_norm"]):
            steps, values = zip(*run["update_norm"])
            label = run["method"] + ("" if run["status"] == FINISHED else f" ({run['status']})")
            axes.plot(steps, values, marker="." if len(steps) < 30 else None, label=label)
        # log y: T-Fixup's output has no final LayerNorm and moves 10x more than the LayerNorm models'
        axes.set(title=f"Model update, {depth}L-{depth}L 64-128-2", xlabel="update", xscale="log", yscale="log",
                 ylabel="||F(x, θ_t) − F(x, θ_0)||")
        axes.legend()
        written.append(workdir / f"update_norm_{depth}L.png")
        figure.savefig(written[-1], dpi=100, bbox_inches="tight")
        plt.close(figure)

    by_method = {m: [(r["depth"], r["final_valid_loss"] if r["status"] == FINISHED else None) for r in runs if r["method"] == m]
                 for m in METHODS}
    written.append(workdir / "final_loss_vs_depth.png")
    plot_vs_depth(by_method, "Final validation loss (x on the bottom edge: diverged or crashed)", "validation loss",
                  written[-1])
    return written


def parse_arguments(argv=None):
    parser = OneLineParser("python -m deepnmt_plugin.bench.depth", description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", required=True, help="a data-prep output (holding data-bin/) or a data-bin folder")
    presets = parser.add_mutually_exclusive_group()
    presets.add_argument("--quick", action="store_const", dest="preset", const="quick",
                         help=f"{PRESETS['quick']}: 15.3 min measured on 2 CPU cores with --jobs 2")
    presets.add_argument("--micro", action="store_const", dest="preset", const="micro",
                         help=f"{PRESETS['micro']}: checks the pipeline in seconds")
    presets.add_argument("--preset", choices=[*PRESETS, "study", "study-micro"],
                         help="study: the depth study on the l10n corpus (data-prep/prepare-l10n-de-en.sh), every cell "
                              "trained until it translates, then test BLEU (bench/study.py); study-micro checks its pipeline")
    parser.set_defaults(preset="full")  # about 69 min on 2 CPU cores with --jobs 2 (15.3 quick + 53.3 for 100L, 200L)
    parser.add_argument("--methods", nargs="+", choices=list(METHODS), default=list(METHODS))
    parser.add_argument("--depths", nargs="+", type=depth_pair, metavar="N|N-M",
                        help="override the preset's depths: N layers per stack, or (study) N encoder and M decoder "
                             "layers, e.g. 12-3")
    parser.add_argument("--seeds", nargs="+", type=positive_int, default=[1],
                        help="study: train every grid cell with each seed (default: 1)")
    parser.add_argument("--max-update", type=positive_int,
                        help="override the preset's updates, every cell's (study: the checkpointed cells' own too)")
    parser.add_argument("--warmup-updates", type=positive_int, default=0,
                        help="warm the lr up over this many updates (inverse_sqrt) instead of keeping it constant")
    parser.add_argument("--lr", type=positive_float,
                        help="override the preset's peak learning rate, the same for every method")
    parser.add_argument("--schedule", choices=["study", "authors"], default="study",
                        help="study: each method under the study's schedule; authors: under its authors' optimiser "
                             "and schedule, scaled to the budget (bench/authors_schedules.py; "
                             f"{', '.join(authors_schedules.SCHEDULES)})")
    parser.add_argument("--workdir", help="runs, logs, JSON, tables and plots "
                                          "(default: runs/bench_depth/<updates>x<tokens>[_warmup<N>][_lr<X>])")
    parser.add_argument("--cpu", action="store_true", help="train on the CPU even when CUDA is available")
    parser.add_argument("--jobs", type=positive_int, default=1,
                        help="runs trained at once (CPU: the cores are split between them; CUDA: they share the GPU)")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_arguments(argv)
    with writing(args.workdir):
        return run(args)


def run(args) -> int:
    if args.preset.startswith("study"):
        return run_study(args)
    if args.seeds != [1] or any(encoder != decoder for encoder, decoder in args.depths or []):
        raise SystemExit("deepnmt: error: --seeds and N-M depths are the study's (--preset study); the sweep trains "
                         "seed 1 with equal stacks")
    if args.schedule != "study":
        raise SystemExit("deepnmt: error: --schedule authors is the study's (--preset study); the sweep trains every "
                         "method under one schedule")
    preset = PRESETS[args.preset]
    preset = replace(preset, depths=tuple(encoder for encoder, _ in args.depths or []) or preset.depths,
                     max_update=args.max_update or preset.max_update, warmup_updates=args.warmup_updates,
                     lr=args.lr or preset.lr)
    args.data_bin = data_bin(args.data, folder="data-bin-sentences")  # the quickstart's corpus
    args.cpu = args.cpu or not cuda_available()
    # named by the budget, so a --quick sweep and a full one share their runs
    workdir = Path(args.workdir or f"runs/bench_depth/{preset.max_update}x{preset.max_tokens}"
                   + (f"_warmup{preset.warmup_updates}" if preset.warmup_updates else "")
                   + (f"_lr{preset.lr:g}" if args.lr else ""))
    args.workdir = str(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    plan = [(m, d) for d in preset.depths for m in args.methods]
    title = (f"Depth sweep ({args.preset}): 64-128-2, {describe_schedule(preset)}, "
             f"{preset.max_update} updates x {preset.max_tokens} tokens")
    device = "CPU" if args.cpu else "CUDA"
    print(f"{title}: {len(plan)} runs in {workdir} on {device}, {args.jobs} at a time", flush=True)
    threads = max(1, available_cores() // args.jobs) if args.cpu and args.jobs > 1 else None
    args.corpus = study.corpus_record(args.data, args.data_bin)
    reused = check_kept_runs(workdir, plan, preset, args.corpus)
    plateau = unigram_plateau(args.data_bin)
    order = sorted(plan, key=lambda run: -run[1])  # deepest first: no long run is left alone at the end

    def run_and_report(index, method, depth):
        label = f"[{index}/{len(plan)}] {method} {depth}L-{depth}L"
        say(f"{label} ...")
        try:
            run = run_one(args, method, depth, preset, threads)
        except CellBusy as busy:
            say(f"{label}: busy, {busy}; skipped")
            return None
        run.update(unigram_plateau=round(plateau, 3),
                   verdict=verdict(run["status"], run["final_valid_loss"], [], plateau))
        loss = "–" if run["final_valid_loss"] is None else f"{run['final_valid_loss']:.3f}"
        say(f"{label}: {run['verdict']}, valid loss {loss} (unigram plateau {plateau:.3f}), {run['seconds']:.0f} s "
            f"(log: {run['log']})")
        return run

    started = time.time()
    with ThreadPoolExecutor(max_workers=args.jobs) as workers, children_stop_with_driver():
        outcomes = list(workers.map(run_and_report, range(1, len(plan) + 1), *zip(*order)))
    wall_minutes = (time.time() - started) / 60
    busy = [f"{method}_{depth}L" for (method, depth), run in zip(order, outcomes) if run is None]
    crashed = [f"{run['method']}_{run['depth']}L" for run in outcomes if run and run["status"] == FAILED]
    runs = sorted((run for run in outcomes if run and run["status"] != FAILED),
                  key=lambda run: plan.index((run["method"], run["depth"])))
    if not runs:
        return unfinished(crashed, busy)
    footer = (f"This invocation: {wall_minutes:.1f} minutes wall clock on {device}, --jobs {args.jobs}"
              + (f", {reused} run{'s' * (reused > 1)} reused from an earlier one." if reused else "."))
    report = {"preset": args.preset, "settings": asdict(preset), "jobs": args.jobs, "device": device,
              "wall_minutes": round(wall_minutes, 1), "reused_runs": reused, "runs": runs}
    (workdir / "bench_depth.json").write_text(json.dumps(report, indent=1))
    write_markdown(runs, workdir / "bench_depth.md", title, footer)
    plots = write_plots(runs, workdir)
    print(f"wrote {workdir / 'bench_depth.json'}, {workdir / 'bench_depth.md'} and {len(plots)} plots", flush=True)
    print((workdir / "bench_depth.md").read_text(), flush=True)
    return unfinished(crashed, busy)


def run_study(args) -> int:
    preset = study.STUDY if args.preset == "study" else study.STUDY_MICRO
    if args.schedule == "authors":
        refused = ([f"--schedule authors has no schedule for {', '.join(unknown)} (only for "
                    f"{', '.join(authors_schedules.SCHEDULES)})"]
                   if (unknown := [m for m in args.methods if m not in authors_schedules.SCHEDULES]) else [])
        refused += [f"{flag} contradicts --schedule authors (the authors' schedule sets it)"
                    for flag, value in (("--lr", args.lr), ("--warmup-updates", args.warmup_updates)) if value]
        if refused:
            raise SystemExit("deepnmt: error: " + "; ".join(refused))
    # --depths picks the grid's depths and the checkpointed cells at those depths; 500 picks only the latter;
    # --max-update overrides the checkpointed cells' own updates too
    depths = args.depths or study.depth_pairs(preset.depths)
    checkpointed_only = {(cell[1], cell[2]) for cell in preset.checkpointed} - set(study.depth_pairs(preset.depths))
    preset = replace(preset, depths=tuple(depth for depth in depths if depth not in checkpointed_only),
                     checkpointed=tuple((method, encoder, decoder, args.max_update or updates)
                                        for method, encoder, decoder, updates in preset.checkpointed
                                        if (encoder, decoder) in depths or not args.depths),
                     max_update=args.max_update or preset.max_update,
                     warmup_updates=args.warmup_updates or preset.warmup_updates, lr=args.lr or preset.lr,
                     schedule=args.schedule)
    args.data_bin = data_bin(args.data)
    args.cpu = args.cpu or not cuda_available()
    args.workdir = args.workdir or f"runs/{args.preset.replace('-', '_')}"
    threads = max(1, available_cores() // args.jobs) if args.cpu and args.jobs > 1 else None
    return study.run(args, preset, threads)


def depth_pair(text: str) -> tuple:
    """``N`` -> (N, N); ``N-M`` -> (N, M): encoder and decoder layers, each at least 1."""
    parts = text.split("-")
    if len(parts) > 2 or not all(part.isdigit() and int(part) >= 1 for part in parts):
        raise argparse.ArgumentTypeError(f"expected N or N-M layers, whole numbers >= 1, got {text!r}")
    return int(parts[0]), int(parts[-1])


def positive_int(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}")
    return int(text)


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}")
    return value


def available_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


if __name__ == "__main__":
    sys.exit(stop_on_ctrl_c(main))
