"""What the depth sweep (``depth.py``) and the depth study (``study.py``) share about a training run: the methods and
their plot style, what its fairseq-train log says (curves, outcome), the verdict that reads it, and a lock per cell.

A verdict says what a run did, in words that match its numbers: ``diverged``, ``crashed``, ``stalled at the unigram
plateau`` (its last validation loss is less than PLATEAU_MARGIN below the loss of a model that predicts the target
words' frequencies and ignores the source, or above it), ``ignores the source`` (below the plateau, yet the same few sentences for every test input: a target-side
language model), ``still learning`` (left the plateau and its loss was still falling at the end), ``trained`` (left
it and its loss had flattened) or ``left the plateau`` (no validation curve to tell which of the two).
"""

import contextlib
import fcntl
import math
import os
import re
import sys
from pathlib import Path
from typing import List, Optional

import numpy as np

from deepnmt_plugin.bench import pyplot
from deepnmt_plugin.reproduce import DIVERGED, diverged_log

METHODS = {  # method -> arch; the benchmarks' dims override every size the arch names
    "postln": "transformer",
    "preln": "transformer_preln",
    "admin": "transformer_admin",
    "deepnorm": "transformer_deepnorm",
    "tfixup": "transformer_tfixup",
    "subln": "transformer_subln",
    "b2t": "transformer_b2t",
    "resi_dual": "transformer_resi_dual",
    "dlcl": "transformer_dlcl",
    "rezero": "transformer_rezero",
    "dsinit": "transformer_dsinit",
    "periln": "transformer_periln",
    "mixln": "transformer_mixln",
    "lns": "transformer_lns",
    "dyt": "transformer_dyt",
    "hybridnorm": "transformer_hybridnorm",
    "denseformer": "transformer_denseformer",
    "sigma": "transformer_sigma",
    "hyper": "transformer_hyper",
    "mhc": "transformer_hyper",
}
METHOD_FLAGS = {"mhc": ("--hyper-sinkhorn-iters", "20")}  # a method that is an arch and flags: mHC, the paper's 20


def arch_flags(method: str) -> List[str]:
    """The fairseq-train flags that choose a benchmark method's model."""
    return ["--arch", METHODS[method], *METHOD_FLAGS.get(method, ())]
FOUNDING = ("postln", "preln", "admin", "deepnorm", "tfixup")  # solid lines in the plots
RECENT = ("periln", "mixln", "lns", "dyt", "hybridnorm", "denseformer", "sigma", "hyper", "mhc")  # the 2024-2026 recipes: dotted; the 2019-2023 ones dashed
FINISHED, FAILED = "finished", "failed"  # a run's outcome besides DIVERGED: it ran to its end, or it crashed
LABEL_SMOOTHING = 0.1  # every benchmark run's; the unigram plateau depends on it
STALLED, STILL_LEARNING, TRAINED = "stalled at the unigram plateau", "still learning", "trained"
LEFT_PLATEAU, CRASHED, IGNORES_SOURCE = "left the plateau", "crashed", "ignores the source"
# bits above the plateau's loss still count as on it: Admin 50L-50L ends 0.07 below it, translating nothing (BLEU 0.02)
PLATEAU_MARGIN = 0.15
# the validation loss fell by more than this fraction over the last quarter of the updates: more updates would help
STILL_FALLING = 0.02
# a model that writes the same few sentences for every input ignores its source, whatever its loss (below the
# plateau's: a target-side language model, as B2T 100L-100L is at update 2,000: valid loss 6.48, one sentence for all)
FEWEST_DISTINCT = 0.05
VERDICT_RULES = (f"stalled when the last validation loss is less than {PLATEAU_MARGIN} below the plateau's loss (or above "
                 "it: nothing learned beyond the target words' frequencies), ignores the source below it with "
                 f"{FEWEST_DISTINCT:.0%} distinct test hypotheses or fewer, still learning when the validation loss fell "
                 f"more than {STILL_FALLING:.0%} over the last quarter of the updates, trained when it fell less; left "
                 "the plateau where no validation curve is kept")


def method_style(method: str) -> dict:
    """One colour and line style per method in every plot, whichever methods a plot has: the founding recipes solid,
    the 2019-2023 ones dashed (matplotlib's ten colours, then black), the 2024-2026 ones dotted (the ten again)."""
    if method in RECENT:
        return {"color": f"C{RECENT.index(method)}", "linestyle": ":"}
    index = list(METHODS).index(method)
    return {"color": f"C{index}" if index < 10 else "black", "linestyle": "-" if method in FOUNDING else "--"}


