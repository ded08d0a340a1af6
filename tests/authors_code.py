"""The authors' published packages, imported for the tests that compare our layers with theirs.

torchscale 0.3.0 is installed without its dependencies (scripts/install.sh): fairscale and timm would pull
torchvision and another torch. It imports them for activation checkpointing, FSDP wrapping and drop-path,
none of which a layer with drop_path_rate 0 and no checkpointing calls; while torchscale is imported they are
stood in for by modules that raise if called, removed again afterwards so that nothing else (fairseq looks for
fairscale when it checkpoints activations) finds them.
"""

import sys
import types


def _unavailable(name):
    def call(*args, **kwargs):
        raise RuntimeError(f"{name} is not installed for the tests; the compared layers never call it")
    return call


def _stand_in(module_name: str, **functions) -> list:
    """Stand-in modules for ``module_name`` and its parents where it does not import; returns the names added."""
    try:
        __import__(module_name)
        return []
    except ImportError:
        parts = module_name.split(".")
        added = [".".join(parts[:i]) for i in range(1, len(parts) + 1) if ".".join(parts[:i]) not in sys.modules]
        for name in added:
            sys.modules[name] = types.ModuleType(name)
        for name, value in functions.items():
            setattr(sys.modules[module_name], name, value)
        return added


def torchscale():
    """``torchscale.architecture`` (config, encoder, decoder modules) of the installed torchscale."""
    added = _stand_in("fairscale.nn", checkpoint_wrapper=_unavailable("fairscale"), wrap=_unavailable("fairscale"))
    added += _stand_in("timm.models.layers", drop_path=_unavailable("timm"))
    try:
        from torchscale.architecture import config, decoder, encoder
    finally:
        for name in added:
            del sys.modules[name]
    return types.SimpleNamespace(config=config, encoder=encoder, decoder=decoder)
