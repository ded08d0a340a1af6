#!/usr/bin/env bash
# Every reproduction script's --smoke at its table's deepest depth, one job per (table, method), side by side on one
# GPU: bash docs/gpu/smoke_all.sh DE_EN_DATA EN_FR_DATA WORKDIR [PARALLEL] [PRECISION].
# Each job's output goes to WORKDIR/logs, its runs to WORKDIR/TABLE_METHOD, one line per job to WORKDIR/status.txt;
# python docs/gpu/collect_smokes.py WORKDIR tabulates them.
set -u
[ $# -ge 3 ] || { echo "usage: $0 DE_EN_DATA EN_FR_DATA WORKDIR [PARALLEL] [PRECISION]" >&2; exit 2; }
de_en=$1 en_fr=$2 work=$3 parallel=${4:-16} precision=${5:-fp16}
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
mkdir -p "$work/logs"
smoke_one() {  # TABLE DATA METHOD DEPTH
  local start=$SECONDS name=$1_$3
  OMP_NUM_THREADS=1 bash "$repo/scripts/reproduce_$1.sh" --data "$2" --smoke --precision "$precision" \
      --methods "$3" --depths "$4" --seeds 1 --workdir "$work/$name" > "$work/logs/$name.log" 2>&1
  echo "$1 $3 $4 rc=$? $(( SECONDS - start ))s" >> "$work/status.txt"
}
export -f smoke_one
export repo work precision
# Every table's methods at their deepest depth (a method's `method_depths` where the config gives them), read from
# configs/, the longest jobs first; a table into French on the En-Fr data.
jobs=$(cd "$repo" && python - "$de_en" "$en_fr" <<'PY'
import sys
from pathlib import Path

from deepnmt_plugin.reproduce import load_config, parse_depth

de_en, en_fr = sys.argv[1:]
jobs = []
for path in sorted(Path("configs").glob("*.yaml")):
    config = load_config(str(path))
    for method in config["methods"]:
        depth = max(config.get("method_depths", {}).get(method, config["depths"]), key=lambda d: sum(parse_depth(d)))
        data = en_fr if config["target_lang"] == "fr" else de_en
        jobs.append((sum(parse_depth(depth)), f"{path.stem} {data} {method} {depth}"))
print("\n".join(job for _, job in sorted(jobs, key=lambda job: -job[0])))
PY
) || exit 1
xargs -P "$parallel" -L 1 bash -c 'smoke_one "$@"' _ <<< "$jobs"
