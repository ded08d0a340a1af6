"""Reproduce a paper's BLEU table: ``python -m deepnmt_plugin.reproduce CONFIG --data DIR [...]``.

A config (``configs/*.yaml``) holds one table: the recipe's fairseq flags, the methods and depths,
the evaluation settings and the published numbers. Every run (method x depth x seed) goes through
train -> average checkpoints -> generate -> score, each step skipped when its output exists, so a
crashed or preempted reproduction resumes where it stopped. ``collect`` then writes the table
(Markdown + CSV) with our BLEU, the paper's and the difference; a run whose loss went NaN/inf or
exploded, or that hit fairseq's minimum loss scale, is reported as ``diverged``.
"""

import argparse
import csv
import json
import math
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional

import yaml

from deepnmt_plugin import compat
from deepnmt_plugin.processes import owned_process, stop_on_ctrl_c
from deepnmt_plugin.provenance import provenance, recorded_command

USER_DIR = str(Path(__file__).resolve().parent)
DIVERGED = "diverged"
ENVIRONMENT = ("commit", "torch", "fairseq", "python", "device", "threads")  # a run's environment.json, in the tables
SMOKE_FLAGS = [
    "--encoder-embed-dim", "64", "--decoder-embed-dim", "64", "--encoder-ffn-embed-dim", "128",
    "--decoder-ffn-embed-dim", "128", "--encoder-attention-heads", "2", "--decoder-attention-heads", "2",
    "--max-update", "20", "--max-epoch", "0", "--save-interval-updates", "10",
]
SMOKE_MAX_TOKENS = 1024
PROGRESS_LINE = re.compile(r"\| (train_inner|train|valid) \||\| admin: |^deepnmt: |Error")
DIVERGENCE_PATTERNS = re.compile(
    r"loss[= ](nan|inf)|Minimum loss scale reached|FloatingPointError|deepnmt: diverged", re.IGNORECASE
)


@dataclass(frozen=True)
class Run:
    method: str
    encoder_layers: int
    decoder_layers: int
    seed: int

    @property
    def depth(self) -> str:
        if self.encoder_layers == self.decoder_layers:
            return f"{self.encoder_layers}L"
        return f"{self.encoder_layers}L-{self.decoder_layers}L"

    @property
    def name(self) -> str:
        return f"{self.method}_{self.depth}_seed{self.seed}"


def parse_depth(depth) -> tuple:
    """``18`` -> (18, 18); ``"60-12"`` -> (60, 12) encoder and decoder layers."""
    encoder, _, decoder = str(depth).partition("-")
    return int(encoder), int(decoder or encoder)


def batching(tokens_per_update: int, gpus: int, max_tokens: int) -> tuple:
    """(max_tokens per GPU, update_freq) with gpus x max_tokens x update_freq = the paper's batch:
    accumulate when the GPUs hold less, shrink the per-GPU batch when they hold more."""
    if gpus * max_tokens >= tokens_per_update:
        return tokens_per_update // gpus, 1
    return max_tokens, math.ceil(tokens_per_update / (gpus * max_tokens))


def load_config(path: str) -> dict:
    """A table's config. Besides the required keys it may give ``batch_by_depth`` (a depth's own
    ``tokens_per_update`` / ``max_tokens``, where the recipe batches it differently) and ``method_depths``
    (the depths a method is run at, where the paper reports fewer than the table's ``depths``)."""
    try:
        with open(path) as handle:
            config = yaml.safe_load(handle)
    except OSError as error:
        raise SystemExit(f"deepnmt: error: cannot read the table's config {path}: {error.strerror}")
    except yaml.YAMLError as error:
        raise SystemExit(f"deepnmt: error: {path} is not YAML: {' '.join(str(error).split())}")
    if not isinstance(config, dict):
        raise SystemExit(f"deepnmt: error: {path} holds a {type(config).__name__}, not a table's config (a mapping of "
                         "table, source_lang, target_lang, train, methods, depths, generate, bleu)")
    missing = {"table", "source_lang", "target_lang", "train", "methods", "depths", "generate", "bleu"} - config.keys()
    if missing:
        raise SystemExit(f"deepnmt: error: {path} lacks {', '.join(sorted(missing))}")
    depths = {str(depth) for depth in config["depths"]}
    stray = {str(depth) for depth in config.get("batch_by_depth", {})} - depths
    for method, method_depths in config.get("method_depths", {}).items():
        if method not in config["methods"]:
            raise SystemExit(f"deepnmt: error: {path}: method_depths names {method}, which is not among its methods")
        stray |= {str(depth) for depth in method_depths} - depths
    if stray:
        raise SystemExit(f"deepnmt: error: {path} names depths {sorted(stray)} that are not among its depths")
    return config


