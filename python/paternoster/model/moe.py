"""Sparse mixture-of-experts feed-forward block (Shazeer et al. 2017, "Outrageously
Large Neural Networks"; top-k softmax routing as in Mixtral, Jiang et al. 2024,
and Qwen3-MoE): each token goes to its ``top_k`` highest-scoring experts, each
a SwiGLU MLP, and their outputs are summed with the routing weights.

Experts are computed grouped: the step's (token, expert) pairs are sorted by
expert and each expert multiplies all of its tokens in one matmul, rather than
one token (or one request) at a time. On CPU, where every matmul of the block
runs on the core's kernels (quantized experts, few enough tokens, or
batch-invariant mode), the whole block is one call into the core
(:class:`~paternoster.kernels.moe.CpuMoeExperts`), which the core's decoder
stack calls too.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from paternoster import kernels
from paternoster.kernels.cpu import CPU_DTYPES
from paternoster.kernels.moe import CpuMoeExperts
from paternoster.kernels.quant import QuantizedWeight, WeightParts
from paternoster.model.rowwise import rowwise


@dataclass(frozen=True)
class Routing:
    """How a block picks and weighs its experts.

    Attributes:
        scoring: ``"softmax"`` over the router logits (Mixtral, Qwen3-MoE,
            gpt-oss), or ``"sigmoid"`` per expert (LFM2-MoE, DeepSeek-V3).
        selection_bias: sigmoid scoring adds a learned per-expert bias to
            the scores to choose the top k (auxiliary-loss-free balancing,
            Wang et al. 2024, arXiv:2408.15664), not to weigh them.
        norm_eps: added to the sum when sigmoid weights are renormalized.
        scaling: the chosen weights' factor (``routed_scaling_factor``).
        groups, topk_groups: sigmoid scoring chooses only among the experts
            of the ``topk_groups`` of ``groups`` equal groups whose two best
            biased scores sum highest (DeepSeek-V3's node-limited routing,
            arXiv:2412.19437; Nemotron-H's MoE); 1, 1: no limit.
        float32_logits: the router's logits kept in float32, not rounded to
            the model dtype (Nemotron-H's router; the core's are always).
    """

    scoring: str = "softmax"
    selection_bias: bool = False
    norm_eps: float = 0.0
    scaling: float = 1.0
    groups: int = 1
    topk_groups: int = 1
    float32_logits: bool = False

    def __post_init__(self) -> None:
        if self.scoring not in ("softmax", "sigmoid"):
            raise ValueError(f"scoring must be 'softmax' or 'sigmoid', got {self.scoring!r}")
        if not 1 <= self.topk_groups <= self.groups:
            raise ValueError(f"topk_group must be in [1, n_group={self.groups}], "
                             f"got {self.topk_groups}")


class SparseMoeBlock(nn.Module):
    """Top-k routed SwiGLU experts.

    Parameters (dense, model dtype, or quantized as loaded from a GGUF file:
    :class:`~paternoster.kernels.QuantizedWeight`), experts stacked along the rows so each
    expert's matrix is a contiguous 2-D slice:

    - ``router_weight`` ``[E, H]`` (HF ``mlp.gate.weight``);
    - ``gate_up_weight`` ``[E * 2I, H]``: expert e's gate rows, then its up rows,
      at ``[e * 2I, (e + 1) * 2I)``;
    - ``down_weight`` ``[E * H, I]``: expert e's at ``[e * H, (e + 1) * H)``;
    - with ``bias``: ``router_bias`` ``[E]``, ``gate_up_bias`` ``[E * 2I]`` and
      ``down_bias`` ``[E * H]``, stacked as the matrices' rows (else None).

    Args:
        hidden: H. inter: I (per expert). num_experts: E. top_k: experts per token.
        norm_topk_prob: renormalize the top-k probabilities to sum to 1.
        checkpoint_names: the HF names under the layer: the block's prefix and
            each expert's gate, up and down matrices (Qwen3-MoE's by default;
            Mixtral's are ``block_sparse_moe`` and ``w1``, ``w3``, ``w2``).
        bias: the router and the experts' projections have biases (gpt-oss).
        routing: a :class:`Routing` other than softmax top-k (LFM2-MoE's
            sigmoid scores with a selection bias).
        gated: each expert is ``down(act(gate x) * up x)`` (SwiGLU); False:
            ``down(act(up x))`` with ``gate_up_weight`` holding only the up
            rows (``[E * I, H]``; Nemotron-H's relu² experts, whose subclass
            overrides :meth:`activation`).
    Raises:
        ValueError: ``top_k`` outside ``[1, num_experts]``.
    """

    def __init__(self, hidden: int, inter: int, num_experts: int, top_k: int,
                 norm_topk_prob: bool, dtype: torch.dtype, invariant: bool = False,
                 checkpoint_names: tuple[str, str, str, str] = (
                     "mlp", "gate_proj", "up_proj", "down_proj"),
                 bias: bool = False, routing: Routing | None = None,
                 gated: bool = True) -> None:
        super().__init__()
        self.checkpoint_names = checkpoint_names
        self.routing = routing if routing is not None else Routing()
        if not 1 <= top_k <= num_experts:
            raise ValueError(f"num_experts_per_tok must be in [1, {num_experts}], got {top_k}")
        self.hidden, self.inter = hidden, inter
        self.num_experts, self.top_k = num_experts, top_k
        self.norm_topk_prob = norm_topk_prob
        self.invariant = invariant
        #: Rows of one expert's first matrix: gate and up, or up alone.
        self.up_rows = (2 if gated else 1) * inter
        empty = lambda *shape: nn.Parameter(torch.empty(*shape, dtype=dtype),  # noqa: E731
                                            requires_grad=False)
        self.router_weight = empty(num_experts, hidden)
        self.gate_up_weight = empty(num_experts * self.up_rows, hidden)
        self.down_weight = empty(num_experts * hidden, inter)
        self.router_bias = empty(num_experts) if bias else None
        self.gate_up_bias = empty(num_experts * self.up_rows) if bias else None
        self.down_bias = empty(num_experts * hidden) if bias else None
        # Added to the sigmoid scores to choose experts, not to weigh them
        # (checkpoint ``{prefix}.expert_bias``, float32).
        self.selection_bias = (nn.Parameter(torch.zeros(num_experts), requires_grad=False)
                               if self.routing.selection_bias else None)

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x ``[T, H]`` -> (weights ``[T, k]`` in x's dtype, expert ids int64
        ``[T, k]``): softmax over the router logits in float32, the top k,
        renormalized if the config says so (HF Qwen3-MoE/Mixtral order); or
        the sigmoid routing of :class:`Routing`."""
        if self.routing.scoring == "sigmoid":
            return self._sigmoid_route(x)
        probs = torch.softmax(self.router_logits(x).float(), dim=-1)
        weights, experts = torch.topk(probs, self.top_k, dim=-1)
        if self.norm_topk_prob:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return weights.to(x.dtype), experts

    def _sigmoid_route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Sigmoid scores in float32; the top k of ``score + selection_bias``
        chosen, weighed by their scores, renormalized (``/ (sum + eps)``)
        if the config says so, times ``routed_scaling_factor`` (HF LFM2-MoE's
        order; DeepSeek-V3's without group limits)."""
        scores = rowwise(torch.sigmoid, self.router_logits(x).float(), self.invariant)
        choice = scores if self.selection_bias is None else scores + self.selection_bias
        r = self.routing
        if r.groups > 1:  # keep the experts of the best groups only
            per_group = choice.view(choice.shape[0], r.groups, -1)
            best = per_group.topk(2, dim=-1).values.sum(-1).topk(r.topk_groups, dim=-1).indices
            keep = torch.zeros_like(per_group[..., 0], dtype=torch.bool).scatter_(1, best, True)
            choice = per_group.masked_fill(~keep[..., None], float("-inf")).view_as(choice)
        experts = torch.topk(choice, self.top_k, dim=-1).indices
        weights = scores.gather(1, experts)
        if self.norm_topk_prob:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + self.routing.norm_eps)
        return (weights * self.routing.scaling).to(x.dtype), experts

    def router_logits(self, x: torch.Tensor) -> torch.Tensor:
        """x ``[T, H]`` -> ``[T, E]`` in x's dtype: ``x @ router_weight.T``
        (``+ router_bias`` when the block has biases); float32 with
        :attr:`Routing.float32_logits`."""
        if not self.routing.float32_logits:
            return kernels.linear(x, self.router_weight, self.router_bias,
                                  invariant=self.invariant)
        if x.device.type != "cpu":  # (kernels.linear rounds to the model dtype there)
            w = self.router_weight
            w = w.dequantize(torch.float32) if isinstance(w, QuantizedWeight | WeightParts) else w
            bias = None if self.router_bias is None else self.router_bias.float()
            return torch.nn.functional.linear(x.float(), w.float(), bias)
        return kernels.linear(x, self.router_weight, self.router_bias, out_dtype=torch.float32,
                              invariant=self.invariant)

    def core_activation(self) -> tuple[str, float, float] | None:
        """The core's name (:data:`paternoster.kernels.moe.ACTIVATIONS`), alpha
        and limit for :meth:`activation`, or None where the core has none
        like it (a subclass overriding :meth:`activation` says so here)."""
        return ("swiglu", 0.0, 0.0) if type(self).activation is SparseMoeBlock.activation else None

    def core_experts(self, num_tokens: int) -> CpuMoeExperts | None:
        """The core's one-call block for a CPU step of ``num_tokens`` tokens,
        or None to run the experts here: the core has the block's activation
        (:meth:`core_activation`), its weights are on the CPU in
        float32/bfloat16 (or quantized), and every matmul takes the core's
        kernel (quantized experts, at most
        ``kernels.cpu.DENSE_CORE_MAX_TOKENS`` tokens, or batch-invariant
        mode). Built once per set of weights."""
        activation = self.core_activation()
        if activation is None or self.router_weight.device.type != "cpu":
            return None
        weights = (self.router_weight, self.gate_up_weight, self.down_weight)
        quantized = all(isinstance(w, QuantizedWeight | WeightParts) for w in weights[1:])
        if not (quantized or self.invariant or kernels.core_runs_matmuls(num_tokens)):
            return None
        biases = (self.router_bias, self.gate_up_bias, self.down_bias)
        key = tuple(id(w) for w in (*weights, *biases, self.selection_bias))
        if getattr(self, "_core_key", None) != key:
            dtype = (self.router_weight.dtype if isinstance(self.router_weight, torch.Tensor)
                     else None)
            self._core = None
            if dtype in CPU_DTYPES:
                name, alpha, limit = activation
                r = self.routing
                sigmoid = None if r.scoring == "softmax" else (
                    None if self.selection_bias is None else self.selection_bias.float(),
                    r.norm_eps, r.scaling, r.groups, r.topk_groups)
                self._core = CpuMoeExperts(*weights, self.hidden, self.inter, self.num_experts,
                                           self.top_k, self.norm_topk_prob, dtype, biases,
                                           name, alpha, limit, sigmoid)
            self._core_key = key
        return self._core

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x ``[T, H]`` -> ``[T, H]``: the routed experts' outputs, weighted and summed."""
        core = self.core_experts(x.shape[0]) if x.device.type == "cpu" else None
        if core is not None and x.dtype == core.dtype:
            return core.forward(x.contiguous(), self.invariant)
        weights, experts = self.route(x)
        return self.combine(x, weights, experts)

    def combine(self, x: torch.Tensor, weights: torch.Tensor,
                experts: torch.Tensor) -> torch.Tensor:
        """The chosen experts on x ``[T, H]``, weighted and summed: weights
        ``[T, k]`` and expert ids ``[T, k]`` as :meth:`route` gives them (or
        from another input: Nemotron-H routes on the hidden state and runs
        the experts on a latent projection of it). Grouped per expert."""
        out = torch.zeros_like(x)
        if x.shape[0] == 1:  # one token: no grouping to do, the same sums in the same order
            ids = experts[0].tolist()
            for s in sorted(range(self.top_k), key=ids.__getitem__):
                out += self._expert(x, ids[s]) * weights[0, s]
            return out
        flat = experts.flatten()  # pair p = token p // k, slot p % k
        order = torch.argsort(flat, stable=True)
        counts = torch.bincount(flat, minlength=self.num_experts).tolist()
        start = 0
        for e, n in enumerate(counts):
            if n == 0:
                continue
            pairs = order[start:start + n]
            start += n
            tokens = pairs // self.top_k
            y = self._expert(x[tokens], e) * weights.flatten()[pairs, None]
            out.index_add_(0, tokens, y)
        return out

    def activation(self, gate_up: torch.Tensor) -> torch.Tensor:
        """``[n, 2I]`` (gate columns, then up) -> ``[n, I]``: SwiGLU,
        ``silu(gate) * up`` (gpt-oss overrides)."""
        return kernels.silu_and_mul(gate_up)

    def _expert(self, x: torch.Tensor, e: int) -> torch.Tensor:
        """Expert ``e``'s gated MLP on rows x ``[n, H]`` -> ``[n, H]``."""
        two_i, h = self.up_rows, self.hidden
        gate_up = kernels.linear(x, self.gate_up_weight[e * two_i:(e + 1) * two_i],
                                 _rows(self.gate_up_bias, e * two_i, two_i),
                                 invariant=self.invariant)
        return kernels.linear(self.activation(gate_up), self.down_weight[e * h:(e + 1) * h],
                              _rows(self.down_bias, e * h, h), invariant=self.invariant)


def _rows(bias: torch.Tensor | None, start: int, n: int) -> torch.Tensor | None:
    return None if bias is None else bias[start:start + n]
