"""Hyper-Connections (Zhu et al., ICLR 2025, "Hyper-Connections", arXiv 2409.19606, Sec. 2 and Appendix J,
Algorithm 2) and mHC (Xie et al., DeepSeek, arXiv 2512.24880, "Manifold-Constrained Hyper-Connections").

The hidden state is n residual streams H (n x C, ``--hyper-streams n``, default 4), the embedding output copied n
times; the stack outputs their sum (then Pre-LN's final LayerNorm). Every sublayer reads and writes them through an
(n+1) x (n+1) connection ``[[0, B], [A_m, A_r]]`` whose entries also depend on the token (dynamic hyper-connections):

* width connection: the branch reads ``h = A_m^T H`` and the streams carried on are ``H' = A_r^T H``;
* depth connection: ``H_new = B^T f(h) + H'``, f the Pre-LN branch ``dropout(F(LN(h)))``;
* ``A = A_static + s_a * tanh(norm(H) W_a)``, ``B = B_static + s_b * tanh(norm(H) W_b)``, per stream: W_a is
  C x (1 + n), W_b is C x 1, s_a = s_b = 0.01, norm the paper's LayerNorm.

The paper's initialisation: W_a = W_b = 0, A_r = I, B = 1, A_m = e_k with k the sublayer's index in the stack mod n:
every stream then carries the same Pre-LN residual, so the model starts as Pre-LN (the n-fold sum is undone by the final
LayerNorm).

mHC (``--hyper-sinkhorn-iters K``): the same parameters, without tanh, with the paper's manifold constraints:
``A_m = sigmoid(.)``, ``B = 2 * sigmoid(.)`` and ``A_r`` doubly stochastic by K Sinkhorn-Knopp iterations on its
exponential (the paper uses 20), with separate scales for A_m, A_r and B and an RMSNorm for norm; computed in float32.
The paper's coefficients read all n streams flattened (norm over n * C); here, as in the ``hyper-connections`` package
(``ManifoldConstrainedHyperConnections``), each stream's row is computed from that stream.

The streams' tensor is T x B x n x C inside the stack; LayerDrop skips a layer's connections with it. fairseq's
initialisation of the sublayers is kept.
"""

from typing import List, Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F
from fairseq.modules import LayerNorm
from torch import Tensor

from deepnmt_plugin.models.method import (DeepMethod, Residual, StackConnection, refuse_below_one, register_method,
                                          scaled_residual_sum)

DYNAMIC_SCALE = 0.01  # s_a, s_b (the paper's and the package's init)


def sinkhorn(logits: Tensor, iterations: int) -> Tensor:
    """exp(logits) made (nearly) doubly stochastic over its last two dimensions by Sinkhorn-Knopp: columns, then rows,
    ``iterations`` times (mHC's projection onto the doubly stochastic matrices); the column maximum is subtracted
    first, for float range."""
    matrix = (logits - logits.amax(dim=-2, keepdim=True).detach()).exp()
    for _ in range(iterations):
        matrix = matrix / matrix.sum(dim=-2, keepdim=True).clamp_min(1e-12)
        matrix = matrix / matrix.sum(dim=-1, keepdim=True).clamp_min(1e-12)
    return matrix


class StreamRMSNorm(nn.Module):
    """mHC's RMSNorm of each stream, in float32 whatever the model's precision (as the coefficients it feeds)."""

    def __init__(self, embed_dim: int):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(embed_dim))

    def forward(self, x: Tensor) -> Tensor:
        return F.rms_norm(x.float(), (x.size(-1),), self.weight.float(), 1e-12)


