"""Rewrite ``docs/choosing.md``, the README's depth-study block and the report's budget-bound cells, per-seed tables
and seed-1 value tables from the committed records (``bench/choosing.py``).

    python -m deepnmt_plugin.bench.from_cells
"""

import argparse
import json
import statistics
from pathlib import Path
from typing import List

from deepnmt_plugin.bench import study
from deepnmt_plugin.bench.choosing import (BUDGET_BOUND_START, README_START, SEED_ONE_START, budget_bound_lines,
                                           readme_block, rewrite_seed_one_values, rewrite_seed_tables, seed_one_table,
                                           shape_name, shapes_of, splice, table_cell, write_choosing)

CELLS = Path("docs/depth_study/cells")
EXTENDED = Path("docs/depth_study/extended")  # seed-1 cells trained on past the budget
REPORT = Path("docs/depth_study/README.md")


def committed_results(cells: Path = CELLS, preset: study.StudyPreset = study.STUDY) -> List[dict]:
    """The cells under ``cells`` trained under ``preset``'s budget, the checkpointed ones included."""
    corpus = json.loads(next(cells.glob("*/result.json")).read_text())["corpus"]
    return study.kept_results(cells, preset, corpus)


def committed_groups(cells: Path = CELLS, preset: study.StudyPreset = study.STUDY) -> dict:
    """The grid cells under ``cells`` trained under ``preset``'s budget, by (method, encoder layers, decoder layers),
    every seed (``over_seeds``)."""
    return study.over_seeds(committed_results(cells, preset))


def beside_the_study(variant: dict, methods, study_label: str, variant_label: str) -> List[str]:
    """A variant folder's cells (``committed_groups``) beside the study's cells of the same method and shape: test
    sacreBLEU (``choosing.table_cell``) and the last validation loss, mean ± sd over the seeds; a row per method and
    shape of the variant. Raises where the study has no cell to set one beside."""
    groups = committed_groups()
    if any(key not in groups for key in variant):
        raise SystemExit(f"deepnmt: error: the study has no cells of {sorted(set(variant) - set(groups))}")

    def valid_loss(group) -> str:
        losses = [r["valid_loss"] for r in group]
        return f"{statistics.mean(losses):.3f}" + (f" ± {statistics.stdev(losses):.3f}" if len(losses) > 1 else "")

    lines = [f"| recipe, shape | test BLEU, {study_label} | test BLEU, {variant_label} | valid loss, {study_label} | "
             f"valid loss, {variant_label} |", "|---|---|---|---|---|"]
    for method in methods:
        for shape in shapes_of(variant):
            if (method, *shape) in variant:
                pair = groups[(method, *shape)], variant[(method, *shape)]
                lines.append(f"| {method} {shape_name(shape)} | " + " | ".join(map(table_cell, pair)) + " | "
                             + " | ".join(valid_loss(group) for group in pair) + " |")
    return lines


def write_variant_table(folder: Path, methods, study_label: str, variant_label: str,
                        preset: study.StudyPreset = study.STUDY) -> None:
    """A variant folder's table (``beside_the_study``) into its ``compare.md`` and into the report between the
    folder's marker, ``<!-- <folder name> table: written by python <folder>/compare.py -->``, and the next end."""
    lines = beside_the_study(committed_groups(folder, preset), methods, study_label, variant_label)
    (folder / "compare.md").write_text("\n".join(lines) + "\n")
    start = f"<!-- {folder.name} table: written by python docs/depth_study/variants/{folder.name}/compare.py -->"
    REPORT.write_text(splice(REPORT.read_text(), start, lines))
    print(f"wrote {folder / 'compare.md'} and its table in {REPORT}")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cells", type=Path, default=CELLS)
    parser.add_argument("--choosing", type=Path, default=Path("docs/choosing.md"))
    parser.add_argument("--readme", type=Path, default=Path("README.md"))
    parser.add_argument("--extended", type=Path, default=EXTENDED)
    parser.add_argument("--report", type=Path, default=REPORT)
    args = parser.parse_args(argv)
    groups = committed_groups(args.cells)
    write_choosing(groups, study.WARMUP_METHODS, study.STUDY.warmup_updates, study.study_title(study.STUDY),
                   args.choosing)
    args.readme.write_text(splice(args.readme.read_text(), README_START, readme_block(groups, study.STUDY)))
    report = splice(args.report.read_text(), BUDGET_BOUND_START,
                    budget_bound_lines(args.extended, groups, study.STUDY.max_update))
    results = committed_results(args.cells)
    report = rewrite_seed_one_values(splice(report, SEED_ONE_START, seed_one_table(results)), results)
    args.report.write_text(rewrite_seed_tables(report, groups))
    print(f"wrote {args.choosing}, the depth-study block of {args.readme} and the budget-bound cells, per-seed "
          f"tables and seed-1 value tables of {args.report}")


if __name__ == "__main__":
    main()
