"""``choosing.md``: which recipe at which depth, written from the depth study's cells by the study's driver.

For each stack shape the recipes ranked by mean test sacreBLEU over their seeds, with the spread, the cells' verdicts,
peak memory and time per update, whether the model exports to stock fairseq and CTranslate2, and the schedule it was
trained with; then the reading of each shape by one rule (``reading``), so that every sentence follows from its table.
Also the README's depth-study block (``readme_block``): what the study is, every recipe by every shape
(``depth_table``) and each shape's findings by the same rules (``findings``), and the report's list of budget-bound
cells (``budget_bound_lines``), from the cells trained on past the budget.

``python -m deepnmt_plugin.bench.from_cells`` rewrites ``docs/choosing.md``, the README's block and the report's list
from the committed records (``docs/depth_study/cells``, ``docs/depth_study/extended``); tests/test_bench.py fails when
any differs from what it writes.
"""

import json
import re
import statistics
import textwrap
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Tuple

from deepnmt_plugin.bench.runs import (BUDGET_BOUND, BUDGETS_TRAINED_ON, DIVERGED, FAILS, FAILS_BELOW, IGNORES_SOURCE,
                                       KEEPS, KEEPS_BLEU, LOSES_BLEU, METHOD_FLAGS, METHODS, STALLED, budget_bound_at,
                                       standing)
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


def sd(group: List[dict]) -> float:
    return statistics.stdev(bleus(group)) if len(group) > 1 else 0.0


def level_with_best(rows: List[Tuple[str, List[dict]]]) -> List[str]:
    """The recipes after the best (``rows[0]``) whose mean plus its standard deviation reaches the best mean less its
    standard deviation, and none of whose seeds failed."""
    best_group = rows[0][1]
    floor = statistics.mean(bleus(best_group)) - sd(best_group)
    return [method for method, group in rows[1:]
            if statistics.mean(bleus(group)) + sd(group) >= floor and not failures(group)]


def reading(rows: List[Tuple[str, List[dict]]]) -> List[str]:
    """The rule: the best is the highest mean; the others level with it (``level_with_best``); a recipe failed where a
    seed learned no translation (stalled, ignores the source, diverged); it is far behind where its mean is below
    FAR_BEHIND of the best's."""
    best_method, best_group = rows[0]
    best = statistics.mean(bleus(best_group))
    level = level_with_best(rows)
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


#: the README's depth-study block, and the report's list of budget-bound cells, sit between a start line and END
README_START = "<!-- depth-study block: written by python -m deepnmt_plugin.bench.from_cells -->"
BUDGET_BOUND_START = "<!-- budget-bound cells: written by python -m deepnmt_plugin.bench.from_cells -->"
#: the report's per-seed tables: the start line names the table's recipes, then (after "beside") the ones to compare,
#: in row order; the columns are the shapes the recipes ran
SEED_ONE_START = "<!-- seed-1 table: written by python -m deepnmt_plugin.bench.from_cells -->"
#: a per-seed table's marker: its recipes, those beside them and, optionally, its shapes ("at 6L-6L 18L-18L")
SEED_TABLE_START = re.compile(r"<!-- seeds of ([a-z0-9_ ]+?)(?: beside ([a-z0-9_ ]+?))?(?: at ([0-9L\- ]+))?: "
                              r"written by python -m deepnmt_plugin.bench.from_cells -->")
#: a seed-1 value table's marker: the record's key and the methods
SEED_ONE_VALUES_START = re.compile(r"<!-- seed-1 (valid_loss|peak_rss_gib) of ([a-z0-9_ ]+): written by python -m "
                                   r"deepnmt_plugin.bench.from_cells -->")
#: the digits the records keep of each value
VALUE_DIGITS = {"valid_loss": 3, "peak_rss_gib": 2}
END = "<!-- end -->"
#: how a table cell names the seeds that learned no translation: (one seed, several)
FAILURE_WORDS = {STALLED: ("stalled", "stalled"), IGNORES_SOURCE: ("ignores the source", "ignore the source"),
                 DIVERGED: ("diverged", "diverged")}


def recipe_label(method: str) -> str:
    """The method's name, with its arch and flags where they are not ``transformer_<method>``."""
    command = [METHODS[method], *METHOD_FLAGS.get(method, ())]
    return method if command == [f"transformer_{method}"] else f"{method} (`{' '.join(command)}`)"


