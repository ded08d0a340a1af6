"""Admin and DLCL with their authors' projection init (this folder's cells, ``--admin-linear-init`` and
``--dlcl-linear-init`` at their default) beside the study's cells of both, trained with fairseq 0.12's init:
``python docs/depth_study/variants/authors_init/compare.py > docs/depth_study/variants/authors_init/compare.md``.

Each entry is the seeds' test sacreBLEU, mean ± sd, with the count of seeds that learned no translation, as in the
study's tables (``bench/choosing.table_cell``)."""

import sys
from pathlib import Path

from deepnmt_plugin.bench.choosing import shape_name, shapes_of, table_cell
from deepnmt_plugin.bench.from_cells import CELLS, committed_groups

HERE = Path(__file__).parent
variant, study = committed_groups(HERE), committed_groups(CELLS)
if any(key not in study for key in variant):
    sys.exit(f"compare.py: {HERE} holds cells the study does not")
print("| recipe, shape | fairseq 0.12's init (the study's cells) | the authors' init (this folder) |")
print("|---|---|---|")
for method in ("admin", "dlcl"):
    for shape in shapes_of(variant):
        if (method, *shape) in variant:
            print(f"| {method} {shape_name(shape)} | {table_cell(study[(method, *shape)])} | "
                  f"{table_cell(variant[(method, *shape)])} |")
