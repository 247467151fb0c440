"""Mixtral (Jiang et al. 2024, "Mixtral of Experts"): Mistral's attention with
a sparse mixture of 8 SwiGLU experts, 2 per token, in every layer
(:class:`~paternoster.model.moe.SparseMoeBlock`; the top-2 softmax weights
renormalized, as Mixtral's router does). Checkpoint names:
``block_sparse_moe.gate`` (router) and ``block_sparse_moe.experts.{e}.w1``
(gate), ``w3`` (up), ``w2`` (down).

Matches HF transformers' ``MixtralForCausalLM`` (tests/model/test_mixtral.py).
A configured sliding window runs through the KV cache groups, as Mistral's
(:mod:`paternoster.model.kv_layout`). CPU steps run
the Python layers (no MoE block in the core's decoder stack yet).
"""

from __future__ import annotations

import torch
from torch import nn

from paternoster.model.llama import LlamaForCausalLM
from paternoster.model.moe import SparseMoeBlock


class MixtralForCausalLM(LlamaForCausalLM):
    """Mixtral 8x7B / 8x22B.

    Raises:
        ValueError: a bad ``num_experts_per_tok``, or what
            :class:`~paternoster.model.llama.LlamaForCausalLM` raises.
    """

    def make_mlp(self, config, dtype: torch.dtype, index: int, invariant: bool) -> nn.Module:
        """Every layer's feed-forward block is routed experts."""
        return SparseMoeBlock(config.hidden_size, config.intermediate_size,
                              config.num_local_experts, config.num_experts_per_tok, True,
                              dtype, invariant,
                              checkpoint_names=("block_sparse_moe", "w1", "w3", "w2"))