class HyperConnection(Residual):
    """One sublayer's hyper-connection. ``branch_input(H)`` computes the sublayer's coefficients from H once (one norm,
    one projection), returns h = A_m^T H and keeps A_r^T H and B, computed in the same product, for
    ``forward(H, f)``, which returns B^T f + A_r^T H: the layer calls the two in turn for each sublayer."""

    pending: Optional[Tuple[Tensor, Tensor]]  # (A_r^T H, B) from branch_input to forward

    def __init__(self, embed_dim: int, streams: int, index: int, sinkhorn_iterations: int):
        super().__init__()
        self.sinkhorn_iterations = sinkhorn_iterations
        self.norm = StreamRMSNorm(embed_dim) if sinkhorn_iterations else LayerNorm(embed_dim)
        static_alpha = torch.cat((torch.zeros(streams, 1), torch.eye(streams)), dim=1)
        static_alpha[index % streams, 0] = 1.0
        self.static_alpha = nn.Parameter(static_alpha)  # n x (1 + n): [A_m, A_r]
        self.dynamic_alpha = nn.Parameter(torch.zeros(embed_dim, 1 + streams))  # W_a
        self.static_beta = nn.Parameter(torch.ones(streams))  # B
        self.dynamic_beta = nn.Parameter(torch.zeros(embed_dim))  # W_b
        # s_a (HC: one for A_m and A_r; mHC: A_m's, then A_r's) and s_b
        self.alpha_scale = nn.Parameter(torch.full((2 if sinkhorn_iterations else 1,), DYNAMIC_SCALE))
        self.beta_scale = nn.Parameter(torch.tensor(DYNAMIC_SCALE))
        self.pending = None

    def coefficients(self, x: Tensor) -> Tuple[Tensor, Tensor]:
        """[A_m, A_r] (T x B x n x (1 + n); row s from stream s) and B (T x B x n), in the norm's dtype."""
        normed = self.norm(x)
        dtype = normed.dtype
        # [W_a, W_b] and [A_m, A_r, B]: every coefficient of a token from one product
        raw = normed @ torch.cat((self.dynamic_alpha, self.dynamic_beta.unsqueeze(-1)), dim=-1).to(dtype)
        static = torch.cat((self.static_alpha, self.static_beta.unsqueeze(-1)), dim=-1).to(dtype)
        if self.sinkhorn_iterations:
            a_m = torch.sigmoid(raw[..., :1] * self.alpha_scale[0] + static[:, :1])
            a_r = sinkhorn(raw[..., 1:-1] * self.alpha_scale[1] + static[:, 1:-1], self.sinkhorn_iterations)
            beta = 2 * torch.sigmoid(raw[..., -1] * self.beta_scale + static[:, -1])
            return torch.cat((a_m, a_r), dim=-1), beta
        scale = torch.cat((self.alpha_scale.expand(static.size(-1) - 1), self.beta_scale.unsqueeze(0))).to(dtype)
        alphas, beta = scaled_residual_sum(static, torch.tanh(raw), scale).split([static.size(-1) - 1, 1], dim=-1)
        return alphas, beta.squeeze(-1)

    def branch_input(self, x: Tensor) -> Tensor:
        """h = sum_s A_m[s] * H_s, T x B x C."""
        alphas, beta = self.coefficients(x)
        # T x B x (1 + n) x C: h, then A_r^T H; split, not indexed, so that the backward joins the two in one operator
        h, carried = (alphas.transpose(-1, -2) @ x.to(alphas.dtype)).split([1, alphas.size(-1) - 1], dim=-2)
        self.pending = (carried, beta)
        return h.squeeze(-2).to(x.dtype)

    def forward(self, x: Tensor, f: Tensor, layer_input: Tensor) -> Tensor:
        """H_new[t] = B[t] * f + sum_s A_r[s, t] * H[s], T x B x n x C."""
        pending = self.pending
        assert pending is not None, "a hyper-connection's forward follows its branch_input"
        carried, beta = pending
        self.pending = None
        return scaled_residual_sum(carried, f.unsqueeze(-2).to(carried.dtype), beta.unsqueeze(-1)).to(x.dtype)

    def extra_repr(self) -> str:
        return f"streams={self.static_beta.numel()}, sinkhorn_iterations={self.sinkhorn_iterations}"


class ResidualStreams(StackConnection):
    """The stack's n streams: the embedding output copied n times in, their sum out (T x B x C at both ends)."""

    def __init__(self, streams: int):
        super().__init__()
        self.streams = streams

    def begin(self, x: Tensor, state: List[Tensor]) -> Tensor:
        return x.unsqueeze(-2).expand(-1, -1, self.streams, -1)

    def output(self, x: Tensor, state: List[Tensor]) -> Tensor:
        return x.sum(dim=-2)

    def extra_repr(self) -> str:
        return f"streams={self.streams}"


@register_method
class HyperConnections(DeepMethod):
    name = "hyper"
    layer_norm = "pre"
    flag_names = ("hyper_streams", "hyper_sinkhorn_iters")
    export_refusal = "its layers read and write several residual streams, which stock fairseq's transformer does not"

    def __init__(self, encoder_layers: int, decoder_layers: int, streams: int = 4, sinkhorn_iterations: int = 0):
        super().__init__(encoder_layers, decoder_layers)
        self.streams, self.sinkhorn_iterations = streams, sinkhorn_iterations

    @classmethod
    def add_args(cls, parser) -> None:
        parser.add_argument("--hyper-streams", type=int, default=None,
                            help="transformer_hyper: the expansion rate n, residual streams per stack (default 4)")
        parser.add_argument("--hyper-sinkhorn-iters", type=int, default=None,
                            help="transformer_hyper: mHC, its residual mixing made doubly stochastic by K "
                                 "Sinkhorn-Knopp iterations (the paper: 20); default plain Hyper-Connections")

    @classmethod
    def from_config(cls, cfg) -> "HyperConnections":
        method = super().from_config(cfg)
        method.streams = getattr(cfg, "hyper_streams", None) or 4
        method.sinkhorn_iterations = getattr(cfg, "hyper_sinkhorn_iters", None) or 0
        return method

    def check_args(self, args, arch: str) -> None:
        super().check_args(args, arch)
        refuse_below_one(args, self.flag_names)

    def residuals(self, side: str, embed_dim: int, count: int, layer_number: int) -> List[Residual]:
        first = (layer_number - 1) * count  # the sublayer's index in the stack: A_m's initial stream
        return [HyperConnection(embed_dim, self.streams, first + j, self.sinkhorn_iterations) for j in range(count)]

    def stack_connection(self, side: str, embed_dim: int, num_layers: int) -> nn.Module:
        return ResidualStreams(self.streams)
