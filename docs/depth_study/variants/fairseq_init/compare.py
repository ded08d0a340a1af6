"""Admin and DLCL with fairseq 0.12's projection init (this folder's cells, ``--admin-linear-init fairseq`` and
``--dlcl-linear-init fairseq``) beside the study's cells of both, trained with their authors' fairseq <= 0.9 init.
Writes ``compare.md`` here and the table of the report's section 5.8 (``bench/from_cells.write_variant_table``):
``python docs/depth_study/variants/fairseq_init/compare.py``."""

from pathlib import Path

from deepnmt_plugin.bench.from_cells import write_variant_table

write_variant_table(Path(__file__).parent, ("admin", "dlcl"), "the authors' init (the study's cells)",
                    "fairseq 0.12's init (this folder)")
