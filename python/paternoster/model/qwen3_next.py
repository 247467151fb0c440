"""Hybrid linear-attention models: Qwen3-Next (Qwen Team 2025, Qwen3-Next-80B-A3B)
and Qwen3.5 dense and MoE (``Qwen3_5ForCausalLM``, ``Qwen3_5MoeForCausalLM``;
the text towers of the released ``Qwen3_5(Moe)ForConditionalGeneration``
checkpoints).

Three layers in four (``layer_types`` ``"linear_attention"``) mix tokens with
Gated DeltaNet (:class:`~paternoster.model.gated_deltanet.GatedDeltaNet`), a
fixed-size state per request; the others are full attention with an output
gate: ``q_proj`` yields each head's query and a gate, the attention output is
multiplied by ``sigmoid(gate)`` before ``o_proj``. The attention has per-head
q/k RMSNorms and rotates only the first ``partial_rotary_factor`` of each head
(a quarter). Every RMSNorm scales by ``1 + w`` (Gemma's form). The
feed-forward block is a SwiGLU MLP (Qwen3.5 dense) or routed experts plus a
shared expert gated by ``sigmoid(shared_expert_gate(x))`` (Qwen3-Next,
Qwen3.5-MoE).

KV memory: the attention layers form the usual paged KV cache groups, the
linear layers one recurrent-state group (one state slot per running request;
:mod:`paternoster.model.kv_layout`). Prefix caching is off for these models
(states are not saved at block boundaries). Matches HF transformers' classes
(tests/model/test_qwen3_next.py). CPU steps run the Python layers; no
multi-token prediction (the checkpoints' ``mtp.*`` weights are ignored).
"""

from __future__ import annotations

import torch
from torch import nn

from paternoster import kernels
from paternoster.model.attention import AttentionMetadata, AttentionOps
from paternoster.model.gated_deltanet import GatedDeltaNet
from paternoster.model.gemma3 import GemmaRMSNorm
from paternoster.model.hybrid_model import HybridCausalLM
from paternoster.model.kv_layout import kv_cache_layout
from paternoster.model.llama import KVCache, LlamaAttention, LlamaMLP, embed
from paternoster.model.moe import SparseMoeBlock
from paternoster.model.rope import RotaryEmbedding, rope_parameters
from paternoster.model.rowwise import rowwise

LINEAR, FULL = "linear_attention", "full_attention"