def data_bin(data: str, must_exist: bool = True, folder: str = "data-bin") -> str:
    """A data-prep output folder (holding ``folder``, data-bin/ unless a config names another) or a
    fairseq-preprocess folder itself."""
    path = Path(data)
    if (path / folder).is_dir():
        path = path / folder
    if must_exist and not path.is_dir():
        raise SystemExit(f"deepnmt: error: --data {data} does not exist")
    if must_exist and not any(path.glob("dict.*.txt")):
        raise SystemExit(f"deepnmt: error: --data {data} holds no fairseq-preprocess output (dict.*.txt); "
                         "run data-prep first")
    return str(path)


class Reproduction:
    def __init__(self, config: dict, args):
        self.config, self.args = config, args
        self.workdir = Path(args.workdir)
        if args.smoke:  # on a GPU where there is one, so the smoke run checks the mixed-precision path too
            self.on_cuda = args.gpus > 0 and self.cuda_available()
        else:  # a dry run plans for the GPUs asked for, whatever this machine has
            self.on_cuda = args.gpus > 0 and (args.dry_run or self.cuda_available())
        self.precision = args.precision or ("fp16" if self.on_cuda else "fp32")
        if self.precision != "fp32" and not self.on_cuda:
            raise SystemExit(f"deepnmt: error: --precision {self.precision} needs a CUDA device; "
                             "on the CPU use --precision fp32 (the default there)")
        # a node trains with one process a GPU, or one process on the CPU
        self.processes_per_node = max(args.gpus, 1) if self.on_cuda else 1
        self.world_size = args.nnodes * self.processes_per_node

    def batch(self, run: Run) -> tuple:
        """(tokens per update, max tokens per GPU, update-freq) of a run: the table's batch, or its depth's
        where ``batch_by_depth`` gives one (Admin's En-Fr 60L-12L: 16 x 5000 x 16 tokens, 6L: 8 x 8000 x 10)."""
        by_depth = {str(depth): batch for depth, batch in self.config.get("batch_by_depth", {}).items()}
        setting = {**self.config, **by_depth.get(depth_key(run.encoder_layers, run.decoder_layers), {})}
        tokens_per_update = setting.get("tokens_per_update", setting.get("max_tokens", 4096))
        if self.args.smoke:
            return tokens_per_update, SMOKE_MAX_TOKENS, 1
        max_tokens, update_freq = batching(tokens_per_update, self.world_size, setting.get("max_tokens", 4096))
        return tokens_per_update, max_tokens, update_freq

    @staticmethod
    def cuda_available() -> bool:
        import torch

        return torch.cuda.is_available()

    def runs(self) -> List[Run]:
        methods = self.args.methods or list(self.config["methods"])
        unknown = set(methods) - set(self.config["methods"])
        if unknown:
            raise SystemExit(f"deepnmt: error: unknown methods {sorted(unknown)}; this table has {list(self.config['methods'])}")
        # a depth as the table spells it (6, 60-12), however it was given (06, 6-6): the runs are looked up by it
        spelled = {parse_depth(depth): depth for depth in self.config["depths"]}
        chosen = self.args.depths or self.config["depths"]
        unknown = [depth for depth in chosen if parse_depth(depth) not in spelled]
        if unknown:
            raise SystemExit(f"deepnmt: error: unknown depths {unknown}; this table has "
                             f"{[str(depth) for depth in self.config['depths']]}")
        depths = [spelled[parse_depth(depth)] for depth in chosen]
        seeds = self.args.seeds or self.config.get("seeds", [1])
        method_depths = {method: {str(d) for d in ds} for method, ds in self.config.get("method_depths", {}).items()}
        runs = [Run(m, *parse_depth(d), s) for m in methods for d in depths for s in seeds
                if m not in method_depths or str(d) in method_depths[m]]
        if not runs:
            raise SystemExit(f"deepnmt: error: no run of this table has a method of {methods} at a depth of "
                             f"{[str(depth) for depth in depths]}; its methods' depths: "
                             + "; ".join(f"{m} {sorted(method_depths.get(m, map(str, self.config['depths'])))}"
                                         for m in methods))
        return runs

    def hardware_flags(self) -> List[str]:
        flags = [] if self.on_cuda else ["--cpu"]
        if self.world_size > 1:
            flags += ["--distributed-world-size", str(self.world_size)]
            if not self.on_cuda:  # NCCL, and the device ids fairseq gives torch's DDP, need CUDA
                flags += ["--distributed-backend", "gloo", "--ddp-backend", "legacy_ddp"]
        return flags

    def launcher(self) -> List[str]:
        """fairseq-train on one node (which spawns a process a GPU itself), or under torchrun on several."""
        if self.args.nnodes == 1:
            return ["fairseq-train"]
        return ["torchrun", "--nnodes", str(self.args.nnodes), "--node-rank", str(self.args.node_rank),
                "--nproc-per-node", str(self.processes_per_node), "--master-addr", self.args.master_addr,
                "--master-port", str(self.args.master_port), shutil.which("fairseq-train") or "fairseq-train"]

    def precision_flags(self) -> List[str]:
        if self.precision == "fp32":
            return []
        return [str(f) for f in self.config.get("precision", {}).get(self.precision, [f"--{self.precision}"])]

    def train_command(self, run: Run, save_dir: Path) -> List[str]:
        config = self.config
        _, max_tokens, update_freq = self.batch(run)
        command = [*self.launcher(), self.args.data_bin, "--user-dir", USER_DIR, "--task", "translation_deep",
                   "--source-lang", config["source_lang"], "--target-lang", config["target_lang"],
                   *map(str, config["train"]), *map(str, config["methods"][run.method]),  # method flags win
                   "--encoder-layers", str(run.encoder_layers), "--decoder-layers", str(run.decoder_layers),
                   "--seed", str(run.seed), "--max-tokens", str(max_tokens),
                   "--update-freq", str(update_freq), "--save-dir", str(save_dir), "--divergence-guard",
                   *self.hardware_flags(), *self.precision_flags()]
        if self.args.smoke:
            command += SMOKE_FLAGS
        return command

    def average_command(self, save_dir: Path, output: Path) -> List[str]:
        last = 2 if self.args.smoke else self.config.get("average_last", 1)
        unit = "update" if self.args.smoke else self.config.get("average_by", "epoch")
        return [sys.executable, "-m", "deepnmt_plugin.average_checkpoints", "--inputs", str(save_dir),
                f"--num-{unit}-checkpoints", str(last), "--output", str(output)]

    def generate_command(self, checkpoint: Path) -> List[str]:
        return ["fairseq-generate", self.args.data_bin, "--user-dir", USER_DIR, "--path", str(checkpoint),
                "--source-lang", self.config["source_lang"], "--target-lang", self.config["target_lang"],
                "--gen-subset", "test", "--remove-bpe", "--max-tokens", "4096",
                # fairseq drops a last batch that is not a multiple of this (8 by default): untranslated sentences
                "--required-batch-size-multiple", "1",
                *map(str, self.config["generate"]), *([] if self.on_cuda else ["--cpu"])]

    def score_command(self, generated: Path, scores: Path) -> List[str]:
        command = [sys.executable, "-m", "deepnmt_plugin.scoring", str(generated),
                   "--source-lang", self.config["source_lang"], "--target-lang", self.config["target_lang"],
                   "--json", str(scores), "--data-bin", self.args.data_bin, "--gen-subset", "test"]
        if self.config.get("sacrebleu_test_set") and not self.args.smoke:
            command += ["--sacrebleu-test-set", self.config["sacrebleu_test_set"]]
        return command

    def run_all(self) -> None:
        runs = self.runs()
        depths_by_batch: Dict[tuple, List[str]] = {}
        for run in runs:
            depths = depths_by_batch.setdefault(self.batch(run), [])
            if run.depth not in depths:
                depths.append(run.depth)
        workers = f"{self.world_size} GPU" if self.on_cuda else f"{self.world_size} CPU process"
        batches = "; ".join(
            f"{tokens} tokens per update = {workers} x {max_tokens} tokens x update-freq {update_freq}"
            + (f" ({', '.join(depths)})" if len(depths_by_batch) > 1 else "")
            for (tokens, max_tokens, update_freq), depths in depths_by_batch.items()
        )
        nodes = f", node {self.args.node_rank} of {self.args.nnodes}" if self.args.nnodes > 1 else ""
        print(f"{self.config['table']}: {len(runs)} runs in {self.workdir}{nodes}, precision {self.precision}, {batches}",
              flush=True)
        if not self.on_cuda and self.args.gpus > 0 and not self.args.smoke:
            print("warning: no CUDA device: training in fp32 on the CPU, which the papers' budgets do not fit", flush=True)
        for number, run in enumerate(runs, 1):
            self.run_one(run, f"[{number}/{len(runs)}] {run.name}")
        if not self.args.dry_run and self.args.node_rank == 0:
            tables = collect(self.workdir, self.config)
            print(Path(tables["markdown"]).read_text(), flush=True)

    def run_one(self, run: Run, label: str) -> None:
        directory = self.workdir / run.name
        save_dir, averaged = directory / "checkpoints", directory / "checkpoint_averaged.pt"
        generated, scores = directory / "generate.txt", directory / "scores.json"
        averaging = self.args.smoke or self.config.get("average_last", 1) > 1
        node = f".node{self.args.node_rank}" if self.args.node_rank else ""
        steps = [("train", self.train_command(run, save_dir), directory / f"train{node}.log",
                  directory / f"train{node}.done")]
        if node:  # only rank 0, on node 0, saves checkpoints: node 0 averages, generates and scores
            self.run_steps(steps, directory, label)
            return
        if not self.args.dry_run and not (directory / "train.done").exists():
            directory.mkdir(parents=True, exist_ok=True)
            record = {**provenance(cpu=not self.on_cuda, threads=None), "seed": run.seed,
                      "command": recorded_command(steps[0][1])}
            (directory / "environment.json").write_text(json.dumps(record, indent=1) + "\n")
        if averaging:
            steps.append(("average", self.average_command(save_dir, averaged), directory / "average.log", averaged))
        checkpoint = averaged if averaging else save_dir / "checkpoint_last.pt"
        steps += [
            ("generate", self.generate_command(checkpoint), generated, directory / "generate.done"),
            ("score", self.score_command(generated, scores), directory / "score.log", scores),
        ]
        self.run_steps(steps, directory, label)

    def run_steps(self, steps: list, directory: Path, label: str) -> None:
        for step, command, log, done in steps:
            if self.args.dry_run:
                print(f"{label} {step}: {shlex.join(command)}", flush=True)
                continue
            if (directory / "diverged").exists():
                print(f"{label}: diverged before, skipped", flush=True)
                return
            record = done.with_name(f"{log.stem if step == 'train' else step}.command")
            if done.exists():
                self.check_same_step(label, step, command, record, directory)
                print(f"{label} {step}: done before", flush=True)
                continue
            directory.mkdir(parents=True, exist_ok=True)
            print(f"{label} {step} ... (log: {log})", flush=True)
            started = time.time()
            # (not on several nodes: the others would wait at their rendezvous for node 0)
            if step == "train" and self.args.nnodes == 1 and saved_at_budget(command):
                print(f"{label} train: its checkpoint_last.pt is at --max-update: finished before its exit", flush=True)
                returncode = 0
            else:  # training resumes from checkpoint_last.pt: its log keeps every attempt's lines, as the checkpoint does
                returncode = run_logged(command, log, echo=step == "train", append=step == "train")
            # a crash that is not a divergence (a bad flag, out of memory) stops the table instead: rerun after the fix
            if step == "train" and diverged_log(log.read_text()):
                (directory / "diverged").write_text(f"fairseq-train exit code {returncode}\n")
                print(f"{label}: diverged (see {log})", flush=True)
                return
            if returncode != 0:
                raise SystemExit(f"deepnmt: error: {label} {step} failed (exit {returncode}); see {log}")
            record.write_text(self.step_command(step, command, directory) + "\n")  # before the marker: a done step has one
            if done.suffix == ".done":
                done.write_text("")
            print(f"{label} {step}: finished in {time.time() - started:.0f}s", flush=True)

    def step_command(self, step: str, command: List[str], directory: Path) -> str:
        """What a step is done with, as recorded beside it: the training's without its launcher (whose rendezvous
        address and port may change between the attempts of one run), this interpreter as ``python`` and the run's
        own folder as ``RUN``, so that a run resumed from another folder or environment is still the same."""
        arguments = command[len(self.launcher()):] if step == "train" else command
        return shlex.join("python" if argument == sys.executable else argument.replace(str(directory), "RUN")
                          for argument in arguments)

    def check_same_step(self, label: str, step: str, command: List[str], record: Path, directory: Path) -> None:
        """Refuse a step done before with another command (other data, config, precision, GPUs or budget): its
        result is not this one's."""
        if not record.exists():  # done before steps were recorded
            return
        before, now = shlex.split(record.read_text()), shlex.split(self.step_command(step, command, directory))
        if before != now:
            removed = shlex.join([argument for argument in before if argument not in now][:6])
            added = shlex.join([argument for argument in now if argument not in before][:6])
            difference = (f"it had {removed}, this one has {added}" if removed and added else
                          f"this one adds {added}" if added else f"this one lacks {removed}" if removed else
                          "the same arguments in another order")
            raise SystemExit(f"deepnmt: error: {label} {step} was done with another command ({difference}): its "
                             f"result is not this run's; give another --workdir, or delete {directory} to redo it")


