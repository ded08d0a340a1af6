"""ResiDual (Xie et al. 2023): a Post-LN stream and a dual stream s*(x_0 + sum f_i); the stack outputs
alpha * x_L + LN(dual), LN eps 1e-7."""

import pytest
import torch

from deepnmt_plugin.models.method import ArchitectureError
from recipe_helpers import record, small_model

SETTINGS = ["--enc-alpha", 0.5, "--dec-alpha", 2.0, "--enc-res-input-norm-scale", 0.05,
            "--dec-res-input-norm-scale", 0.3]


@pytest.mark.parametrize("flags, encoder, decoder", [([], (1.0, 1.0), (1.0, 1.0)),
                                                     (SETTINGS, (0.5, 0.05), (2.0, 0.3))])
def test_stack_output_is_alpha_x_plus_normalised_dual_stream(flags, encoder, decoder, build_model):
    model, args = small_model(build_model, "resi_dual", 3, 2, *flags)
    seen = record(model)
    outputs = {"encoder": seen["encoder_out"], "decoder": seen["features"].transpose(0, 1)}
    for side, (alpha, scale) in (("encoder", encoder), ("decoder", decoder)):
        stack = getattr(model, side)
        assert stack.connection.layer_norm.eps == 1e-7 and stack.layer_norm is None
        last = seen["outputs"][side][-1][0]
        dual = scale * (seen["embedded"][side] + sum(seen["branches"][side]))
        torch.testing.assert_close(outputs[side], alpha * last + stack.connection.layer_norm(dual))
    saved = vars(args)  # what the checkpoint keeps
    assert [saved[k] for k in ("enc_alpha", "enc_res_input_norm_scale")] == ([None, None] if not flags else [0.5, 0.05])


def test_its_flags_are_refused_with_another_recipe(build_model):
    with pytest.raises(SystemExit) as error:
        build_model("transformer_deepnorm_iwslt_de_en", "--enc-alpha", 0.5)
    assert str(error.value.code) == ("deepnmt: error: --enc-alpha is a flag of transformer_resi_dual; "
                                     "--arch transformer_deepnorm_iwslt_de_en would ignore it")


@pytest.mark.parametrize("flag", ["--enc-alpha", "--dec-res-input-norm-scale"])
@pytest.mark.parametrize("value", ["nan", "inf"])
def test_a_setting_that_is_not_finite_is_refused_in_one_line(flag, value, build_model):
    with pytest.raises(ArchitectureError, match=rf"^deepnmt: error: {flag} {value}: give a finite number$"):
        build_model("transformer_resi_dual_iwslt_de_en", flag, value)