class PartialRope:
    """RoPE on the first ``rotary_dim`` of each head only (the rest passes
    through), GPT-NeoX halves within that part, in the model dtype as HF's
    ``apply_rotary_pos_emb`` (``x * cos + rotate_half(x) * sin``).

    Args:
        rotary: the table for ``rotary_dim``. positions: int64[T].
    """

    def __init__(self, rotary: RotaryEmbedding, positions: torch.Tensor) -> None:
        self.cos = rotary.cos[positions][:, None, :]  # [T, 1, rd / 2]
        self.sin = rotary.sin[positions][:, None, :]
        self.half = rotary.head_dim // 2

    def __call__(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """q ``[T, Hq, D]``, k ``[T, Hkv, D]`` (contiguous) -> the same
        tensors, their first ``rotary_dim`` columns rotated in place."""
        for x in (q, k):
            x1, x2 = x[..., : self.half], x[..., self.half : 2 * self.half]
            r1 = x1 * self.cos - x2 * self.sin
            r2 = x2 * self.cos + x1 * self.sin
            x1.copy_(r1)
            x2.copy_(r2)
        return q, k


class GatedAttention(LlamaAttention):
    """Full attention with an output gate and ``1 + w`` q/k norms.

    ``qkv_weight`` is ``[2 Hq D + 2 Hkv D, H]``: HF's ``q_proj`` rows (per
    head, D query rows then D gate rows), then k, then v.
    """

    def __init__(self, config, dtype: torch.dtype, ops: AttentionOps,
                 invariant: bool = False) -> None:
        bias = bool(getattr(config, "attention_bias", False))
        super().__init__(config, dtype, ops, bias, bias, invariant)
        rows = 2 * self.q_size + 2 * self.kv_size
        self.qkv_weight = nn.Parameter(torch.empty(rows, config.hidden_size, dtype=dtype),
                                       requires_grad=False)
        self.qkv_bias = (nn.Parameter(torch.empty(rows, dtype=dtype), requires_grad=False)
                         if bias else None)
        self.q_norm = GemmaRMSNorm(self.head_dim, config.rms_norm_eps, dtype)
        self.k_norm = GemmaRMSNorm(self.head_dim, config.rms_norm_eps, dtype)

    def forward(self, rope: PartialRope, x: torch.Tensor, kv_cache: KVCache,
                attn: AttentionMetadata) -> torch.Tensor:
        """x ``[T, H]`` -> ``[T, H]``; writes this step's K/V into ``kv_cache``."""
        T, D = x.shape[0], self.head_dim
        qkv = kernels.linear(x, self.qkv_weight, self.qkv_bias, invariant=self.invariant)
        qg, k, v = qkv.split([2 * self.q_size, self.kv_size, self.kv_size], dim=-1)
        qg = qg.view(T, self.num_heads, 2 * D)
        gate = qg[..., D:].reshape(T, self.q_size)
        q = self.q_norm(qg[..., :D])
        k = self.k_norm(k.view(T, self.num_kv_heads, D))
        q, k = rope(q, k)
        out = self.attend(q, k, v.reshape(T, self.num_kv_heads, D), kv_cache, attn)
        out = out.reshape(T, self.q_size) * rowwise(torch.sigmoid, gate, self.invariant)
        return kernels.linear(out, self.o_weight, self.o_bias, invariant=self.invariant)


class SharedExpertMoe(nn.Module):
    """Routed experts plus one always-on shared expert scaled by
    ``sigmoid(x @ shared_expert_gate^T)`` (Qwen2-MoE's design, kept by
    Qwen3-Next and Qwen3.5-MoE)."""

    def __init__(self, config, dtype: torch.dtype, invariant: bool, norm_topk_prob: bool) -> None:
        super().__init__()
        self.experts = SparseMoeBlock(config.hidden_size, config.moe_intermediate_size,
                                      config.num_experts, config.num_experts_per_tok,
                                      norm_topk_prob, dtype, invariant)
        shared = _with(config, intermediate_size=config.shared_expert_intermediate_size)
        self.shared_expert = LlamaMLP(shared, dtype, invariant)
        self.shared_gate_weight = nn.Parameter(torch.empty(1, config.hidden_size, dtype=dtype),
                                               requires_grad=False)
        self.invariant = invariant

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x ``[T, H]`` -> ``[T, H]``."""
        gate = rowwise(torch.sigmoid,
                       kernels.linear(x, self.shared_gate_weight, invariant=self.invariant),
                       self.invariant)
        return self.experts(x) + gate * self.shared_expert(x)


class HybridDecoderLayer(nn.Module):
    """Pre-norm block ``h = x + mixer(norm(x)); out = h + mlp(norm(h))`` whose
    token mixer is Gated DeltaNet (``linear_attn``) or gated full attention
    (``self_attn``)."""

    def __init__(self, config, kind: str, mlp: nn.Module, dtype: torch.dtype,
                 ops: AttentionOps, invariant: bool) -> None:
        super().__init__()
        h, eps = config.hidden_size, config.rms_norm_eps
        self.kind = kind
        self.input_layernorm = GemmaRMSNorm(h, eps, dtype)
        if kind == LINEAR:
            self.linear_attn = GatedDeltaNet(config, dtype, invariant)
        else:
            self.self_attn = GatedAttention(config, dtype, ops, invariant)
        self.post_attention_layernorm = GemmaRMSNorm(h, eps, dtype)
        self.mlp = mlp

    def forward(self, rope: PartialRope, x: torch.Tensor, cache: KVCache,
                attn: AttentionMetadata) -> torch.Tensor:
        """x ``[T, H]`` -> new ``[T, H]``; ``cache`` is the layer's KV cache
        or, for a linear layer, its ``(conv_state, ssm_state)``."""
        y = self.input_layernorm(x)
        if self.kind == LINEAR:
            y = self.linear_attn(y, cache, attn)
        else:
            y = self.self_attn(rope, y, cache, attn)
        h = x + y
        return h + self.mlp(self.post_attention_layernorm(h))


class Qwen3NextForCausalLM(HybridCausalLM):
    """Qwen3-Next / Qwen3.5 over a flattened batch (see the module docstring).

    Args and attributes as :class:`~paternoster.model.llama.LlamaForCausalLM`;
    ``kv_caches`` entries of linear layers are their state tensors.
    Raises:
        ValueError: ``layer_types`` naming anything but linear and full
            attention, or what the layers raise.
    """

    #: Every layer's feed-forward block is routed experts (Qwen3.5-MoE), or
    #: only those the config's ``decoder_sparse_step`` picks (Qwen3-Next).
    moe_every_layer = False
    #: Renormalize the top-k routing weights (Qwen3-Next reads the config).
    always_norm_topk = False

    def __init__(self, config, dtype: torch.dtype, ops: AttentionOps,
                 max_positions: int | None = None, batch_invariant: bool = False) -> None:
        super().__init__()
        self.config, self.dtype, self.batch_invariant = config, dtype, batch_invariant
        self.layer_types = hybrid_layer_types(config)
        params = rope_parameters(_with(config, rope_parameters=_full_rope(config)))
        head_dim = (getattr(config, "head_dim", None)
                    or config.hidden_size // config.num_attention_heads)
        rotary_dim = int(head_dim * _partial_factor(config))
        self.rotary = RotaryEmbedding(rotary_dim, max_positions or config.max_position_embeddings,
                                      params, dtype)
        self.embed_tokens = nn.Parameter(torch.empty(config.vocab_size, config.hidden_size,
                                                     dtype=dtype), requires_grad=False)
        self.layers = nn.ModuleList(
            HybridDecoderLayer(config, kind, self._make_mlp(config, dtype, i, batch_invariant),
                               dtype, ops, batch_invariant)
            for i, kind in enumerate(self.layer_types))
        self.norm = GemmaRMSNorm(config.hidden_size, config.rms_norm_eps, dtype)
        self.lm_head = self.embed_tokens
        self.set_kv_cache_layout(kv_cache_layout(config))

    def _make_mlp(self, config, dtype: torch.dtype, index: int, invariant: bool) -> nn.Module:
        experts = int(getattr(config, "num_experts", 0) or 0)
        step = int(getattr(config, "decoder_sparse_step", 1) or 1)
        dense_layers = set(getattr(config, "mlp_only_layers", None) or [])
        if experts > 0 and (self.moe_every_layer
                            or (index not in dense_layers and (index + 1) % step == 0)):
            norm = self.always_norm_topk or bool(getattr(config, "norm_topk_prob", True))
            return SharedExpertMoe(config, dtype, invariant, norm)
        return LlamaMLP(config, dtype, invariant)

    def cached_mixer(self, layer: nn.Module) -> nn.Module:
        """The layer's Gated DeltaNet or attention."""
        return layer.linear_attn if layer.kind == LINEAR else layer.self_attn

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                attn: AttentionMetadata, kv_caches: list) -> torch.Tensor:
        """int64[T] ids and positions -> ``[T, H]`` final hidden states (model
        dtype); ``kv_caches[i]``: layer i's KV cache, or its state tensors."""
        x = embed(input_ids, self.embed_tokens, self.dtype)
        rope = PartialRope(self.rotary, positions)
        for layer, cache in zip(self.layers, kv_caches, strict=True):
            x = layer(rope, x, cache, attn)
        return self.norm(x)


