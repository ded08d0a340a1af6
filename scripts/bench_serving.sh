#!/usr/bin/env bash
# fairseq-generate vs CTranslate2 float32 and int8 on a trained checkpoint's test set, interleaved in one process:
# identical hypotheses, sacreBLEU, sentences/s and speed-up. python -m deepnmt_plugin.bench.serving --help lists the flags
# (--checkpoint CKPT [--data DIR] [--sentences N] [--rounds R] [--threads 2] [--beam 4] [--max-len-a 1.2 --max-len-b 10]).
# Paths are taken from the current directory (no cd: deepnmt is installed, so the module runs from anywhere).
set -euo pipefail
exec python -m deepnmt_plugin.bench.serving "$@"
