#!/usr/bin/env bash
# Depth sweep (methods x depths, 64-128-2, no warmup) and, with --preset study, the depth study that trains every cell until
# it translates (docs/depth_study): python -m deepnmt_plugin.bench.depth --help lists the flags (--data DIR
# --quick|--micro|--preset {full,quick,micro,study,study-micro} --methods --depths --max-update --warmup-updates --workdir --jobs --cpu). --quick: 6, 18, 50 layers (15.3 min measured with --jobs 2 on 2 idle CPU cores);
# the full preset adds 100 and 200 layers (53.3 min measured for those 10 runs, so about 69 min from nothing).
set -euo pipefail
cd "$(dirname "$0")/.."
exec python -m deepnmt_plugin.bench.depth "$@"
