#!/usr/bin/env bash
# The quickstart: builds the Ding De-En corpus, trains Post-LN and Admin 12L-12L on its sentences (tiny dims, 1800 updates,
# about 7 minutes each on 2 CPU cores, no warmup), generates, scores and prints the results table. About 18 minutes on 2 cores;
# rerunning it skips every finished step.
set -euo pipefail
cd "$(dirname "$0")/.."
data=${QUICKSTART_DATA:-data/ding}
workdir=${QUICKSTART_WORKDIR:-runs}
echo "== quickstart 1/2: the Ding De-En corpus in $data"
bash data-prep/prepare-ding-de-en.sh --output "$data" --workers "$(nproc)"
echo "== quickstart 2/2: train, generate and score (runs in $workdir/quickstart)"
exec python -m deepnmt_plugin.reproduce configs/quickstart.yaml --data "$data" --workdir "$workdir" --gpus 0 "$@"
