"""Admin (Liu et al. 2020): omega profiling against an independent recomputation, modes, errors."""

import math

import numpy as np
import pytest
import torch

from deepnmt_plugin.models.admin import (
    AdminResidual,
    ProfileFileError,
    admin_analytic_omega,
    profile_admin,
    read_clinic_profile,
    set_analytic_omega,
    set_omega_from_file,
)

NO_DROPOUT = ["--dropout", 0, "--attention-dropout", 0, "--activation-dropout", 0]
SMALL = ["--encoder-embed-dim", 32, "--decoder-embed-dim", 32, "--encoder-ffn-embed-dim", 64,
         "--decoder-ffn-embed-dim", 64, "--encoder-attention-heads", 2, "--decoder-attention-heads", 2]


def admin_model(build_model, encoder_layers, decoder_layers, *flags):
    torch.manual_seed(0)
    model, _ = build_model("transformer_admin_iwslt_de_en", "--encoder-layers", encoder_layers,
                           "--decoder-layers", decoder_layers, *SMALL, *NO_DROPOUT, *flags)
    return model


def fixed_batch(model, batch=6, src_len=9, tgt_len=7):
    generator = torch.Generator().manual_seed(1)
    pad = model.encoder.padding_idx
    src = torch.randint(4, len(model.encoder.dictionary), (batch, src_len), generator=generator)
    src[0, :3] = pad  # fairseq left-pads sources: padding positions count in the variance, as in Clinic
    prev = torch.randint(4, len(model.decoder.dictionary), (batch, tgt_len), generator=generator)
    prev[1, -2:] = pad
    return {"src_tokens": src, "src_lengths": src.ne(pad).sum(1), "prev_output_tokens": prev}


def omegas(stack):
    return [m.omega for m in stack.layers.modules() if isinstance(m, AdminResidual)]  # every layer, even with LayerDrop


def branch_activations(model, net_input):
    """(input x_{i-1}, branch output f_i) of every sublayer, captured with hooks on the branches."""
    captured = {"encoder": [], "decoder": []}
    handles = []

    def capture_attention(side):
        def hook(module, args, kwargs, output):
            captured[side].append((kwargs["query"].detach().clone(), output[0].detach().clone()))
        return hook

    for side in ("encoder", "decoder"):
        for layer in getattr(model, side).layers:
            attentions = [layer.self_attn] + ([layer.encoder_attn] if side == "decoder" else [])
            for attention in attentions:
                handles.append(attention.register_forward_hook(capture_attention(side), with_kwargs=True))
            # the FFN branch: input of fc1, output of fc2
            ffn_input = {}
            handles.append(layer.fc1.register_forward_pre_hook(lambda m, a, store=ffn_input: store.__setitem__("x", a[0])))
            handles.append(layer.fc2.register_forward_hook(
                lambda m, a, out, side=side, store=ffn_input: captured[side].append((store["x"].detach().clone(), out.detach().clone()))))
    model.train()
    with torch.no_grad():
        encoder_out = model.encoder(net_input["src_tokens"], src_lengths=net_input["src_lengths"])
        model.decoder(net_input["prev_output_tokens"], encoder_out=encoder_out)
    for handle in handles:
        handle.remove()
    return captured


def test_profile_equals_independent_recomputation(build_model):
    model = admin_model(build_model, 4, 3)
    net_input = fixed_batch(model)
    records = profile_admin(model, net_input)
    activations = branch_activations(model, net_input)  # same activations: omega_i does not feed f_i
    for side in ("encoder", "decoder"):
        ratio = 1.0
        profiled = [o.detach() for o in omegas(getattr(model, side))]
        assert len(profiled) == len(activations[side]) == {"encoder": 8, "decoder": 9}[side]
        for omega, (x, f) in zip(profiled, activations[side]):
            assert torch.all(omega == omega[0])
            assert omega[0].item() == pytest.approx(ratio, abs=1e-5)
            ratio = math.sqrt(np.var(omega[0].item() * x.numpy().ravel().astype(np.float64)) + np.var(f.numpy().ravel().astype(np.float64)))
        assert [r["omega"] for r in records[side]] == pytest.approx([o[0].item() for o in profiled], abs=1e-6)
        assert profiled[0][0].item() == 1.0  # first omega of each stack is 1


def last_omega_squared(build_model, layers):
    model = admin_model(build_model, layers, 1)
    profile_admin(model, fixed_batch(model))
    return omegas(model.encoder)[-1][0].item() ** 2


def test_omega_grows_with_the_number_of_sublayers(build_model):
    # omega_i^2 ~ 1 + sum_{j<i} Var f_j: the growth above 1 scales with the sublayers below (47 vs 11)
    shallow, deep = last_omega_squared(build_model, 6), last_omega_squared(build_model, 24)
    assert (deep - 1) / (shallow - 1) == pytest.approx(47 / 11, rel=0.25)


@pytest.mark.parametrize("n, expected", [(12, 2.017009), (36, 3.040839), (300, 7.193138)])
def test_analytic_omega(n, expected):  # by hand: n=12: sqrt(13 / 2.564949 - 1) = 2.017009
    assert admin_analytic_omega(n) == pytest.approx(math.sqrt((n + 1) / math.log(n + 1) - 1))
    assert admin_analytic_omega(n) == pytest.approx(expected, abs=1e-6)


