"""Routed SwiGLU experts in one call into the C++ core (``paternoster/moe.h``):
the router, softmax top-k routing and every expert's MLP, so a mixture-of-
experts layer costs one call from Python instead of a few per expert (a
Qwen3-30B-A3B decode step routes to 8 of 128 experts in each of 48 layers).

The arithmetic (``paternoster/moe.h``): router logits in float32; each
expert's gate/up projection and SwiGLU rounded to the model dtype as a dense
MLP's; its down projection kept in float32, weighted and summed over the
token's experts in ascending expert order in float32, rounded once.
"""

from __future__ import annotations

import torch

from paternoster import _core
from paternoster.kernels.checks import check_tensor
from paternoster.kernels.cpu import CPU_DTYPES, WEIGHT_FORMATS
from paternoster.kernels.quant import QuantizedWeight, WeightParts

Weight = torch.Tensor | QuantizedWeight | WeightParts


def weight_parts(weight: Weight, dtype: torch.dtype) -> list[tuple[int, object, int]]:
    """``(data pointer, core WeightFormat, rows)`` of each row block of
    ``weight``: its parts, the one quantized matrix, or the one dense matrix
    (2-D, contiguous, ``dtype``; ValueError otherwise)."""
    if isinstance(weight, WeightParts):
        return [(p.data.data_ptr(), WEIGHT_FORMATS[p.format], p.shape[0]) for p in weight.parts]
    if isinstance(weight, QuantizedWeight):
        return [(weight.data.data_ptr(), WEIGHT_FORMATS[weight.format], weight.shape[0])]
    check_tensor(weight, "weight", 2, dtype)
    return [(weight.data_ptr(), WEIGHT_FORMATS[dtype], weight.shape[0])]


#: The experts' gating functions the core has (``paternoster/moe.h``
#: MoeActivation): SwiGLU, and gpt-oss's clamped SwiGLU (alpha, limit).
ACTIVATIONS = {"swiglu": 0, "clamped_swiglu": 1, "relu2": 2}


class CpuMoeExperts:
    """The core's routed experts over a block's weights (kept referenced).

    Args:
        router: ``[E, H]``; gate_up: ``[E * 2I, H]`` (expert e's gate rows,
            then its up rows); down: ``[E * H, I]``. Dense in ``dtype``, or
            quantized (:class:`QuantizedWeight` or :class:`WeightParts`).
        hidden, inter: H and I. num_experts: E. top_k: experts per token.
        norm_topk_prob: renormalize the chosen experts' probabilities to 1
            (the same as a softmax over the top-k logits alone: gpt-oss).
        dtype: activations' dtype, float32 or bfloat16.
        biases: (router ``[E]``, gate_up ``[E * 2I]``, down ``[E * H]``),
            each in ``dtype`` or None.
        activation: a key of :data:`ACTIVATIONS`, with ``alpha`` and
            ``limit`` for ``"clamped_swiglu"``; ``"relu2"``: non-gated
            experts, ``gate_up`` holding only the up rows (``[E * I, H]``).
        sigmoid_routing: None for softmax top-k, else ``(selection_bias,
            norm_eps, scaling, groups, topk_groups)`` of the core's sigmoid
            routing (``selection_bias``: float32 ``[E]`` or None; kept
            referenced), as :class:`paternoster.model.moe.Routing`.
    Raises:
        ValueError: a bad dtype or activation, a weight of the wrong rows or
            format, or ``top_k`` outside ``[1, num_experts]`` (the core's checks).
    """

    def __init__(self, router: Weight, gate_up: Weight, down: Weight, hidden: int, inter: int,
                 num_experts: int, top_k: int, norm_topk_prob: bool, dtype: torch.dtype,
                 biases: tuple[torch.Tensor | None, ...] = (None, None, None),
                 activation: str = "swiglu", alpha: float = 0.0, limit: float = 0.0,
                 sigmoid_routing: tuple | None = None) -> None:
        if dtype not in CPU_DTYPES:
            raise ValueError(f"dtype must be float32 or bfloat16, got {dtype}")
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}, got {activation!r}")
        up_rows = inter if activation == "relu2" else 2 * inter
        rows = (num_experts, num_experts * up_rows, num_experts * hidden)
        for bias, n, name in zip(biases, rows, ("router", "gate_up", "down"), strict=True):
            if bias is not None and check_tensor(bias, f"{name} bias", 1, dtype)[0] != n:
                raise ValueError(f"{name} bias needs {n} entries, got {bias.shape[0]}")
        routing: dict = {}
        if sigmoid_routing is not None:
            bias, norm_eps, scaling, groups, topk_groups = sigmoid_routing
            if bias is not None and tuple(check_tensor(bias, "selection_bias", 1,
                                                       torch.float32)) != (num_experts,):
                raise ValueError(f"selection_bias needs {num_experts} entries")
            routing = dict(sigmoid=True, selection_bias=0 if bias is None else bias.data_ptr(),
                           norm_eps=norm_eps, scaling=scaling, groups=groups,
                           topk_groups=topk_groups)
        self._keep = (router, gate_up, down, biases, sigmoid_routing)
        self.core = _core.MoeExperts(
            hidden_size=hidden, intermediate_size=inter, num_experts=num_experts, top_k=top_k,
            norm_topk_prob=norm_topk_prob, dtype=CPU_DTYPES[dtype],
            router=weight_parts(router, dtype), gate_up=weight_parts(gate_up, dtype),
            down=weight_parts(down, dtype),
            router_bias=0 if biases[0] is None else biases[0].data_ptr(),
            gate_up_bias=0 if biases[1] is None else biases[1].data_ptr(),
            down_bias=0 if biases[2] is None else biases[2].data_ptr(),
            activation=ACTIVATIONS[activation], alpha=alpha, limit=limit, **routing)
        self.dtype, self.hidden = dtype, hidden

    def forward(self, x: torch.Tensor, invariant: bool = False) -> torch.Tensor:
        """x ``[T, H]`` -> ``[T, H]``: the routed experts' weighted sum.

        Args:
            invariant: batch-invariant linear kernels (each token's result
                independent of the others in the call).
        Raises:
            ValueError: x not a contiguous ``[T, H]`` CPU tensor of the dtype.
        """
        t, h = check_tensor(x, "x", 2, self.dtype)
        if h != self.hidden:
            raise ValueError(f"x has {h} columns, the experts take {self.hidden}")
        out = torch.empty_like(x)
        self.core._forward_ptr(out.data_ptr(), x.data_ptr(), t, invariant)
        return out


def moe_route(logits: torch.Tensor, top_k: int,
              renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The core's softmax top-k routing: float32 logits ``[T, E]`` ->
    (float32 weights ``[T, top_k]``, int32 expert ids ``[T, top_k]``), each
    token's slots in descending probability (ties: the lower expert first).

    Raises:
        ValueError: ``top_k`` outside ``[1, E]``, or logits not a contiguous
            float32 CPU matrix.
    """
    t, e = check_tensor(logits, "logits", 2, torch.float32)
    weights = torch.empty(t, max(top_k, 0), dtype=torch.float32)
    experts = torch.empty(t, max(top_k, 0), dtype=torch.int32)
    _core._moe_route_ptr(weights.data_ptr(), experts.data_ptr(), logits.data_ptr(), t, e,
                         top_k, renormalize)
    return weights, experts
