"""Hyper-Connections (Zhu et al., ICLR 2025) and mHC (DeepSeek 2025) against the ``hyper-connections`` package
0.4.11 (``HyperConnections``, ``ManifoldConstrainedHyperConnections``, ``get_expand_reduce_stream_functions``): every
sublayer of a trained-looking model, with the same weights, computes the package's branch input and streams."""

import pytest
import torch

from deepnmt_plugin.models.hyper import HyperConnection, sinkhorn
from deepnmt_plugin.models.method import ArchitectureError
from recipe_helpers import SMALL, small_model

STREAMS = 4
BRANCH_NORMS = {"self_attn_residual": "self_attn_layer_norm", "encoder_attn_residual": "encoder_attn_layer_norm",
                "ffn_residual": "final_layer_norm"}  # the Pre-LN norm each branch applies first reads h = A_m^T H


def connections(model):
    """(side, layer, residual name, module) of every hyper-connection, in forward order."""
    for side in ("encoder", "decoder"):
        for number, layer in enumerate(getattr(model, side).layers):
            for name in BRANCH_NORMS:
                module = getattr(layer, name, None)
                if module is not None:
                    yield side, number, name, module


def run_recording(model):
    """One forward pass; per connection: the streams H it got, the branch input h, the branch output f, its output."""
    seen, handles = {}, []
    for side, number, name, module in connections(model):
        key = (side, number, name)
        norm = getattr(getattr(model, side).layers[number], BRANCH_NORMS[name])
        handles.append(norm.register_forward_pre_hook(lambda m, a, key=key: seen.setdefault(key, {}).update(h=a[0])))
        handles.append(module.register_forward_hook(
            lambda m, a, out, key=key: seen.setdefault(key, {}).update(H=a[0], f=a[1], out=out)))
    torch.manual_seed(1)
    src, prev = torch.randint(4, 30, (2, 6)), torch.randint(4, 30, (2, 5))
    with torch.no_grad():
        encoder_out = model.encoder(src, src_lengths=torch.tensor([6, 6]))
        features, _ = model.decoder(prev, encoder_out=encoder_out, features_only=True)
    for handle in handles:
        handle.remove()
    return seen, encoder_out["encoder_out"][0], features


def packed(streams):
    """Our T x B x n x C streams in the package's layout, (B n) x T x C."""
    t, b, n, c = streams.shape
    return streams.permute(1, 2, 0, 3).reshape(b * n, t, c)


def package_connection(ours: HyperConnection, index: int):
    """The package's module for sublayer ``index`` of a stack, holding our weights (eval mode, no dropout)."""
    import hyper_connections
    from hyper_connections.manifold_constrained_hyper_connections import ManifoldConstrainedHyperConnections

    dim = ours.dynamic_beta.numel()
    with torch.no_grad():
        if ours.sinkhorn_iterations:
            theirs = ManifoldConstrainedHyperConnections(STREAMS, dim=dim, layer_index=index,
                                                         sinkhorn_iters=ours.sinkhorn_iterations)
            theirs.static_alpha.copy_(ours.static_alpha)
            theirs.dynamic_alpha_fn.copy_(ours.dynamic_alpha.unsqueeze(0))  # one proposal
            theirs.pre_branch_scale.copy_(ours.alpha_scale[:1])
            theirs.residual_scale.copy_(ours.alpha_scale[1:])
            theirs.h_post_scale.copy_(ours.beta_scale)
            theirs.norm.gamma.copy_(ours.norm.weight - 1)  # their RMSNorm scales by (gamma + 1)
        else:
            theirs = hyper_connections.HyperConnections(STREAMS, dim=dim, layer_index=index)
            theirs.static_alpha.copy_(ours.static_alpha)
            theirs.dynamic_alpha_fn.copy_(ours.dynamic_alpha)
            theirs.dynamic_alpha_scale.copy_(ours.alpha_scale[0])
            theirs.dynamic_beta_scale.copy_(ours.beta_scale)
            theirs.norm = ours.norm  # the paper's LayerNorm, where the package chose an RMSNorm
        theirs.static_beta.copy_(ours.static_beta)
        theirs.dynamic_beta_fn.copy_(ours.dynamic_beta)
    return theirs.eval()


@pytest.mark.parametrize("flags", [[], ["--hyper-sinkhorn-iters", 20], ["--hyper-sinkhorn-iters", 3]],
                         ids=["hc", "mhc", "mhc-3-iterations"])
