"""Qwen3 dense (Qwen Team 2025, "Qwen3 Technical Report"): the Llama block
with an RMSNorm over each attention head's query and key (``q_norm``,
``k_norm``, weights ``[head_dim]``) between the projection and RoPE, in place
of Qwen2's q/k/v biases; ``head_dim`` is set by the config, not derived from
the hidden size.

Matches HF transformers' ``Qwen3ForCausalLM`` (tests/model/test_qwen3.py):
norm, then rotate, then attend. Qwen3's optional sliding window
(``use_sliding_window``, off in every released checkpoint: the layers from
``max_window_layers`` on) runs through the KV cache groups
(tests/model/test_sliding_window.py).
"""

from __future__ import annotations

import torch

from paternoster.model.attention import AttentionOps
from paternoster.model.llama import LlamaAttention, LlamaForCausalLM, RMSNorm


class Qwen3Attention(LlamaAttention):
    """:class:`~paternoster.model.llama.LlamaAttention` with per-head q/k RMSNorm.

    Attributes:
        q_norm, k_norm: :class:`~paternoster.model.llama.RMSNorm` over
            ``head_dim``, applied to every head of every token.
    """

    def __init__(self, config, dtype: torch.dtype, ops: AttentionOps, qkv_bias: bool,
                 o_bias: bool, invariant: bool = False) -> None:
        super().__init__(config, dtype, ops, qkv_bias, o_bias, invariant)
        self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps, dtype)
        self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps, dtype)

    def norm_qk(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """q ``[T, Hq, D]``, k ``[T, Hkv, D]`` (views into the qkv projection)
        -> new, normalized tensors of the same shapes."""
        t, d = q.shape[0], self.head_dim
        # One head per row; contiguous (with one KV head, reshape alone would
        # keep the qkv row stride).
        q = self.q_norm(q.reshape(-1, d).contiguous()).view(t, self.num_heads, d)
        k = self.k_norm(k.reshape(-1, d).contiguous()).view(t, self.num_kv_heads, d)
        return q, k


class Qwen3ForCausalLM(LlamaForCausalLM):
    """Qwen3 dense models (Qwen3-0.6B … 32B).

    Raises:
        ValueError: what :class:`~paternoster.model.llama.LlamaForCausalLM` raises.
    """

    attention_cls = Qwen3Attention
