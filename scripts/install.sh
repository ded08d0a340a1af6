#!/usr/bin/env bash
# Installs deepnmt and its pinned fairseq stack into the active Python environment.
# Order matters: fairseq-fixed's setup.py imports torch and numpy, so they come first, and it is
# built without build isolation (an isolated build would fetch a fresh, CUDA, torch into the build env).
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
pip=("$python" -m pip install --disable-pip-version-check)

if torch_version=$("$python" -c "import torch; print(torch.__version__)" 2>/dev/null); then
  echo "[1/4] torch $torch_version already installed: keeping it"
else
  echo "[1/4] installing torch==2.13.0"
  "${pip[@]}" torch==2.13.0
fi
echo "[2/4] installing build requirements of fairseq-fixed"
"${pip[@]}" "numpy<2" cython wheel setuptools
echo "[3/4] building fairseq-fixed==0.12.3.1 (a few minutes: it compiles its Cython extensions)"
"${pip[@]}" --no-build-isolation "fairseq-fixed==0.12.3.1"
echo "[4/4] installing deepnmt (editable) and its remaining dependencies"
"${pip[@]}" --no-build-isolation -e ".[test]"
# torchscale, which the tests compare Sub-LN and DeepNorm with, without the fairscale and timm it pins: timm pulls
# torchvision and another torch, and the compared layers use neither (tests/authors_code.py)
"${pip[@]}" --no-deps "torchscale==0.3.0"
"$python" -c "import deepnmt_plugin, fairseq, torch; print(f'deepnmt {deepnmt_plugin.__version__} ready: fairseq {fairseq.__version__}, torch {torch.__version__}')"
