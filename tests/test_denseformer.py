"""DenseFormer (Pagliardini et al., NeurIPS 2024; epfml/DenseFormer ``denseformer/denseformer.py``): Pre-LN layers,
after each a depth-weighted average of the embedding and every earlier layer output, initialised to the identity;
the code's dilation and period. The averages are recomputed here as the code's ``DWAModules`` computes them."""

import pytest
import torch

from deepnmt_plugin.models.denseformer import dwa_mask
from deepnmt_plugin.models.method import ArchitectureError
from recipe_helpers import record, small_model


def authors_dwa(weight, history, layer, dilation, period):
    """DWAModules.forward after block ``layer - 1`` (0-based in their code): the alphas of row ``layer`` over the
    accumulator of group ``layer % dilation`` (X_j, j = layer mod dilation, j <= layer), every ``period``-th block."""
    if layer % period:
        return history[layer]
    group = list(range(layer % dilation, layer + 1, dilation))
    return sum(weight[layer, j] * history[j] for j in group)


def test_mask_keeps_each_rows_dilation_group():
    torch.testing.assert_close(dwa_mask(4, 2), torch.tensor([
        [1, 0, 0, 0, 0], [0, 1, 0, 0, 0], [1, 0, 1, 0, 0], [0, 1, 0, 1, 0], [1, 0, 1, 0, 1]], dtype=torch.float))
    assert (dwa_mask(3, 1) == torch.ones(4, 4).tril()).all()


def test_at_init_every_average_is_the_identity(build_model):
    model, _ = small_model(build_model, "denseformer", 3, 2, perturb=False)
    assert torch.equal(model.encoder.connection.weight, torch.eye(4))
    seen = record(model)
    for number, output in enumerate(seen["outputs"]["encoder"][:-1]):
        torch.testing.assert_close(seen["inputs"]["encoder"][number + 1], output[0])  # Pre-LN as it starts


@pytest.mark.parametrize("dilation, period", [(1, 1), (2, 1), (1, 2), (2, 2)])
def test_each_layer_reads_the_authors_depth_weighted_average(dilation, period, build_model):
    model, _ = small_model(build_model, "denseformer", 4, 3, "--denseformer-dilation", dilation,
                           "--denseformer-period", period)
    seen = record(model)
    finals = {"encoder": seen["encoder_out"], "decoder": seen["features"].transpose(0, 1)}
    for side in ("encoder", "decoder"):
        stack = getattr(model, side)
        history = [seen["embedded"][side]] + [out[0] for out in seen["outputs"][side]]
        for layer in range(1, len(history)):
            average = authors_dwa(stack.connection.weight, history, layer, dilation, period)
            if layer < len(history) - 1:
                torch.testing.assert_close(seen["inputs"][side][layer], average, msg=f"{side} after layer {layer}")
            else:  # the last average goes through the stack's final LayerNorm (ln_f)
                torch.testing.assert_close(finals[side], stack.layer_norm(average))


@pytest.mark.parametrize("flags, message", [
    (["--denseformer-dilation", 0], "--denseformer-dilation 0: give a whole number of at least 1"),
    (["--denseformer-period", -1], "--denseformer-period -1: give a whole number of at least 1"),
    (["--decoder-layerdrop", 0.1],
     "--decoder-layerdrop is not supported by --arch transformer_denseformer_iwslt_de_en"),
])
def test_what_denseformer_cannot_honour_is_refused_in_one_line(flags, message, build_model):
    with pytest.raises(ArchitectureError, match=f"^deepnmt: error: {message}"):
        build_model("transformer_denseformer_iwslt_de_en", *flags)
