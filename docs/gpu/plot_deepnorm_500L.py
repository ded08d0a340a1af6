"""Draws deepnorm_500L_base.png from the records beside it (run from the repository root):
training loss per update and GPU memory (the run's own peak per update, and the whole GPU from nvidia-smi)."""

import re
from datetime import datetime
from pathlib import Path

from deepnmt_plugin.bench import pyplot

HERE = Path(__file__).parent
TOTAL_GB = 139.801  # fairseq's "total memory" of the H200; gb_free = total - torch.cuda.max_memory_allocated()

updates, losses, peaks = [], [], []
for line in (HERE / "deepnorm_500L_base_train.log").read_text().splitlines():
    fields = dict(re.findall(r"(\w+)=([\d.e+-]+)", line))
    if "num_updates" in fields:
        updates.append(int(fields["num_updates"]))
        losses.append(float(fields["loss"]))
        peaks.append(TOTAL_GB - float(fields["gb_free"]))

rows = [row.split(", ") for row in (HERE / "gpu_memory_500L_and_smoke.csv").read_text().splitlines()]
start = datetime.strptime(rows[0][0], "%Y/%m/%d %H:%M:%S.%f")
seconds = [(datetime.strptime(r[0], "%Y/%m/%d %H:%M:%S.%f") - start).total_seconds() for r in rows]
used_gb = [int(r[1].split()[0]) / 1024 for r in rows]

plt = pyplot()
figure, (loss_axes, run_axes, gpu_axes) = plt.subplots(1, 3, figsize=(15, 4.2))
loss_axes.plot(updates, losses, marker=".")
loss_axes.axhline(9.264, color="grey", linestyle="--", label="unigram plateau (9.264)")
loss_axes.set(xlabel="update", ylabel="training loss (label-smoothed, bits)", title="DeepNorm 500L-500L, 512-2048-8, fp16")
loss_axes.legend(fontsize="small")
run_axes.plot(updates, peaks, marker=".")
run_axes.set(xlabel="update", ylabel="GiB", ylim=(0, TOTAL_GB), title="the run's peak allocated memory per update")
gpu_axes.plot(seconds, used_gb)
gpu_axes.set(xlabel="seconds from the start of the checks", ylabel="GiB", ylim=(0, 145),
             title="whole GPU (nvidia-smi): 500L run + smoke runs")
for axes in (loss_axes, run_axes, gpu_axes):
    axes.grid(alpha=0.3)
figure.tight_layout()
figure.savefig(HERE / "deepnorm_500L_base.png", dpi=110)
