"""The depth study: ``python -m deepnmt_plugin.bench.depth --preset study --data DIR [--jobs 2]``.

Every method at every depth trains on real text long enough to translate, each under its own paper's
schedule, with the same peak learning rate and token budget: inverse_sqrt warmup for Post-LN, Admin and
DeepNorm (their recipes warm up), ``inverse_sqrt_nowarmup`` (T-Fixup's decay, no warmup) for T-Fixup and
Pre-LN (both papers' claim). A cell is trained -> its last checkpoint generates the test set (beam 4) ->
sacreBLEU; the 1,000-layer cells (DeepNorm and Post-LN at 500L-500L) and a 100L-100L DeepNorm twin train
with ``--checkpoint-activations``, and each cell's peak RSS is measured (``os.wait4``).

Resumable at every level: a cell whose ``result.json`` exists is reused; a cell stopped mid-training
resumes from its ``checkpoint_last.pt`` (fairseq's own resume, saved every ``save_interval`` updates), and one
stopped after the save at its last update is scored, not trained on;
generation and scoring are skipped when their outputs exist; a crashed cell (not a divergence) keeps no
``result.json``: the study names it, exits 1, and the next invocation resumes it. A cell is locked while it trains, so
a second study on the same ``--workdir`` skips it, saying so; its trainer, generate and scoring die with the study,
kill -9 included. ``--jobs N`` trains N cells at once, deepest first, the CPU cores split between them as OMP threads.

Outputs in ``--workdir`` (default ``runs/depth_study``), over every finished cell there, this invocation's and earlier
ones': ``results.csv`` (one row a cell), ``results.md``,
``bleu_vs_depth.png`` (DeepNet Fig. 1/3), ``bleu_by_shape.png`` (with N-M stacks: deep encoders beside the
equal stacks), ``update_norm_<depth>L.png`` (DeepNet Fig. 5: early model
update, each method under its schedule), ``valid_loss_vs_update.png`` (still learning, or stalled),
``samples.md`` (the first test sentences as each cell translated them), ``choosing.md`` (the recipes ranked per
stack shape, ``bench/choosing.py``; not under ``--schedule authors``, whose cells are variants beside the study's)
and, per cell, ``train_command.txt`` (its exact ``fairseq-train``), ``train.log``, ``generate.txt``, ``scores.json``.
"""

import csv
import hashlib
import json
import os
import re
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import List, Optional, Tuple

from deepnmt_plugin.bench import authors_schedules, pyplot
from deepnmt_plugin.bench.choosing import write_choosing
from deepnmt_plugin.bench.runs import (FAILED, FAILS, FINISHED, IGNORES_SOURCE, LABEL_SMOOTHING, METHODS, STALLED,
                                       VERDICT_RULES, CellBusy, arch_flags, cell_lock, classify, final_valid_loss, method_style,
                                       plot_vs_depth, say, unfinished, unigram_plateau, update_norm_curve,
                                       standing, valid_loss_curve, verdict)
from deepnmt_plugin.compat import atomic_write
from deepnmt_plugin.processes import children_stop_with_driver, owned_process, run_owned
from deepnmt_plugin.provenance import provenance, recorded_command
from deepnmt_plugin.reproduce import DIVERGED, USER_DIR, diverged_log, saved_at_budget

RESULT_COLUMNS = ["method", "encoder_layers", "decoder_layers", "seed", "updates", "valid_loss", "test_bleu", "diverged",
                  "peak_rss_gib", "verdict"]
PROGRESS_EVERY = 100
MEASURE_EVERY = 30  # seconds
SAMPLES = 6  # test sentences kept per cell (result.json) and shown in samples.md
PROGRESS_LINE = re.compile(r"\| (?P<kind>train_inner|valid) \|.*?loss[= ](?P<loss>[^,\s|]+).*?num_updates[= ](?P<update>\d+)")
# Every recipe warms up in its authors' training settings but T-Fixup, Pre-LN and σReparam, proposed to need no
# warmup (ReZero's paper makes no such claim for translation; its code publishes no NMT recipe; the 2024-2026 recipes
# were all proposed and trained with a warmup).
WARMUP_METHODS = ("postln", "admin", "deepnorm", "subln", "b2t", "resi_dual", "dlcl", "rezero", "dsinit",
                  "periln", "mixln", "lns", "dyt", "hybridnorm", "denseformer", "hyper", "mhc")


@dataclass(frozen=True)
class StudyPreset:
    depths: tuple
    max_update: int
    max_tokens: int
    lr: float  # the peak, the same for every method
    warmup_updates: int  # inverse_sqrt warmup of WARMUP_METHODS; the decay period of the others' schedule
    embed_dim: int
    ffn_dim: int
    heads: int
    dropout: float
    interval: int  # updates between train_inner lines and update-norm measurements
    save_interval: int  # updates between checkpoints (what an interrupted cell resumes from)
    # (method, encoder layers, decoder layers, updates) trained with --checkpoint-activations, beside the grid; fewer
    # updates than the grid's where the cell costs most of the budget (500L-500L: 80x a 6L-6L update)
    checkpointed: tuple = ()
    # "authors": each method under its authors' optimiser and schedule (bench/authors_schedules.py) instead of the
    # study's, for the variant cells of the recipes that stall under the study's
    schedule: str = "study"


