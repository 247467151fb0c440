"""EXAONE 4.0 (LG AI Research 2025, "EXAONE 4.0: Unified Large Language Models
Integrating Non-reasoning and Reasoning Modes"; 1.2B and 32B): OLMo 2's
post-norm block (:class:`~paternoster.model.olmo2.PostNormDecoderLayer`) with
Qwen3's per-head q/k RMSNorms and Llama's RMSNorm. With a ``sliding_window``,
three layers of four attend within the window with RoPE and every fourth
attends to the whole context without RoPE (``layer_types``); without one,
every layer is full attention with RoPE.

Matches HF transformers' ``Exaone4ForCausalLM``
(tests/model/test_post_norm_models.py). Every step runs the Python layers.
"""

from __future__ import annotations

import torch
from torch import nn

from paternoster.model.attention import AttentionOps
from paternoster.model.layer_types import FULL, TypedLayersForCausalLM
from paternoster.model.llama import RMSNorm
from paternoster.model.olmo2 import PostNormDecoderLayer
from paternoster.model.qwen3 import Qwen3Attention


class Exaone4ForCausalLM(TypedLayersForCausalLM):
    """EXAONE 4.0 (see the module docstring).

    Raises:
        ValueError: what :class:`~paternoster.model.layer_types.TypedLayersForCausalLM`
            raises.
    """

    attention_cls = Qwen3Attention
    default_pattern = 4

    def __init__(self, config, dtype: torch.dtype, ops: AttentionOps,
                 max_positions: int | None = None, batch_invariant: bool = False) -> None:
        super().__init__(config, dtype, ops, max_positions, batch_invariant)
        if getattr(config, "sliding_window", None):  # the full layers are NoPE
            for layer, kind in zip(self.layers, self.layer_types, strict=True):
                layer.self_attn.use_rope = kind != FULL

    def make_layer(self, config, dtype: torch.dtype, ops: AttentionOps, index: int,
                   qkv_bias: bool, o_bias: bool, invariant: bool) -> nn.Module:
        """The post-norm block with Qwen3's attention."""
        return PostNormDecoderLayer(config, dtype, ops, qkv_bias, o_bias, invariant,
                                    Qwen3Attention, RMSNorm)
