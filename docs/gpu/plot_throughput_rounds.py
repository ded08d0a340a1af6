"""Draws throughput_h200_15rounds.png from throughput_h200_15rounds.csv (run from the repository root): each arch's
words/s over `transformer`'s in the same round, one box per arch and precision."""

import csv
from collections import defaultdict
from pathlib import Path

from deepnmt_plugin.bench import pyplot

HERE = Path(__file__).parent
ratios = defaultdict(list)
for row in csv.DictReader((HERE / "throughput_h200_15rounds.csv").open()):
    ratios[row["precision"], row["arch"].removeprefix("transformer_")].append(
        int(row["words_per_s"]) / int(row["transformer_words_per_s"]))
archs = list(dict.fromkeys(arch for _, arch in ratios))

plt = pyplot()
fig, ax = plt.subplots(figsize=(10, 4.5))
for offset, (precision, colour) in zip((-0.18, 0.18), (("fp16", "tab:blue"), ("bf16", "tab:orange"))):
    boxes = ax.boxplot([ratios[precision, arch] for arch in archs], positions=[i + offset for i in range(len(archs))],
                       widths=0.3, patch_artist=True, showfliers=True)
    for box in boxes["boxes"]:
        box.set(facecolor=colour, alpha=0.5)
    ax.plot([], [], color=colour, linewidth=8, alpha=0.5, label=precision)
ax.axhline(1.0, color="grey", linestyle="--", linewidth=1)
ax.set_xticks(range(len(archs)), archs)
ax.set_ylabel("words/s over transformer's, per round")
ax.set_title("6L-6L 512-2048-8, 4,096 tokens per update, 15 rounds x 4 updates, one H200")
ax.legend()
fig.tight_layout()
fig.savefig(HERE / "throughput_h200_15rounds.png", dpi=110)
