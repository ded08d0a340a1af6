#!/usr/bin/env bash
# The quickstart: builds the l10n De-En corpus (German UI strings of 14 Debian packages, data-prep/prepare-l10n-de-en.sh),
# then trains Post-LN and DeepNorm at 18L-18L side by side under the depth study's preset (64-128-2, peak lr 2e-3 after 500
# warmup updates, 2000 updates of 1024 tokens), generates the test set and prints the table with test sacreBLEU.
# They are two cells of the depth study (docs/depth_study), kept in its workdir; rerunning skips every finished step.
set -euo pipefail
cd "$(dirname "$0")/.."
data=${QUICKSTART_DATA:-data/l10n}
workdir=${QUICKSTART_WORKDIR:-runs/depth_study}
echo "== quickstart 1/2: the l10n De-En corpus in $data"
bash data-prep/prepare-l10n-de-en.sh --output "$data" --workers "$(nproc)"
python -c 'import sys; from deepnmt_plugin.data.l10n import corpus_checksum; checksum, pinned = corpus_checksum(sys.argv[1])
print("corpus checksum", checksum, "(the pinned one)" if pinned else "(NOT the pinned one: see its README)")' "$data"
echo "== quickstart 2/2: Post-LN and DeepNorm 18L-18L, trained side by side, then test sacreBLEU (runs in $workdir)"
exec python -m deepnmt_plugin.bench.depth --preset study --data "$data" --methods postln deepnorm --depths 18 --jobs 2 \
    --workdir "$workdir" "$@"
