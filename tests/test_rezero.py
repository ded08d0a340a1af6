"""ReZero (Bachlechner et al. 2020): no LayerNorm; x + alpha * f with one alpha per layer, 0 at init.
Equality with the rezero package's layers: test_authors_packages.py."""

import torch

from recipe_helpers import record, small_model


def test_every_layer_starts_as_the_identity_with_one_shared_alpha(build_model):
    model, _ = small_model(build_model, "rezero", perturb=False)
    assert not any("LayerNorm" in type(m).__name__ for m in model.modules())
    for side in ("encoder", "decoder"):
        for layer in getattr(model, side).layers:
            residuals = [m for m in (layer.self_attn_residual, getattr(layer, "encoder_attn_residual", None),
                                     layer.ffn_residual) if m is not None]
            assert all(r.alpha is residuals[0].alpha for r in residuals) and residuals[0].alpha.item() == 0
    seen = record(model)
    for side in ("encoder", "decoder"):
        for x, out in zip(seen["inputs"][side], seen["outputs"][side]):
            torch.testing.assert_close(out[0], x)
    names = [name for name, _ in model.named_parameters() if name.endswith("alpha")]
    assert len(names) == 3 + 2  # one a layer, counted once however many sublayers hold it
