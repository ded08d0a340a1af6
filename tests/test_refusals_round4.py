"""Bad inputs on the 2024-2026 archs, refused at start-up in one line where they crashed or were silently ignored:
``--quant-noise-scalar`` on σReparam, HybridNorm and Sub-LN (a KeyError in fairseq's swap of their projections); a DyT alpha_0
that a float32 cannot hold (a RuntimeError, or alpha silently 0); a σReparam gain whose drawn weights the power
iteration cannot resolve (nan in the first forward); a DenseFormer period or dilation longer than a stack (no average,
or averages that read no earlier output; an OverflowError when huge). And a Mix-LN alpha within 1e-9 of 1, which made
every layer Post-LN (what alpha 1 is refused for), keeps the top layer Pre-LN."""

import pytest
import torch

from conftest import TINY_DIMS, USER_DIR, fairseq_cli
from deepnmt_plugin.models.mixln import mixln_post_layers
from deepnmt_plugin.models.sigma import SigmaReparamLinear
from tiny_training import last_line
from tiny_training import one_thread_per_process  # noqa: F401  (autouse fixture)

LAYERS = ["--encoder-layers", 2, "--decoder-layers", 2]
FLOAT32 = ("alpha_0 must be positive and finite, as a float32 (1.18e-38 to 3.4e+38; tanh(0 * x) is 0 for every "
           "input, tanh(inf * 0) is nan)")
SCALAR = ("--quant-noise-scalar is not supported by --arch {arch}: fairseq's scalar quantization swaps each "
          "nn.Linear for its own, and {method} replaces projections with its own")
NO_AVERAGE = ("--denseformer-period {period}: the {side}'s {layers} layers would hold no average (one every {period} "
              "layers); give at most {most}")
NO_EARLIER = ("--denseformer-dilation {dilation}: no average of the encoder's {layers} layers would read an earlier "
              "output (the one after layer i reads layers i - {dilation}, i - {twice}, ...); give at most {most}")
HUGE = 99999999999999999999

# the recipe, its flags, the one line it stops with, and flags that line advises instead (they build)
REFUSED = [
    *(pytest.param(method, ["--quant-noise-scalar", 0.1], SCALAR.replace("{method}", method), None,
                   id=f"{method}-quant-noise-scalar") for method in ("sigma", "hybridnorm", "subln")),
    pytest.param("dyt", ["--dyt-alpha-init", "1e39"], f"--dyt-alpha-init 1e+39: {FLOAT32}",
                 ["--dyt-alpha-init", "1e30"], id="dyt-alpha-overflows"),
    pytest.param("dyt", ["--dyt-alpha-init", "1e-50"], f"--dyt-alpha-init 1e-50: {FLOAT32}",
                 ["--dyt-alpha-init", "1e-30"], id="dyt-alpha-underflows"),
    pytest.param("dyt", ["--dyt-attention-alpha-init", "1e300"], f"--dyt-attention-alpha-init 1e+300: {FLOAT32}",
                 None, id="dyt-attention-alpha-overflows"),
    pytest.param("dyt", ["--dyt-attention-alpha-init", "1e-40"], f"--dyt-attention-alpha-init 1e-40: {FLOAT32}", None,
                 id="dyt-attention-alpha-underflows"),
    pytest.param("denseformer", ["--denseformer-period", 3],
                 NO_AVERAGE.format(period=3, side="encoder", layers=2, most=2), ["--denseformer-period", 2],
                 id="denseformer-period"),
    pytest.param("denseformer", ["--encoder-layers", 6, "--denseformer-period", 3],
                 NO_AVERAGE.format(period=3, side="decoder", layers=2, most=2),
                 ["--encoder-layers", 6, "--denseformer-period", 2], id="denseformer-period-decoder"),
    pytest.param("denseformer", ["--denseformer-period", HUGE],
                 NO_AVERAGE.format(period=HUGE, side="encoder", layers=2, most=2), None, id="denseformer-period-huge"),
    pytest.param("denseformer", ["--denseformer-dilation", 3],
                 NO_EARLIER.format(dilation=3, layers=2, twice=6, most=2), ["--denseformer-dilation", 2],
                 id="denseformer-dilation"),
    pytest.param("denseformer", ["--encoder-layers", 5, "--decoder-layers", 5, "--denseformer-period", 2,
                                 "--denseformer-dilation", 5],
                 NO_EARLIER.format(dilation=5, layers=5, twice=10, most=4),
                 ["--encoder-layers", 5, "--decoder-layers", 5, "--denseformer-period", 2, "--denseformer-dilation", 4],
                 id="denseformer-dilation-past-the-last-average"),
    pytest.param("denseformer", ["--denseformer-dilation", HUGE],  # an OverflowError in the mask
                 NO_EARLIER.format(dilation=HUGE, layers=2, twice=2 * HUGE, most=2), None,
                 id="denseformer-dilation-huge"),
]


@pytest.mark.parametrize("method, flags, message, advised", REFUSED)
def test_bad_recipe_inputs_are_refused_in_one_line(method, flags, message, advised, build_model):
    arch = f"transformer_{method}_iwslt_de_en"
    with pytest.raises(SystemExit) as refused:
        build_model(arch, *TINY_DIMS, *LAYERS, *flags)
    assert refused.value.code == "deepnmt: error: " + message.format(arch=arch)
    if advised is not None:
        build_model(arch, *TINY_DIMS, *LAYERS, *advised)


