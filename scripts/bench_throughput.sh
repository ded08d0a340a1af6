#!/usr/bin/env bash
# Words/sec of every arch relative to stock fairseq transformer, interleaved in one process:
# python -m deepnmt_plugin.bench.throughput --help lists the flags (--data DIR --dims --layers --max-tokens --rounds --updates).
set -euo pipefail
cd "$(dirname "$0")/.."
exec python -m deepnmt_plugin.bench.throughput "$@"
