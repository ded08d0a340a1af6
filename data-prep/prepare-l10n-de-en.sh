#!/usr/bin/env bash
# Usage: data-prep/prepare-l10n-de-en.sh [--archives DIR] [--output DIR] [--bpe subword-nmt|sentencepiece] [--bpe-ops N] [--workers N]
#                                        [--manifest FILE] [--snapshot-url BASE] [--unpinned]
# The depth study's corpus: German-English UI strings from Debian packages' gettext catalogs. The .debs are the ones
# data-prep/l10n-de-en.manifest.json pins, verified by sha256: from --archives, else apt-get download, else Debian's
# snapshot archive by hash; the corpus must come out with the pinned checksum unless --unpinned (then it is marked so).
# See data-prep/README.md; the recipe is deepnmt_plugin/data/l10n.py.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}"
exec "${PYTHON:-python3}" -m deepnmt_plugin.data l10n-de-en "$@"