def one_point_per_update(points) -> List[List[float]]:
    """[[update, value], ...] in update order, the last value logged for each update: a resumed trainer retrains the
    updates after its checkpoint, and its values, not the killed one's, are the ones the model carries."""
    return [[update, value] for update, value in sorted(dict(points).items())]


def update_norm_curve(log: str) -> List[List[float]]:
    """[[update, update_norm], ...] from the train_inner lines, one per update."""
    return one_point_per_update((int(re.search(r"num_updates=(\d+)", line).group(1)),
                                 float(re.search(r"update_norm=([^,\s]+)", line).group(1)))
                                for line in log.splitlines() if "| train_inner |" in line and "update_norm=" in line)


def final_valid_loss(log: str) -> Optional[float]:
    losses = re.findall(r"\| valid \|.*?\| loss (\S+) \|", log)
    return float(losses[-1]) if losses else None


def valid_loss_curve(log: str) -> List[List[float]]:
    """[[update, validation loss], ...] from fairseq's valid lines, one per validated update."""
    return one_point_per_update((int(update), float(loss)) for loss, update
                                in re.findall(r"\| valid \|.*?\| loss (\S+) \|.*?\| num_updates (\d+)", log))


def classify(log: str, returncode: int) -> str:
    """diverged (the project's rule, or a non-finite validation loss), failed (a crash that is not a
    divergence, e.g. out of memory), or finished."""
    valid_loss = final_valid_loss(log)
    if diverged_log(log) or (valid_loss is not None and not math.isfinite(valid_loss)):
        return DIVERGED
    if returncode != 0 or valid_loss is None:
        return FAILED
    return FINISHED


def unigram_plateau(data_bin: str, label_smoothing: float = LABEL_SMOOTHING) -> float:
    """The label-smoothed validation loss (bits a token, as fairseq logs it) of the best model that ignores the
    source: it predicts the training targets' unigram distribution, smoothed as label smoothing rewards
    (fairseq's loss (1 - eps - eps_i) nll + eps_i sum_v -log q_v, eps_i = eps / (V - 1), is lowest at
    q_v = (1 - eps - eps_i) p_v + eps_i). A run that ends near it has learned no translation."""
    from fairseq.data import Dictionary, data_utils

    folder = Path(data_bin)
    pair = next(folder.glob("train.*-*.*.idx")).name.split(".")[1]  # train.de-en.en.idx -> de-en
    target = pair.split("-")[1]
    dictionary = Dictionary.load(str(folder / f"dict.{target}.txt"))

    def counts(split: str) -> np.ndarray:
        dataset = data_utils.load_indexed_dataset(str(folder / f"{split}.{pair}.{target}"), dictionary)
        return np.bincount(np.concatenate([dataset[i].numpy() for i in range(len(dataset))]), minlength=len(dictionary))

    train, valid = counts("train"), counts("valid")
    eps_i = label_smoothing / (len(dictionary) - 1)
    q = (1 - label_smoothing - eps_i) * train / train.sum() + eps_i
    weights = (1 - label_smoothing - eps_i) * valid / valid.sum() + eps_i
    return float(-(weights * np.log2(q)).sum())

# a method's standing at a depth against its own 6L-6L BLEU after the same updates: it keeps its BLEU at KEEPS of it or
# more, fails below FAILS_BELOW of it (or where a seed learned no translation), and loses BLEU in between
KEEPS, FAILS_BELOW = 0.9, 0.5
KEEPS_BLEU, LOSES_BLEU, FAILS = "keeps its 6L BLEU", "loses BLEU", "fails"
# a cell that does not keep its BLEU at the budget but, trained on under the same schedule, keeps it within this many
# budgets is budget-bound: it fails (or loses BLEU) at the budget, and more updates, not another recipe, mend it
BUDGET_BOUND, BUDGETS_TRAINED_ON = "budget-bound", 3
LEARNED_NOTHING = (STALLED, IGNORES_SOURCE, DIVERGED)


def standing(bleu: float, six_layer_bleu: float, learned_nothing: bool = False) -> str:
    """``bleu`` at a depth against the method's ``six_layer_bleu`` at the same budget (rule above)."""
    if learned_nothing or bleu < FAILS_BELOW * six_layer_bleu:
        return FAILS
    return KEEPS_BLEU if bleu >= KEEPS * six_layer_bleu else LOSES_BLEU


