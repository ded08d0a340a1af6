"""Admin and DLCL with their authors' projection init (this folder's cells, ``--admin-linear-init`` and
``--dlcl-linear-init`` at their default) beside the study's cells of both, trained with fairseq 0.12's init. Writes
``compare.md`` here and the table of the report's section 5.8:
``python docs/depth_study/variants/authors_init/compare.py``.

The seeds' test sacreBLEU, mean ± sd, with the count of seeds that learned no translation, as in the study's tables
(``bench/choosing.table_cell``), and their last validation loss, mean ± sd."""

import statistics
import sys
from pathlib import Path

from deepnmt_plugin.bench.choosing import shape_name, shapes_of, splice, table_cell
from deepnmt_plugin.bench.from_cells import CELLS, REPORT, committed_groups

HERE = Path(__file__).parent
TABLE_START = "<!-- authors_init table: written by python docs/depth_study/variants/authors_init/compare.py -->"

variant, study = committed_groups(HERE), committed_groups(CELLS)
if any(key not in study for key in variant):
    sys.exit(f"compare.py: {HERE} holds cells the study does not")

def valid_loss(group) -> str:
    losses = [r["valid_loss"] for r in group]
    return f"{statistics.mean(losses):.3f}" + (f" ± {statistics.stdev(losses):.3f}" if len(losses) > 1 else "")


lines = ["| recipe, shape | test BLEU, fairseq 0.12's init (the study's cells) | test BLEU, the authors' init (this folder) "
         "| valid loss, fairseq 0.12's init | valid loss, the authors' init |", "|---|---|---|---|---|"]
for method in ("admin", "dlcl"):
    for shape in shapes_of(variant):
        if (method, *shape) in variant:
            groups = study[(method, *shape)], variant[(method, *shape)]
            lines.append(f"| {method} {shape_name(shape)} | " + " | ".join(map(table_cell, groups)) + " | "
                         + " | ".join(valid_loss(group) for group in groups) + " |")
(HERE / "compare.md").write_text("\n".join(lines) + "\n")
REPORT.write_text(splice(REPORT.read_text(), TABLE_START, lines))
print(f"wrote {HERE / 'compare.md'} and the table of {REPORT}'s section 5.8")