class Qwen3_5ForCausalLM(Qwen3NextForCausalLM):  # noqa: N801 - HF's class name
    """Qwen3.5 dense: Qwen3-Next's layers with a SwiGLU MLP in every layer
    and separate q/k/v, z, b and a projections in the checkpoint."""


class Qwen3_5MoeForCausalLM(Qwen3NextForCausalLM):  # noqa: N801 - HF's class name
    """Qwen3.5-MoE: routed experts (top-k always renormalized) and a shared
    expert in every layer."""

    moe_every_layer = True
    always_norm_topk = True


def hybrid_layer_types(config) -> list[str]:
    """Each layer's token mixer: ``config.layer_types``, else every
    ``full_attention_interval``-th layer full attention (default 4).

    Raises:
        ValueError: not one of ``linear_attention`` / ``full_attention`` per layer.
    """
    n = config.num_hidden_layers
    types = getattr(config, "layer_types", None)
    if types is None:
        every = int(getattr(config, "full_attention_interval", 4) or 4)
        types = [FULL if (i + 1) % every == 0 else LINEAR for i in range(n)]
    types = list(types)
    if len(types) != n or any(t not in (LINEAR, FULL) for t in types):
        raise ValueError(f"layer_types must name {LINEAR!r} or {FULL!r} for each of the "
                         f"{n} layers, got {types}")
    return types


def _full_rope(config) -> dict:
    """The config's RoPE parameters without the partial factor (the table is
    built for the rotated part only) nor the multimodal sections (text
    positions are equal in all three, which makes M-RoPE plain RoPE)."""
    params = dict(getattr(config, "rope_parameters", None) or {})
    for key in ("partial_rotary_factor", "mrope_section", "mrope_interleaved"):
        params.pop(key, None)
    if not params:
        params = {"rope_type": "default",
                  "rope_theta": float(getattr(config, "rope_theta", 10000.0))}
    return params


def _partial_factor(config) -> float:
    params = getattr(config, "rope_parameters", None) or {}
    return float(params.get("partial_rotary_factor",
                            getattr(config, "partial_rotary_factor", 1.0)) or 1.0)


class _Overlay:
    """A config with some fields replaced (the rest read through)."""

    def __init__(self, base, **fields) -> None:
        self._base = base
        self.__dict__.update(fields)

    def __getattr__(self, name: str):
        return getattr(self._base, name)


def _with(config, **fields):
    return _Overlay(config, **fields)


__all__ = ["Qwen3NextForCausalLM", "Qwen3_5ForCausalLM", "Qwen3_5MoeForCausalLM",
           "hybrid_layer_types"]
