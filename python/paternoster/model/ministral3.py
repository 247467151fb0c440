"""Ministral 3 (Mistral AI, December 2025; 3B, 8B, 14B) text models: the
Mistral block (Llama's, with an optional sliding window) with YaRN-scaled
RoPE and Llama 4's attention temperature: after RoPE every query is
multiplied by ``1 + beta * ln(1 + floor(p / L))`` for its position ``p``,
``beta = llama_4_scaling_beta`` and ``L = original_max_position_embeddings``
of ``rope_parameters``. The factor is exactly 1 below ``L`` (16,384 in the
released configs), so steps whose positions all lie there run the core's
decoder stack like Llama's; steps that reach past it run the Python layers,
which scale.

Matches HF transformers' ``Ministral3ForCausalLM`` and the text tower of
``Mistral3ForConditionalGeneration`` (tests/model/test_ministral3.py).
"""

from __future__ import annotations

import torch

from paternoster.model.attention import AttentionMetadata, AttentionOps
from paternoster.model.llama import KVCache, LlamaAttention, LlamaForCausalLM, Rope
from paternoster.model.rope import rope_parameters


def llama4_scaling(config) -> tuple[float, int] | None:
    """``(beta, L)`` of the config's attention temperature, or None when it
    has none (``llama_4_scaling_beta`` absent or 0).

    Raises:
        ValueError: a beta without a positive ``original_max_position_embeddings``.
    """
    params = rope_parameters(config)
    beta = params.get("llama_4_scaling_beta")
    if not beta:
        return None
    original = params.get("original_max_position_embeddings")
    if not original or int(original) <= 0:
        raise ValueError("rope_parameters has llama_4_scaling_beta but no positive "
                         "original_max_position_embeddings")
    return float(beta), int(original)


class Ministral3Attention(LlamaAttention):
    """:class:`~paternoster.model.llama.LlamaAttention` whose queries are
    scaled after RoPE (see the module docstring).

    Attributes:
        temperature: ``(beta, L)``, or None for no scaling.
    """

    def __init__(self, config, dtype: torch.dtype, ops: AttentionOps, qkv_bias: bool,
                 o_bias: bool, invariant: bool = False) -> None:
        super().__init__(config, dtype, ops, qkv_bias, o_bias, invariant)
        self.temperature = llama4_scaling(config)

    def rotate(self, rope: Rope, q: torch.Tensor,
               k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """RoPE, then q ``[T, Hq, D]`` times each token's factor, rounded to
        the model dtype first (as HF)."""
        q, k = super().rotate(rope, q, k)
        if self.temperature is None:
            return q, k
        beta, original = self.temperature
        factor = 1 + beta * torch.log(1 + torch.floor(rope.positions / original))
        return q * factor.to(q.dtype)[:, None, None], k


class Ministral3ForCausalLM(LlamaForCausalLM):
    """Ministral 3 text models (see the module docstring).

    Raises:
        ValueError: see :func:`llama4_scaling`, or what
            :class:`~paternoster.model.llama.LlamaForCausalLM` raises.
    """

    attention_cls = Ministral3Attention

    def __init__(self, config, dtype: torch.dtype, ops: AttentionOps,
                 max_positions: int | None = None, batch_invariant: bool = False) -> None:
        super().__init__(config, dtype, ops, max_positions, batch_invariant)
        self.temperature = self.layers[0].self_attn.temperature if self.layers else None
        self._scaled_step = False

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                attn: AttentionMetadata, kv_caches: list[KVCache]) -> torch.Tensor:
        """As the Llama model's forward; a CPU step with a position at or past
        ``L`` runs the Python layers (the core's stack does not scale q)."""
        self._scaled_step = (self.temperature is not None and positions.device.type == "cpu"
                             and positions.numel() > 0
                             and int(positions.max()) >= self.temperature[1])
        return super().forward(input_ids, positions, attn, kv_caches)

    def _decoder_stack(self, num_tokens: int, kv_caches: list[KVCache]):
        """The Llama model's, but None for a step that scales q."""
        if self._scaled_step:
            return None
        return super()._decoder_stack(num_tokens, kv_caches)
