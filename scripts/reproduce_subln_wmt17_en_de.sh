#!/usr/bin/env bash
# Reproduces configs/subln_wmt17_en_de.yaml: python -m deepnmt_plugin.reproduce --help lists the flags
# (--data DIR --gpus N --precision fp16|bf16|fp32 --methods --depths --seeds --workdir --dry-run --smoke).
set -euo pipefail
# Relative --data and --workdir are taken from where it is called; runs go to the checkout's runs/ by default.
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}"
exec python -m deepnmt_plugin.reproduce "$repo/configs/subln_wmt17_en_de.yaml" --workdir "$repo/runs" "$@"
