"""fairseq 0.12 under numpy 2 (and still under numpy 1.26): each numpy name fairseq calls that numpy removed is restored by
compat.py, and the fairseq code path that calls it runs; checkpoints load whichever numpy wrote them."""

import importlib

import numpy
import pytest
import torch
from fairseq.data import BucketPadLengthDataset, TokenBlockDataset, data_utils
from fairseq.modules import DynamicCRF

import deepnmt_plugin  # noqa: F401  (installs the shims, as fairseq-train --user-dir does)
from conftest import TINY_DIMS, USER_DIR, fairseq_cli


def test_fairseq_compiled_extensions_import():
    """Built from fairseq-fixed's sdist against the installed torch and numpy, every extension loads (the cp312 wheel's
    libbase was built against another torch and does not)."""
    for extension in ("fairseq.data.data_utils_fast", "fairseq.data.token_block_utils_fast", "fairseq.libbleu",
                      "fairseq.libbase", "fairseq.libnat"):
        importlib.import_module(extension)


def test_buckets_by_percentile_as_fairseq_computes_them():
    """get_buckets (np.percentile's interpolation=, removed in numpy 2.4): the lower 25/50/75/100th percentiles."""
    sizes = numpy.arange(1, 101)
    dataset = BucketPadLengthDataset([torch.ones(n) for n in sizes], sizes, num_buckets=4, pad_idx=0, left_pad=False)
    assert dataset.buckets.tolist() == [25, 50, 75, 100]
    assert data_utils.get_buckets(sizes, 4).tolist() == [25, 50, 75, 100]


def test_token_blocks_in_eos_mode():
    """TokenBlockDataset's "eos" mode (np.compat.long, removed in numpy 2): one block per sentence."""
    sentences = [torch.tensor([5, 6, 2]), torch.tensor([7, 2]), torch.tensor([8, 9, 10, 2])]
    blocks = TokenBlockDataset(sentences, [3, 2, 4], block_size=None, pad=1, eos=2, break_mode="eos")
    assert [blocks[i].tolist() for i in range(len(blocks))] == [s.tolist() for s in sentences]


def test_dynamic_crf_scores_a_sequence():
    """DynamicCRF's normaliser (np.float, removed in numpy 1.24): a finite log-likelihood, at most 0."""
    torch.manual_seed(0)
    crf = DynamicCRF(num_embedding=12, low_rank=4, beam_size=5)
    emissions, targets = torch.randn(2, 6, 12), torch.randint(0, 12, (2, 6))
    log_likelihood = crf(emissions, targets, torch.ones(2, 6, dtype=torch.bool))
    assert torch.isfinite(log_likelihood).all() and (log_likelihood <= 1e-5).all()


@pytest.mark.parametrize("writer", ["numpy.core.multiarray", "numpy._core.multiarray"])
def test_checkpoint_with_numpy_arrays_loads_whichever_numpy_wrote_it(tmp_path, writer):
    """numpy 1.x pickles arrays through numpy.core.multiarray._reconstruct, numpy 2 through numpy._core.multiarray's:
    a checkpoint holding arrays (as a run validated with --eval-bleu does) loads weights-only from either."""
    path = tmp_path / "checkpoint.pt"
    # torch's legacy format with pickle protocol 2 names each global as "c<module>\n<name>\n", to rename in place
    torch.save({"model": {"w": torch.ones(1)}, "counts": numpy.array([3, 1])}, path,
               _use_new_zipfile_serialization=False, pickle_protocol=2)
    written = path.read_bytes()
    for numpy_name in ("numpy.core.multiarray", "numpy._core.multiarray"):
        written = written.replace(f"c{numpy_name}\n_reconstruct\n".encode(), f"c{writer}\n_reconstruct\n".encode())
    assert f"c{writer}\n_reconstruct\n".encode() in written
    path.write_bytes(written)
    assert torch.load(path, map_location="cpu")["counts"].tolist() == [3, 1]  # weights_only, fairseq's allowlist


@pytest.mark.slow  # trains through a subprocess
def test_training_with_batch_buckets(toy_data, tmp_path):
    """--num-batch-buckets (LanguagePairDataset's np.compat.long and get_buckets) trains and saves."""
    fairseq_cli(
        "fairseq-train", toy_data, "--user-dir", USER_DIR, "--arch", "transformer_preln_iwslt_de_en", "--cpu",
        *TINY_DIMS, "--encoder-layers", 1, "--decoder-layers", 1, "--optimizer", "adam", "--lr", "1e-3",
        "--max-tokens", 1500, "--max-update", 2, "--save-dir", tmp_path, "--num-batch-buckets", 3,
    )
    assert (tmp_path / "checkpoint_last.pt").exists()
