"""The one paged-attention reference of the test suite, written from the
definition (PagedAttention, Kwon et al., SOSP'23) and independent of the code
under test: float64 torch, a loop over sequences, K/V gathered through the
block table, a causal mask, a plain softmax.

Query row i of sequence b (``q_len = query_start_loc[b+1] - query_start_loc[b]``)
sits at position ``seq_lens[b] - q_len + i`` and attends to positions
``0 ..`` that position (with a sliding window W > 0, to the positions
``p - W < k <= p``: HF transformers' sliding-window causal mask); query head h
reads kv head ``h // (Hq // Hkv)``. Attention sinks (gpt-oss) follow HF
transformers' ``gpt_oss`` eager attention: the head's sink logit is one more
column of the logits, softmaxed with them, then dropped.
:class:`ReferenceAttentionOps` wraps it in the model's attention-ops interface
(:class:`paternoster.model.attention.AttentionOps`).
"""

from __future__ import annotations

import torch


def paged_attention_reference(query: torch.Tensor, key_cache: torch.Tensor,
                              value_cache: torch.Tensor, block_tables: torch.Tensor,
                              seq_lens: torch.Tensor, query_start_loc: torch.Tensor,
                              scale: float, sliding_window: int = 0,
                              sinks: torch.Tensor | None = None) -> torch.Tensor:
    """Causal attention over a paged KV cache in float64.

    Args:
        query: ``[T, Hq, D]``. key_cache, value_cache: ``[num_blocks,
            block_size, Hkv, D]``. block_tables: ``[B, M]`` block ids.
        seq_lens: ``[B]`` context lengths including the new tokens.
        query_start_loc: ``[B + 1]`` row offsets. scale: softmax scale.
        sliding_window: W > 0: each query sees its last W positions; 0: all.
            Only the table entries of positions some query sees are read.
        sinks: optional ``[Hq]`` sink logits (unscaled), one per query head.
    Returns:
        float64 ``[T, Hq, D]`` on ``query``'s device; rows of no sequence are 0.
    """
    q = query.double()
    num_heads = q.shape[1]
    block_size, num_kv_heads = key_cache.shape[1], key_cache.shape[2]
    group = num_heads // num_kv_heads
    out = torch.zeros_like(q)
    tables = block_tables.long()
    for b in range(seq_lens.shape[0]):
        start, end = int(query_start_loc[b]), int(query_start_loc[b + 1])
        seq_len, q_len = int(seq_lens[b]), end - start
        if q_len == 0:
            continue
        first = max(0, seq_len - q_len - sliding_window + 1) if sliding_window else 0
        pos = torch.arange(first, seq_len, device=q.device)
        blocks, offsets = tables[b][pos // block_size], pos % block_size
        k = key_cache[blocks, offsets].double().repeat_interleave(group, dim=1)  # [L, Hq, D]
        v = value_cache[blocks, offsets].double().repeat_interleave(group, dim=1)
        scores = torch.einsum("qhd,khd->hqk", q[start:end], k) * scale
        q_pos = torch.arange(seq_len - q_len, seq_len, device=q.device).unsqueeze(1)
        scores.masked_fill_(pos.unsqueeze(0) > q_pos, float("-inf"))
        if sliding_window:
            scores.masked_fill_(pos.unsqueeze(0) <= q_pos - sliding_window, float("-inf"))
        if sinks is None:
            probs = scores.softmax(-1)
        else:  # [Hq, q_len, L + 1] with the sink last, then the sink dropped
            sink = sinks.double().to(q.device).view(-1, 1, 1).expand(-1, q_len, 1)
            probs = torch.cat([scores, sink], -1).softmax(-1)[..., :-1]
        out[start:end] = torch.einsum("hqk,khd->qhd", probs, v)
    return out


def reshape_and_cache_reference(key: torch.Tensor, value: torch.Tensor,
                                key_cache: torch.Tensor, value_cache: torch.Tensor,
                                slot_mapping: torch.Tensor) -> None:
    """Store ``key``/``value`` ``[T, Hkv, D]`` at the flat slots ``slot_mapping``
    (``block * block_size + offset``; negative: skipped) of the caches."""
    keep = slot_mapping >= 0
    slots = slot_mapping[keep]
    key_cache.view(-1, *key_cache.shape[2:])[slots] = key[keep]
    value_cache.view(-1, *value_cache.shape[2:])[slots] = value[keep]


class ReferenceAttentionOps:
    """The reference as the model's attention ops (``reshape_and_cache``,
    ``paged_attention``); outputs are rounded to the query's dtype. The CUDA
    path's keyword arguments are accepted and ignored."""

    @staticmethod
    def reshape_and_cache(key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor,
                          value_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
        """See :func:`reshape_and_cache_reference`."""
        reshape_and_cache_reference(key, value, key_cache, value_cache, slot_mapping)

    @staticmethod
    def paged_attention(query: torch.Tensor, key_cache: torch.Tensor,
                        value_cache: torch.Tensor, block_tables: torch.Tensor,
                        seq_lens: torch.Tensor, query_start_loc: torch.Tensor, scale: float,
                        out: torch.Tensor | None = None, *, sliding_window: int = 0,
                        sinks: torch.Tensor | None = None, **hints) -> torch.Tensor:
        """See :func:`paged_attention_reference`; writes the rows of the
        sequences into ``out`` (new if not given) in the query's dtype."""
        ref = paged_attention_reference(query, key_cache, value_cache, block_tables, seq_lens,
                                        query_start_loc, scale, sliding_window, sinks)
        if out is None:
            out = torch.zeros_like(query)
        first, last = int(query_start_loc[0]), int(query_start_loc[-1])
        out[first:last] = ref[first:last].to(out.dtype)
        return out