@pytest.mark.parametrize("gain", ["1e-50", "1e-30", "3e-12"])
def test_sigma_gain_too_small_for_the_power_iteration_is_refused_in_one_line(gain, build_model):
    """W = 0 (1e-50) gave nan in the first forward (then a StopIteration in fairseq's NaN detector); a spectral
    norm under F.normalize's floor (1e-30, 3e-12), a power-iteration estimate that is not sigma(W): W_hat != W at init.
    A gain whose weights the iteration resolves builds a model that starts as its weights."""
    with pytest.raises(SystemExit) as refused:
        build_model("transformer_sigma_iwslt_de_en", *TINY_DIMS, *LAYERS, "--sigma-init-gain", gain)
    std = f"{0.02 * float(gain):.3g}"
    assert refused.value.code.startswith(f"deepnmt: error: --sigma-init-gain {gain}: weights drawn with std {std} have "
                                         "a spectral norm of ")
    assert refused.value.code.endswith(", under what σReparam's power iteration resolves (1e-12); give a larger gain")
    assert "\n" not in refused.value.code

    model, _ = build_model("transformer_sigma_iwslt_de_en", *TINY_DIMS, *LAYERS, "--sigma-init-gain", "1e-9")
    projections = [m for m in model.modules() if isinstance(m, SigmaReparamLinear)]
    assert len(projections) == 2 * 6 + 2 * 10  # encoder layers: q, k, v, out, fc1, fc2; decoder's: cross-attention too
    with torch.no_grad():
        for linear in projections:
            reparameterised = linear.weight * (linear.gamma / linear.sigma())
            torch.testing.assert_close(reparameterised, linear.weight, rtol=1e-4, atol=0)


@pytest.mark.parametrize("layers", [1, 2, 3, 10])
def test_mixln_alpha_just_below_one_keeps_the_top_layer_pre_ln(layers, build_model):
    """floor(alpha * L) for alpha < 1 is at most L - 1; the 1e-9 guard against 0.3 * 10 = 2.9999999999999996 made
    0.9999999999 every layer Post-LN: alpha 1's model, which --mixln-alpha refuses."""
    assert mixln_post_layers(0.9999999999, layers) == layers - 1
    model, _ = build_model("transformer_mixln_iwslt_de_en", *TINY_DIMS, "--encoder-layers", layers,
                           "--decoder-layers", layers, "--mixln-alpha", "0.9999999999")
    for stack in (model.encoder, model.decoder):
        assert [layer.self_attn_post_norm for layer in stack.layers] == [True] * (layers - 1) + [False]
        assert [layer.ffn_pre_norm for layer in stack.layers] == [False] * (layers - 1) + [True]


# Where a traceback was: the real fairseq-train, exit status 1 and the one line

CRASHED = [
    *(pytest.param(f"transformer_{method}", ["--quant-noise-scalar", 0.1], SCALAR.replace("{method}", method),
                   id=f"{method}-quant-noise-scalar") for method in ("sigma", "hybridnorm", "subln")),  # a KeyError
    pytest.param("transformer_dyt", ["--dyt-alpha-init", "1e39"], f"--dyt-alpha-init 1e+39: {FLOAT32}",
                 id="dyt-alpha-overflows"),  # a RuntimeError
    pytest.param("transformer_denseformer", ["--denseformer-dilation", HUGE],
                 NO_EARLIER.format(dilation=HUGE, layers=2, twice=2 * HUGE, most=2), id="denseformer-dilation-huge"),
]


@pytest.mark.slow
@pytest.mark.parametrize("arch, flags, message", CRASHED)
def test_fairseq_train_refuses_what_crashed_with_exit_status_1_and_no_traceback(arch, flags, message, toy_data,
                                                                                tmp_path):
    result = fairseq_cli("fairseq-train", toy_data, "--user-dir", USER_DIR, "--arch", arch, "--cpu", *TINY_DIMS,
                         *LAYERS, "--optimizer", "adam", "--lr", 1e-3, "--max-tokens", 1500, "--max-update", 2,
                         "--save-dir", tmp_path, *flags, check=False)
    assert result.returncode == 1, result.stderr[-2000:]
    assert last_line(result.stderr) == "deepnmt: error: " + message.format(arch=arch)
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "checkpoint_last.pt").exists()


@pytest.mark.slow
def test_sigma_gain_refusal_from_fairseq_train_exits_1_without_a_traceback(toy_data, tmp_path):
    """Refused while the model is built (the check needs the drawn weights): still one line, before any update.
    Crashed with a StopIteration from fairseq's NaN detector."""
    result = fairseq_cli("fairseq-train", toy_data, "--user-dir", USER_DIR, "--arch", "transformer_sigma", "--cpu",
                         *TINY_DIMS, *LAYERS, "--optimizer", "adam", "--lr", 1e-3, "--max-tokens", 1500,
                         "--max-update", 2, "--save-dir", tmp_path, "--sigma-init-gain", "1e-30", check=False)
    assert result.returncode == 1, result.stderr[-2000:]
    assert last_line(result.stderr).startswith("deepnmt: error: --sigma-init-gain 1e-30: weights drawn with std 2e-32")
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "checkpoint_last.pt").exists()