def test_analytic_mode_sets_each_stack(build_model):
    model = admin_model(build_model, 6, 4)
    set_analytic_omega(model)
    assert all(torch.all(o == admin_analytic_omega(12)) for o in omegas(model.encoder))
    assert all(torch.all(o == admin_analytic_omega(12)) for o in omegas(model.decoder))  # 3 x 4 = 12 too


def write_clinic_file(path, encoder_values, decoder_values):
    lines = [f"{i} {v}" for i, v in enumerate(encoder_values, 1)] + [f"{i} {v}" for i, v in enumerate(decoder_values, 1)]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_clinic_profile_file(build_model, tmp_path):
    model = admin_model(build_model, 2, 2)
    encoder_values, decoder_values = [1.0, 1.319, 1.52, 1.7], [1.0, 1.2, 1.4, 1.6, 1.8, 2.0]
    path = write_clinic_file(tmp_path / "profile.ratio.init", encoder_values, decoder_values)
    set_omega_from_file(model, str(path))
    assert [o[0].item() for o in omegas(model.encoder)] == pytest.approx(encoder_values)
    assert [o[-1].item() for o in omegas(model.decoder)] == pytest.approx(decoder_values)


@pytest.mark.parametrize(
    "content, message",
    [
        ("1 1.0\n2 x1.3\n", r"profile.ratio.init:2: expected '<index> <value>', got '2 x1.3'"),
        ("1 1.0\n3 1.3\n", r"profile.ratio.init:2: expected encoder sublayer index 2, got 3"),
        ("1 1.0\n2 -1\n", r"profile.ratio.init:2: omega must be a positive number, got -1"),
        ("1 1.0\n2 1.1\n", r"2 lines, but this model has 4 encoder and 6 decoder sublayers \(10 lines expected\)"),
    ],
)
def test_malformed_profile_file_names_file_and_line(tmp_path, content, message):
    path = tmp_path / "profile.ratio.init"
    path.write_text(content)
    with pytest.raises(ProfileFileError, match=message):
        read_clinic_profile(str(path), 4, 6)


def test_admin_is_post_ln_only(build_model):
    with pytest.raises(SystemExit, match="--encoder-normalize-before contradicts --arch transformer_admin"):
        build_model("transformer_admin", "--encoder-normalize-before")


def test_training_without_initialisation_is_refused(build_model):
    model = admin_model(build_model, 1, 1)
    net_input = fixed_batch(model)
    with pytest.raises(RuntimeError, match="--task translation_deep"):
        model.train()(**net_input)
    model.eval()(**net_input)  # evaluation of any checkpoint is fine


@pytest.mark.parametrize("seed", range(4))
def test_layerdrop_profiles_every_sublayer_once_and_leaves_no_profiler(build_model, seed):
    """fairseq's LayerDropModuleList yields a random subset of layers in training mode; profiling walks them all."""
    model = admin_model(build_model, 4, 3, "--encoder-layerdrop", 0.5, "--decoder-layerdrop", 0.5, "--dropout", 0.1)
    torch.manual_seed(seed)
    records = profile_admin(model, fixed_batch(model))
    for side, sublayers in (("encoder", 8), ("decoder", 9)):
        profiled = omegas(getattr(model, side))
        assert len(records[side]) == len(profiled) == sublayers
        assert [o[0].item() for o in profiled] == pytest.approx([r["omega"] for r in records[side]], abs=1e-6)
    residuals = [m for m in model.modules() if isinstance(m, AdminResidual)]
    assert not any(r._forward_pre_hooks or r._forward_hooks for r in residuals)

    profiled = [o.detach().clone() for o in omegas(model.encoder) + omegas(model.decoder)]
    model.admin_initialized.fill_(True)
    net_input = fixed_batch(model)
    for _ in range(3):  # training passes drop layers at random; only an optimizer may move omega
        model.train()(**net_input)[0].sum().backward()
    assert all(torch.equal(o, p) for o, p in zip(omegas(model.encoder) + omegas(model.decoder), profiled))


@pytest.mark.parametrize("scale_size", ["channel", "scalar"])  # Admin's omega, ReZero's alpha
@pytest.mark.parametrize("shape", [(5, 3, 8), (1, 2, 8), (4, 8)])
def test_the_scaled_residual_sum_has_addcmuls_values_and_gradients(shape, scale_size):
    """ScaledResidualSum writes addcmul's backward out without its multiplications by 1: bitwise the same, also for a
    non-contiguous x."""
    from deepnmt_plugin.models.method import ScaledResidualSum

    torch.manual_seed(0)
    f, omega = torch.randn(shape), torch.rand(shape[-1] if scale_size == "channel" else 1) + 0.5
    x = torch.randn(tuple(reversed(shape[:-1])) + shape[-1:]).transpose(0, -2) if len(shape) == 3 else torch.randn(shape)
    grad = torch.randn(shape)
    results = []
    for sum_of in (lambda a, b, w: torch.addcmul(a, b, w), ScaledResidualSum.apply):
        inputs = [t.clone().requires_grad_() for t in (f, x, omega)]
        out = sum_of(*inputs)
        out.backward(grad)
        results.append([out, *(t.grad for t in inputs)])
    for ours, addcmul in zip(*results):
        assert torch.equal(ours, addcmul)
