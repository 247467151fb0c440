"""Models whose layers come in two attention types, sliding-window and full,
each with its own RoPE table (Gemma 3, OLMo 3, EXAONE 4): the config's
``layer_types`` and a causal-LM base whose forward gives each layer the rope
of its type.

Their layers are self-contained blocks (``layer(rope, x, kv_cache, attn) ->
x``, each with its own residual adds), not the Llama block with the residual
stream carried outside; every step runs these Python layers, since the core's
decoder stack is Llama-shaped.
"""

from __future__ import annotations

import torch

from paternoster.model.attention import AttentionMetadata, AttentionOps
from paternoster.model.llama import KVCache, LlamaForCausalLM, Rope, embed
from paternoster.model.rope import RotaryEmbedding, rope_parameters

SLIDING, FULL = "sliding_attention", "full_attention"


def layer_types(config, default_pattern: int | None) -> list[str]:
    """Each layer's attention, ``"sliding_attention"`` or ``"full_attention"``:
    ``config.layer_types``; else, with a ``sliding_window``, every
    ``sliding_window_pattern``-th layer full (older configs; ``default_pattern``
    when the config has none, or all full when that is None too); else all full.

    Raises:
        ValueError: not one known type per layer, or sliding layers without
            a ``sliding_window``.
    """
    n = config.num_hidden_layers
    types = getattr(config, "layer_types", None)
    if types is None:
        pattern = getattr(config, "sliding_window_pattern", None) or default_pattern
        if not getattr(config, "sliding_window", None) or not pattern:
            types = [FULL] * n
        else:
            types = [FULL if (i + 1) % int(pattern) == 0 else SLIDING for i in range(n)]
    types = list(types)
    if len(types) != n or any(t not in (SLIDING, FULL) for t in types):
        raise ValueError(f"layer_types must name {SLIDING!r} or {FULL!r} for each of the "
                         f"{n} layers, got {types}")
    if SLIDING in types and not getattr(config, "sliding_window", None):
        raise ValueError("layer_types has sliding_attention layers but sliding_window is not set")
    return types


class TypedLayersForCausalLM(LlamaForCausalLM):
    """A causal LM of self-contained layers, each rotating with its type's
    RoPE table (see the module docstring).

    Attributes:
        layer_types: each layer's attention (:func:`layer_types`).
        local_rotary: the sliding layers' RoPE table (``rotary`` is the
            full-attention layers').
        embed_scale: the factor the embeddings are multiplied by, or None.
    Raises:
        ValueError: bad ``layer_types`` (see :func:`layer_types`), or what
            :class:`~paternoster.model.llama.LlamaForCausalLM` raises.
    """

    fused_steps = False
    #: The layer-type pattern of configs with a ``sliding_window`` but
    #: neither ``layer_types`` nor ``sliding_window_pattern``.
    default_pattern: int | None = None
    embed_scale: float | None = None

    def __init__(self, config, dtype: torch.dtype, ops: AttentionOps,
                 max_positions: int | None = None, batch_invariant: bool = False) -> None:
        types = layer_types(config, self.default_pattern)
        super().__init__(config, dtype, ops, max_positions, batch_invariant)
        self.layer_types = types
        self.local_rotary = RotaryEmbedding(self.rotary.head_dim, self.rotary.cos.shape[0],
                                            self.local_rope_parameters(config), dtype)

    def local_rope_parameters(self, config) -> dict:
        """RoPE of the sliding layers: transformers 5's ``rope_parameters
        ["sliding_attention"]`` where the config keeps one dict per layer
        type, else the same as the full layers'."""
        return rope_parameters(config, SLIDING)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                attn: AttentionMetadata, kv_caches: list[KVCache]) -> torch.Tensor:
        """As the Llama model's forward: int64[T] ids and positions -> [T, H]
        final hidden states (model dtype); each layer rotates with its type's
        table."""
        x = embed(input_ids, self.embed_tokens, self.dtype)
        if self.embed_scale is not None:
            x = x * self.embed_scale
        ropes = {SLIDING: Rope(self.local_rotary, positions), FULL: Rope(self.rotary, positions)}
        for layer, kind, kv_cache in zip(self.layers, self.layer_types, kv_caches, strict=True):
            x = layer(ropes[kind], x, kv_cache, attn)
        return self.norm(x)