# Chosen on valid BLEU of 6L-6L runs, lr 2e-3 with no warmup (inverse_sqrt_nowarmup, decay period 4000), 1500 updates:
# Pre-LN 10.4 with dropout 0.1, 13.5 without, T-Fixup 16.7 without; 64-dim models learned more per CPU-second than
# 128-dim ones, 1024-token batches more per token than 4096 (lr 1e-3, 500 x 4096 tokens: 4.5).
STUDY = StudyPreset(depths=(6, 18, 50, 100), max_update=2000, max_tokens=1024, lr=2e-3, warmup_updates=500,
                    embed_dim=64, ffn_dim=128, heads=2, dropout=0.0, interval=10, save_interval=100,
                    checkpointed=(("deepnorm", 500, 500, 1000), ("postln", 500, 500, 300), ("deepnorm", 100, 100, 50)))
# checks the pipeline in about a minute: every step of every kind of cell, on any corpus
STUDY_MICRO = StudyPreset(depths=(1, 2), max_update=4, max_tokens=512, lr=2e-3, warmup_updates=2, embed_dim=16,
                          ffn_dim=32, heads=2, dropout=0.1, interval=2, save_interval=2,
                          checkpointed=(("deepnorm", 2, 2, 2),))


@dataclass(frozen=True)
class Cell:
    method: str
    encoder_layers: int
    decoder_layers: int
    checkpoint_activations: bool = False
    max_update: Optional[int] = None  # None: the preset's
    seed: int = 1

    @property
    def name(self) -> str:
        return (f"{self.method}_{self.encoder_layers}L-{self.decoder_layers}L" + ("_ckpt" * self.checkpoint_activations)
                + (f"_seed{self.seed}" if self.seed != 1 else ""))  # seed 1's cells keep the names they had

    @property
    def layers(self) -> int:
        return self.encoder_layers + self.decoder_layers


def budget(preset: StudyPreset) -> dict:
    """What every cell's result depends on besides the cell itself (its method, depth and own updates), so that
    an invocation with other --depths or --methods reuses the cells it shares with an earlier one."""
    kept = {key: value for key, value in asdict(preset).items() if key not in ("depths", "checkpointed")}
    if kept["schedule"] == "study":  # the records written before there was another one stay comparable
        del kept["schedule"]
    return kept


def depth_pairs(depths) -> List[Tuple[int, int]]:
    """(encoder layers, decoder layers) of each entry of a preset's depths: N for N-N, or an (N, M) pair."""
    return [(depth, depth) if isinstance(depth, int) else tuple(depth) for depth in depths]


def cells(preset: StudyPreset, methods, seeds=(1,)) -> List[Cell]:
    """The grid (every depth, method and seed, each once however often it is named), then the checkpointed cells
    (seed 1: each costs hours)."""
    grid = [Cell(method, encoder, decoder, seed=seed) for encoder, decoder in depth_pairs(preset.depths)
            for method in dict.fromkeys(methods) for seed in dict.fromkeys(seeds)]
    return grid + [Cell(method, encoder, decoder, True, updates) for method, encoder, decoder, updates in preset.checkpointed
                   if method in methods]


def schedule(preset: StudyPreset, method: str) -> List[str]:
    """``fairseq-train``'s optimiser, peak lr and lr schedule flags for METHOD's cells."""
    if preset.schedule == "authors":
        return authors_schedules.fairseq_flags(method, preset.max_update)
    adam = ["--optimizer", "adam", "--adam-betas", "(0.9, 0.98)", "--lr", str(preset.lr)]
    if method in WARMUP_METHODS:
        return [*adam, "--lr-scheduler", "inverse_sqrt", "--warmup-updates", str(preset.warmup_updates),
                "--warmup-init-lr", "1e-7"]
    return [*adam, "--lr-scheduler", "inverse_sqrt_nowarmup", "--decay-period", str(preset.warmup_updates)]


def train_command(data_bin: str, cell: Cell, preset: StudyPreset, save_dir: Path, cpu: bool) -> List[str]:
    dims = [f"--{side}-{name}" for side in ("encoder", "decoder") for name in ("embed-dim", "ffn-embed-dim",
                                                                             "attention-heads")]
    sizes = [preset.embed_dim, preset.ffn_dim, preset.heads] * 2
    return [
        sys.executable, "-m", "fairseq_cli.train", data_bin, "--user-dir", USER_DIR, "--task", "translation_deep",
        *arch_flags(cell.method), "--encoder-layers", str(cell.encoder_layers),
        "--decoder-layers", str(cell.decoder_layers), *[str(x) for pair in zip(dims, sizes) for x in pair],
        "--share-all-embeddings", *schedule(preset, cell.method), "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", str(LABEL_SMOOTHING),
        "--dropout", str(preset.dropout), "--max-tokens", str(preset.max_tokens),
        "--max-update", str(cell.max_update or preset.max_update), "--seed", str(cell.seed), "--divergence-guard",
        "--log-format", "simple", "--log-interval", str(preset.interval),
        "--diagnostics-interval", str(preset.interval), "--diagnostics-groups", "update",
        # checkpoint_last.pt (what a stopped cell resumes from) every save_interval updates; fairseq validates at
        # each of these saves and at the end, and not at epoch ends
        "--validate-interval", str(10**6), "--save-dir", str(save_dir), "--no-epoch-checkpoints",
        "--save-interval-updates", str(preset.save_interval), "--keep-interval-updates", "1",
        # the checkpointed cells are the deepest; Post-LN's gradients underflow there (42 s an update instead of 9.8)
        *(["--checkpoint-activations", "--flush-denormal"] if cell.checkpoint_activations else []),
        *(["--cpu"] if cpu else []),
    ]


