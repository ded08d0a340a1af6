"""Rewrite ``docs/choosing.md`` and the README's depth-study table from the committed cells (``bench/choosing.py``).

    python -m deepnmt_plugin.bench.from_cells
"""

import argparse
import json
from pathlib import Path

from deepnmt_plugin.bench import study
from deepnmt_plugin.bench.choosing import rewrite_table, write_choosing

CELLS = Path("docs/depth_study/cells")


def committed_groups(cells: Path = CELLS) -> dict:
    """The study's grid cells under ``cells`` by (method, encoder layers, decoder layers), every seed (``over_seeds``)."""
    corpus = json.loads(next(cells.glob("*/result.json")).read_text())["corpus"]
    return study.over_seeds(study.kept_results(cells, study.STUDY, corpus))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cells", type=Path, default=CELLS)
    parser.add_argument("--choosing", type=Path, default=Path("docs/choosing.md"))
    parser.add_argument("--readme", type=Path, default=Path("README.md"))
    args = parser.parse_args(argv)
    groups = committed_groups(args.cells)
    write_choosing(groups, study.WARMUP_METHODS, study.STUDY.warmup_updates, study.study_title(study.STUDY),
                   args.choosing)
    args.readme.write_text(rewrite_table(args.readme, groups))
    print(f"wrote {args.choosing} and the depth-study table of {args.readme}")


if __name__ == "__main__":
    main()
