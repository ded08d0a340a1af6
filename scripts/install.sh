#!/usr/bin/env bash
# Installs deepnmt and its pinned fairseq stack into the active Python environment.
# Order matters: fairseq-fixed's setup.py imports torch and numpy, so they come first, and it is
# built without build isolation (an isolated build would fetch a fresh, CUDA, torch into the build env).
# numpy 1.26 or 2.x: deepnmt_plugin/compat.py restores the numpy names fairseq 0.12 still calls.
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
"${pip[@]}" numpy cython wheel setuptools
# From its sdist on every Python: its cp312 wheel's libbase extension was built against another torch and does not load.
echo "[3/4] building fairseq-fixed==0.12.3.1 (a few minutes: it compiles its Cython and C++ extensions)"
"${pip[@]}" --no-build-isolation --no-binary fairseq-fixed "fairseq-fixed==0.12.3.1"
extensions_load() {
  "$python" -c "import fairseq.data.data_utils_fast, fairseq.data.token_block_utils_fast, fairseq.libbleu, \
fairseq.libbase, fairseq.libnat" 2>/dev/null
}
if ! extensions_load; then
  # pip's wheel cache keys a built wheel by the sdist alone: one built against numpy 1.x or another torch is reused
  echo "[3/4] fairseq-fixed's compiled extensions do not load with this numpy and torch: rebuilding it without pip's cache"
  "${pip[@]}" --no-build-isolation --no-binary fairseq-fixed --no-cache-dir --force-reinstall --no-deps \
    "fairseq-fixed==0.12.3.1"
  extensions_load || { echo "install.sh: fairseq-fixed's compiled extensions still do not load" >&2; exit 1; }
fi
echo "[4/4] installing deepnmt (editable) and its remaining dependencies"
"${pip[@]}" --no-build-isolation -e ".[test]"
# torchscale, which the tests compare Sub-LN and DeepNorm with, without the fairscale and timm it pins: timm pulls
# torchvision and another torch, and the compared layers use neither (tests/authors_code.py)
"${pip[@]}" --no-deps "torchscale==0.3.0"
"$python" -c "import deepnmt_plugin, fairseq, torch; print(f'deepnmt {deepnmt_plugin.__version__} ready: fairseq {fairseq.__version__}, torch {torch.__version__}')"