def generate_command(data_bin: str, checkpoint: Path, cpu: bool) -> List[str]:
    # a model that has not learnt to stop would otherwise decode 200 tokens a sentence
    return [sys.executable, "-m", "fairseq_cli.generate", data_bin, "--user-dir", USER_DIR, "--path", str(checkpoint),
            "--gen-subset", "test", "--beam", "4", "--max-len-a", "1.2", "--max-len-b", "10", "--remove-bpe",
            "--max-tokens", "4096", "--required-batch-size-multiple", "1", *(["--cpu"] if cpu else [])]


def corpus_record(data: str, data_bin: str) -> dict:
    """The checksum of the corpus text a study trains on and whether it is data-prep's pinned l10n corpus; for a
    data-bin without its data-prep text beside it, the checksum of the data-bin's files (``"of": "data-bin"``)."""
    from deepnmt_plugin.data.l10n import corpus_checksum
    from deepnmt_plugin.data.pipeline import DataPrepError

    for folder in dict.fromkeys((Path(data), Path(data_bin).parent)):
        try:
            checksum, pinned = corpus_checksum(folder)
        except DataPrepError:  # not the folder holding the text
            continue
        return {"checksum": checksum, "pinned": pinned}
    files = hashlib.sha256()
    for path in sorted(Path(data_bin).iterdir()):
        if path.is_file():
            files.update(path.name.encode() + b"\0" + path.read_bytes())
    return {"checksum": files.hexdigest(), "pinned": False, "of": "data-bin"}


def run_measured(command: List[str], log_path: Path, environment: dict, label: str, measured) -> tuple:
    """(exit status, seconds, peak RSS in KiB) of ``command``, its output appended to ``log_path`` by the trainer
    itself, so a driver killed mid-cell loses none of its lines (through a pipe, the lines the driver had not yet
    copied died with it, and the log could end before the checkpoint). The driver follows the file for a progress
    line every PROGRESS_EVERY updates and at validation, so a long cell shows where it is, and hands
    ``measured(seconds, peak RSS in KiB)`` the measurements so far every MEASURE_EVERY seconds, so a driver killed
    mid-cell loses at most that much of them."""
    started = last_measured = time.time()
    with open(log_path, "a") as log, open(log_path, errors="replace") as follow:
        follow.seek(0, os.SEEK_END)
        with owned_process(command, stdout=log, stderr=subprocess.STDOUT, env=environment) as process:
            partial = ""
            while True:
                pid, status, usage = os.wait4(process.pid, os.WNOHANG)  # this child's own rusage once it ends
                partial += follow.read()
                *lines, partial = partial.split("\n")
                for line in lines:
                    say_progress(line, label)
                if pid:
                    process.returncode = os.waitstatus_to_exitcode(status)
                    break
                if time.time() - last_measured >= MEASURE_EVERY:
                    last_measured = time.time()
                    measured(last_measured - started, peak_rss_kib(process.pid))
                time.sleep(0.5)
    return process.returncode, time.time() - started, usage.ru_maxrss  # Linux: KiB


def peak_rss_kib(pid: int) -> int:
    """The process's peak resident set so far (VmHWM, what ``ru_maxrss`` reports once it ends); 0 where /proc does
    not say."""
    try:
        return int(re.search(r"^VmHWM:\s*(\d+) kB", Path(f"/proc/{pid}/status").read_text(), re.M).group(1))
    except (OSError, AttributeError):
        return 0


def say_progress(line: str, label: str) -> None:
    progress = PROGRESS_LINE.search(line)
    if progress and (progress.group("kind") == "valid" or int(progress.group("update")) % PROGRESS_EVERY == 0):
        say(f"    {label}: {progress.group('kind')} loss {progress.group('loss')} at update {progress.group('update')}")


def seconds_per_update(log: str) -> Optional[float]:
    """1 / median of fairseq's updates per second over the train_inner lines (steady state, no start-up)."""
    rates = [float(value) for value in re.findall(r"\| train_inner \|.*?ups=([\d.]+)", log)]
    rates = [rate for rate in rates if rate > 0]
    return round(1 / statistics.median(rates), 3) if rates else None


def last_update(log: str) -> int:
    updates = re.findall(r"num_updates[= ](\d+)", log)
    return int(updates[-1]) if updates else 0


