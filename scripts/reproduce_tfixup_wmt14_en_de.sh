#!/usr/bin/env bash
# Reproduces configs/tfixup_wmt14_en_de.yaml: python -m deepnmt_plugin.reproduce --help lists the flags
# (--data DIR --gpus N --precision fp16|bf16|fp32 --methods --depths --seeds --workdir --dry-run --smoke).
set -euo pipefail
cd "$(dirname "$0")/.."
exec python -m deepnmt_plugin.reproduce configs/tfixup_wmt14_en_de.yaml "$@"
