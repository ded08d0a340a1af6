"""Per-layer diagnostics against depth: ``python -m deepnmt_plugin.bench.layers LOG [LOG ...] --key gnorm --out F.png``.

Reads the ``train_inner`` lines (simple or json ``--log-format``) of ``fairseq-train`` logs written with
``--task translation_deep --diagnostics-groups gnorm,ln_input,beta,omega`` and plots each layer's value against
its index at chosen updates: one row of panels (encoder, decoder) per log, one line per update. This is Xiong et
al. Fig. 3 (gradient norm by layer) and Admin Fig. 4 (beta by layer) followed through one run, so it shows where
in the stack gradients vanish and at which update.
"""

import argparse
import re
import sys
from pathlib import Path
from typing import Dict, List, Optional

from deepnmt_plugin.bench import pyplot

KEYS = ("gnorm", "ln_input", "beta", "omega", "omega_std")
SUBLAYERS = ("attn", "cross", "ffn")
STACKS = {"enc": "encoder", "dec": "decoder"}


def layer_values(log: str, key: str, sublayer: Optional[str] = None) -> Dict[int, Dict[str, List[float]]]:
    """{update: {"enc": [layer 0, layer 1, ...], "dec": [...]}} for ``key`` (of ``sublayer``: attn, cross, ffn,
    for every key but gnorm, which is per layer), from the train_inner lines that measured it."""
    suffix = "" if sublayer is None else r"\." + sublayer
    value = re.compile(r'"?' + re.escape(key) + r"/(enc|dec)\.(\d+)" + suffix + r'"?(?:=|: )"?([^,\s"}]+)')
    by_update = {}
    for line in log.splitlines():
        if "| train_inner |" not in line:
            continue
        stacks = {}
        for stack, layer, text in value.findall(line):
            if text != "None":  # fairseq prints a stat with no new value since the previous line as None
                stacks.setdefault(stack, {})[int(layer)] = float(text)
        if stacks:
            update = int(re.search(r'num_updates"?(?:=|: )"?(\d+)', line).group(1))
            by_update[update] = {stack: [layers[i] for i in sorted(layers)] for stack, layers in stacks.items()}
    return by_update


def plot(runs: Dict[str, Dict[int, Dict[str, List[float]]]], updates: List[int], ylabel: str, path: Path) -> None:
    """One row per run (label -> layer_values), encoder and decoder side by side, one line per update."""
    plt = pyplot()

    figure, axes = plt.subplots(len(runs), 2, figsize=(10, 3.5 * len(runs)), squeeze=False, sharey=True,
                               layout="constrained")  # no title over the xlabel above it
    colors = plt.get_cmap("viridis")([i / max(1, len(updates) - 1) for i in range(len(updates))])
    values = [v for by_update in runs.values() for stacks in by_update.values() for vs in stacks.values() for v in vs]
    # log y when the values span orders of magnitude (vanishing gradients), linear for beta and omega
    log_y = min(values) > 0 and max(values) / min(values) > 100
    for row, (label, by_update) in zip(axes, runs.items()):
        for panel, (stack, name) in zip(row, STACKS.items()):
            for update, color in zip(updates, colors):
                layers = by_update.get(update, {}).get(stack)
                if layers:
                    panel.plot(range(len(layers)), layers, marker="." if len(layers) < 30 else None, color=color,
                               label=f"update {update}")
            panel.set(title=f"{label}: {name}", xlabel="layer", ylabel=ylabel, yscale="log" if log_y else "linear")
            if panel.has_data():
                panel.legend(fontsize="small")
    figure.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(figure)


def parse_arguments(argv=None):
    parser = argparse.ArgumentParser("python -m deepnmt_plugin.bench.layers", description=__doc__.split("\n\n")[0])
    parser.add_argument("logs", nargs="+", type=Path, help="fairseq-train logs, one row of panels each")
    parser.add_argument("--key", choices=KEYS, default="gnorm")
    parser.add_argument("--sublayer", choices=SUBLAYERS, help="whose value: needed for every key but gnorm")
    parser.add_argument("--updates", nargs="+", type=int, required=True, help="one line per update (measured ones)")
    parser.add_argument("--labels", nargs="+", help="one per log (default: the log's parent folder)")
    parser.add_argument("--out", type=Path, required=True, help="the PNG to write")
    args = parser.parse_args(argv)
    if (args.key == "gnorm") != (args.sublayer is None):
        parser.error(f"--key {args.key}: " + ("gnorm is per layer, drop --sublayer" if args.sublayer else
                                              f"name the sublayer, --sublayer {{{','.join(SUBLAYERS)}}}"))
    if args.labels and len(args.labels) != len(args.logs):
        parser.error(f"--labels: {len(args.labels)} labels for {len(args.logs)} logs")
    return args, parser


def main(argv=None) -> int:
    args, parser = parse_arguments(argv)
    name = args.key + ("" if args.sublayer is None else f" ({args.sublayer})")
    runs = {}
    for path, label in zip(args.logs, args.labels or [p.parent.name for p in args.logs]):
        by_update = layer_values(path.read_text(errors="replace"), args.key, args.sublayer)
        if not by_update:
            parser.error(f"{path}: no train_inner line has {name} per layer; train with --task translation_deep "
                         f"--diagnostics-interval K --diagnostics-groups {args.key.replace('omega_std', 'omega')}")
        missing = [u for u in args.updates if u not in by_update]
        if missing:
            measured = sorted(by_update)
            parser.error(f"{path}: {name} was not measured at update {', '.join(map(str, missing))} "
                         f"(measured at {len(measured)} updates, {measured[0]} to {measured[-1]})")
        runs[label] = by_update
    plot(runs, args.updates, name, args.out)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