def run_cell(args, cell: Cell, preset: StudyPreset, threads: Optional[int]) -> dict:
    """Train (resuming), generate, score; returns and keeps the cell's result. CellBusy where another driver holds the
    cell's lock."""
    directory = Path(args.workdir) / cell.name
    directory.mkdir(parents=True, exist_ok=True)
    with cell_lock(directory):
        result_path = directory / "result.json"
        kept = read_record(result_path)  # read under the lock: a driver that held it may have just written it
        if kept is not None:
            return {**kept, **cell_verdict(kept, args.unigram_plateau)}
        save_dir, log_path, progress_path = directory / "checkpoints", directory / "train.log", directory / "train.json"
        environment = {**os.environ, **({"OMP_NUM_THREADS": str(threads)} if threads else {})}
        # what earlier, interrupted invocations measured: the segments' seconds add up, the peak RSS is their max, and
        # the environments they trained under (the first, and any other a resume brought) are the record's
        progress = read_record(progress_path) or {"seconds": 0.0, "rss_kib": 0}
        log = log_path.read_text() if log_path.exists() else ""
        command = train_command(args.data_bin, cell, preset, save_dir, cpu=args.cpu)
        unfinished = progress.get("returncode") != 0 and not diverged_log(log)
        if unfinished and saved_at_budget(command):  # the log holds the final validation: fairseq's precedes its save
            progress, unfinished = {**progress, "returncode": 0}, False
        if unfinished:  # train, or resume
            if not (save_dir / "checkpoint_last.pt").exists():  # a start stopped before its first checkpoint left
                progress, log = {"seconds": 0.0, "rss_kib": 0}, ""  # nothing to resume: this start's record is its own
                log_path.write_text("")
            (directory / "train_command.txt").write_text(recorded_command(command) + "\n")  # the cell's exact fairseq-train
            trained_under = progress.get("environments", [])
            now = provenance(args.cpu, threads)  # read as training starts: a commit made while it trains is not its
            before = {**progress, "environments": trained_under + [now] if now not in trained_under else trained_under}

            def keep(seconds: float, rss_kib: int, returncode: Optional[int] = None) -> dict:
                # the budget and corpus it trains under: a resume under others is refused before it starts (run)
                kept = {**before, "seconds": before["seconds"] + seconds, "rss_kib": max(before["rss_kib"], rss_kib),
                        "returncode": returncode, "budget": budget(preset), "corpus": args.corpus}
                with atomic_write(progress_path) as partial:  # a kill mid-write leaves the last whole measurement
                    Path(partial).write_text(json.dumps(kept))
                return kept

            keep(0.0, 0)
            returncode, seconds, rss_kib = run_measured(command, log_path, environment, cell.name, keep)
            progress = keep(seconds, rss_kib, returncode)
            log = log_path.read_text()
        status = classify(log, progress["returncode"])
        scores = samples = None
        if status == FINISHED:
            generated, scores_path = directory / "generate.txt", directory / "scores.json"
            if not scores_path.exists():
                with open(generated, "w") as out:
                    run_owned(generate_command(args.data_bin, save_dir / "checkpoint_last.pt", args.cpu), check=True,
                              stdout=out, stderr=subprocess.STDOUT, env=environment)
                run_owned([sys.executable, "-m", "deepnmt_plugin.scoring", str(generated), "--source-lang", "de",
                           "--target-lang", "en", "--data-bin", args.data_bin, "--gen-subset", "test",  # all of it
                           "--json", str(scores_path)], check=True, stdout=subprocess.DEVNULL)
            scores = json.loads(scores_path.read_text())
            samples = sample_sentences(generate_lines(generated)) if generated.exists() else None
        result = {
            **asdict(cell), "name": cell.name, "budget": budget(preset), "status": status,
            "updates": last_update(log), "valid_loss": final_valid_loss(log),
            "test_bleu": scores["sacrebleu"] if scores else None, "scores": scores,
            "peak_rss_gib": round(progress["rss_kib"] / 2**20, 2), "seconds": round(progress["seconds"]),
            "seconds_per_update": seconds_per_update(log), "update_norm": update_norm_curve(log),
            # the record alone redraws every plot and table: the log and the generate output need not be kept
            "valid_loss_curve": valid_loss_curve(log), "samples": samples, "log": str(log_path),
            "command": recorded_command(command),
            # train.json without environments: training ended before the driver kept them there; the one read now
            "environment": progress["environments"][0] if "environments" in progress else provenance(args.cpu, threads),
            "corpus": args.corpus,
            **({"resumed_under": progress["environments"][1:]} if len(progress.get("environments", [])) > 1 else {}),
        }
        result.update(cell_verdict(result, args.unigram_plateau))
        if status != FAILED:  # a crash (out of memory, a bad flag) is retried by the next invocation, from its checkpoint
            with atomic_write(result_path) as partial:  # a kill or a full disk mid-write leaves no torn record
                Path(partial).write_text(json.dumps(result, indent=1))
        return result


def read_record(path: Path) -> Optional[dict]:
    """A cell's record (``result.json``, ``train.json``), or None where there is none. A record torn by a crash
    mid-write (written before records were written atomically) is named and read as absent: the driver rebuilds a
    torn result.json from the cell's log and scores, and a torn train.json loses only the seconds it had measured."""
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except json.JSONDecodeError:
        say(f"deepnmt: {path} is torn (a write was cut short); rebuilding it")
        return None