def failure_notes(group: List[dict]) -> List[str]:
    """How many of the group's seeds stalled, ignore the source or diverged ("stalled" for a single seed)."""
    notes = []
    for verdict, (one, several) in FAILURE_WORDS.items():
        count = sum((r["status"] == DIVERGED) if verdict == DIVERGED else (r["verdict"] == verdict) for r in group)
        if count:
            notes.append(one if len(group) == 1 else f"{count}/{len(group)} {several}")
    return notes


def table_cell(group: List[dict]) -> str:
    """Mean ± sd of the seeds' test BLEU, the seeds when they are neither one nor three, and each failure's count."""
    seeds = sorted(r.get("seed", 1) for r in group)
    notes = []
    if len(seeds) not in (1, 3):
        contiguous = seeds == list(range(seeds[0], seeds[-1] + 1))
        notes.append(f"seeds {seeds[0]}–{seeds[-1]}" if contiguous else "seeds " + ", ".join(map(str, seeds)))
    notes += failure_notes(group)
    return mean_sd(bleus(group)) + (f" ({'; '.join(notes)})" if notes else "")


def depth_table(groups: Dict[Tuple[str, int, int], List[dict]]) -> List[str]:
    """The README's table: a row per recipe (the study's order), a column per shape; – where a shape was not run."""
    shapes = shapes_of(groups)
    methods = [method for method in METHODS if any(key[0] == method for key in groups)]
    lines = ["| method | " + " | ".join(shape_name(shape) for shape in shapes) + " |",
             "|---|" + "---|" * len(shapes)]
    for method in methods:
        cells = [table_cell(groups[(method, *shape)]) if (method, *shape) in groups else "–" for shape in shapes]
        lines.append(f"| {recipe_label(method)} | " + " | ".join(cells) + " |")
    return lines


def shape_name(shape: Tuple[int, int]) -> str:
    return f"{shape[0]}L-{shape[1]}L"


def parse_shape(name: str) -> Tuple[int, int]:
    """``shape_name``'s inverse: ``18L-18L`` → (18, 18)."""
    encoder, decoder = (int(part.rstrip("L")) for part in name.split("-"))
    return encoder, decoder


def shapes_of(groups) -> List[Tuple[int, int]]:
    return sorted({(encoder, decoder) for _, encoder, decoder in groups}, key=lambda s: (s[0] + s[1], s[0]))


def study_intro(groups: Dict[Tuple[str, int, int], List[dict]], preset) -> List[str]:
    """What the study is: its shapes, models, corpus, schedule and hardware, from the preset and the cells."""
    shapes = ", ".join(shape_name(shape) for shape in shapes_of(groups))
    return [f"Every recipe at the shapes it has cells for ({shapes}; 12L-3L and 50L-6L are deep encoders over shallow "
            f"decoders): {preset.embed_dim}-{preset.ffn_dim}-{preset.heads} models (width, FFN width, heads) on the "
            "pinned l10n German→English corpus of Debian UI strings ([data-prep](data-prep/README.md)), peak lr "
            f"{preset.lr:g} for every recipe, {preset.max_update:,} updates of {preset.max_tokens:,} tokens, an "
            f"inverse-sqrt warmup of {preset.warmup_updates} updates where the recipe uses one, one CPU thread per "
            "cell. It ranks the recipes' early training at depth on one small corpus, not their BLEU at paper scale "
            "(that needs the reproduction scripts on GPUs). Test sacreBLEU, the mean ± sd over three seeds (one seed "
            "where no sd is given; others named), with the seeds that learned no translation "
            "([results.md](docs/depth_study/results.md); – : not run):"]


def percent(share: float) -> str:
    return f"{share * 100:.0f}\u00a0%"  # a no-break space: the number and its sign stay on one line


def findings(groups: Dict[Tuple[str, int, int], List[dict]]) -> List[str]:
    """Per shape: the best recipe and those level with it (``reading``'s rule); beyond 6L-6L each recipe's standing
    against its own 6L-6L mean (``runs.standing``)."""
    words = {KEEPS_BLEU: f"keep ≥ {percent(KEEPS)} of their 6L BLEU",
             LOSES_BLEU: f"keep {percent(FAILS_BELOW)}–{percent(KEEPS)}",
             FAILS: f"fail (below {percent(FAILS_BELOW)}, or a seed learned no translation)"}
    lines = []
    for shape in shapes_of(groups):
        rows = ranked(groups, shape)
        level = level_with_best(rows)
        parts = [f"best {rows[0][0]} ({mean_sd(bleus(rows[0][1]))})"
                 + (f", level with it {', '.join(level)}" if level else "")]
        if shape != (6, 6):
            by_standing: Dict[str, List[str]] = {}
            for method, group in rows:
                if (method, 6, 6) in groups:
                    six_layer = statistics.mean(bleus(groups[(method, 6, 6)]))
                    word = standing(statistics.mean(bleus(group)), six_layer, bool(failures(group)))
                    by_standing.setdefault(word, []).append(method)
            parts += [f"{words[word]}: {', '.join(by_standing[word])}" for word in words if word in by_standing]
        lines.append(f"- **{shape_name(shape)}**: " + "; ".join(parts) + ".")
    return lines


