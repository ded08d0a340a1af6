"""Test harness: one fairseq-train rank that also records the omega it ends its Admin initialisation with.

Usage: python admin_rank.py OUT_DIR <fairseq-train arguments>; writes OUT_DIR/rank<R>.json.
"""

import json
import os
import sys

import torch

import deepnmt_plugin  # noqa: F401
from deepnmt_plugin.tasks.translation_deep import TranslationDeepTask
from fairseq_cli import train

out_dir = sys.argv.pop(1)
profiling_input, initialize_admin = TranslationDeepTask.profiling_input, TranslationDeepTask.initialize_admin
seen = {}


def record_input(self, model, dataset, kwargs):
    net_input = profiling_input(self, model, dataset, kwargs)
    seen["src_tokens_sum"] = int(net_input["src_tokens"].sum())
    return net_input


def record_omega(self, model, dataset, kwargs):
    initialize_admin(self, model, dataset, kwargs)
    seen["omega"] = {n: p.tolist() for n, p in model.named_parameters() if n.endswith(".omega")}
    rank = torch.distributed.get_rank()
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as handle:
        json.dump(seen, handle)


TranslationDeepTask.profiling_input = record_input
TranslationDeepTask.initialize_admin = record_omega
train.cli_main()
