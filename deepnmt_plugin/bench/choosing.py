"""``choosing.md``: which recipe at which depth, written from the depth study's cells by the study's driver.

For each stack shape the recipes ranked by mean test sacreBLEU over their seeds, with the spread, the cells' verdicts,
peak memory and time per update, whether the model exports to stock fairseq and CTranslate2, and the schedule it was
trained with; then the reading of each shape by one rule (``reading``), so that every sentence follows from its table.
Also the README's depth-study table (``depth_table``): every recipe by every shape.

``python -m deepnmt_plugin.bench.from_cells`` rewrites ``docs/choosing.md`` and the README's table from the committed
cells (``docs/depth_study/cells``); tests/test_bench.py fails when either differs from what it writes.
"""

import statistics
from pathlib import Path
from typing import Dict, List, Tuple

from deepnmt_plugin.bench.runs import DIVERGED, IGNORES_SOURCE, METHOD_FLAGS, METHODS, STALLED
from deepnmt_plugin.models.method import METHODS as RECIPES

#: a recipe is far behind at a shape when its mean is below this share of the shape's best mean
FAR_BEHIND = 0.5


def exports(method: str) -> bool:
    """Whether ``deepnmt-export`` writes the method's model as stock fairseq (and from there CTranslate2)."""
    arch = METHODS[method]
    if arch == "transformer":
        return True
    return RECIPES[arch.removeprefix("transformer_")].export_refusal is None


def bleus(group: List[dict]) -> List[float]:
    return [0.0 if r["test_bleu"] is None else r["test_bleu"] for r in group]  # a diverged seed translates nothing


def failures(group: List[dict]) -> List[str]:
    """The verdicts of the group's seeds that mean it learned no translation."""
    return [r["verdict"] for r in group if r["verdict"] in (STALLED, IGNORES_SOURCE) or r["status"] == DIVERGED]


def ranked(groups: Dict[Tuple[str, int, int], List[dict]], shape: Tuple[int, int]) -> List[Tuple[str, List[dict]]]:
    rows = [(method, group) for (method, encoder, decoder), group in groups.items() if (encoder, decoder) == shape]
    return sorted(rows, key=lambda row: -statistics.mean(bleus(row[1])))


def mean_sd(values: List[float]) -> str:
    return f"{statistics.mean(values):.2f}" + (f" ± {statistics.stdev(values):.2f}" if len(values) > 1 else "")


def reading(rows: List[Tuple[str, List[dict]]]) -> List[str]:
    """The rule: the best is the highest mean; the others whose mean plus its standard deviation reaches the best mean
    less its standard deviation, and none of whose seeds failed, are level with it; a recipe failed where a seed learned
    no translation (stalled, ignores the source, diverged); it is far behind where its mean is below FAR_BEHIND of the
    best's."""
    best_method, best_group = rows[0]
    best = statistics.mean(bleus(best_group))
    best_sd = statistics.stdev(bleus(best_group)) if len(best_group) > 1 else 0.0
    level = [method for method, group in rows[1:]
             if statistics.mean(bleus(group)) + (statistics.stdev(bleus(group)) if len(group) > 1 else 0)
             >= best - best_sd and not failures(group)]
    failing = [method for method, group in rows if failures(group)]
    behind = [method for method, group in rows if not failures(group) and statistics.mean(bleus(group)) < FAR_BEHIND * best]
    seeds = f"{len(best_group)} seeds" if len(best_group) > 1 else "one seed"
    lines = [f"- Best: **{best_method}**, {mean_sd(bleus(best_group))} ({seeds})."]
    lines.append(f"- Level with it (within one standard deviation): {', '.join(level)}." if level else
                 "- No other recipe is within one standard deviation of it.")
    if failing:
        lines.append(f"- Learned no translation in a seed (stalled, ignores the source or diverged): {', '.join(failing)}.")
    if behind:
        lines.append(f"- Below {FAR_BEHIND:.0%} of the best's BLEU: {', '.join(behind)}.")
    exportable = [method for method, group in rows if exports(method) and method not in failing + behind]
    if not exportable:
        lines.append("- No recipe that exports to stock fairseq and CTranslate2 reaches half the best's BLEU without a "
                     "failed seed.")
    elif exportable[0] != best_method:
        lines.append(f"- Best that exports to stock fairseq and CTranslate2: {exportable[0]}, "
                     f"{mean_sd(bleus(dict(rows)[exportable[0]]))}.")
    return lines


def verdict_counts(group: List[dict]) -> str:
    counts: Dict[str, int] = {}
    for r in group:
        counts[r["verdict"]] = counts.get(r["verdict"], 0) + 1
    return ", ".join(f"{count} {word}" for word, count in counts.items())


#: the README's depth-study table sits between these two lines
TABLE_START, TABLE_END = "<!-- depth-study table: written by python -m deepnmt_plugin.bench.from_cells -->", "<!-- end -->"
#: how a table cell names the seeds that learned no translation: (one seed, several)
FAILURE_WORDS = {STALLED: ("stalled", "stalled"), IGNORES_SOURCE: ("ignores the source", "ignore the source"),
                 DIVERGED: ("diverged", "diverged")}


