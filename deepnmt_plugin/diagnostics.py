"""Training-dynamics diagnostics, opt-in through ``--task translation_deep --diagnostics-interval K``.

Every K updates, from the task's ``optimizer_step`` (called once per update, whatever ``--update-freq``):

* before the step, ``gnorm/enc.03`` ...: the gradient norm of every encoder and decoder layer (and
  ``gnorm/other``: embeddings, output projection, final LayerNorms) of the update being applied, as the
  optimizer sees it (all-reduced across ranks, divided by the sample size, after ``--clip-norm``);
* after the step, one forward pass with dropout off (eval mode, no gradient) on a fixed held-out batch,
  the first ``--diagnostics-sentences`` sentences of the first validation subset:

  - ``update_norm``: the model update ||F(x, theta_t) - F(x, theta_0)|| (DeepNet Fig. 5; Admin's output
    change, Fig. 2). F is the decoder's output features (the last layer's output, which the output
    projection reads, as in Admin's output-change analysis); the L2 norm of each target token's difference,
    averaged over the batch's target tokens. theta_0's output is captured at the first update, kept in
    memory and in ``<save-dir>/diagnostics_reference.pt`` so a resumed run keeps measuring from theta_0;
  - ``ln_input/enc.03.attn`` ...: the mean L2 norm over tokens of each sublayer LayerNorm's input
    (T-Fixup Fig. 3); sublayers are ``attn`` (self-attention), ``cross`` (encoder attention), ``ffn``;
  - ``beta/enc.03.attn`` ...: Admin's dependency of sublayer i on its own residual branch (Admin Sec. 4),
    ``beta_ii = sqrt(Var f_i(x_{i-1}) / Var(omega_i * x_{i-1} + f_i(x_{i-1})))``, for Post-LN layouts
    (Post-LN, Admin, DeepNorm with alpha for omega), where the LayerNorm input is exactly that sum;
  - ``omega/enc.03.attn``, ``omega_std/enc.03.attn``: mean and standard deviation of Admin's omega.

Statistics skip padding. The probes are forward hooks that exist only during that one forward pass;
without the flag the task registers nothing and does no extra work. Layers are found by fairseq's
submodule names, so the stock ``transformer`` is measured exactly like the deep archs.
"""

import logging
import os
from dataclasses import dataclass
from typing import Dict, List, Optional

import torch
import torch.distributed as dist
import torch.nn as nn
from fairseq.logging import metrics
from torch import Tensor

from deepnmt_plugin import compat
from deepnmt_plugin.models.method import all_layers

logger = logging.getLogger(__name__)

GROUPS = ("update", "gnorm", "ln_input", "beta", "omega")
REFERENCE_FILE = "diagnostics_reference.pt"
#: fairseq's own training stats use priorities up to 1600: diagnostics come after them, in this order.
PRIORITY = {"update": 5000, "gnorm": 5100, "ln_input": 5200, "beta": 5300, "omega": 5400}
#: (short name, branch module, its LayerNorm, its residual module) of every sublayer, in forward order.
SUBLAYERS = (
    ("attn", "self_attn", "self_attn_layer_norm", "self_attn_residual"),
    ("cross", "encoder_attn", "encoder_attn_layer_norm", "encoder_attn_residual"),
    ("ffn", "fc2", "final_layer_norm", "ffn_residual"),
)
STACKS = (("encoder", "enc"), ("decoder", "dec"))


def parse_groups(text: str) -> List[str]:
    groups = [g.strip() for g in text.split(",") if g.strip()]
    unknown = sorted(set(groups) - set(GROUPS))
    if unknown or not groups:
        raise ValueError(f"--diagnostics-groups: unknown {unknown or text!r}; choose from {','.join(GROUPS)}")
    return groups


def unwrap(model: nn.Module) -> nn.Module:
    """The model itself under fairseq's DDP wrappers (``ModuleProxyWrapper(DistributedDataParallel(model))``)."""
    while hasattr(model, "module"):
        model = model.module
    return model


def layer_names(model: nn.Module):
    """(stack, name such as ``enc.03``, layer); indices zero-padded so names sort in order."""
    for side, short in STACKS:
        layers = all_layers(getattr(model, side))  # every layer, also where LayerDrop skips some
        width = len(str(len(layers) - 1))
        for index, layer in enumerate(layers):
            yield side, f"{short}.{index:0{width}d}", layer


