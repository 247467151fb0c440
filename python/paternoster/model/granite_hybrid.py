"""Granite 4.0-H (IBM 2025; HF ``GraniteMoeHybridForCausalLM``): pre-norm
blocks whose token mixer is Mamba2 (``layer_types`` ``"linear_attention"``,
:class:`~paternoster.model.mamba2.Mamba2Mixer`) or grouped-query attention
(``"full_attention"``; RoPE only with ``position_embedding_type "rope"``,
none in the released models), and whose feed-forward block is routed
SwiGLU experts (softmax over the top-k logits) plus a shared SwiGLU MLP, or
the shared MLP alone (``num_local_experts`` 0: the dense "micro" models).
Granite's scalings: the embeddings times ``embedding_multiplier``, each
sub-block's output times ``residual_multiplier`` before its residual add,
the attention scores times ``attention_multiplier`` (instead of ``D^-1/2``),
the logits divided by ``logits_scaling``.

KV memory: the attention layers form the paged KV cache group, the Mamba
layers the recurrent-state group. Prefix caching is off (states are not
saved at block boundaries); CPU steps run the Python layers. Matches HF
transformers' class (tests/model/test_granite_hybrid.py).
"""

from __future__ import annotations

import torch
from torch import nn

from paternoster.model.attention import AttentionMetadata, AttentionOps
from paternoster.model.hybrid_model import HybridCausalLM
from paternoster.model.kv_layout import kv_cache_layout
from paternoster.model.llama import LlamaAttention, LlamaMLP, RMSNorm, Rope, embed
from paternoster.model.llama_weights import _expert_target, layer_name
from paternoster.model.mamba2 import Mamba2Mixer
from paternoster.model.moe import SparseMoeBlock
from paternoster.model.nemotron_h import ATTENTION, MAMBA, _attention_table, _mamba_table
from paternoster.model.qwen3_next import _with
from paternoster.model.qwen3_next_weights import Target
from paternoster.model.rope import RotaryEmbedding, rope_parameters


class GraniteHybridLayer(nn.Module):
    """``h = x + rm * mixer(norm(x)); out = h + rm * ffn(norm(h))`` with
    ``ffn = experts + shared_mlp`` (or the shared MLP alone)."""

    def __init__(self, config, kind: str, dtype: torch.dtype, ops: AttentionOps,
                 invariant: bool) -> None:
        super().__init__()
        h, eps = config.hidden_size, config.rms_norm_eps
        self.kind = kind
        self.residual_multiplier = float(config.residual_multiplier)
        self.input_layernorm = RMSNorm(h, eps, dtype)
        self.post_attention_layernorm = RMSNorm(h, eps, dtype)
        if kind == MAMBA:
            self.mixer = Mamba2Mixer(config, dtype, invariant)
        else:
            bias = bool(getattr(config, "attention_bias", False))
            self.mixer = LlamaAttention(config, dtype, ops, bias, bias, invariant)
            self.mixer.scale = float(config.attention_multiplier)
            self.mixer.use_rope = getattr(config, "position_embedding_type", None) == "rope"
        experts = int(getattr(config, "num_local_experts", 0) or 0)
        self.experts = (SparseMoeBlock(h, config.intermediate_size, experts,
                                       config.num_experts_per_tok, True, dtype, invariant)
                        if experts else None)
        self.shared_mlp = LlamaMLP(_with(config, intermediate_size=config.shared_intermediate_size),
                                   dtype, invariant)

    def forward(self, rope: Rope | None, x: torch.Tensor, cache,
                attn: AttentionMetadata) -> torch.Tensor:
        """x ``[T, H]`` -> ``[T, H]``; ``cache``: the attention layer's KV
        cache or the Mamba layer's states."""
        y = self.input_layernorm(x)
        y = self.mixer(y, cache, attn) if self.kind == MAMBA else self.mixer(rope, y, cache, attn)
        h = x + y * self.residual_multiplier
        y = self.post_attention_layernorm(h)
        ffn = self.shared_mlp(y)
        if self.experts is not None:
            ffn = self.experts(y) + ffn
        return h + ffn * self.residual_multiplier


