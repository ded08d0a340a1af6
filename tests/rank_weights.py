"""Test harness: fairseq-train that also saves each rank's model weights at every checkpoint, as rank<R>.pt in the
save dir (fairseq writes its checkpoints from rank 0 alone). The multi-node test puts it on PATH as
``fairseq-train``, so the reproduction scripts' torchrun launches it as it launches the real one."""

import os
import sys

import torch

# the plugin from the --user-dir the driver passes, as fairseq-train imports it (not an installed copy elsewhere):
# it registers the plugin and its fairseq shims before training starts
sys.path.insert(0, os.path.dirname(os.path.abspath(sys.argv[sys.argv.index("--user-dir") + 1])))
import deepnmt_plugin  # noqa: E402,F401
from fairseq import checkpoint_utils  # noqa: E402
from fairseq_cli import train  # noqa: E402

save_checkpoint = checkpoint_utils.save_checkpoint


def save_and_record(cfg, trainer, epoch_itr, val_loss):
    rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
    os.makedirs(cfg.save_dir, exist_ok=True)
    torch.save(trainer.get_model().state_dict(), os.path.join(cfg.save_dir, f"rank{rank}.pt"))
    return save_checkpoint(cfg, trainer, epoch_itr, val_loss)


checkpoint_utils.save_checkpoint = save_and_record
sys.exit(train.cli_main())