def saved_at_budget(command: List[str]) -> bool:
    """Whether fairseq-train ``command``'s ``checkpoint_last.pt`` was saved at its ``--max-update``: the run stopped
    between that save and its exit. Rerun, fairseq 0.12 would train one update past the budget (it takes a step
    before it reads --max-update)."""
    def last(flag: str) -> Optional[str]:  # argparse keeps a repeated flag's last value
        return command[len(command) - command[::-1].index(flag)] if flag in command else None

    max_update, save_dir = last("--max-update"), last("--save-dir")
    checkpoint = Path(save_dir or "checkpoints") / "checkpoint_last.pt"  # fairseq's default save dir
    if not max_update or int(max_update) <= 0 or not checkpoint.exists():  # 0: no budget in updates
        return False
    from fairseq import checkpoint_utils

    try:
        state = checkpoint_utils.load_checkpoint_to_cpu(str(checkpoint))
    except compat.CorruptCheckpointError:  # torn: fairseq-train resumes from the newest intact one (compat)
        return False
    return state["optimizer_history"][-1]["num_updates"] >= int(max_update)


def run_logged(command: List[str], log: Path, echo: bool, append: bool = False) -> int:
    """Run ``command`` with its output written by the command itself (not through a pipe, whose unread lines would die
    with a killed driver): appended to ``log`` with ``append``, else under a temporary name until it ends. With
    ``echo``, the driver follows the file and shows fairseq's progress lines as they come."""
    target = log if append else log.with_name(log.name + ".partial")
    with open(target, "a" if append else "w") as out, open(target, errors="replace") as follow:
        follow.seek(0, os.SEEK_END)
        with owned_process(command, stdout=out, stderr=subprocess.STDOUT) as process:
            pending = ""
            while True:
                ended = process.poll() is not None
                pending += follow.read()
                *lines, pending = pending.split("\n")
                for line in lines:
                    if echo and PROGRESS_LINE.search(line):
                        print("    " + line.rstrip(), flush=True)
                if ended:
                    break
                time.sleep(0.2)
            returncode = process.wait()
    if not append:
        os.replace(target, log)
    return returncode