@dataclass
class Sublayer:
    name: str  # e.g. "dec.03.cross"
    side: str  # "encoder" or "decoder": which padding mask applies
    branch: nn.Module  # its output is the residual branch f_i(x_{i-1}) (dropout is off in eval mode)
    layer_norm: Optional[nn.Module]
    residual: Optional[nn.Module]
    post_norm: bool  # the LayerNorm input is the residual sum (Post-LN layouts), which beta needs


def post_norm(layer: nn.Module, residual: str) -> bool:
    """Whether the sublayer's LayerNorm reads its residual sum: a deep layer says so sublayer by sublayer
    (``self_attn_post_norm``, ...), a stock fairseq layer by its stack's ``normalize_before``."""
    return getattr(layer, residual.replace("_residual", "_post_norm"), not layer.normalize_before)


def sublayers(model: nn.Module) -> List[Sublayer]:
    found = []
    for side, layer_name, layer in layer_names(model):
        for short, branch, layer_norm, residual in SUBLAYERS:
            if getattr(layer, branch, None) is None:  # a decoder without encoder attention
                continue
            norm = getattr(layer, layer_norm, None)
            found.append(Sublayer(f"{layer_name}.{short}", side, getattr(layer, branch), norm,
                                  getattr(layer, residual, None), norm is not None and post_norm(layer, residual)))
    return found


def gradient_norms(model: nn.Module, scale: float = 1.0) -> Dict[str, float]:
    """L2 norm of the gradient of each layer, and of all other parameters as ``other``, times ``scale``."""
    groups, seen = {}, set()
    for _, name, layer in layer_names(model):
        params = [p for p in layer.parameters() if p.grad is not None]
        groups[name] = params
        seen.update(id(p) for p in params)
    groups["other"] = [p for p in model.parameters() if p.grad is not None and id(p) not in seen]
    zero = torch.zeros((), dtype=torch.float64, device=next(model.parameters()).device)
    squares = torch.stack([sum((p.grad.detach().double().pow(2).sum() for p in params), zero) for params in groups.values()])
    return dict(zip(groups, (squares.sqrt() * scale).tolist()))


def masked_tokens(t: Tensor, mask: Tensor) -> Tensor:
    """The non-padding rows of a time-major ``T x B x C`` activation, as ``tokens x C`` float64."""
    return t.detach()[mask].double()


class Probe:
    """One eval-mode forward pass on the fixed batch; hooks reduce each sublayer's activations to scalars."""

    def __init__(self, model: nn.Module, net_input: Dict[str, Tensor], groups: List[str]):
        self.model, self.net_input, self.groups = model, net_input, groups
        pad = model.encoder.padding_idx
        self.masks = {  # time-major, as the layers see their input
            "encoder": net_input["src_tokens"].ne(pad).t(),
            "decoder": net_input["prev_output_tokens"].ne(pad).t(),
        }
        self.values: Dict[str, Tensor] = {}  # logged key -> 0-d tensor
        self.branch_variance: Dict[str, Tensor] = {}  # sublayer -> Var f_i
        self.sum_variance: Dict[str, Tensor] = {}  # sublayer -> Var(LayerNorm input)

    @torch.no_grad()
    def run(self):
        """Returns the decoder output features (B x T x C, float32) and ``{key: value}`` to log."""
        handles = [handle for sublayer in sublayers(self.model) for handle in self.attach(sublayer)]
        was_training = self.model.training
        self.model.eval()
        try:
            features, _ = self.model(**self.net_input, features_only=True)
        finally:
            self.model.train(was_training)
            for handle in handles:
                handle.remove()
        for name, branch_variance in self.branch_variance.items():
            self.values[f"beta/{name}"] = (branch_variance / self.sum_variance[name]).sqrt()
        values = torch.stack(list(self.values.values())).tolist() if self.values else []  # one device sync
        return features.float(), dict(zip(self.values, values))

    def attach(self, sublayer: Sublayer) -> list:
        mask, name, handles = self.masks[sublayer.side], sublayer.name, []
        wants_beta = "beta" in self.groups and sublayer.post_norm
        if sublayer.layer_norm is not None and ("ln_input" in self.groups or wants_beta):

            def layer_norm_input(module, args):
                tokens = masked_tokens(args[0], mask)
                if "ln_input" in self.groups:
                    self.values[f"ln_input/{name}"] = tokens.norm(dim=1).mean()
                if wants_beta:
                    self.sum_variance[name] = tokens.var(unbiased=False)

            handles.append(sublayer.layer_norm.register_forward_pre_hook(layer_norm_input))
        if wants_beta:

            def branch_output(module, args, output):
                f = output[0] if isinstance(output, tuple) else output  # attention returns (out, weights)
                self.branch_variance[name] = masked_tokens(f, mask).var(unbiased=False)

            handles.append(sublayer.branch.register_forward_hook(branch_output))
        if "omega" in self.groups and hasattr(sublayer.residual, "omega"):
            omega = sublayer.residual.omega.detach().double()
            self.values[f"omega/{name}"] = omega.mean()
            self.values[f"omega_std/{name}"] = omega.std(unbiased=False)
        return handles