def check_reusable(workdir: Path, plan: List[Cell], preset: StudyPreset, corpus: Optional[dict]) -> None:
    """Stop, before anything trains, where a cell of the plan was finished or started under another budget or on
    another corpus: its number would be reported as this study's, or a resume would mix two budgets in one record."""
    def schedule(kept: dict) -> dict:
        """A started cell's budget but its length: updates up to the stop are the same whatever --max-update the run
        ends at (the study's inverse_sqrt schedules do not read it), so it may resume under another one; the
        authors' cosine schedules do read it."""
        return {key: value for key, value in kept.items() if key != "max_update" or "schedule" in kept}

    for cell in plan:
        for record_name, done, same in (("result.json", "trained", lambda kept: kept),
                                         ("train.json", "started", schedule)):
            path = workdir / cell.name / record_name
            record = read_record(path)
            if record is None or "budget" not in record:  # train.json of a cell started before it kept its budget
                continue
            if same(record["budget"]) != same(budget(preset)):
                raise SystemExit(f"deepnmt: error: {path.parent} was {done} under another budget than "
                                 f"{budget(preset)}; give this study another --workdir")
            if "corpus" in record and (record["corpus"] or {}).get("checksum") != (corpus or {}).get("checksum"):
                raise SystemExit(f"deepnmt: error: {path.parent} was {done} on another corpus (checksum "
                                 f"{(record['corpus'] or {}).get('checksum')}) than this study's "
                                 f"({(corpus or {}).get('checksum')}); give this study another --workdir")


def cell_verdict(result: dict, plateau: float) -> dict:
    """The cell's verdict (``bench.runs.verdict``) and the plateau it was read against, for its record."""
    scores = result["scores"]
    distinct = scores and scores.get("distinct_hypotheses")
    return {"unigram_plateau": round(plateau, 3),
            "verdict": verdict(result["status"], result["valid_loss"], result.get("valid_loss_curve") or [], plateau,
                               distinct / scores["sentences"] if distinct else None)}


def reading(results: List[dict]) -> str:
    """One sentence that reads the cells' verdicts for a newcomer."""
    parts = [f"{r['name']} {r['verdict']}" + ("" if r["test_bleu"] is None else f" (test sacreBLEU {r['test_bleu']:.2f})")
             for r in results]
    sentence = "Reading the table: " + "; ".join(parts) + "."
    if any(r["verdict"] == STALLED for r in results):
        sentence += (f" A cell stalled at the unigram plateau (validation loss {results[0]['unigram_plateau']:.2f}) "
                     "predicts the most frequent target words whatever the source: it has learned no translation.")
    if any(r["verdict"] == IGNORES_SOURCE for r in results):
        sentence += (" A cell that ignores the source has learned what English sentences look like, not what the German "
                     "says: it writes the same few sentences for every input.")
    return sentence


def kept_results(workdir: Path, preset: StudyPreset, corpus: Optional[dict]) -> List[dict]:
    """Every finished cell of ``workdir`` trained under ``preset``'s budget on ``corpus``, in table order: the grid
    by depth and method, then the checkpointed cells."""
    results = [read_record(path) for path in sorted(workdir.glob("*/result.json"))]
    results = [r for r in results if r is not None and r.get("budget") == budget(preset)
               and (r.get("corpus") or {}).get("checksum") == (corpus or {}).get("checksum")]
    return sorted(results, key=lambda r: (r["checkpoint_activations"], r["encoder_layers"], r["decoder_layers"],
                                          list(METHODS).index(r["method"]), r.get("seed", 1)))


def post_ln_failure_depth(results: List[dict]) -> Optional[int]:
    """The smallest depth at which Post-LN fails (``runs.standing``): it diverged, or ended below half its 6L-6L BLEU."""
    post_ln = {r["encoder_layers"]: r for r in results if r["method"] == "postln" and not r["checkpoint_activations"]
               and r["encoder_layers"] == r["decoder_layers"] and r.get("seed", 1) == 1}
    if 6 not in post_ln or post_ln[6]["test_bleu"] is None:
        return None
    for depth in sorted(post_ln):
        run = post_ln[depth]
        if run["status"] == DIVERGED or standing(run["test_bleu"], post_ln[6]["test_bleu"]) == FAILS:
            return depth
    return None


def write_csv(results: List[dict], path: Path) -> None:
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=RESULT_COLUMNS, extrasaction="ignore", lineterminator="\n")
        writer.writeheader()
        for result in results:
            writer.writerow({**result, "seed": result.get("seed", 1), "diverged": result["status"] == DIVERGED,
                             "test_bleu": "" if result["test_bleu"] is None else result["test_bleu"]})


def over_seeds(results: List[dict]) -> dict:
    """{(method, encoder layers, decoder layers): the grid cells of every seed}, in table order."""
    groups: dict = {}
    for r in results:
        if not r["checkpoint_activations"]:
            groups.setdefault((r["method"], r["encoder_layers"], r["decoder_layers"]), []).append(r)
    return groups


