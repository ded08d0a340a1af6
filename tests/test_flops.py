"""Model FLOPs (bench/flops.py) against a hand count and against PyTorch's FlopCounterMode on a real fairseq
transformer, and the throughput tool's TFLOP/s and MFU columns with their peak."""

from types import SimpleNamespace

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from deepnmt_plugin.bench import throughput
from deepnmt_plugin.bench.flops import forward_flops, update_flops


def translation_batch(sentences: int, source: int, target: int, vocab: int = 10) -> dict:
    """A fairseq translation batch's tensors: the first source sentence padded by 2 (left, as fairseq pads them)."""
    src_tokens = torch.randint(4, vocab, (sentences, source))
    src_tokens[0, :2] = 1
    src_lengths = torch.full((sentences,), source)
    src_lengths[0] = source - 2
    prev_output_tokens = torch.randint(4, vocab, (sentences, target))
    net_input = {"src_tokens": src_tokens, "src_lengths": src_lengths, "prev_output_tokens": prev_output_tokens}
    return {"net_input": net_input, "target": torch.randint(4, vocab, (sentences, target))}


def test_flops_of_a_tiny_config_by_hand():
    """2 encoder layers, 1 decoder layer, d 4, f 8, V 10; 2 sentences of 3 source and 5 target positions."""
    batch = translation_batch(sentences=2, source=3, target=5)
    source_tokens, target_tokens = 2 * 3, 2 * 5
    # 6 source tokens x (q, k, v, out: 4 x 4 x 4; FFN: 2 x 4 x 8) + 2 sentences x QKᵀ and AV (2 x 3 x 3 x 4)
    encoder_layer = source_tokens * (4 * 4 * 4 + 2 * 4 * 8) + 2 * (2 * 3 * 3 * 4)
    assert encoder_layer == 768 + 144
    # 10 target tokens x (self q, k, v, out; cross q, out; FFN) + 6 source tokens x cross k, v
    # + 2 sentences x (self QKᵀ and AV over 5 x 5; cross over 5 x 3)
    decoder_layer = (target_tokens * (4 * 4 * 4 + 2 * 4 * 4 + 2 * 4 * 8) + source_tokens * 2 * 4 * 4
                     + 2 * (2 * 5 * 5 * 4 + 2 * 5 * 3 * 4))
    assert decoder_layer == 1600 + 192 + 640
    output = target_tokens * 4 * 10  # d x V per target token
    multiply_adds = 2 * encoder_layer + 1 * decoder_layer + output
    assert multiply_adds == 1824 + 2432 + 400 == 4656
    assert forward_flops(2, 1, 4, 8, 10, batch) == 2 * multiply_adds == 9312
    assert update_flops(2, 1, 4, 8, 10, batch) == 3 * 2 * multiply_adds == 27936


def test_flops_equal_pytorchs_count_of_a_fairseq_transformer(build_model):
    """FlopCounterMode counts mm, addmm, bmm and the attention kernels, all matmuls, as we do. It has no formula for
    the CPU's fused attention (``_scaled_dot_product_flash_attention_for_cpu``), which the self-attentions run, so
    the count is taken on PyTorch's math backend, where attention is two bmm's: the same products."""
    model, args = build_model("transformer", "--encoder-layers", 2, "--decoder-layers", 3,
                              "--encoder-embed-dim", 16, "--decoder-embed-dim", 16, "--encoder-ffn-embed-dim", 32,
                              "--decoder-ffn-embed-dim", 32, "--encoder-attention-heads", 2,
                              "--decoder-attention-heads", 2, "--share-all-embeddings")
    vocab = len(model.decoder.dictionary)
    batch = translation_batch(sentences=3, source=7, target=5, vocab=vocab)
    ours = forward_flops(2, 3, 16, 32, vocab, batch)
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as forward:
        model(**batch["net_input"])
    assert forward.get_total_flops() == ours
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as update:
        logits, _ = model(**batch["net_input"])
        logits.sum().backward()
    assert update.get_total_flops() == 3 * ours == update_flops(2, 3, 16, 32, vocab, batch)  # backward = 2 x forward


def test_throughput_reports_tflops_and_mfu_against_the_given_peak(toy_data, capsys):
    assert throughput.main(["--data", str(toy_data), "--dims", "tiny", "--layers", "1", "--max-tokens", "500",
                            "--rounds", "2", "--updates", "1", "--archs", "transformer", "--cpu",
                            "--peak-tflops", "0.5"]) == 0
    out = capsys.readouterr().out
    assert "Model FLOPs per update: " in out and "Peak 0.5 TFLOP/s (--peak-tflops)" in out
    assert "| operators per update | TFLOP/s | MFU |" in out
    tflops, mfu = out.split("| transformer | ")[1].split(" |\n")[0].split(" | ")[-2:]
    assert float(tflops) > 0
    assert float(mfu.rstrip("%")) == pytest.approx(100 * float(tflops) / 0.5, rel=0.01, abs=0.01)


def test_peak_from_the_card_the_precision_or_a_cpu_matmul(monkeypatch):
    args = SimpleNamespace(peak_tflops=None, cpu=False, precision="fp32")
    for name, precision, allow_tf32, peak in [("NVIDIA H200", "bf16", False, 989.5),
                                              ("NVIDIA H100 80GB HBM3", "fp32", False, 67),
                                              ("NVIDIA H100 PCIe", "fp16", False, 756.5),
                                              ("NVIDIA A100-SXM4-80GB", "fp32", True, 156),  # TF32 on
                                              ("NVIDIA A10", "fp32", False, 31.2),  # not the A100
                                              ("Tesla V100-PCIE-32GB", "fp16", False, 112),
                                              ("NVIDIA L40S", "bf16", False, None),  # not the L4
                                              ("Tesla V100-SXM2-16GB", "bf16", False, None)]:  # Volta has no bf16
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda name=name: name)
        monkeypatch.setattr(torch.backends.cuda, "matmul", SimpleNamespace(allow_tf32=allow_tf32))
        args.precision = precision
        found, line = throughput.peak_tflops(args)
        assert found == peak, name
        assert ("pass --peak-tflops" in line) == (peak is None)

    monkeypatch.setattr(throughput, "CPU_MATMUL_SIZE", 256)  # the wiring, not the 2048² measurement
    peak, line = throughput.peak_tflops(SimpleNamespace(peak_tflops=None, cpu=True))
    assert peak > 0 and line.startswith("CPU peak measured by a 256² fp32 matmul: ")
    assert float(line.split(": ")[1].split(" GFLOP/s")[0]) == pytest.approx(1000 * peak, rel=0.01)


def test_an_unknown_peak_prints_a_dash_for_mfu():
    args = SimpleNamespace(dims="tiny", layers=1, max_tokens=500, rounds=1, updates=1, precision="fp32", cpu=True,
                           archs=["transformer"])
    result = {"wps": 1000, "ratio": 1.0, "min": 1.0, "max": 1.0, "update_seconds": 0.5, "update_flops": 2e9,
              "operators": 3000}
    table = throughput.report(args, {"transformer": result}, None, "MFU: no fp32 peak known for X: pass --peak-tflops")
    assert "| 3000 (1.000) | 0.004 | – |" in table and "pass --peak-tflops" in table
