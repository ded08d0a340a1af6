"""Admin's and DLCL's projections initialised as their authors' fairseq (<= 0.9) built them (legacy_init.py):
fc1/fc2 Xavier-uniform with zero biases and zero q/k/v biases; ``--<recipe>-linear-init fairseq`` keeps fairseq 0.12's.
The bounds are computed here from the authors' code (Transformer-Clinic's and wangqiangneu/dlcl's ``Linear()`` and
``MultiheadAttention.reset_parameters``), not from ours."""

import math

import pytest
import torch

from recipe_helpers import SMALL

EMBED, FFN = 32, 64  # SMALL's widths
ARCHS = ["transformer_admin_iwslt_de_en", "transformer_dlcl_iwslt_de_en"]


def old_fairseq_bounds():
    """The authors' code: ``Linear()`` is xavier_uniform_ (gain 1) on fc1/fc2, zero bias; q, k and v are rows of one
    (3d, d) ``in_proj_weight``, xavier_uniform_ with gain 1, its bias zero."""
    return {"fc1": math.sqrt(6 / (EMBED + FFN)), "fc2": math.sqrt(6 / (FFN + EMBED)),
            "q_proj": math.sqrt(6 / (EMBED + 3 * EMBED))}


def projections(model):
    """(name, nn.Linear) of every layer's fc1, fc2 and attention q/k/v, both stacks."""
    for stack in (model.encoder, model.decoder):
        for layer in stack.layers:
            yield "fc1", layer.fc1
            yield "fc2", layer.fc2
            for attention in (layer.self_attn, getattr(layer, "encoder_attn", None)):
                if attention is not None:
                    for name in ("q_proj", "k_proj", "v_proj"):
                        yield name, getattr(attention, name)


def build(build_model, arch, *flags):
    torch.manual_seed(0)
    model, _ = build_model(arch, "--encoder-layers", 3, "--decoder-layers", 2, *SMALL, *flags)
    return model


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("given", [[], ["authors"]], ids=["default", "authors"])
def test_projections_follow_the_authors_fairseq(arch, given, build_model):
    recipe = arch.split("_")[1]
    model = build(build_model, arch, *([f"--{recipe}-linear-init", *given] if given else []))
    bounds = old_fairseq_bounds()
    for name, linear in projections(model):
        bound = bounds.get(name, bounds["q_proj"])
        assert linear.weight.abs().max().item() <= bound
        assert linear.weight.abs().max().item() == pytest.approx(bound, rel=0.05)
        assert linear.weight.std().item() == pytest.approx(bound / math.sqrt(3), rel=0.15)
        assert torch.count_nonzero(linear.bias) == 0, name


@pytest.mark.parametrize("arch", ARCHS)
def test_fairseq_init_keeps_fairseq_012s_draws(arch, build_model):
    """PyTorch's nn.Linear default: weights and biases U(+-1/sqrt(fan_in)); fc2's bound half the authors' here."""
    recipe = arch.split("_")[1]
    model = build(build_model, arch, f"--{recipe}-linear-init", "fairseq")
    for name, linear in projections(model):
        if name.startswith("fc"):
            bound = 1 / math.sqrt(linear.in_features)
            assert linear.weight.abs().max().item() == pytest.approx(bound, rel=0.05)
        assert linear.bias.abs().max().item() > 0, name
        assert linear.bias.abs().max().item() <= 1 / math.sqrt(linear.in_features)


@pytest.mark.parametrize("arch", ARCHS)
def test_only_the_projections_the_authors_built_otherwise_change(arch, build_model):
    """Same seed, both inits: every other parameter (embeddings, out_proj, q/k/v weights, LayerNorms, omega, DLCL's
    weights) is bitwise the same."""
    recipe = arch.split("_")[1]
    authors = dict(build(build_model, arch).named_parameters())
    fairseq = dict(build(build_model, arch, f"--{recipe}-linear-init", "fairseq").named_parameters())
    changed = {name for name in authors if not torch.equal(authors[name], fairseq[name])}
    expected = {name for name in authors
                if name.rsplit(".", 2)[-2] in ("fc1", "fc2") or name.endswith(("q_proj.bias", "k_proj.bias",
                                                                               "v_proj.bias"))}
    assert changed == expected and expected


def test_the_flag_of_one_recipe_is_refused_with_the_other(build_model):
    with pytest.raises(SystemExit) as stopped:
        build(build_model, "transformer_dlcl_iwslt_de_en", "--admin-linear-init", "fairseq")
    assert stopped.value.code == ("deepnmt: error: --admin-linear-init is a flag of transformer_admin; "
                                  "--arch transformer_dlcl_iwslt_de_en would ignore it")
