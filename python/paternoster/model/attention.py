"""Paged attention for one layer: write the step's K/V into the block cache, then
attend through the block tables (PagedAttention, Kwon et al., SOSP'23).

The kernels live in :mod:`paternoster.kernels`. The model receives them as an
*attention ops* object (anything with ``reshape_and_cache`` and
``paged_attention`` of the signatures below): the :mod:`paternoster.kernels`
module itself (dispatch on the tensors' device), one
:class:`~paternoster.kernels.Backend` (e.g. the CUDA emulation on CPU
tensors, :func:`paternoster.kernels.emulated_cuda_backend`), or a test's
reference.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch

from paternoster import kernels


class AttentionOps(Protocol):
    """The two paged-attention kernels (see :mod:`paternoster.kernels`)."""

    def reshape_and_cache(self, key: torch.Tensor, value: torch.Tensor,
                          key_cache: torch.Tensor, value_cache: torch.Tensor,
                          slot_mapping: torch.Tensor) -> None:
        """Store ``key``/``value`` [T, Hkv, D] at flat slots ``slot_mapping`` int64[T]
        (slot = block * block_size + offset) of caches [num_blocks, block_size, Hkv, D]."""

    def paged_attention(self, query: torch.Tensor, key_cache: torch.Tensor,
                        value_cache: torch.Tensor, block_tables: torch.Tensor,
                        seq_lens: torch.Tensor, query_start_loc: torch.Tensor,
                        scale: float, out: torch.Tensor | None = None) -> torch.Tensor:
        """Causal attention of ``query`` [T, Hq, D] over each sequence's cached K/V;
        returns [T, Hq, D]. Called with the keyword arguments ``max_query_len``,
        ``max_seq_len`` and ``workspace`` as well when the metadata carries
        them (the GPU path; see :func:`paternoster.kernels.paged_attention`),
        and with ``sliding_window=W`` (an int > 0) for a sliding-window layer:
        each query then attends to its last W positions, itself included, and
        the table entries of blocks wholly before the window of a sequence's
        first query may be -1 (freed). Ops without windows need not take the
        keyword as long as no layer has one. With ``sinks=`` (float32
        ``[Hq]`` on the query's device) for a layer with attention sinks
        (gpt-oss): head h's logit ``s_h`` joins each row's softmax
        normalisation without a value vector, ``out = sum_k exp(l_k - m) v_k
        / (sum_k exp(l_k - m) + exp(s_h - m))``, ``m = max(max_k l_k, s_h)``
        over the logits ``l_k`` of the keys the row sees; ops need not take
        the keyword as long as no layer has sinks."""


def default_attention_ops() -> AttentionOps:
    """The kernels of the tensors' device: the :mod:`paternoster.kernels`
    module, whose functions dispatch on ``query.device`` / ``key.device``."""
    return kernels


@dataclass(frozen=True)
class AttentionMetadata:
    """Where each token of a flattened step lives in the paged KV cache.

    ``B`` sequences contribute ``T`` tokens in total, sequence ``b`` owning
    tokens ``query_start_loc[b]:query_start_loc[b+1]``; its queries sit at the
    last positions of its context of ``seq_lens[b]`` tokens.

    Attributes:
        slot_mapping: int64[T], cache slot (block * block_size + offset) for each
            new token's K/V.
        block_tables: int32[B, M], the physical blocks of each sequence, in order.
        seq_lens: int32[B], context length in tokens including this step's tokens.
        query_start_loc: int32[B + 1], prefix sums of tokens per sequence.
        max_query_len: host-side upper bound of the query lengths (1 = all
            decodes), or None. Set on CUDA, where the kernels cannot read the
            device tensors without a sync; None keeps the CPU call unchanged.
        max_seq_len: host-side upper bound of ``seq_lens`` (CUDA), or None.
        workspace: the decode kernel's split-K scratch (CUDA), or None.
        batch_invariant: ask the kernels for per-token results independent
            of the rest of the step (CPU).
        group_slot_mappings: with ``G > 1`` KV cache groups
            (:mod:`paternoster.model.kv_layout`), groups 1..G-1's slot
            mappings, each int64[T] (``slot_mapping`` is group 0's).
        group_block_tables: the same groups' block tables, each int32[B, M]
            (-1 where a sliding window released a block).
    """

    slot_mapping: torch.Tensor
    block_tables: torch.Tensor
    seq_lens: torch.Tensor
    query_start_loc: torch.Tensor
    max_query_len: int | None = None
    max_seq_len: int | None = None
    workspace: torch.Tensor | None = None
    batch_invariant: bool = False
    group_slot_mappings: tuple[torch.Tensor, ...] = ()
    group_block_tables: tuple[torch.Tensor, ...] = ()

    def for_group(self, group: int) -> tuple[torch.Tensor, torch.Tensor]:
        """KV cache group ``group``'s (slot_mapping, block_tables).

        Raises:
            IndexError: the step carries no such group.
        """
        if group == 0:
            return self.slot_mapping, self.block_tables
        if not 0 < group <= len(self.group_block_tables):
            raise IndexError(f"KV cache group {group} not in this step's metadata "
                             f"({1 + len(self.group_block_tables)} groups)")
        return self.group_slot_mappings[group - 1], self.group_block_tables[group - 1]


def paged_attention_layer(ops: AttentionOps, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                          kv_cache: tuple[torch.Tensor, torch.Tensor], attn: AttentionMetadata,
                          scale: float, sliding_window: int = 0,
                          kv_group: int = 0, sinks: torch.Tensor | None = None) -> torch.Tensor:
    """One layer's attention step.

    Args:
        ops: the kernels.
        q: [T, Hq, D]; k, v: [T, Hkv, D] (after RoPE), model dtype.
        kv_cache: (key_cache, value_cache), each [num_blocks, block_size, Hkv, D].
        attn: token placement for this step.
        scale: softmax scale, usually ``D ** -0.5``.
        sliding_window: W > 0 for a sliding-window layer (each query sees its
            last W positions; passed to ``ops.paged_attention`` as
            ``sliding_window=``); 0: full causal attention (the keyword is not
            passed, so ops without it still work).
        kv_group: the layer's KV cache group (its slot mapping and block
            tables in ``attn``).
        sinks: the layer's attention-sink logits, float32 ``[Hq]`` on ``q``'s
            device (gpt-oss; converted once from the checkpoint's dtype by the
            caller), passed to ``ops.paged_attention`` as ``sinks=``; None: no
            sinks (the keyword is not passed).
    Returns:
        [T, Hq, D] attention output, model dtype.
    Raises:
        ValueError: a negative ``sliding_window``.
    """
    if sliding_window < 0:
        raise ValueError(f"sliding_window must be >= 0 (0 = no window), got {sliding_window}")
    key_cache, value_cache = kv_cache
    slot_mapping, block_tables = attn.for_group(kv_group)
    ops.reshape_and_cache(k.contiguous(), v.contiguous(), key_cache, value_cache, slot_mapping)
    hints: dict[str, Any] = {}
    if attn.batch_invariant:
        hints["batch_invariant"] = True
    elif attn.max_query_len is not None:
        hints.update(max_query_len=attn.max_query_len, max_seq_len=attn.max_seq_len,
                     workspace=attn.workspace)
    if sliding_window > 0:
        hints["sliding_window"] = sliding_window
    if sinks is not None:
        hints["sinks"] = sinks
    return ops.paged_attention(q.contiguous(), key_cache, value_cache, block_tables,
                               attn.seq_lens, attn.query_start_loc, scale, **hints)
