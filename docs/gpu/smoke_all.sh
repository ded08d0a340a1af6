#!/usr/bin/env bash
# Every reproduction script's --smoke at its table's deepest depth, one job per (table, method), side by side on one
# GPU: bash docs/gpu/smoke_all.sh DE_EN_DATA EN_FR_DATA WORKDIR [PARALLEL] [PRECISION].
# Each job's output goes to WORKDIR/logs, its runs to WORKDIR/TABLE_METHOD, one line per job to WORKDIR/status.txt;
# python docs/gpu/collect_smokes.py WORKDIR tabulates them.
set -u
[ $# -ge 3 ] || { echo "usage: $0 DE_EN_DATA EN_FR_DATA WORKDIR [PARALLEL] [PRECISION]" >&2; exit 2; }
de_en=$1 en_fr=$2 work=$3 parallel=${4:-16} precision=${5:-fp16}
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
mkdir -p "$work/logs"
smoke_one() {  # TABLE DATA METHOD DEPTH
  local start=$SECONDS name=$1_$3
  OMP_NUM_THREADS=1 bash "$repo/scripts/reproduce_$1.sh" --data "$2" --smoke --precision "$precision" \
      --methods "$3" --depths "$4" --seeds 1 --workdir "$work/$name" > "$work/logs/$name.log" 2>&1
  echo "$1 $3 $4 rc=$? $(( SECONDS - start ))s" >> "$work/status.txt"
}
export -f smoke_one
export repo work precision
# The deepest depth of every table, the longest jobs first; the En-Fr table on its own data.
xargs -P "$parallel" -L 1 bash -c 'smoke_one "$@"' _ <<EOF
deepnet_wmt17_en_de $de_en postln 100
deepnet_wmt17_en_de $de_en admin 100
deepnet_wmt17_en_de $de_en tfixup 100
deepnet_wmt17_en_de $de_en preln 100
deepnet_wmt17_en_de $de_en deepnorm 100
deepnet_iwslt14_de_en $de_en postln 100
deepnet_iwslt14_de_en $de_en preln 100
deepnet_iwslt14_de_en $de_en deepnorm 100
admin_wmt14_en_fr $en_fr postln 60-12
admin_wmt14_en_fr $en_fr preln 60-12
admin_wmt14_en_fr $en_fr admin 60-12
dlcl_wmt16_en_de $de_en dlcl 30-6
dlcl_wmt16_en_de $de_en dlcl_postnorm 25-6
dlcl_wmt16_en_de $de_en preln 20-6
dlcl_wmt16_en_de $de_en postln 6
tfixup_wmt14_en_de $de_en tfixup 30
tfixup_wmt17_en_de $de_en tfixup 30
tfixup_wmt17_en_de $de_en tfixup_big 6
admin_wmt14_en_de $de_en postln 18
admin_wmt14_en_de $de_en preln 18
admin_wmt14_en_de $de_en admin 18
b2t_wmt16_en_de $de_en preln 18
b2t_wmt16_en_de $de_en b2t 18
resi_dual_iwslt14_de_en $de_en postln 12
resi_dual_iwslt14_de_en $de_en preln 12
resi_dual_iwslt14_de_en $de_en resi_dual 12
resi_dual_wmt14_en_de $de_en postln 12
resi_dual_wmt14_en_de $de_en preln 12
resi_dual_wmt14_en_de $de_en resi_dual 12
admin_iwslt14_de_en $de_en postln 6
admin_iwslt14_de_en $de_en preln 6
admin_iwslt14_de_en $de_en admin 6
preln_iwslt14_de_en $de_en postln 6
preln_iwslt14_de_en $de_en preln 6
subln_wmt17_en_de $de_en preln 6
subln_wmt17_en_de $de_en subln 6
tfixup_iwslt14_de_en $de_en tfixup 6
EOF