def spread(group: List[dict]) -> str:
    """Mean ± standard deviation of the seeds' test BLEU (a diverged seed counts as 0: it translates nothing)."""
    bleus = [0.0 if r["test_bleu"] is None else r["test_bleu"] for r in group]
    return f"{statistics.mean(bleus):.2f}" + (f" ± {statistics.stdev(bleus):.2f}" if len(bleus) > 1 else "")


def write_markdown(results: List[dict], path: Path, title: str) -> None:
    lines = [f"### {title}", "",
             "| cell | updates | valid loss | test sacreBLEU | s/update | peak RSS (GiB) | verdict |",
             "|---|---|---|---|---|---|---|"]
    for r in results:
        bleu = DIVERGED if r["status"] == DIVERGED else f"{r['test_bleu']:.2f}"
        loss = "–" if r["valid_loss"] is None else f"{r['valid_loss']:.3f}"
        lines.append(f"| {r['name']} | {r['updates']} | {loss} | {bleu} | {r['seconds_per_update']} | {r['peak_rss_gib']} "
                     f"| {r['verdict']} |")
    if any(r.get("seed", 1) != 1 for r in results):
        lines += ["", "Over seeds (test sacreBLEU mean ± standard deviation; stalled: at the unigram plateau):", "",
                  "| method | depth | seeds | test sacreBLEU | stalled | ignores the source | diverged |",
                  "|---|---|---|---|---|---|---|"]
        lines += [f"| {method} | {encoder}-{decoder} | {len(group)} | {spread(group)} | "
                  f"{sum(r['verdict'] == STALLED for r in group)}/{len(group)} | "
                  f"{sum(r['verdict'] == IGNORES_SOURCE for r in group)}/{len(group)} | "
                  f"{sum(r['status'] == DIVERGED for r in group)}/{len(group)} |"
                  for (method, encoder, decoder), group in over_seeds(results).items()]
    if any(r["method"] == "postln" and r["encoder_layers"] == 6 for r in results):
        failure = post_ln_failure_depth(results)
        lines += ["", "Post-LN fails (diverges, or ends below half its 6L-6L BLEU) first at "
                  + (f"{failure}L-{failure}L." if failure else "no depth of this study.")]
    if results:
        lines += ["", f"Verdicts against the corpus's unigram plateau (validation loss {results[0]['unigram_plateau']:.3f}): "
                  f"{VERDICT_RULES}."]
    path.write_text("\n".join(lines) + "\n")


def sample_sentences(sentences: dict, count: int = SAMPLES) -> List[dict]:
    """The first ``count`` of ``generate_lines``' sentences, as kept in a cell's result.json."""
    return [{"id": number, **sentences[number]} for number in sorted(sentences)[:count]]


def kept_samples(result: dict, workdir: Path) -> dict:
    """{sentence id: {"S", "T", "H"}}: the cell's kept samples, else those of its generate.txt, else none."""
    if result.get("samples"):
        return {sample["id"]: {key: sample[key] for key in "STH"} for sample in result["samples"]}
    generated = workdir / result["name"] / "generate.txt"
    return generate_lines(generated) if generated.exists() else {}


def write_samples(results: List[dict], workdir: Path, path: Path, count: int = SAMPLES) -> None:
    """The first ``count`` test sentences as each converged cell translated them: BLEU is read beside them."""
    outputs = {r["name"]: kept_samples(r, workdir) for r in results if r["status"] == FINISHED}
    outputs = {name: output for name, output in outputs.items() if output}
    if not outputs:
        return
    first = next(iter(outputs.values()))
    lines = ["### Sample test translations (detokenization aside, as scored)", ""]
    for sentence in sorted(first)[:count]:
        lines += [f"- source: {first[sentence]['S']}", f"  - reference: {first[sentence]['T']}"]
        lines += [f"  - {name}: {output.get(sentence, {}).get('H', '–')}" for name, output in outputs.items()]
    path.write_text("\n".join(lines) + "\n")


def generate_lines(path: Path) -> dict:
    """{sentence id: {"S": source, "T": reference, "H": hypothesis}} from fairseq-generate's output."""
    sentences: dict = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        kind, _, rest = line.partition("-")
        if kind in ("S", "T", "H") and rest[:1].isdigit():
            number, *fields = rest.split("\t")
            sentences.setdefault(int(number), {})[kind] = fields[-1]
    return sentences


