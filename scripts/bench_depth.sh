#!/usr/bin/env bash
# Depth sweep (methods x depths, 64-128-2, no warmup): python -m deepnmt_plugin.bench.depth --help lists the
# flags (--data DIR --quick|--micro --methods --depths --workdir --cpu). --quick: 6, 18, 50 layers (48.8 min measured on loaded cores).
set -euo pipefail
cd "$(dirname "$0")/.."
exec python -m deepnmt_plugin.bench.depth "$@"
