"""Admin and DLCL with their authors' projection init (this folder's cells, ``--admin-linear-init`` and
``--dlcl-linear-init`` at their default) beside the study's cells of both, trained with fairseq 0.12's init. Writes
``compare.md`` here and the table of the report's section 5.8:
``python docs/depth_study/variants/authors_init/compare.py``.

Each entry is the seeds' test sacreBLEU, mean ± sd, with the count of seeds that learned no translation, as in the
study's tables (``bench/choosing.table_cell``)."""

import sys
from pathlib import Path

from deepnmt_plugin.bench.choosing import shape_name, shapes_of, splice, table_cell
from deepnmt_plugin.bench.from_cells import CELLS, REPORT, committed_groups

HERE = Path(__file__).parent
TABLE_START = "<!-- authors_init table: written by python docs/depth_study/variants/authors_init/compare.py -->"

variant, study = committed_groups(HERE), committed_groups(CELLS)
if any(key not in study for key in variant):
    sys.exit(f"compare.py: {HERE} holds cells the study does not")
lines = ["| recipe, shape | fairseq 0.12's init (the study's cells) | the authors' init (this folder) |", "|---|---|---|"]
for method in ("admin", "dlcl"):
    for shape in shapes_of(variant):
        if (method, *shape) in variant:
            lines.append(f"| {method} {shape_name(shape)} | {table_cell(study[(method, *shape)])} | "
                         f"{table_cell(variant[(method, *shape)])} |")
(HERE / "compare.md").write_text("\n".join(lines) + "\n")
REPORT.write_text(splice(REPORT.read_text(), TABLE_START, lines))
print(f"wrote {HERE / 'compare.md'} and the table of {REPORT}'s section 5.8")
