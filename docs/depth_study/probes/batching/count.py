"""How many pairs of the study's corpus fairseq's batching leaves out of an epoch, and the plugin's:
``python docs/depth_study/probes/batching/count.py data/l10n > docs/depth_study/probes/batching/counts.txt``.

The study's batches: --max-tokens 1024, fairseq's default --required-batch-size-multiple 8, every pair within the
model's 1024 positions."""

import logging
import sys

import numpy
from fairseq import options, tasks
from fairseq.data import data_utils

import deepnmt_plugin  # noqa: F401  (installs the plugin's batching over fairseq's)

logging.disable(logging.INFO)
fairseq_batching, plugin_batching = data_utils.batch_by_size.__wrapped__, data_utils.batch_by_size
parser = options.get_training_parser()
args = options.parse_args_and_arch(parser, [f"{sys.argv[1]}/data-bin", "--arch", "transformer", "--cpu"])
task = tasks.setup_task(args)
print("subset\tpairs\tbatching\tbatches\tpairs batched")
for subset in ("train", "valid"):
    task.load_dataset(subset)
    dataset = task.dataset(subset)
    indices, _ = dataset.filter_indices_by_size(dataset.ordered_indices(), (1024, 1024))
    tokens = dataset.num_tokens_vec(indices).astype(numpy.int64)
    for name, batching in (("fairseq", fairseq_batching), ("plugin", plugin_batching)):
        batches = batching(indices, dataset.num_tokens, num_tokens_vec=tokens, max_tokens=1024,
                           required_batch_size_multiple=8)
        print(f"{subset}\t{len(dataset)}\t{name}\t{len(batches)}\t{sum(len(batch) for batch in batches)}")
