"""Qwen3-MoE (Qwen Team 2025, "Qwen3 Technical Report"; Qwen3-30B-A3B,
Qwen3-235B-A22B): Qwen3's attention (per-head q/k RMSNorm) with a sparse
mixture of experts (:class:`~paternoster.model.moe.SparseMoeBlock`) as the
feed-forward block of every ``decoder_sparse_step``-th layer outside
``mlp_only_layers`` (the others keep a dense SwiGLU MLP).

Matches HF transformers' ``Qwen3MoeForCausalLM`` (tests/model/test_qwen3_moe.py).
On CPU each layer's experts are one core call (paternoster/moe.h), and the
core's decoder stack runs whole steps as for the dense models. GGUF files
(``qwen3moe``) are served with the experts where they lie in the file.
"""

from __future__ import annotations

import torch
from torch import nn

from paternoster.model.moe import SparseMoeBlock
from paternoster.model.qwen3 import Qwen3ForCausalLM


class Qwen3MoeForCausalLM(Qwen3ForCausalLM):
    """Qwen3 with routed experts.

    Raises:
        ValueError: a bad ``num_experts_per_tok``, or what
            :class:`~paternoster.model.qwen3.Qwen3ForCausalLM` raises.
    """

    def make_mlp(self, config, dtype: torch.dtype, index: int, invariant: bool) -> nn.Module:
        """The routed experts for sparse layers, else the dense MLP."""
        step = int(getattr(config, "decoder_sparse_step", 1) or 1)
        dense_layers = set(getattr(config, "mlp_only_layers", None) or [])
        if config.num_experts > 0 and index not in dense_layers and (index + 1) % step == 0:
            return SparseMoeBlock(config.hidden_size, config.moe_intermediate_size,
                                  config.num_experts, config.num_experts_per_tok,
                                  bool(config.norm_topk_prob), dtype, invariant)
        return super().make_mlp(config, dtype, index, invariant)
