#!/usr/bin/env bash
# Usage: data-prep/prepare-l10n-de-en.sh [--archives DIR] [--output DIR] [--bpe subword-nmt|sentencepiece] [--bpe-ops N] [--workers N]
# The depth study's corpus: German-English UI strings from Debian packages' gettext catalogs (their .debs in --archives,
# fetched with apt-get download when missing). See data-prep/README.md; the recipe is deepnmt_plugin/data/l10n.py.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}"
exec "${PYTHON:-python3}" -m deepnmt_plugin.data l10n-de-en "$@"
