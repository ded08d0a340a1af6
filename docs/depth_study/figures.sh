#!/usr/bin/env bash
# Redraws the depth study's figures from the records in docs/depth_study (run from the repository root).
# bleu_vs_depth.png, valid_loss_vs_update.png and update_norm_<N>L.png are written by
#   python -m deepnmt_plugin.bench.depth --preset study --data data/l10n --workdir runs/depth_study
# from the cells in that workdir (copy docs/depth_study/cells/* there to reuse them).
set -euo pipefail

# deepnorm_100L_schedules.png
python -m deepnmt_plugin.bench.curves \
    --curve "DeepNorm, lr 2e-3, warmup 500 (the study's cell, trained on)" docs/depth_study/cells/deepnorm_100L-100L/result.json docs/depth_study/extended/deepnorm_100L-100L/valid.log \
    --curve "DeepNorm, lr 1e-3, warmup 500" docs/depth_study/variants/lr1e-3/deepnorm_100L-100L/result.json \
    --curve "DeepNorm, lr 2e-3, warmup 4000" docs/depth_study/variants/warmup4000/deepnorm_100L-100L/result.json \
    --curve "T-Fixup, lr 2e-3, no warmup (the study's cell, trained on)" docs/depth_study/cells/tfixup_100L-100L/result.json docs/depth_study/extended/tfixup_100L-100L/valid.log \
    --title "100L-100L: DeepNorm under three schedules, T-Fixup under the study's" --out docs/depth_study/deepnorm_100L_schedules.png

# admin_warmup.png
V=docs/depth_study/variants/warmup4000; C=docs/depth_study/cells
python -m deepnmt_plugin.bench.curves \
    --curve "Admin 6L-6L, warmup 4000" $V/admin_6L-6L/result.json $V/extended/admin_6L-6L/valid.log \
    --curve "Admin 50L-50L, warmup 500 (the study's cell)" $C/admin_50L-50L/result.json \
    --curve "Admin 50L-50L, warmup 4000" $V/admin_50L-50L/result.json $V/extended/admin_50L-50L/valid.log \
    --curve "Admin 100L-100L, warmup 500 (the study's cell)" $C/admin_100L-100L/result.json \
    --curve "Admin 100L-100L, warmup 4000" $V/admin_100L-100L/result.json $V/extended/admin_100L-100L/valid.log \
    --title "Admin, peak lr 2e-3: warmup 500 (the study's) and 4,000 updates" --out docs/depth_study/admin_warmup.png

# gnorm_by_layer.png: each probe retrains its cell's first 400 updates into runs/depth_study_probes/<probe>/train.log
for p in admin_50L-50L admin_18L-18L postln_50L-50L; do mkdir -p runs/depth_study_probes/${p}_first400
    bash docs/depth_study/probes/${p}_first400/train_command.txt > runs/depth_study_probes/${p}_first400/train.log 2>&1; done
python -m deepnmt_plugin.bench.layers runs/depth_study_probes/admin_18L-18L_first400/train.log \
    runs/depth_study_probes/admin_50L-50L_first400/train.log runs/depth_study_probes/postln_50L-50L_first400/train.log \
    --key gnorm --updates 10 100 200 250 300 400 --labels "Admin 18L-18L" "Admin 50L-50L" "Post-LN 50L-50L" \
    --out docs/depth_study/gnorm_by_layer.png

# gnorm_by_layer_deepnorm.png: the first 300 updates of each cell (the 500L one at about 9 s per update on one CPU thread)
for p in deepnorm_50L-50L deepnorm_100L-100L deepnorm_500L-500L; do mkdir -p runs/depth_study_probes/${p}_first300
    bash docs/depth_study/probes/${p}_first300/train_command.txt > runs/depth_study_probes/${p}_first300/train.log 2>&1; done
python -m deepnmt_plugin.bench.layers runs/depth_study_probes/deepnorm_50L-50L_first300/train.log \
    runs/depth_study_probes/deepnorm_100L-100L_first300/train.log runs/depth_study_probes/deepnorm_500L-500L_first300/train.log \
    --key gnorm --updates 10 100 150 200 --labels "DeepNorm 50L-50L" "DeepNorm 100L-100L" "DeepNorm 500L-500L" \
    --out docs/depth_study/gnorm_by_layer_deepnorm.png

# gnorm_by_layer_deepnorm_500L_lr1e-3.png, from the recorded train_inner lines of the one-update probes
cat docs/depth_study/probes/lr1e-3_one_update/deepnorm_500L-500L_ckpt_at{1000,0}/train_inner.txt > gnorm_500L.log
python -m deepnmt_plugin.bench.layers gnorm_500L.log --key gnorm --updates 1 1001 --labels "DeepNorm 500L-500L, lr 1e-3" \
    --out docs/depth_study/gnorm_by_layer_deepnorm_500L_lr1e-3.png