class GraniteMoeHybridForCausalLM(HybridCausalLM):
    """Granite 4.0-H over a flattened batch (see the module docstring).

    Args and attributes as :class:`~paternoster.model.llama.LlamaForCausalLM`;
    ``kv_caches`` entries of Mamba layers are their states.
    Raises:
        ValueError: a layer type other than Mamba and full attention, an
            activation other than silu, or what the layers raise.
    """

    torch_ops_elementwise = True

    def __init__(self, config, dtype: torch.dtype, ops: AttentionOps,
                 max_positions: int | None = None, batch_invariant: bool = False) -> None:
        super().__init__()
        types = self.layer_types_of(config)
        if getattr(config, "hidden_act", "silu") != "silu":
            raise ValueError(f"hidden_act must be 'silu', got {config.hidden_act!r}")
        self.config, self.dtype, self.batch_invariant = config, dtype, batch_invariant
        self.layer_types = types
        self.embed_tokens = nn.Parameter(torch.empty(config.vocab_size, config.hidden_size,
                                                     dtype=dtype), requires_grad=False)
        self.layers = nn.ModuleList(GraniteHybridLayer(config, kind, dtype, ops, batch_invariant)
                                    for kind in types)
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype)
        self.lm_head = self.embed_tokens
        self.rotary = None
        if getattr(config, "position_embedding_type", None) == "rope":
            head_dim = (getattr(config, "head_dim", None)
                        or config.hidden_size // config.num_attention_heads)
            self.rotary = RotaryEmbedding(head_dim, max_positions
                                          or config.max_position_embeddings,
                                          rope_parameters(config), dtype)
        self.set_kv_cache_layout(kv_cache_layout(config))

    @staticmethod
    def layer_types_of(config) -> list[str]:
        """Each layer's mixer (``layer_types``; the hub's ``mamba`` /
        ``attention`` read as transformers maps them).

        Raises:
            ValueError: a kind other than Mamba2 and full attention.
        """
        types = list(getattr(config, "layers_block_type", None) or config.layer_types)
        if any(t not in (MAMBA, ATTENTION) for t in types):
            raise ValueError(f"layer types must be {MAMBA!r} or {ATTENTION!r} "
                             f"(the hub's 'mamba' / 'attention'), got {types}")
        return types

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                attn: AttentionMetadata, kv_caches: list) -> torch.Tensor:
        """int64[T] ids and positions -> ``[T, H]`` final hidden states."""
        x = embed(input_ids, self.embed_tokens, self.dtype) * float(
            self.config.embedding_multiplier)
        rope = Rope(self.rotary, positions) if self.rotary is not None else None
        for layer, cache in zip(self.layers, kv_caches, strict=True):
            x = layer(rope, x, cache, attn)
        return self.norm(x)

    def logits_divisor(self) -> float:
        """Granite's ``logits_scaling``."""
        return float(self.config.logits_scaling)

    def _target(self, name: str) -> Target | None:
        """HF's names onto our parameters (see HybridWeights); the experts'
        stacked ``input_linear`` ``[E, 2I, H]`` and ``output_linear``
        ``[E, H, I]`` flattened to rows."""
        h = self.config.hidden_size
        if name == "model.embed_tokens.weight":
            return self, "embed_tokens", 0, self.config.vocab_size, None
        if name == "lm_head.weight":
            return self, "lm_head", 0, self.config.vocab_size, None
        if name == "model.norm.weight":
            return self.norm, "weight", 0, h, None
        found = layer_name(name, len(self.layers))
        if found is None:
            return None
        layer, rest = self.layers[found[0]], found[1]
        mlp, e = layer.shared_mlp, layer.experts
        table = {"input_layernorm.weight": (layer.input_layernorm, "weight", 0, h, None),
                 "post_attention_layernorm.weight": (layer.post_attention_layernorm, "weight",
                                                     0, h, None),
                 "shared_mlp.input_linear.weight": (mlp, "gate_up_weight", 0, 2 * mlp.inter,
                                                    None),
                 "shared_mlp.output_linear.weight": (mlp, "down_weight", 0, h, None),
                 # a GGUF file's, split by the converter
                 "shared_mlp.gate_proj.weight": (mlp, "gate_up_weight", 0, mlp.inter, None),
                 "shared_mlp.up_proj.weight": (mlp, "gate_up_weight", mlp.inter, mlp.inter,
                                               None)}
        prefix = "mamba." if layer.kind == MAMBA else "self_attn."
        mixer = (_mamba_table if layer.kind == MAMBA else _attention_table)(layer.mixer, h)
        table.update({prefix + k: v for k, v in mixer.items()})
        if e is not None:
            flat = lambda w: w.reshape(-1, w.shape[-1])  # noqa: E731
            table.update({
                "block_sparse_moe.router.layer.weight": (e, "router_weight", 0, e.num_experts,
                                                         None),
                "block_sparse_moe.input_linear.weight": (e, "gate_up_weight", 0,
                                                         e.num_experts * e.up_rows, flat),
                "block_sparse_moe.output_linear.weight": (e, "down_weight", 0,
                                                          e.num_experts * h, flat)})
        target = table.get(rest)
        if target is None and e is not None and rest.startswith("mlp.experts."):
            found = _expert_target(e, rest)  # a GGUF file's, unstacked: mlp.experts.{e}.*_proj
            target = None if found is None else (*found, None)
        if target is None or getattr(target[0], target[1]) is None:
            return None
        return target