def plot_by_shape(groups: dict, path: Path) -> None:
    """Deep encoders with shallow decoders (N-M) beside the equal stacks up to the first as deep as their deepest
    encoder: per method a group of stack shapes, each the mean over seeds (large marker) and the seeds (dots); x on
    the bottom edge: diverged. groups: over_seeds() of the results."""
    plt = pyplot()
    deepest_encoder = max(encoder for _, encoder, decoder in groups if encoder != decoder)
    cut_off = min((encoder for _, encoder, decoder in groups if encoder == decoder >= deepest_encoder),
                  default=deepest_encoder)
    shapes = sorted({(encoder, decoder) for _, encoder, decoder in groups if encoder <= cut_off})
    methods = [m for m in METHODS if any(method == m for method, _, _ in groups)]
    figure, axes = plt.subplots(figsize=(10, 4))
    for index, shape in enumerate(shapes):
        colour, offset = plt.cm.viridis(index / max(1, len(shapes) - 1)), 0.8 * (index + 0.5) / len(shapes) - 0.4
        marker, label = "o" if shape[0] == shape[1] else "s", f"{shape[0]}-{shape[1]}"
        for position, method in enumerate(methods):
            cells = groups.get((method, *shape), [])
            bleus = [r["test_bleu"] for r in cells if r["status"] != DIVERGED]
            if bleus:
                axes.plot([position + offset] * len(bleus), bleus, ".", color=colour, alpha=0.6)
                axes.plot(position + offset, statistics.mean(bleus), marker, color=colour, markersize=7, label=label)
                label = None  # one legend entry a shape
            if len(bleus) < len(cells):
                axes.plot(position + offset, 0, "x", color=colour, markersize=9, clip_on=False,
                          transform=axes.get_xaxis_transform())
    axes.set(title="Test sacreBLEU by stack shape", ylabel="sacreBLEU")
    axes.set_ylim(bottom=0)
    axes.set_xticks(range(len(methods)), methods)
    axes.legend(title="encoder-decoder\nlayers", fontsize="small", loc="upper left", bbox_to_anchor=(1.0, 1.0))
    figure.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(figure)


def depth_curve_cells(results: List[dict]) -> List[dict]:
    """The equal-stack cells drawn against depth: every plain one, and a checkpointed one only where no plain cell of
    its shape and seed is (500L). The 100L twin measures memory and time over its own, shorter budget; drawn, it would
    add its 50-update BLEU to DeepNorm's 100L mean, whatever --depths the drawing invocation names."""
    equal = [r for r in results if r["encoder_layers"] == r["decoder_layers"]]
    plain = {(r["method"], r["encoder_layers"], r.get("seed", 1)) for r in equal if not r["checkpoint_activations"]}
    return [r for r in equal
            if not r["checkpoint_activations"] or (r["method"], r["encoder_layers"], r.get("seed", 1)) not in plain]


def write_plots(results: List[dict], workdir: Path, preset: StudyPreset) -> List[Path]:
    plt = pyplot()

    every_seed = depth_curve_cells(results)
    by_method = {m: [(r["encoder_layers"], None if r["status"] == DIVERGED else r["test_bleu"]) for r in every_seed
                     if r["method"] == m] for m in METHODS}
    written = [workdir / "bleu_vs_depth.png"]
    plot_vs_depth(by_method, "Test sacreBLEU vs depth (N = M; filled: mean over seeds, dots: the seeds; hollow: one "
                  "seed; x on the bottom edge: diverged)", "sacreBLEU", written[0])
    plotted = [r for r in every_seed if r.get("seed", 1) == 1]  # the curves: one line a method

    groups = over_seeds(results)
    if any(encoder != decoder for _, encoder, decoder in groups):
        written.append(workdir / "bleu_by_shape.png")
        plot_by_shape(groups, written[-1])

    for depth in sorted({r["encoder_layers"] for r in plotted}):
        figure, axes = plt.subplots(figsize=(6, 4))
        for run in (r for r in plotted if r["encoder_layers"] == depth and r["update_norm"]):
            steps, values = zip(*run["update_norm"])
            warmup = ("authors' schedule" if preset.schedule == "authors" else
                      f"warmup {preset.warmup_updates}" if run["method"] in WARMUP_METHODS else "no warmup")
            axes.plot(steps, values, **method_style(run["method"]),
                      label=f"{run['method']} ({warmup})" + ("" if run["status"] == FINISHED else ", diverged"))
        axes.set(title=f"Model update, {depth}L-{depth}L, each method under its own schedule", xlabel="update",
                 ylabel="||F(x, θ_t) − F(x, θ_0)||", yscale="log")
        axes.set_xlim(0, 2 * preset.warmup_updates)  # early training: warmup and as long again
        axes.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.0, 1.0))  # beside the axes: no curve hidden
        written.append(workdir / f"update_norm_{depth}L.png")
        figure.savefig(written[-1], dpi=100, bbox_inches="tight")
        plt.close(figure)

    # whether a cell that ends low is still learning (needs more updates) or stalled (at the unigram loss)
    curves = {}
    for run in plotted:
        log = workdir / run["name"] / "train.log"
        curves[run["name"]] = run.get("valid_loss_curve") or (valid_loss_curve(log.read_text()) if log.exists() else [])
    depths = sorted({r["encoder_layers"] for r in plotted if curves[r["name"]]})  # a panel per depth with curves
    if not depths:
        return written
    plateau = next((r["unigram_plateau"] for r in plotted if r.get("unigram_plateau")), None)
    figure, panels = plt.subplots(1, len(depths), figsize=(3.2 * len(depths), 3.6), sharey=True, squeeze=False)
    labels = {}  # one legend for all panels, beside them: a method's style is the same in each
    for axes, depth in zip(panels[0], depths):
        for run in (r for r in plotted if r["encoder_layers"] == depth and curves[r["name"]]):
            line, = axes.plot(*zip(*curves[run["name"]]), **method_style(run["method"]))
            labels.setdefault(run["method"], line)
            if run["status"] != FINISHED:  # diverged or crashed: an x where its curve ends
                axes.plot(*curves[run["name"]][-1], "x", color=line.get_color(), markersize=8)
        if plateau is not None:
            line = axes.axhline(plateau, color="grey", linewidth=0.8, linestyle="-.")
            labels.setdefault(f"unigram plateau ({plateau:.3f})", line)
        axes.set(title=f"{depth}L-{depth}L", xlabel="update")
    panels[0][-1].legend(list(labels.values()), list(labels), fontsize="x-small", loc="upper left",
                         bbox_to_anchor=(1.02, 1.0))
    panels[0][0].set_ylabel("validation loss (label-smoothed, bits)")
    figure.suptitle("Validation loss vs update, each method under its own schedule (x: diverged)", y=1.02)
    written.append(workdir / "valid_loss_vs_update.png")
    figure.savefig(written[-1], dpi=100, bbox_inches="tight")
    plt.close(figure)
    return written