def budget_bound_at(bleu_by_update: dict, six_layer_bleu: float, budget: int) -> Optional[int]:
    """The first update past ``budget``, within BUDGETS_TRAINED_ON budgets, at which a trained-on cell keeps its 6L
    BLEU (its test BLEU by update); None where it does not: then it is not budget-bound."""
    for update in sorted(bleu_by_update):
        if budget < update <= BUDGETS_TRAINED_ON * budget and bleu_by_update[update] >= KEEPS * six_layer_bleu:
            return update
    return None


def verdict(status: str, valid_loss: Optional[float], curve: List[List[float]], plateau: Optional[float],
            distinct_fraction: Optional[float] = None) -> str:
    """What the run did (module docstring), from its outcome, last validation loss, validation curve, the corpus's
    unigram plateau and the fraction of its test hypotheses that differ (None where not generated)."""
    if status == DIVERGED:
        return DIVERGED
    if status == FAILED or valid_loss is None:
        return CRASHED
    if plateau is not None and valid_loss >= plateau - PLATEAU_MARGIN:
        return STALLED
    if distinct_fraction is not None and distinct_fraction <= FEWEST_DISTINCT:
        return IGNORES_SOURCE
    last_update, last_loss = curve[-1] if curve else (0, valid_loss)
    earlier = [loss for update, loss in curve if update <= 0.75 * last_update]
    if not earlier:  # one validation, at the end: no slope to read
        return LEFT_PLATEAU
    return STILL_LEARNING if earlier[-1] - last_loss > STILL_FALLING * earlier[-1] else TRAINED


def plot_vs_depth(by_method: dict, title: str, ylabel: str, path: Path) -> None:
    """One line per method through the mean of its (depth, value) points at each depth, each point a dot where a depth
    has several (seeds): a filled marker for a mean over several, a hollow one for a single run; a value of None (a run
    that diverged or crashed) is an x on the bottom edge."""
    plt = pyplot()

    figure, axes = plt.subplots(figsize=(6, 4))
    for method, points in ((m, sorted(p, key=lambda point: point[0])) for m, p in by_method.items() if p):
        finished = [(depth, value) for depth, value in points if value is not None]
        depths = sorted({depth for depth, _ in finished})
        means = [float(np.mean([value for d, value in finished if d == depth])) for depth in depths]
        line, = axes.plot(depths, means, label=method, **(method_style(method) if method in METHODS else {}))
        runs_at = [sum(d == depth for d, _ in finished) for depth in depths]
        for several, face in ((True, line.get_color()), (False, "none")):
            chosen = [(d, m) for d, m, n in zip(depths, means, runs_at) if (n > 1) == several]
            if chosen:
                axes.plot(*zip(*chosen), "o", color=line.get_color(), markerfacecolor=face)
        if len(finished) > len(depths):
            axes.plot([d for d, _ in finished], [v for _, v in finished], ".", color=line.get_color(), alpha=0.6)
        failed = [depth for depth, value in points if value is None]
        if failed:
            axes.plot(failed, [0] * len(failed), "x", color=line.get_color(), markersize=10, clip_on=False,
                      transform=axes.get_xaxis_transform())
    depths = sorted({depth for points in by_method.values() for depth, _ in points})
    axes.set(title=title, xlabel="layers per stack", ylabel=ylabel, xscale="log")
    axes.set_xticks(depths, [str(d) for d in depths])
    axes.minorticks_off()
    axes.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.0, 1.0))  # beside the axes: no line hidden
    figure.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(figure)


def say(line: str) -> None:
    """One write per line, so the lines of parallel runs do not interleave."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


class CellBusy(Exception):
    """Another driver holds the cell's lock: it trains the cell now."""


@contextlib.contextmanager
def cell_lock(directory: Path):
    """Hold the cell's lock while the cell trains, or raise CellBusy naming the driver that holds it: two drivers on
    one --workdir would train the cell together into one save-dir. The kernel releases an flock when its holder dies,
    kill -9 included, so a lock never outlives its driver."""
    with open(directory / "lock", "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            raise CellBusy(f"another driver (pid {handle.read().strip() or '?'}) trains it") from None
        handle.truncate(0)
        handle.write(str(os.getpid()))
        handle.flush()
        yield


def unfinished(crashed: List[str], busy: List[str]) -> int:
    """A driver's exit status: 1 with one line on stderr naming the cells left without a result, 0 if none."""
    reasons = ([f"{', '.join(crashed)} crashed (not a divergence): see their train.log, then rerun to retry them"]
               if crashed else [])
    reasons += [f"{', '.join(busy)} busy in another driver on this --workdir: rerun once it is done"] if busy else []
    if reasons:
        print("deepnmt: error: " + "; ".join(reasons), file=sys.stderr, flush=True)
    return 1 if reasons else 0
