"""DLCL (Wang et al. 2019): each layer reads a learned weighted sum of the embedding and every earlier layer
output; W lower-triangular, initialised to 1/(l+1). Pre-norm (default) and post-norm (--dlcl-post-norm)."""

import pytest
import torch

from deepnmt_plugin.models.dlcl import dlcl_initial_weights
from deepnmt_plugin.models.layer_history import weighted_sum
from recipe_helpers import record, small_model


def test_initial_weights_average_the_history():
    torch.testing.assert_close(dlcl_initial_weights(3), torch.tensor([
        [1, 0, 0, 0], [1 / 2, 1 / 2, 0, 0], [1 / 3, 1 / 3, 1 / 3, 0], [1 / 4, 1 / 4, 1 / 4, 1 / 4]]))


def layer_norm(connection, x, index):
    return torch.nn.functional.layer_norm(x, (x.size(-1),), connection.norm_weight[index], connection.norm_bias[index])


@pytest.mark.parametrize("post_norm", [False, True])
def test_each_layer_reads_the_weighted_history(post_norm, build_model):
    model, args = small_model(build_model, "dlcl", 3, 2, *(["--dlcl-post-norm"] if post_norm else []))
    assert args.encoder_normalize_before is not post_norm
    seen = record(model)
    finals = {"encoder": seen["encoder_out"], "decoder": seen["features"].transpose(0, 1)}
    for side in ("encoder", "decoder"):
        stack = getattr(model, side)
        connection, weight = stack.connection, stack.connection.weight
        outputs = [out[0] for out in seen["outputs"][side]]
        # pre-norm: G_k = LN_k (identity for the embedding); post-norm: G_k the identity, LN_l on the sum
        history = [seen["embedded"][side]] + [y if post_norm else layer_norm(connection, y, k)
                                              for k, y in enumerate(outputs)]
        for row in range(len(outputs) + 1):
            combined = sum(weight[row, k] * history[k] for k in range(row + 1))
            if post_norm and row > 0:
                combined = layer_norm(connection, combined, row - 1)
            expected = seen["inputs"][side][row] if row < len(outputs) else finals[side]
            if row == len(outputs) and not post_norm:
                combined = stack.layer_norm(combined)  # the final LayerNorm of the pre-norm stack
            torch.testing.assert_close(expected, combined, msg=f"{side} row {row}")
        assert (stack.layer_norm is None) is post_norm


@pytest.mark.parametrize("flags, message", [
    (["--encoder-layerdrop", 0.2], "--encoder-layerdrop is not supported by --arch transformer_dlcl_iwslt_de_en"),
    (["--dsinit-bound", "code"], "--dsinit-bound is a flag of transformer_dsinit"),
])
def test_what_dlcl_cannot_honour_is_refused_in_one_line(flags, message, build_model):
    with pytest.raises(SystemExit) as error:
        build_model("transformer_dlcl_iwslt_de_en", *flags)
    assert str(error.value.code).startswith(f"deepnmt: error: {message}") and "\n" not in str(error.value.code)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("terms", [1, 2, 7, 40])
def test_the_in_place_weighted_sum_is_the_term_by_term_one_to_the_bit(terms, dtype):
    """``weighted_sum`` accumulates in place (its partial sums fragmented the CPU heap: 3x Pre-LN's peak at 50L); the
    outputs and every gradient equal the plain ``sum = sum + w_k * h_k`` bit for bit."""
    def term_by_term(weights, history):
        combined = weights[0] * history[0]
        for k in range(1, len(history)):
            combined = combined + weights[k] * history[k]
        return combined

    torch.manual_seed(terms)
    history = [torch.randn(5, 3, 16, dtype=dtype, requires_grad=True) for _ in range(terms)]
    weights = torch.nn.Parameter(torch.rand(terms, dtype=dtype))
    ours, theirs = weighted_sum(weights, history), term_by_term(weights, history)
    assert torch.equal(ours, theirs)
    upstream = torch.randn_like(ours)
    for mine, reference in zip(torch.autograd.grad(ours, [weights, *history], upstream),
                               torch.autograd.grad(theirs, [weights, *history], upstream)):
        assert torch.equal(mine, reference)