def update_norm(features: Tensor, reference: Tensor, prev_output_tokens: Tensor, pad: int) -> float:
    """Mean over target tokens of ||F_t(x, theta) - F_t(x, theta_0)||_2 (features are B x T x C)."""
    per_token = (features.double() - reference.double()).norm(dim=-1)
    return per_token[prev_output_tokens.ne(pad)].mean().item()


def is_main_rank() -> bool:
    return not (dist.is_available() and dist.is_initialized()) or dist.get_rank() == 0


class Diagnostics:
    """What the task calls around each optimizer step when ``--diagnostics-interval`` is set."""

    def __init__(self, interval: int, groups: List[str], fixed_batch, reference_path: Optional[str]):
        self.interval = interval
        self.groups = groups
        self.forward_groups = [g for g in groups if g != "gnorm"]  # those measured by the probe pass
        self.fixed_batch = fixed_batch  # () -> net_input on the CPU; called once
        self.reference_path = reference_path  # None with --no-save
        self.net_input: Optional[Dict[str, Tensor]] = None
        self.reference: Optional[Tensor] = None

    def due(self, update: int) -> bool:
        return update % self.interval == 0

    def before_step(self, model: nn.Module, optimizer, update_num: int) -> None:
        """``update_num`` updates are done; the gradients of update ``update_num + 1`` are ready."""
        model = unwrap(model)
        if self.net_input is None:
            self.start(model, update_num)
        if "gnorm" in self.groups and self.due(update_num + 1):
            # fairseq's FP16 optimizers defer 1/loss-scale, 1/sample-size and clipping to step()
            scale = float(getattr(optimizer, "_multiply_factor", 1.0))
            for name, value in gradient_norms(model, scale).items():
                metrics.log_scalar(f"gnorm/{name}", value, priority=PRIORITY["gnorm"])

    def after_step(self, model: nn.Module, update_num: int) -> None:
        """The parameters are now theta_{update_num + 1}."""
        if not self.forward_groups or not self.due(update_num + 1):
            return
        model = unwrap(model)
        features, values = Probe(model, self.net_input, self.forward_groups).run()
        if "update" in self.groups:
            pad = model.encoder.padding_idx
            value = update_norm(features, self.reference, self.net_input["prev_output_tokens"], pad)
            metrics.log_scalar("update_norm", value, priority=PRIORITY["update"])
        for key, value in values.items():
            group = "omega" if key.startswith("omega") else key.split("/")[0]
            metrics.log_scalar(key, value, priority=PRIORITY[group])

    def start(self, model: nn.Module, update_num: int) -> None:
        """Fix the held-out batch and, for ``update_norm``, theta_0's output on it (saved for resuming)."""
        device = next(model.parameters()).device
        wants_reference = "update" in self.groups
        saved = None
        if wants_reference and update_num > 0 and self.reference_path and os.path.exists(self.reference_path):
            saved = torch.load(self.reference_path, map_location="cpu")
        net_input = saved["net_input"] if saved else self.fixed_batch()
        self.net_input = {key: value.to(device) for key, value in net_input.items()}
        if saved:
            self.reference, since = saved["features"].to(device), saved["update"]
        elif wants_reference:
            self.reference, since = Probe(model, self.net_input, []).run()[0], update_num
            if update_num > 0:
                logger.warning(f"diagnostics: no {REFERENCE_FILE} from update 0 in the save dir; "
                               f"update_norm is measured from update {update_num}")
            if self.reference_path and is_main_rank():
                os.makedirs(os.path.dirname(self.reference_path), exist_ok=True)
                batch = {k: v.cpu() for k, v in self.net_input.items()}
                compat.save_atomically({"update": update_num, "net_input": batch, "features": self.reference.cpu()},
                                       self.reference_path)
        tokens = int(self.net_input["prev_output_tokens"].ne(model.encoder.padding_idx).sum())
        logger.info(
            f"diagnostics: every {self.interval} updates ({','.join(self.groups)}) on "
            f"{len(self.net_input['src_lengths'])} held-out sentences ({tokens} target tokens)"
            + (f"; update_norm measured from update {since}" if wants_reference else "")
        )
