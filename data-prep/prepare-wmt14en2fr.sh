#!/usr/bin/env bash
# Usage: data-prep/prepare-wmt14en2fr.sh [--archives DIR] [--output DIR] [--bpe subword-nmt|sentencepiece] [--bpe-ops N] [--workers N]
# See data-prep/README.md; the recipe itself is deepnmt_plugin/data (python -m deepnmt_plugin.data wmt14en2fr --help).
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}"
exec "${PYTHON:-python3}" -m deepnmt_plugin.data wmt14en2fr "$@"
