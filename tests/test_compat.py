"""torch >= 2.6 weights-only loading: fairseq checkpoints load, anything else is refused clearly."""

import os

import pytest
import torch
from fairseq import checkpoint_utils

from conftest import TINY_DIMS, USER_DIR, fairseq_cli
from deepnmt_plugin.compat import UnsafeCheckpointError

pytestmark = pytest.mark.slow  # trains, generates or builds corpora through subprocesses


class Payload:
    """Pickles as a call to os.system: what a malicious checkpoint smuggles in."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


@pytest.fixture(scope="module")
def checkpoint(toy_data, tmp_path_factory):
    save_dir = tmp_path_factory.mktemp("compat")
    fairseq_cli(
        "fairseq-train", toy_data, "--user-dir", USER_DIR, "--arch", "transformer_deepnorm_iwslt_de_en",
        "--cpu", *TINY_DIMS, "--encoder-layers", 1, "--decoder-layers", 1, "--optimizer", "adam",
        "--lr", "1e-3", "--max-tokens", 1500, "--max-update", 3, "--save-dir", save_dir,
    )
    return save_dir / "checkpoint_last.pt"


def test_fairseq_checkpoint_needs_only_the_allowlisted_globals(checkpoint):
    assert torch.serialization.get_unsafe_globals_in_checkpoint(checkpoint) == []  # none left unallowed
    state = checkpoint_utils.load_checkpoint_to_cpu(str(checkpoint))
    assert state["cfg"].model.arch == "transformer_deepnorm_iwslt_de_en"


def test_a_run_validated_with_eval_bleu_loads_and_generates(toy_data, tmp_path):
    """--eval-bleu (ResiDual's IWSLT reproduction validates with it) keeps sacreBLEU's counts as numpy arrays in the
    checkpoint's metrics; the checkpoint still loads weights-only, and fairseq-generate translates with it."""
    fairseq_cli(
        "fairseq-train", toy_data, "--user-dir", USER_DIR, "--arch", "transformer_preln_iwslt_de_en", "--cpu",
        *TINY_DIMS, "--encoder-layers", 1, "--decoder-layers", 1, "--optimizer", "adam", "--lr", "1e-3",
        "--max-tokens", 1500, "--max-update", 2, "--save-dir", tmp_path, "--eval-bleu", "--eval-bleu-args",
        '{"beam": 1, "max_len_b": 5}', "--best-checkpoint-metric", "bleu", "--maximize-best-checkpoint-metric",
    )
    checkpoint = tmp_path / "checkpoint_last.pt"
    state = checkpoint_utils.load_checkpoint_to_cpu(str(checkpoint))
    counts = {name: meter.get("val") for _, name, _, meter in state["extra_state"]["metrics"]["valid"]}["_bleu_counts"]
    assert type(counts).__module__ == "numpy"
    result = fairseq_cli("fairseq-generate", toy_data, "--user-dir", USER_DIR, "--path", checkpoint, "--cpu",
                         "--beam", 1, "--max-len-b", 5)
    assert "H-0\t" in result.stdout


def test_weights_only_stays_on(checkpoint):
    """The plugin allowlists globals; it does not switch weights-only loading off."""
    assert torch.load(checkpoint, map_location="cpu")["cfg"]["model"].arch  # Namespace is allowed
    with pytest.raises(Exception, match="GLOBAL posix.system"):
        torch.load(_malicious(checkpoint.parent / "plain.pt", checkpoint.parent / "never"))


def _malicious(path, marker):
    torch.save({"model": {}, "args": None, "cfg": Payload(marker)}, path)
    return path


def test_smuggled_global_is_refused_in_process(tmp_path):
    marker = tmp_path / "code-ran"
    path = _malicious(tmp_path / "evil.pt", marker)
    with pytest.raises(UnsafeCheckpointError) as error:
        checkpoint_utils.load_checkpoint_to_cpu(str(path))
    message = str(error.value)
    assert str(path) in message and "posix.system" in message and "\n" not in message
    assert not marker.exists()


def test_smuggled_global_is_refused_by_fairseq_generate(toy_data, tmp_path):
    marker = tmp_path / "code-ran"
    path = _malicious(tmp_path / "evil.pt", marker)
    result = fairseq_cli(
        "fairseq-generate", toy_data, "--user-dir", USER_DIR, "--path", path, "--cpu", check=False,
    )
    assert result.returncode == 1 and "Traceback" not in result.stderr
    last_line = result.stderr.strip().splitlines()[-1]
    assert last_line.startswith(f"deepnmt: error: refusing to load checkpoint {path}: it references posix.system")
    assert not marker.exists()


def test_bf16_trains_where_the_run_is_not_on_a_missing_tpu(monkeypatch):
    """fairseq 0.12 turns --bf16 into --tpu; without torch_xla, training stays on CUDA or the CPU, in bf16."""
    from fairseq.distributed import utils as distributed_utils
    from omegaconf import OmegaConf

    from deepnmt_plugin import compat

    assert "_checked_start" in distributed_utils.call_main.deepnmt_shims  # fairseq-train's way in passes the check
    cfg = lambda **common: OmegaConf.create({"common": {"bf16": True, "tpu": True, "cpu": False, **common}})
    monkeypatch.setattr(compat, "_has_torch_xla", lambda: False)
    for off_tpu in (cfg(), cfg(cpu=True)):
        compat.bf16_off_tpu(off_tpu)
        assert off_tpu.common.tpu is False and off_tpu.common.bf16 is True
    explicit_tpu = cfg(bf16=False)  # an explicit --tpu without bf16: fairseq's call
    compat.bf16_off_tpu(explicit_tpu)
    assert explicit_tpu.common.tpu is True
    monkeypatch.setattr(compat, "_has_torch_xla", lambda: True)  # a real TPU host keeps fairseq's meaning
    on_tpu = cfg()
    compat.bf16_off_tpu(on_tpu)
    assert on_tpu.common.tpu is True


@pytest.mark.parametrize("vectorised", [True, False])
@pytest.mark.parametrize("multiple", [1, 3, 8])
@pytest.mark.parametrize("max_sentences, max_tokens", [(16, None), (64, None), (1, None), (None, 300), (16, 300)])
@pytest.mark.parametrize("size", [1, 7, 50, 333])
def test_batch_by_size_puts_every_index_in_exactly_one_batch(size, max_sentences, max_tokens, multiple, vectorised):
    """fairseq's batch_by_size dropped a last batch whose size is not a multiple of the required one (48 of 50 indices
    for 16 sentences a batch and the default 8); the others keep fairseq's sizes."""
    import numpy
    from fairseq.data import data_utils

    lengths = numpy.random.RandomState(size).randint(1, 40, size=size)
    indices = numpy.argsort(lengths, kind="mergesort")
    batches = data_utils.batch_by_size(indices, lambda i: lengths[i], num_tokens_vec=lengths if vectorised else None,
                                       max_tokens=max_tokens, max_sentences=max_sentences,
                                       required_batch_size_multiple=multiple)
    assert numpy.array_equal(numpy.concatenate(batches), indices)
    assert all(len(batch) % multiple == 0 or len(batch) < multiple for batch in batches[:-1])