def logged_losses(log: str) -> List[float]:
    return [float(v) for v in re.findall(r"\| train_inner \|.*?loss=([-\d.]+|nan|inf)", log)]


def diverged_log(log: str) -> bool:
    """NaN/inf loss, minimum loss scale, a divergence stop, or a loss that ended above where it started."""
    if DIVERGENCE_PATTERNS.search(log):
        return True
    losses = logged_losses(log)
    return len(losses) >= 2 and losses[-1] > losses[0]


def depth_key(encoder_layers: int, decoder_layers: int) -> str:
    """The configs' depth key: "18", or "60-12" when the stacks differ."""
    return str(encoder_layers) if encoder_layers == decoder_layers else f"{encoder_layers}-{decoder_layers}"


def collect(workdir: Path, config: dict) -> Dict[str, str]:
    """Write ``results.md`` and ``results.csv`` (method x depth: mean BLEU over seeds, paper, difference, the runs'
    environment) and ``runs.csv`` (a row a run: seed, BLEU, environment, training command)."""
    metric = config["bleu"]
    cells: Dict[tuple, dict] = {}
    runs = []  # one row a run: its seed, BLEU, environment and training command
    for directory in sorted(p for p in Path(workdir).iterdir() if p.is_dir()):
        match = re.fullmatch(r"(\w+?)_(\d+)L(?:-(\d+)L)?_seed(\d+)", directory.name)
        if not match:
            continue
        method, encoder, decoder, seed = match.groups()
        cell = cells.setdefault((method, int(encoder), int(decoder or encoder)),
                                {"bleu": [], "diverged": 0, "environments": []})
        diverged, scored = (directory / "diverged").exists(), (directory / "scores.json").exists()
        bleu = json.loads((directory / "scores.json").read_text())[metric] if scored and not diverged else None
        cell["diverged"] += diverged
        if bleu is not None:
            cell["bleu"].append(bleu)
        environment = (json.loads((directory / "environment.json").read_text())
                       if (directory / "environment.json").exists() else {})
        cell["environments"].append(environment)
        status = DIVERGED if diverged else "done" if bleu is not None else "incomplete"
        runs.append({"method": method, "depth": depth_key(int(encoder), int(decoder or encoder)), "seed": int(seed),
                     "bleu": bleu, "status": status, **{key: environment.get(key) for key in ENVIRONMENT},
                     "command": environment.get("command")})
    paper = {method: {str(k): v for k, v in depths.items()} for method, depths in config.get("paper", {}).items()}
    rows = []
    for (method, encoder, decoder), cell in sorted(cells.items()):
        depth = depth_key(encoder, decoder)
        published = paper.get(method, {}).get(depth)
        ours: Optional[float] = round(sum(cell["bleu"]) / len(cell["bleu"]), 2) if cell["bleu"] else None
        status = DIVERGED if cell["diverged"] else ("done" if ours is not None else "incomplete")
        difference = round(ours - published, 2) if ours is not None and isinstance(published, (int, float)) else None
        rows.append({"method": method, "depth": depth, "seeds": len(cell["bleu"]) + cell["diverged"],
                     "bleu": ours, "paper": published, "difference": difference, "status": status,
                     **{key: distinct(e.get(key) for e in cell["environments"]) for key in ENVIRONMENT}})
    csv_path, markdown_path = Path(workdir) / "results.csv", Path(workdir) / "results.md"
    runs_path = Path(workdir) / "runs.csv"
    for path, table in ((csv_path, rows), (runs_path, runs)):
        with open(path, "w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=list(table[0]) if table else ["method"])
            writer.writeheader()
            writer.writerows(table)
    lines = [f"### {config['table']}", "", f"BLEU: {metric}", "",
             "| method | depth | seeds | ours | paper | difference |", "|---|---|---|---|---|---|"]
    for row in rows:
        ours = DIVERGED if row["status"] == DIVERGED else ("–" if row["bleu"] is None else f"{row['bleu']:.2f}")
        paper_value = "–" if row["paper"] is None else row["paper"]
        difference = "" if row["difference"] is None else f"{row['difference']:+.2f}"
        lines.append(f"| {row['method']} | {row['depth']} | {row['seeds']} | {ours} | {paper_value} | {difference} |")
    environments = [run for run in runs if run["commit"] is not None]
    if environments:
        values = {key: distinct(run[key] for run in environments) for key in ENVIRONMENT}
        lines += ["", f"Trained at commit {values['commit']} with torch {values['torch']}, fairseq {values['fairseq']}, "
                      f"Python {values['python']} on {values['device']} ({values['threads']} threads a process); "
                      f"each run's seed, environment and training command: runs.csv."]
    markdown_path.write_text("\n".join(lines) + "\n")
    return {"csv": str(csv_path), "markdown": str(markdown_path), "runs": str(runs_path)}


def distinct(values) -> Optional[str]:
    """The different values among ``values`` (None left out), joined by " / "; None where there are none."""
    found = list(dict.fromkeys(str(value) for value in values if value is not None))
    return " / ".join(found) if found else None


class OneLineParser(argparse.ArgumentParser):
    """A bad flag is refused in one line naming it (argparse prints its whole usage first)."""

    def error(self, message):
        raise SystemExit(f"deepnmt: error: {message}")


def depth_argument(text: str) -> str:
    """``18``, or encoder-decoder ``60-12``: layer counts of at least 1."""
    try:
        layers = parse_depth(text)
    except ValueError:
        layers = (0,)
    if min(layers) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a depth: give a layer count (18) or encoder-decoder (60-12)")
    return text


def count_argument(text: str) -> int:
    """An integer of at least 0 (GPUs, seeds)."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of 0 or more")
    return value


def parse_arguments(argv=None):
    parser = OneLineParser("python -m deepnmt_plugin.reproduce", description=__doc__.split("\n\n")[0])
    parser.add_argument("config", help="a table's config, e.g. configs/admin_wmt14_en_de.yaml")
    parser.add_argument("--data", required=True, help="a data-prep output (holding data-bin/) or a data-bin folder")
    parser.add_argument("--gpus", type=count_argument, default=1,
                        help="GPUs on this node (fairseq's --distributed-world-size)")
    parser.add_argument("--nnodes", type=count_argument, default=1,
                        help="nodes training together: each runs this command with its --node-rank, under torchrun")
    parser.add_argument("--node-rank", type=count_argument, default=0, help="this node's rank, 0 .. --nnodes - 1")
    parser.add_argument("--master-addr", help="the address of node 0 (with --nnodes above 1)")
    parser.add_argument("--master-port", type=count_argument, default=29500, help="a free port on node 0")
    parser.add_argument("--precision", choices=["fp16", "bf16", "fp32"], help="default: fp16 on CUDA, fp32 on CPU")
    parser.add_argument("--methods", nargs="+", help="subset of the table's methods")
    parser.add_argument("--depths", nargs="+", type=depth_argument,
                        help="subset of depths: 6 18 or encoder-decoder 60-12")
    parser.add_argument("--seeds", nargs="+", type=count_argument, help="seeds (default: the config's, else 1)")
    parser.add_argument("--workdir", default="runs", help="where runs, logs and results go")
    parser.add_argument("--dry-run", action="store_true", help="print every command, run nothing")
    parser.add_argument("--smoke", action="store_true",
                        help="64-128-2 models, 20 updates, the last 2 update checkpoints averaged: checks the pipeline "
                             "(on the CPU, or on one GPU where there is one)")
    args = parser.parse_args(argv)
    if args.nnodes < 1:
        parser.error("--nnodes must be at least 1")
    if args.node_rank >= args.nnodes:
        parser.error(f"--node-rank {args.node_rank} is not below --nnodes {args.nnodes}")
    if args.nnodes > 1 and not args.master_addr:
        parser.error("--nnodes above 1 needs --master-addr, the address of node 0")
    if not 1 <= args.master_port <= 65535:  # 0, "any free port", is one no other node could know
        parser.error(f"--master-port {args.master_port} is not a TCP port every node can reach: give one of 1 to 65535")
    return args


def main(argv=None) -> int:
    args = parse_arguments(argv)
    config = load_config(args.config)
    # absolute, so each fairseq command and message names the folder meant, taken from where this was called
    args.data = os.path.abspath(args.data)
    args.data_bin = data_bin(args.data, must_exist=not args.dry_run, folder=config.get("data_bin", "data-bin"))
    # a smoke run is not the table's run: it has a folder of its own, so a full run never finds its steps done
    args.workdir = os.path.join(os.path.abspath(args.workdir), Path(args.config).stem + ("_smoke" * args.smoke))
    with compat.writing(args.workdir):
        Reproduction(config, args).run_all()
    return 0


if __name__ == "__main__":
    sys.exit(stop_on_ctrl_c(main))