def test_every_sublayer_computes_the_packages_hyper_connection(flags, build_model):
    model, _ = small_model(build_model, "hyper", 3, 2, *flags)
    seen, _, _ = run_recording(model)
    assert len(seen) == 3 * 2 + 2 * 3
    index = {"encoder": 0, "decoder": 0}  # the sublayer's in its stack, which picks A_m's initial stream
    for side, number, name, ours in connections(model):
        record = seen[(side, number, name)]
        theirs = package_connection(ours, index[side])
        index[side] += 1
        with torch.no_grad():
            branch_input, add_residual = theirs(packed(record["H"]))
            streams = add_residual(record["f"].transpose(0, 1))
        where = f"{side} layer {number} {name}"
        torch.testing.assert_close(record["h"], branch_input.transpose(0, 1), atol=1e-5, rtol=1e-5, msg=where)
        torch.testing.assert_close(packed(record["out"]), streams, atol=1e-5, rtol=1e-5, msg=where)


def test_the_stack_expands_to_n_streams_and_sums_them_as_the_package(build_model):
    from hyper_connections import get_init_and_expand_reduce_stream_functions

    _, expand, reduce = get_init_and_expand_reduce_stream_functions(STREAMS)
    model, _ = small_model(build_model, "hyper", 3, 2)
    seen, encoder_out, features = run_recording(model)
    embedded = seen[("encoder", 0, "self_attn_residual")]["H"]
    torch.testing.assert_close(packed(embedded), expand(embedded[:, :, 0].transpose(0, 1)))
    last = {side: seen[(side, layers - 1, "ffn_residual")]["out"] for side, layers in (("encoder", 3), ("decoder", 2))}
    torch.testing.assert_close(encoder_out, model.encoder.layer_norm(reduce(packed(last["encoder"])).transpose(0, 1)))
    torch.testing.assert_close(features, model.decoder.layer_norm(reduce(packed(last["decoder"]))))


@pytest.mark.parametrize("flags", [[], ["--hyper-sinkhorn-iters", 20]], ids=["hc", "mhc"])
def test_initial_connections_are_the_packages(flags, build_model):
    """A_m = e_(k mod n) for the k-th sublayer of a stack, A_r = I, B = 1, dynamic weights 0, scales 0.01."""
    model, _ = small_model(build_model, "hyper", 3, 2, *flags, perturb=False)
    for side in ("encoder", "decoder"):
        modules = [module for s, _, _, module in connections(model) if s == side]
        for index, ours in enumerate(modules):
            theirs = package_connection(HyperConnection(32, STREAMS, index, ours.sinkhorn_iterations), index)
            assert torch.equal(ours.static_alpha, theirs.static_alpha), (side, index)
            assert ours.static_alpha[index % STREAMS, 0] == 1 and ours.static_alpha[:, 0].sum() == 1
            assert not ours.dynamic_alpha.any() and not ours.dynamic_beta.any()
            assert torch.equal(ours.static_beta, torch.ones(STREAMS))
            assert torch.equal(ours.alpha_scale, torch.full_like(ours.alpha_scale, 0.01))


def test_hyper_connections_start_as_pre_ln(build_model):
    """At init every stream carries the Pre-LN residual: the same weights give Pre-LN's output (the n-fold sum is
    undone by the final LayerNorm, up to its epsilon)."""
    torch.manual_seed(0)
    hyper, _ = build_model("transformer_hyper_iwslt_de_en", "--encoder-layers", 3, "--decoder-layers", 2, *SMALL)
    torch.manual_seed(0)
    preln, _ = build_model("transformer_preln_iwslt_de_en", "--encoder-layers", 3, "--decoder-layers", 2, *SMALL)
    for name, parameter in preln.state_dict().items():  # fairseq's init draws the same numbers for both
        assert torch.equal(hyper.state_dict()[name], parameter), name
    src, prev = torch.randint(4, 30, (2, 6)), torch.randint(4, 30, (2, 5))
    with torch.no_grad():
        ours = hyper.eval()(src, torch.tensor([6, 6]), prev)[0]
        theirs = preln.eval()(src, torch.tensor([6, 6]), prev)[0]
    torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=1e-4)
    assert not torch.allclose(ours, theirs, atol=1e-8, rtol=0)  # the streams are really there (the eps shows)


def paper_connection(ours: HyperConnection, streams, f):
    """The paper's Algorithm 2 (HC) or mHC's constraints, term by term from our parameters: (h, B^T f + A_r^T H)."""
    normed = ours.norm(streams)
    raw_alpha, raw_beta = normed @ ours.dynamic_alpha, normed @ ours.dynamic_beta
    if ours.sinkhorn_iterations:
        a_m = torch.sigmoid(raw_alpha[..., 0] * ours.alpha_scale[0] + ours.static_alpha[:, 0])
        a_r = sinkhorn(raw_alpha[..., 1:] * ours.alpha_scale[1] + ours.static_alpha[:, 1:], ours.sinkhorn_iterations)
        beta = 2 * torch.sigmoid(raw_beta * ours.beta_scale + ours.static_beta)
    else:
        a_m = ours.static_alpha[:, 0] + ours.alpha_scale[0] * torch.tanh(raw_alpha[..., 0])
        a_r = ours.static_alpha[:, 1:] + ours.alpha_scale[0] * torch.tanh(raw_alpha[..., 1:])
        beta = ours.static_beta + ours.beta_scale * torch.tanh(raw_beta)
    h = torch.einsum("tbs,tbsc->tbc", a_m, streams)
    return h, torch.einsum("tbs,tbc->tbsc", beta, f) + torch.einsum("tbsu,tbsc->tbuc", a_r, streams)


