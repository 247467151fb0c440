"""Gemma 3 text models (Gemma Team 2025, "Gemma 3 Technical Report";
``Gemma3ForCausalLM``, model_type ``gemma3_text``: gemma-3-1b and the text
towers of the 4B-27B checkpoints saved as causal LMs).

The Llama block reshaped: four RMSNorms per layer (before and after both
attention and the MLP, the "after" ones on the sub-block's output before the
residual add), Gemma's RMSNorm scaling by ``1 + w``, per-head q/k norms
before RoPE (as Qwen3), a softmax scale of ``query_pre_attn_scalar ** -0.5``,
a GeGLU MLP (tanh-approximated GELU), embeddings multiplied by
``sqrt(hidden_size)`` and optional tanh soft-capping of the final logits.
Layers alternate between sliding-window attention with local RoPE
(``rope_local_base_freq``, no scaling) and full attention with global RoPE
(``rope_theta`` with ``rope_scaling``), as ``layer_types`` (or
``sliding_window_pattern``) says.

Matches HF transformers' ``Gemma3ForCausalLM`` (tests/model/test_gemma3.py;
past the window: tests/model/test_sliding_window.py). Each layer's window
comes from the config as for every architecture
(:func:`~paternoster.model.kv_layout.layer_windows`); the sliding layers form
their own KV cache groups, which release the blocks that fall out of the
window. Attention-logit soft-capping
(``attn_logit_softcapping``, Gemma 2) and bidirectional attention
(EmbeddingGemma) are refused: our kernels have neither. Every step runs the
Python layers (the core's decoder stack is Llama-shaped).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from paternoster import kernels
from paternoster.model.attention import AttentionMetadata, AttentionOps
from paternoster.model.layer_types import SLIDING, TypedLayersForCausalLM
from paternoster.model.llama import KVCache, LlamaAttention, Rope, _param
from paternoster.model.rope import rope_parameters


class GemmaRMSNorm(nn.Module):
    """Gemma's RMSNorm: ``x * rsqrt(mean(x^2) + eps) * (offset + w)``, all in
    float32 and cast back once at the end (HF ``Gemma3RMSNorm``'s order; Llama's
    casts before the weight). Gemma's checkpoints store ``w`` initialised to
    0, with ``offset`` 1; OLMo 2's norm is the same with ``offset`` 0
    (:class:`~paternoster.model.olmo2.OlmoRMSNorm`).

    Args:
        size: the normalized (last) dimension. eps: added to the mean square.
    """

    offset = 1.0

    def __init__(self, size: int, eps: float, dtype: torch.dtype) -> None:
        super().__init__()
        self.weight = _param(size, dtype=dtype)
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x ``[..., size]`` -> new tensor of the same shape and dtype."""
        y = x.float()
        y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * (self.offset + self.weight.float())).to(x.dtype)


class Gemma3Attention(LlamaAttention):
    """:class:`~paternoster.model.llama.LlamaAttention` with Gemma's per-head
    q/k norms and the ``query_pre_attn_scalar`` softmax scale (its window is
    set by the model, as for every architecture).

    Attributes:
        q_norm, k_norm: :class:`GemmaRMSNorm` over ``head_dim``.
    """

    def __init__(self, config, dtype: torch.dtype, ops: AttentionOps, qkv_bias: bool,
                 o_bias: bool, invariant: bool = False) -> None:
        super().__init__(config, dtype, ops, qkv_bias, o_bias, invariant)
        self.scale = float(config.query_pre_attn_scalar) ** -0.5
        self.q_norm = GemmaRMSNorm(self.head_dim, config.rms_norm_eps, dtype)
        self.k_norm = GemmaRMSNorm(self.head_dim, config.rms_norm_eps, dtype)

    def norm_qk(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """q ``[T, Hq, D]``, k ``[T, Hkv, D]`` (views into the qkv projection)
        -> new, contiguous, normalized tensors of the same shapes."""
        return self.q_norm(q), self.k_norm(k)


class Gemma3MLP(nn.Module):
    """GeGLU feed-forward (Shazeer 2020): ``down(gelu_tanh(gate(x)) * up(x))``
    with gate and up fused into ``gate_up_weight`` [2 I, H] (gate rows first),
    the parameter layout of :class:`~paternoster.model.llama.LlamaMLP` (so the
    weights load alike) without being one: the core's decoder stack has
    SwiGLU only."""

    def __init__(self, config, dtype: torch.dtype, invariant: bool = False) -> None:
        super().__init__()
        self.invariant = invariant
        hidden, inter = config.hidden_size, config.intermediate_size
        self.inter = inter
        self.gate_up_weight = _param(2 * inter, hidden, dtype=dtype)
        self.gate_up_bias = None
        self.down_weight = _param(hidden, inter, dtype=dtype)
        self.down_bias = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [T, H] -> [T, H] (the activation and product rounded to the
        model dtype one after the other, as in HF)."""
        gate, up = kernels.linear(x, self.gate_up_weight, invariant=self.invariant).split(
            self.inter, dim=-1)
        return kernels.linear(F.gelu(gate, approximate="tanh") * up, self.down_weight,
                              invariant=self.invariant)


class Gemma3DecoderLayer(nn.Module):
    """``h = x + post_attn_norm(attn(input_norm(x)));
    out = h + post_ff_norm(mlp(pre_ff_norm(h)))``.

    Args:
        qkv_bias, o_bias: the attention projections have biases.
    """

    def __init__(self, config, dtype: torch.dtype, ops: AttentionOps, qkv_bias: bool,
                 o_bias: bool, invariant: bool = False) -> None:
        super().__init__()
        h, eps = config.hidden_size, config.rms_norm_eps
        self.input_layernorm = GemmaRMSNorm(h, eps, dtype)
        self.self_attn = Gemma3Attention(config, dtype, ops, qkv_bias, o_bias, invariant)
        self.post_attention_layernorm = GemmaRMSNorm(h, eps, dtype)
        self.pre_feedforward_layernorm = GemmaRMSNorm(h, eps, dtype)
        self.mlp = Gemma3MLP(config, dtype, invariant)
        self.post_feedforward_layernorm = GemmaRMSNorm(h, eps, dtype)

    def forward(self, rope: Rope, x: torch.Tensor, kv_cache: KVCache,
                attn: AttentionMetadata) -> torch.Tensor:
        """x: [T, H], the block's input -> new [T, H]; writes this step's
        K/V into ``kv_cache``. ``rope``: the layer type's (local or global)."""
        a = self.self_attn(rope, self.input_layernorm(x), kv_cache, attn)
        h = x + self.post_attention_layernorm(a)
        return h + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(h)))


