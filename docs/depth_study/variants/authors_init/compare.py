"""Admin and DLCL with their authors' projection init (this folder's cells, ``--admin-linear-init`` and
``--dlcl-linear-init`` at their default) beside the study's cells of both, trained with fairseq 0.12's init. Writes
``compare.md`` here and the table of the report's section 5.8 (``bench/from_cells.write_variant_table``):
``python docs/depth_study/variants/authors_init/compare.py``."""

from pathlib import Path

from deepnmt_plugin.bench.from_cells import write_variant_table

write_variant_table(Path(__file__).parent, ("admin", "dlcl"), "fairseq 0.12's init (the study's cells)",
                    "the authors' init (this folder)")
