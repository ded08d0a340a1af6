"""Mix-LN, HybridNorm and DyT under their authors' optimiser and schedule (this folder's cells, ``--schedule
authors``, ``deepnmt_plugin/bench/authors_schedules.py``) beside the study's cells of each, trained under the study's.
Writes ``compare.md`` here and the table of the report's section 5.9 (``bench/from_cells.write_variant_table``):
``python docs/depth_study/variants/authors_schedule/compare.py``."""

from dataclasses import replace
from pathlib import Path

from deepnmt_plugin.bench import study
from deepnmt_plugin.bench.from_cells import write_variant_table

write_variant_table(Path(__file__).parent, ("mixln", "hybridnorm", "dyt"), "the study's schedule",
                    "the authors' schedule", replace(study.STUDY, schedule="authors"))
