"""Mix-LN and HybridNorm under their authors' optimiser and schedule (this folder's cells, ``--schedule authors``,
``deepnmt_plugin/bench/authors_schedules.py``) beside the study's cells of both, trained under the study's. Writes
``compare.md`` here and the table of the report's section 5.9:
``python docs/depth_study/variants/authors_schedule/compare.py``.

The seeds' test sacreBLEU, mean ± sd, with the count of seeds that learned no translation, as in the study's tables
(``bench/choosing.table_cell``), and their last validation loss, mean ± sd (``bench/from_cells.beside_the_study``)."""

from dataclasses import replace
from pathlib import Path

from deepnmt_plugin.bench import study
from deepnmt_plugin.bench.choosing import splice
from deepnmt_plugin.bench.from_cells import REPORT, beside_the_study, committed_groups

HERE = Path(__file__).parent
TABLE_START = "<!-- authors_schedule table: written by python docs/depth_study/variants/authors_schedule/compare.py -->"

variant = committed_groups(HERE, replace(study.STUDY, schedule="authors"))
lines = beside_the_study(variant, ("mixln", "hybridnorm"), "the study's schedule", "the authors' schedule")
(HERE / "compare.md").write_text("\n".join(lines) + "\n")
REPORT.write_text(splice(REPORT.read_text(), TABLE_START, lines))
print(f"wrote {HERE / 'compare.md'} and the table of {REPORT}'s section 5.9")
