"""Where Sub-LN's extra operators come from: ATen operators of one forward and backward (no optimizer step) of
6L-6L 64-128-2 on the CPU, for Pre-LN, Pre-LN with its self-attention forced onto fairseq's unfused path (as Sub-LN's
inner LayerNorm before out_proj forces it), and Sub-LN. Run from the repository root:
OMP_NUM_THREADS=1 python docs/gpu/subln_operators.py
"""

import argparse

from deepnmt_plugin.bench import throughput

ARGS = argparse.Namespace(data_bin="data/l10n/data-bin", dims="tiny", layers=6, max_tokens=4096, cpu=True,
                          precision="fp32")


def forward_backward_operators(arch: str, unfused_self_attention: bool = False) -> int:
    trainer = throughput.build_trainer(ARGS, arch)
    if unfused_self_attention:
        for module in trainer.model.modules():
            if getattr(module, "self_attention", False):
                module._set_skip_embed_dim_check()  # fairseq then skips torch's fused attention
    batch = throughput.fixed_batches(trainer, 1)[0]
    trainer.model.train()
    with throughput.OperatorCounter() as counter:
        loss, _, _ = trainer.criterion(trainer.model, batch)
        loss.backward()
    return counter.count


if __name__ == "__main__":
    for arch, unfused in (("transformer_preln", False), ("transformer_preln", True), ("transformer_subln", False)):
        print(f"{arch}{' (self-attention unfused)' if unfused else ''}: {forward_backward_operators(arch, unfused)}")
