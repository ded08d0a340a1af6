"""Admin and DLCL with their authors' projection init (this folder's cells, ``--admin-linear-init`` and
``--dlcl-linear-init`` at their default) beside the study's cells of both, trained with fairseq 0.12's init. Writes
``compare.md`` here and the table of the report's section 5.8:
``python docs/depth_study/variants/authors_init/compare.py``.

The seeds' test sacreBLEU, mean ± sd, with the count of seeds that learned no translation, as in the study's tables
(``bench/choosing.table_cell``), and their last validation loss, mean ± sd (``bench/from_cells.beside_the_study``)."""

from pathlib import Path

from deepnmt_plugin.bench.choosing import splice
from deepnmt_plugin.bench.from_cells import REPORT, beside_the_study, committed_groups

HERE = Path(__file__).parent
TABLE_START = "<!-- authors_init table: written by python docs/depth_study/variants/authors_init/compare.py -->"

lines = beside_the_study(committed_groups(HERE), ("admin", "dlcl"), "fairseq 0.12's init (the study's cells)",
                         "the authors' init (this folder)")
(HERE / "compare.md").write_text("\n".join(lines) + "\n")
REPORT.write_text(splice(REPORT.read_text(), TABLE_START, lines))
print(f"wrote {HERE / 'compare.md'} and the table of {REPORT}'s section 5.8")