def local_rope_parameters(config) -> dict:
    """RoPE of the sliding layers: transformers 5's ``rope_parameters
    ["sliding_attention"]``, else (4.x configs) ``rope_local_base_freq``
    without scaling."""
    per_type = getattr(config, "rope_parameters", None)
    if isinstance(per_type, dict) and isinstance(per_type.get(SLIDING), dict):
        return rope_parameters(config, SLIDING)
    return {"rope_type": "default",
            "rope_theta": float(getattr(config, "rope_local_base_freq", 10000.0))}


class Gemma3ForCausalLM(TypedLayersForCausalLM):
    """Gemma 3 text models (see the module docstring).

    Attributes:
        layer_types, local_rotary: as
            :class:`~paternoster.model.layer_types.TypedLayersForCausalLM`.
        embed_scale: ``sqrt(hidden_size)`` rounded to the model dtype (as HF).
        final_logit_softcapping: the cap ``c`` of ``c * tanh(logits / c)``, or None.
    Raises:
        ValueError: ``attn_logit_softcapping`` or ``use_bidirectional_attention``
            set, a ``hidden_activation`` other than ``gelu_pytorch_tanh``, bad
            ``layer_types``, or what
            :class:`~paternoster.model.layer_types.TypedLayersForCausalLM` raises.
    """

    norm_cls = GemmaRMSNorm
    #: Older configs: every sixth layer full.
    default_pattern = 6

    def __init__(self, config, dtype: torch.dtype, ops: AttentionOps,
                 max_positions: int | None = None, batch_invariant: bool = False) -> None:
        if getattr(config, "attn_logit_softcapping", None) is not None:
            raise ValueError(f"attn_logit_softcapping={config.attn_logit_softcapping} is not "
                             f"supported (the attention kernels have no logit soft-capping)")
        if getattr(config, "use_bidirectional_attention", False):
            raise ValueError("use_bidirectional_attention=True is not supported "
                             "(the attention kernels are causal)")
        act = getattr(config, "hidden_activation", None) or "gelu_pytorch_tanh"
        if act != "gelu_pytorch_tanh":
            raise ValueError(f"hidden_activation must be 'gelu_pytorch_tanh', got {act!r}")
        super().__init__(config, dtype, ops, max_positions, batch_invariant)
        self.embed_scale = torch.tensor(config.hidden_size**0.5).to(dtype).item()
        self.final_logit_softcapping = getattr(config, "final_logit_softcapping", None)

    def make_layer(self, config, dtype: torch.dtype, ops: AttentionOps, index: int,
                   qkv_bias: bool, o_bias: bool, invariant: bool) -> nn.Module:
        """Gemma's four-norm block."""
        return Gemma3DecoderLayer(config, dtype, ops, qkv_bias, o_bias, invariant)

    def local_rope_parameters(self, config) -> dict:
        """The sliding layers' RoPE (:func:`local_rope_parameters`)."""
        return local_rope_parameters(config)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [N, H] -> float32 logits [N, V] (as the Llama model's),
        soft-capped to ``(-c, c)`` when ``final_logit_softcapping`` is ``c``."""
        logits = super().compute_logits(hidden)
        cap = self.final_logit_softcapping
        if cap is None:
            return logits
        return torch.tanh(logits / cap) * cap
