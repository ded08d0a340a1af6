"""python -m deepnmt_plugin.data RECIPE [--archives DIR] [--output DIR] [--bpe B] [--bpe-ops N] [--workers N] [--unpinned]

The data-prep/prepare-*.sh scripts are thin front ends to this.
"""

import argparse
import os
import sys
from pathlib import Path

from deepnmt_plugin import compat
from deepnmt_plugin.data.debian import SNAPSHOT_URL
from deepnmt_plugin.data.ding import DING
from deepnmt_plugin.data.l10n import L10N
from deepnmt_plugin.data.pipeline import DataPrepError, claim_output, run_steps, stamp_output
from deepnmt_plugin.data.recipes import IWSLT14, WMT14, WMT14_EN_FR, WMT17, Options

RECIPES = {recipe.name: recipe for recipe in (IWSLT14, WMT14, WMT17, WMT14_EN_FR, DING, L10N)}


def parse_arguments(argv):
    parser = argparse.ArgumentParser("python -m deepnmt_plugin.data", description=__doc__.split("\n\n")[1])
    parser.add_argument("recipe", choices=sorted(RECIPES))
    add = parser.add_argument
    add("--archives", type=Path, help="the original archives, under their original names; missing ones are "
        "downloaded into it (default: OUTPUT/archives)")
    add("--output", type=Path, help="where the BPE'd text, the BPE model, data-bin/ and README go "
        "(default: fairseq's folder name, e.g. iwslt14.tokenized.de-en)")
    add("--bpe", choices=("subword-nmt", "sentencepiece"), default="subword-nmt",
        help="joint BPE by subword-nmt (default, as the papers) or SentencePiece")
    add("--bpe-ops", type=int, help="merge operations (subword-nmt) or vocabulary size (sentencepiece); "
        "default: IWSLT 10000, WMT 40000, Ding 8000, l10n 2000")
    add("--workers", type=int, default=os.cpu_count(), help="processes (default: all cores)")
    add("--joined-dictionary", action=argparse.BooleanOptionalAction, default=True,
        help="one dictionary for both languages, as shared embeddings need (default: on)")
    add("--no-download", dest="download", action="store_false",
        help="never download: stop and list the missing archives instead")
    add("--manifest", type=Path, metavar="FILE", help="l10n-de-en: the manifest that pins the .debs and the corpus checksum "
        "(default: data-prep/l10n-de-en.manifest.json)")
    add("--snapshot-url", default=SNAPSHOT_URL, metavar="BASE", help="l10n-de-en: where pinned .debs that are "
        "neither in --archives nor from apt-get download are fetched, as BASE/file/<sha1> (default: %(default)s)")
    add("--unpinned", action="store_true", help="l10n-de-en: build even from other .debs or settings than the "
        "pinned ones, or to another checksum; the corpus is marked as unpinned")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    arguments = parse_arguments(argv)
    recipe = RECIPES[arguments.recipe]
    output = arguments.output or Path(recipe.default_output)
    options = Options(
        output=output,
        archives=arguments.archives or output / "archives",
        bpe=arguments.bpe,
        bpe_ops=arguments.bpe_ops or recipe.default_bpe_ops,
        workers=max(1, arguments.workers),
        joined_dictionary=arguments.joined_dictionary,
        download=arguments.download,
        manifest=arguments.manifest,
        snapshot_url=arguments.snapshot_url,
        unpinned=arguments.unpinned,
    )
    settings = dict(recipe=recipe.name, bpe=options.bpe, bpe_ops=options.bpe_ops)
    settings["joined_dictionary"] = options.joined_dictionary
    with compat.writing(output):
        try:
            if recipe is not L10N and (arguments.manifest or arguments.unpinned or arguments.snapshot_url != SNAPSHOT_URL):
                raise DataPrepError("--manifest, --snapshot-url and --unpinned apply to l10n-de-en only")
            claim_output(output, settings, recipe.final_names(options.bpe))
            recipe.ensure_sources(options)
            print(f"{recipe.title}: {output} (archives in {options.archives})", flush=True)
            stamp_output(output, settings)
            run_steps(recipe.steps(options), options.tmp / "done")
        except DataPrepError as error:
            print(f"deepnmt: error: {error}", file=sys.stderr)
            return 1
    print(f"done: {output}/README lists the counts; train with data-bin {output / 'data-bin'}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