def trained_on(extended: Path, groups: Dict[Tuple[str, int, int], List[dict]],
               budget: int) -> Iterator[Tuple[str, Tuple[int, int], Optional[int]]]:
    """(method, shape, ``runs.budget_bound_at``) for every seed-1 cell trained on past the budget (``extended/``)
    whose committed seed-1 cell does not keep its 6L BLEU at the budget."""
    for directory in sorted(path for path in extended.iterdir() if path.is_dir()):
        method, shape_text = directory.name.rsplit("_", 1)
        shape = parse_shape(shape_text)
        six_layer = next(r["test_bleu"] for r in groups[(method, 6, 6)] if r.get("seed", 1) == 1)
        cell = next(r for r in groups[(method, *shape)] if r.get("seed", 1) == 1)
        if standing(cell["test_bleu"] or 0.0, six_layer, bool(failures([cell]))) == KEEPS_BLEU:
            continue
        scores = {int(path.stem.split("_")[1]): json.loads(path.read_text())["sacrebleu"]
                  for path in directory.glob("scores_*.json")}
        yield method, shape, budget_bound_at(scores, six_layer, budget)


def budget_bound_lines(extended: Path, groups: Dict[Tuple[str, int, int], List[dict]], budget: int) -> List[str]:
    """Which cells trained on past the budget are budget-bound (``runs.budget_bound_at``), and which are not."""
    cells = list(trained_on(extended, groups, budget))
    bound = [f"{method} {shape_name(shape)} (at update {update:,})" for method, shape, update in cells if update]
    not_bound = [f"{method} {shape_name(shape)}" for method, shape, update in cells if not update]
    lines = [f"By the rule of section 2 (`deepnmt_plugin/bench/runs.py`): **{BUDGET_BOUND}**, keeping {percent(KEEPS)} "
             f"of seed 1's 6L BLEU within {BUDGETS_TRAINED_ON * budget:,} updates: {', '.join(bound) or 'none'}."]
    if not_bound:
        lines.append(f"Not budget-bound (below {percent(KEEPS)} of it at every score up to "
                     f"{BUDGETS_TRAINED_ON * budget:,} updates): {', '.join(not_bound)}.")
    return wrapped(lines)


def splice(text: str, start: str, lines: List[str], end: str = END) -> str:
    """``text`` with the lines between ``start`` and the next ``end`` replaced by ``lines``."""
    before, rest = text.split(start + "\n", 1)
    _, after = rest.split(end, 1)
    return before + start + "\n" + "\n".join(lines) + "\n" + end + after


def seed_cell(group: List[dict], six_layer: Optional[List[dict]]) -> str:
    """Each seed's test BLEU in seed order, then mean ± sd, the share of the 6L-6L mean and each failure's count."""
    ordered = sorted(group, key=lambda r: r.get("seed", 1))
    notes = [mean_sd(bleus(group))] if len(group) > 1 else []
    if six_layer is not None and statistics.mean(bleus(six_layer)):
        notes.append(f"{100 * statistics.mean(bleus(group)) / statistics.mean(bleus(six_layer)):.0f}\u00a0% of 6L")
    notes += failure_notes(group)
    return " / ".join(f"{bleu:.2f}" for bleu in bleus(ordered)) + (f" ({'; '.join(notes)})" if notes else "")


def seed_table(groups: Dict[Tuple[str, int, int], List[dict]], recipes: List[str], beside: List[str],
               shapes: Optional[List[Tuple[int, int]]] = None) -> List[str]:
    """A row per method, recipes then those beside them; a column per shape of ``shapes`` (by default every shape any
    of the recipes ran): the seeds' test BLEU (``seed_cell``)."""
    if shapes is None:
        shapes = [shape for shape in shapes_of(groups) if any((method, *shape) in groups for method in recipes)]
    methods = recipes + beside
    lines = ["| method | " + " | ".join(f"{shape_name(shape)} seeds 1 / 2 / 3" for shape in shapes) + " |",
             "|---|" + "---|" * len(shapes)]
    for method in methods:
        cells = ["–" if (method, *shape) not in groups else
                 seed_cell(groups[(method, *shape)], None if shape == (6, 6) else groups.get((method, 6, 6)))
                 for shape in shapes]
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    return lines


