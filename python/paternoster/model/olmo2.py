"""OLMo 2 and OLMo 3 (Team OLMo 2025, "2 OLMo 2 Furious"; AI2's OLMo 3
release, 7B and 32B): the Llama block with the norms moved after each
sub-block (``h = x + norm(attn(x)); out = h + norm(mlp(h))``, no norm before
them), an RMSNorm over the whole q and the whole k projection (weights
``[Hq * D]`` and ``[Hkv * D]``, not per head) before RoPE, and RMSNorms that
apply their weight in float32 before casting back. OLMo 3 adds sliding-window
attention in three layers of four (``layer_types``), with RoPE per layer type
(the full layers' may be YaRN-scaled).

Matches HF transformers' ``Olmo2ForCausalLM`` and ``Olmo3ForCausalLM``
(tests/model/test_post_norm_models.py). Every step runs the Python layers (the
core's decoder stack is pre-norm).
"""

from __future__ import annotations

import torch
from torch import nn

from paternoster.model.attention import AttentionMetadata, AttentionOps
from paternoster.model.gemma3 import GemmaRMSNorm
from paternoster.model.layer_types import TypedLayersForCausalLM
from paternoster.model.llama import KVCache, LlamaAttention, LlamaMLP, Rope


class OlmoRMSNorm(GemmaRMSNorm):
    """OLMo 2's RMSNorm: ``x * rsqrt(mean(x^2) + eps) * w`` in float32, cast
    back once (HF ``Olmo2RMSNorm``)."""

    offset = 0.0


class Olmo2Attention(LlamaAttention):
    """:class:`~paternoster.model.llama.LlamaAttention` with OLMo 2's q/k
    norms over the whole projections.

    Attributes:
        q_norm: :class:`OlmoRMSNorm` over ``Hq * D``. k_norm: over ``Hkv * D``.
    """

    def __init__(self, config, dtype: torch.dtype, ops: AttentionOps, qkv_bias: bool,
                 o_bias: bool, invariant: bool = False) -> None:
        super().__init__(config, dtype, ops, qkv_bias, o_bias, invariant)
        self.q_norm = OlmoRMSNorm(self.q_size, config.rms_norm_eps, dtype)
        self.k_norm = OlmoRMSNorm(self.kv_size, config.rms_norm_eps, dtype)

    def norm_qk(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """q ``[T, Hq, D]``, k ``[T, Hkv, D]`` (views into the qkv projection)
        -> new tensors of the same shapes, each token's whole q and whole k
        normalized."""
        t = q.shape[0]
        q = self.q_norm(q.reshape(t, self.q_size)).view(t, self.num_heads, self.head_dim)
        k = self.k_norm(k.reshape(t, self.kv_size)).view(t, self.num_kv_heads, self.head_dim)
        return q, k


class PostNormDecoderLayer(nn.Module):
    """``h = x + post_attn_norm(attn(x)); out = h + post_ff_norm(mlp(h))``
    (OLMo 2, EXAONE 4): no norm before either sub-block.

    Args:
        attention_cls: the attention module's class. norm_cls: the two norms'.
    """

    def __init__(self, config, dtype: torch.dtype, ops: AttentionOps, qkv_bias: bool,
                 o_bias: bool, invariant: bool, attention_cls: type[LlamaAttention],
                 norm_cls: type[nn.Module]) -> None:
        super().__init__()
        h, eps = config.hidden_size, config.rms_norm_eps
        self.self_attn = attention_cls(config, dtype, ops, qkv_bias, o_bias, invariant)
        self.post_attention_layernorm = norm_cls(h, eps, dtype)
        self.mlp = LlamaMLP(config, dtype, invariant)
        self.post_feedforward_layernorm = norm_cls(h, eps, dtype)

    def forward(self, rope: Rope, x: torch.Tensor, kv_cache: KVCache,
                attn: AttentionMetadata) -> torch.Tensor:
        """x: [T, H], the block's input -> new [T, H]; writes this step's
        K/V into ``kv_cache``. ``rope``: the layer type's table."""
        h = x + self.post_attention_layernorm(self.self_attn(rope, x, kv_cache, attn))
        return h + self.post_feedforward_layernorm(self.mlp(h))


class Olmo2ForCausalLM(TypedLayersForCausalLM):
    """OLMo 2 (1B-32B) and, with its sliding layers, OLMo 3 (see the module
    docstring).

    Raises:
        ValueError: what :class:`~paternoster.model.layer_types.TypedLayersForCausalLM`
            raises.
    """

    attention_cls = Olmo2Attention
    norm_cls = OlmoRMSNorm

    def make_layer(self, config, dtype: torch.dtype, ops: AttentionOps, index: int,
                   qkv_bias: bool, o_bias: bool, invariant: bool) -> nn.Module:
        """The post-norm block."""
        return PostNormDecoderLayer(config, dtype, ops, qkv_bias, o_bias, invariant,
                                    self.attention_cls, self.norm_cls)


class Olmo3ForCausalLM(Olmo2ForCausalLM):
    """OLMo 3 (7B, 32B): OLMo 2 with sliding-window layers; configs without
    ``layer_types`` make every fourth layer full (as transformers does)."""

    default_pattern = 4
