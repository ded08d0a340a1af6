"""σReparam (Zhai et al., ICML 2023; apple/ml-sigma-reparam ``vision/layers.py``): every layer projection used as
``gamma / sigma(W) * W``, sigma by one power-iteration step a training forward, gamma = sigma(W) at init; Post-LN."""

import pytest
import torch
import torch.nn.functional as F

from deepnmt_plugin.models.method import ArchitectureError
from deepnmt_plugin.models.sigma import SigmaReparamLinear
from recipe_helpers import SMALL, small_model


def reparameterised(model):
    return [(name, module) for name, module in model.named_modules() if isinstance(module, SigmaReparamLinear)]


def test_every_projection_is_reparameterised_and_starts_as_its_weight(build_model):
    model, _ = small_model(build_model, "sigma", 2, 2, perturb=False)
    found = {name.split("layers.")[1].split(".", 1)[1] for name, _ in reparameterised(model)}
    assert found == {"fc1", "fc2", *(f"{attention}.{projection}" for attention in ("self_attn", "encoder_attn")
                                     for projection in ("q_proj", "k_proj", "v_proj", "out_proj"))}
    assert len(reparameterised(model)) == 2 * 6 + 2 * 10
    for name, linear in reparameterised(model):
        singular_values = torch.linalg.svdvals(linear.weight)
        assert linear.gamma.item() == pytest.approx(singular_values[0].item(), rel=1e-5), name  # W_hat = W at init
        # the code's trunc_normal_(std=0.02) cuts at +-2 (100 std): a plain normal of std 0.02
        assert linear.weight.std().item() == pytest.approx(0.02, rel=0.1), name
        x = torch.randn(3, linear.in_features)
        torch.testing.assert_close(linear(x), F.linear(x, linear.weight, linear.bias), rtol=1e-4, atol=1e-5)
    names = {name for name, _ in model.named_parameters()}
    assert {"encoder.layers.0.fc1.weight", "encoder.layers.0.fc1.gamma"} <= names  # fairseq's names kept


def test_sigma_is_one_power_iteration_step_stored_in_training_only(build_model):
    """The code's SpectralNormedWeight.get_sigma: v = normalize(W u), u' = normalize(W^T v), sigma = v^T W u';
    u' stored in training, not in evaluation; W_hat = gamma / sigma * W."""
    model, _ = small_model(build_model, "sigma", 1, 1)
    linear = model.encoder.layers[0].fc1
    x = torch.randn(4, linear.in_features)
    for training in (False, True):
        linear.train(training)
        u = linear.u.clone()
        v = F.normalize(linear.weight.detach() @ u, dim=0)
        u_next = F.normalize(linear.weight.detach().t() @ v, dim=0)
        sigma = v @ linear.weight.detach() @ u_next
        expected = F.linear(x, linear.gamma.detach() / sigma * linear.weight.detach(), linear.bias.detach())
        torch.testing.assert_close(linear(x).detach(), expected)
        torch.testing.assert_close(linear.u, u_next if training else u)


def test_power_iteration_converges_to_the_spectral_norm(build_model):
    model, _ = small_model(build_model, "sigma", 1, 1)
    linear = model.encoder.layers[0].self_attn.v_proj.train()
    for _ in range(200):
        sigma = linear.sigma()
    assert sigma.item() == pytest.approx(torch.linalg.svdvals(linear.weight)[0].item(), rel=1e-4)


def test_post_ln_layout_and_the_gain_flag(build_model):
    model, args = build_model("transformer_sigma_iwslt_de_en", "--encoder-layers", 1, "--decoder-layers", 1, *SMALL,
                              "--sigma-init-gain", 0.5)
    assert not args.encoder_normalize_before and model.encoder.layers[0].self_attn_post_norm
    std = model.encoder.layers[0].fc1.weight.std().item()
    assert std == pytest.approx(0.5 * 0.02, rel=0.1)


@pytest.mark.parametrize("flags, message", [
    (["--sigma-init-gain", 0], "--sigma-init-gain 0: give a positive, finite gain"),
    (["--sigma-init-gain", "inf"], "--sigma-init-gain inf: give a positive, finite gain"),
    (["--sigma-init-gain", "nan"], "--sigma-init-gain nan: give a positive, finite gain"),
    (["--quant-noise-pq", 0.1], "--quant-noise-pq is not supported by --arch transformer_sigma_iwslt_de_en"),
])
def test_what_sigma_cannot_honour_is_refused_in_one_line(flags, message, build_model):
    with pytest.raises(ArchitectureError, match=f"^deepnmt: error: {message}"):
        build_model("transformer_sigma_iwslt_de_en", *flags)