@pytest.mark.parametrize("sinkhorn_iterations, dtype, tolerance", [(0, torch.float64, 1e-12), (20, torch.float32, 1e-6)],
                         ids=["hc", "mhc"])  # mHC's coefficients are float32 whatever the model's dtype
def test_a_connection_computes_the_papers_values_and_gradients(sinkhorn_iterations, dtype, tolerance):
    """branch_input and forward, whose coefficients come from one product and whose sums have their backward written
    out, give the paper's formula's outputs and gradients (input, branch output, every parameter)."""
    torch.manual_seed(0)
    ours = HyperConnection(8, STREAMS, 1, sinkhorn_iterations).to(dtype)
    with torch.no_grad():
        for parameter in ours.parameters():
            parameter.add_(0.3 * torch.randn_like(parameter))
    streams = torch.randn(3, 2, STREAMS, 8, dtype=dtype, requires_grad=True)
    branch = torch.randn(3, 2, 8, dtype=dtype, requires_grad=True)
    weights = [torch.randn(3, 2, 8, dtype=dtype), torch.randn(3, 2, STREAMS, 8, dtype=dtype)]

    def ours_computed():
        h = ours.branch_input(streams)
        return h, ours(streams, torch.tanh(h) * branch, streams)  # the branch output depends on h, as a sublayer's

    def paper_computed():
        h, _ = paper_connection(ours, streams, branch)
        return h, paper_connection(ours, streams, torch.tanh(h) * branch)[1]

    results = []
    for compute in (ours_computed, paper_computed):
        outputs = compute()
        inputs = [streams, branch, *ours.parameters()]
        grads = torch.autograd.grad(sum((o * w).sum() for o, w in zip(outputs, weights)), inputs)
        results.append((outputs, grads))
    (ours_out, ours_grads), (paper_out, paper_grads) = results
    for mine, paper in zip((*ours_out, *ours_grads), (*paper_out, *paper_grads)):
        torch.testing.assert_close(mine, paper, rtol=100 * tolerance, atol=tolerance)
    assert ours.pending is None  # forward let go of what branch_input kept


def test_sinkhorn_makes_the_residual_mix_doubly_stochastic():
    torch.manual_seed(0)
    mixed = sinkhorn(torch.randn(5, 4, 4), 20)
    torch.testing.assert_close(mixed.sum(dim=-1), torch.ones(5, 4))
    torch.testing.assert_close(mixed.sum(dim=-2), torch.ones(5, 4), atol=1e-3, rtol=0)
    assert (mixed > 0).all()


@pytest.mark.parametrize("flags, message", [
    (["--hyper-streams", 0], "--hyper-streams 0: give a whole number of at least 1"),
    (["--hyper-sinkhorn-iters", -2], "--hyper-sinkhorn-iters -2: give a whole number of at least 1"),
    (["--encoder-normalize-before"], None),
])
def test_what_hyper_connections_cannot_honour_is_refused_in_one_line(flags, message, build_model):
    if message is None:  # Pre-LN sets it: accepted
        build_model("transformer_hyper_iwslt_de_en", *flags)
        return
    with pytest.raises(ArchitectureError, match=f"^deepnmt: error: {message}"):
        build_model("transformer_hyper_iwslt_de_en", *flags)


def test_hyper_flags_on_another_arch_are_refused(build_model):
    with pytest.raises(ArchitectureError, match="--hyper-streams is a flag of transformer_hyper"):
        build_model("transformer_preln_iwslt_de_en", "--hyper-streams", 2)


def test_hyper_streams_sets_the_expansion_rate_and_its_connections_learn(build_model):
    model, _ = small_model(build_model, "hyper", 2, 1, "--hyper-streams", 2, perturb=False)
    assert model.encoder.layers[0].self_attn_residual.static_alpha.shape == (2, 3)
    assert model.encoder.layers[1].self_attn_residual.static_alpha[0, 0] == 1  # sublayer 2: stream 2 mod 2
    model.train()
    src, prev = torch.randint(4, 30, (2, 6)), torch.randint(4, 30, (2, 5))
    model(src, torch.tensor([6, 6]), prev)[0].sum().backward()
    assert model.encoder.layers[0].self_attn_residual.dynamic_alpha.grad.abs().sum() > 0