def study_title(preset: StudyPreset) -> str:
    if preset.schedule == "authors":
        return (f"Depth study: {preset.embed_dim}-{preset.ffn_dim}-{preset.heads}, {preset.max_update} updates x "
                f"{preset.max_tokens} tokens, each method under its authors' optimiser and schedule: "
                + "; ".join(authors_schedules.describe(method, preset.max_update)
                            for method in authors_schedules.SCHEDULES))
    return (f"Depth study: {preset.embed_dim}-{preset.ffn_dim}-{preset.heads}, peak lr {preset.lr:g}, "
            f"{preset.max_update} updates x {preset.max_tokens} tokens, warmup {preset.warmup_updates} for "
            f"{', '.join(WARMUP_METHODS)}, none for the others")


def run(args, preset: StudyPreset, threads: Optional[int]) -> int:
    """The study's driver, called by ``bench.depth.main`` with its parsed arguments."""
    from concurrent.futures import ThreadPoolExecutor

    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    plan = cells(preset, args.methods, args.seeds)
    title = study_title(preset)
    args.unigram_plateau = unigram_plateau(args.data_bin)
    args.corpus = corpus_record(args.data, args.data_bin)
    check_reusable(workdir, plan, preset, args.corpus)
    corpus = (f"its text unknown (no data-prep output beside the data-bin), data-bin checksum {args.corpus['checksum']}"
              if args.corpus.get("of") == "data-bin" else
              f"checksum {args.corpus['checksum']} ({'the pinned one' if args.corpus['pinned'] else 'NOT the pinned one'})")
    say(f"{title}: {len(plan)} cells in {workdir}, {args.jobs} at a time; the corpus: {corpus}, its unigram plateau "
        f"at validation loss {args.unigram_plateau:.3f}")
    order = sorted(plan, key=lambda cell: -cell.layers)  # deepest first: no long cell is left alone at the end

    def run_and_report(index, cell):
        label = f"[{index}/{len(plan)}] {cell.name}"
        say(f"{label} ...")
        try:
            result = run_cell(args, cell, preset, threads)
        except CellBusy as busy:
            say(f"{label}: busy, {busy}; skipped")
            return None
        bleu = "–" if result["test_bleu"] is None else f"{result['test_bleu']:.2f}"
        say(f"{label}: {result['verdict']} after {result['updates']} updates, test sacreBLEU {bleu}, "
            f"{result['seconds_per_update']} s/update, peak RSS {result['peak_rss_gib']} GiB (log: {result['log']})")
        return result

    with ThreadPoolExecutor(max_workers=args.jobs) as workers, children_stop_with_driver():
        outcomes = list(workers.map(run_and_report, range(1, len(order) + 1), order))
    busy = [cell.name for cell, result in zip(order, outcomes) if result is None]
    failed = [result["name"] for result in outcomes if result and result["status"] == FAILED]
    results = kept_results(workdir, preset, args.corpus)  # this invocation's cells and those of earlier ones
    for result in results:  # records written under an earlier rule are brought to today's
        fresh = cell_verdict(result, args.unigram_plateau)
        if any(result.get(key) != value for key, value in fresh.items()):
            result.update(fresh)
            with atomic_write(workdir / result["name"] / "result.json") as partial:
                Path(partial).write_text(json.dumps(result, indent=1))
    write_csv(results, workdir / "results.csv")
    write_markdown(results, workdir / "results.md", title)
    if preset.schedule == "study":  # the page ranks recipes under one schedule: the study's
        write_choosing(over_seeds(results), WARMUP_METHODS, preset.warmup_updates, title, workdir / "choosing.md")
    write_samples(results, workdir, workdir / "samples.md")
    plots = write_plots(results, workdir, preset)
    say(f"wrote {workdir / 'results.csv'}, {workdir / 'results.md'} and {len(plots)} plots")
    say((workdir / "results.md").read_text())
    say(reading([r for r in results if r["name"] in {cell.name for cell in plan}]))
    return unfinished(failed, busy)
