"""The authors' published packages, imported for the tests that compare our layers with theirs.

torchscale 0.3.0 is installed without its dependencies (scripts/install.sh): fairscale and timm would pull
torchvision and another torch. It imports them for activation checkpointing, FSDP wrapping and drop-path,
none of which a layer with drop_path_rate 0 and no checkpointing calls; they are stood in for by modules
that raise if called.
"""

import sys
import types


def _unavailable(name):
    def call(*args, **kwargs):
        raise RuntimeError(f"{name} is not installed for the tests; the compared layers never call it")
    return call


def _stand_in(module_name: str, **functions) -> None:
    if module_name in sys.modules:
        return
    try:
        __import__(module_name)
    except ImportError:
        parts = module_name.split(".")
        for i in range(1, len(parts) + 1):
            sys.modules.setdefault(".".join(parts[:i]), types.ModuleType(".".join(parts[:i])))
        for name, value in functions.items():
            setattr(sys.modules[module_name], name, value)


def torchscale():
    """``torchscale.architecture`` (config, encoder, decoder modules) of the installed torchscale."""
    _stand_in("fairscale.nn", checkpoint_wrapper=_unavailable("fairscale"), wrap=_unavailable("fairscale"))
    _stand_in("timm.models.layers", drop_path=_unavailable("timm"))
    from torchscale.architecture import config, decoder, encoder
    return types.SimpleNamespace(config=config, encoder=encoder, decoder=decoder)