def seed_one(results: List[dict], method: str, depth: int, checkpointed: bool = False) -> Optional[dict]:
    """``method``'s seed-1 cell of ``depth`` layers a stack among ``results``; None where it has none."""
    return next((r for r in results if (r["method"], r["encoder_layers"], r["decoder_layers"], r.get("seed", 1),
                                        r["checkpoint_activations"]) == (method, depth, depth, 1, checkpointed)), None)


def seed_one_table(results: List[dict]) -> List[str]:
    """The report's section 3 table: each method's seed-1 test BLEU at 6, 18, 50 and 100 layers a stack, each as % of
    its 6L-6L, and at 500L-500L (the checkpointed cells); a row per method with a 6L-6L cell, – where a shape has none."""
    lines = ["| method | 6L-6L | 18L-18L | % | 50L-50L | % | 100L-100L | % | 500L-500L |",
             "|---|---|---|---|---|---|---|---|---|"]
    for method in METHODS:
        six = seed_one(results, method, 6)
        if six is None:
            continue
        row = [method, f"{six['test_bleu']:.2f}"]
        for depth in (18, 50, 100):
            deep = seed_one(results, method, depth)
            row += (["–", "–"] if deep is None else
                    [f"{deep['test_bleu']:.2f}", f"{100 * deep['test_bleu'] / six['test_bleu']:.0f}"])
        deepest = seed_one(results, method, 500, checkpointed=True)
        row.append("–" if deepest is None else f"{deepest['test_bleu']:.2f}")
        lines.append("| " + " | ".join(row) + " |")
    return lines


def seed_one_values(results: List[dict], key: str, methods: List[str]) -> List[str]:
    """A row per method of ``methods``: its seed-1 cells' ``key`` (``valid_loss`` or ``peak_rss_gib``, as the records
    round it) at 6, 18, 50, 100 and 500 (checkpointed) layers a stack, – where a shape has none."""
    lines = ["| method | 6L-6L | 18L-18L | 50L-50L | 100L-100L | 500L-500L |", "|---|---|---|---|---|---|"]
    digits = VALUE_DIGITS[key]
    for method in methods:
        cells = [seed_one(results, method, depth, checkpointed=depth == 500) for depth in (6, 18, 50, 100, 500)]
        lines.append(f"| {method} | " + " | ".join("–" if cell is None else f"{cell[key]:.{digits}f}" for cell in cells)
                     + " |")
    return lines


def rewrite_seed_one_values(text: str, results: List[dict]) -> str:
    """``text`` with every seed-1 value table (between a SEED_ONE_VALUES_START line and END) written from ``results``."""
    for start in SEED_ONE_VALUES_START.finditer(text):
        text = splice(text, start.group(0), seed_one_values(results, start.group(1), start.group(2).split()))
    return text


def rewrite_seed_tables(text: str, groups: Dict[Tuple[str, int, int], List[dict]]) -> str:
    """``text`` with every per-seed table (between a SEED_TABLE_START line and END) written from ``groups``."""
    for start in SEED_TABLE_START.finditer(text):
        recipes, beside, shapes = start.groups()
        text = splice(text, start.group(0), seed_table(
            groups, recipes.split(), (beside or "").split(),
            None if shapes is None else [parse_shape(name) for name in shapes.split()]))
    return text


def wrapped(paragraphs: List[str], indent: str = "") -> List[str]:
    """Each paragraph (or list item) wrapped at the pages' 120 columns, links and hyphenated words kept whole."""
    return [line for paragraph in paragraphs
            for line in textwrap.wrap(paragraph, 120, subsequent_indent=indent, break_long_words=False,
                                      break_on_hyphens=False)]


def readme_block(groups: Dict[Tuple[str, int, int], List[dict]], preset) -> List[str]:
    lead = ("Per shape, by the chooser's rule (the best mean, and those within one standard deviation of it with no "
            "failed seed: docs/choosing.md) and each recipe's standing against its own 6L-6L mean (the report's "
            "section 2; a single seed where the table gives no sd):")
    return [*wrapped(study_intro(groups, preset)), "", *depth_table(groups), "", *wrapped([lead]), "",
            *wrapped(findings(groups), "  ")]


def write_choosing(groups: Dict[Tuple[str, int, int], List[dict]], warmup_methods, warmup_updates: int, title: str,
                   path: Path) -> None:
    """``groups``: the study's grid cells by (method, encoder layers, decoder layers), every seed (``over_seeds``)."""
    shapes = shapes_of(groups)
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
        lines += ["", f"## {shape_name(shape)}", "",
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