def recipe_label(method: str) -> str:
    """The method's name, with its arch and flags where they are not ``transformer_<method>``."""
    command = [METHODS[method], *METHOD_FLAGS.get(method, ())]
    return method if command == [f"transformer_{method}"] else f"{method} (`{' '.join(command)}`)"


def table_cell(group: List[dict]) -> str:
    """Mean ± sd of the seeds' test BLEU, the seeds when they are neither one nor three, and each failure's count."""
    seeds = sorted(r.get("seed", 1) for r in group)
    notes = []
    if len(seeds) not in (1, 3):
        contiguous = seeds == list(range(seeds[0], seeds[-1] + 1))
        notes.append(f"seeds {seeds[0]}–{seeds[-1]}" if contiguous else "seeds " + ", ".join(map(str, seeds)))
    for verdict, (one, several) in FAILURE_WORDS.items():
        count = sum((r["status"] == DIVERGED) if verdict == DIVERGED else (r["verdict"] == verdict) for r in group)
        if count:
            notes.append(one if len(group) == 1 else f"{count}/{len(group)} {several}")
    return mean_sd(bleus(group)) + (f" ({'; '.join(notes)})" if notes else "")


def depth_table(groups: Dict[Tuple[str, int, int], List[dict]]) -> List[str]:
    """The README's table: a row per recipe (the study's order), a column per shape; – where a shape was not run."""
    shapes = sorted({(encoder, decoder) for _, encoder, decoder in groups}, key=lambda s: (s[0] + s[1], s[0]))
    methods = [method for method in METHODS if any(key[0] == method for key in groups)]
    lines = ["| method | " + " | ".join(f"{encoder}L-{decoder}L" for encoder, decoder in shapes) + " |",
             "|---|" + "---|" * len(shapes)]
    for method in methods:
        cells = [table_cell(groups[(method, *shape)]) if (method, *shape) in groups else "–" for shape in shapes]
        lines.append(f"| {recipe_label(method)} | " + " | ".join(cells) + " |")
    return lines


def rewrite_table(readme: Path, groups: Dict[Tuple[str, int, int], List[dict]]) -> str:
    """``readme``'s text with the lines between TABLE_START and TABLE_END replaced by ``depth_table``."""
    text = readme.read_text()
    before, rest = text.split(TABLE_START + "\n", 1)
    _, after = rest.split("\n" + TABLE_END, 1)
    return before + TABLE_START + "\n" + "\n".join(depth_table(groups)) + "\n" + TABLE_END + after


def write_choosing(groups: Dict[Tuple[str, int, int], List[dict]], warmup_methods, warmup_updates: int, title: str,
                   path: Path) -> None:
    """``groups``: the study's grid cells by (method, encoder layers, decoder layers), every seed (``over_seeds``)."""
    shapes = sorted({(encoder, decoder) for _, encoder, decoder in groups}, key=lambda s: (s[0] + s[1], s[0]))
    lines = ["# Which recipe at which depth", "",
             "Written by the depth study's driver from its cells (`docs/depth_study/cells`); a test rewrites it from "
             "them and fails on any difference. The study: " + title + ". It is a small-scale study: 64-wide models, "
             "2,000 updates, one small corpus (the pinned l10n German-English corpus), trained on a CPU. It ranks "
             "the recipes' early training at depth, not their BLEU at paper scale; that needs the reproduction "
             "scripts on GPUs (docs/reproduce.md).", "",
             "Each shape's table ranks the recipes by mean test sacreBLEU over their seeds (± the standard deviation; a "
             "diverged seed counts as 0). Verdicts are the study's (docs/depth_study/README.md). s/update is the "
             "study's own measure (one CPU thread per cell, beside another cell: a rough relative cost, not a "
             "benchmark); peak RSS is the training process's. Exports: whether `deepnmt-export` writes the model as "
             "stock fairseq, and from there CTranslate2. Schedule: the study's inverse-sqrt warmup of "
             f"{warmup_updates} updates, or none (the recipes proposed to need none)."]
    for shape in shapes:
        rows = ranked(groups, shape)
        lines += ["", f"## {shape[0]}L-{shape[1]}L", "",
                  "| rank | recipe | test sacreBLEU | seeds | verdicts | s/update | peak RSS (GiB) | exports | schedule |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for rank, (method, group) in enumerate(rows, 1):
            recipe = f"{method} (`{' '.join([METHODS[method], *METHOD_FLAGS.get(method, ())])}`)"
            lines.append(
                f"| {rank} | {recipe} | {mean_sd(bleus(group))} | {len(group)} | {verdict_counts(group)} | "
                f"{statistics.mean(r['seconds_per_update'] for r in group):.3f} | "
                f"{max(r['peak_rss_gib'] for r in group)} | {'yes' if exports(method) else 'no'} | "
                f"{'warmup' if method in warmup_methods else 'none'} |")
        lines += ["", *reading(rows)]
    lines += ["", f"Rule of each reading: the best is the highest mean; a recipe is level with it when its mean plus its "
              f"standard deviation reaches the best's mean less the best's standard deviation and no seed of it "
              f"failed; a recipe learned no translation where a seed stalled, ignores the source or diverged; it is far "
              f"behind where its mean is below {FAR_BEHIND:.0%} of the best's (`deepnmt_plugin/bench/choosing.py`)."]
    path.write_text("\n".join(lines) + "\n")
