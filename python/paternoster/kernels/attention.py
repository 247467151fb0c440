"""Paged attention (Kwon et al., "Efficient Memory Management for Large
Language Model Serving with PagedAttention", SOSP'23): the cache write and the
attention over block tables, dispatched on the query's device
(:func:`~paternoster.kernels.dispatch.backend_for`). Layouts: see
:mod:`paternoster.kernels`.
"""

from __future__ import annotations

import torch

from paternoster.kernels.dispatch import backend_for


def reshape_and_cache(key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor,
                      value_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Write this step's keys and values into their KV cache slots (in place).

    For every token t with ``slot_mapping[t] >= 0``, with
    ``block, offset = divmod(slot_mapping[t], block_size)``:
    ``key_cache[block, offset] = key[t]`` and ``value_cache[block, offset] = value[t]``.

    Args:
        key, value: ``[T, Hkv, D]``; float32 or bfloat16 on CPU, float16 or
            bfloat16 on CUDA.
        key_cache, value_cache: ``[num_blocks, block_size, Hkv, D]``, same dtype
            and device.
        slot_mapping: int64 ``[T]``; a negative slot skips the token.

    Raises:
        ValueError: naming the argument, for a wrong type, dtype, device, shape or
            non-contiguous tensor; on CPU also for a slot
            ``>= num_blocks * block_size`` (then nothing is written; on CUDA the
            slots stay on the device and such a token is skipped); a device
            without paged-attention kernels.
        RuntimeError: a CUDA launch error.
    """
    backend_for(key.device).reshape_and_cache(key, value, key_cache, value_cache, slot_mapping)


def paged_attention(query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                    block_tables: torch.Tensor, seq_lens: torch.Tensor,
                    query_start_loc: torch.Tensor, scale: float,
                    out: torch.Tensor | None = None, *, max_query_len: int | None = None,
                    max_seq_len: int | None = None,
                    workspace: torch.Tensor | None = None,
                    batch_invariant: bool = False,
                    sliding_window: int = 0,
                    sinks: torch.Tensor | None = None) -> torch.Tensor:
    """Causal attention of this step's queries over the paged KV cache.

    Query row i of sequence b (``q_len = query_start_loc[b+1] - query_start_loc[b]``)
    sits at position ``seq_lens[b] - q_len + i`` and attends to the cached
    positions ``0 ..`` that position (with a sliding window W, only the W
    positions ``p - W < k <= p`` ending there), read through ``block_tables[b]``:
    ``out = softmax(scale * q K^T) V`` per head (with ``sinks``, one more
    logit per head in the softmax). One call may mix whole prompts,
    prefill chunks over earlier cached context and single decode tokens. GQA /
    MQA: query head h reads kv head ``h // (Hq // Hkv)``. The cache must already
    hold this step's keys and values (:func:`reshape_and_cache`). 16-bit
    inputs are accumulated in float32.

    CPU: the C++ core on ``set_num_threads`` threads; the index tensors are
    validated (block ids, lengths) before anything is written. CUDA: see
    :mod:`paternoster.kernels.cuda`; index contents are trusted (reading them
    would cost a sync); head size 64, 128 or 256, block size a power of two >= 8;
    a decode row whose ``seq_lens`` entry is 0 is written as zeros (padding).

    Args:
        query: ``[T, Hq, D]``; float32 or bfloat16 on CPU, float16 or bfloat16
            on CUDA.
        key_cache, value_cache: ``[num_blocks, block_size, Hkv, D]``, same dtype;
            Hq must be a multiple of Hkv.
        block_tables: int32 ``[B, max_blocks_per_seq]``; only the first
            ``ceil(seq_lens[b] / block_size)`` entries of row b are read (with
            a sliding window, not those of blocks wholly before the window of
            the sequence's first query row: they may be -1).
        seq_lens: int32 ``[B]``, context length in tokens including the new ones.
        query_start_loc: int32 ``[B + 1]``, non-decreasing, last entry <= T.
        scale: softmax scale, usually ``D ** -0.5``.
        out: optional ``[T, Hq, D]`` output of the query's dtype; rows outside
            ``query_start_loc[0]:query_start_loc[B]`` are left untouched.
        max_query_len: CUDA only: an upper bound of the query lengths (1 = a
            pure decode batch: only the decode kernel runs); default ``T``.
        max_seq_len: CUDA only: an upper bound of ``seq_lens`` (sizes the
            split-K grid; a CUDA graph captures with the longest context);
            default ``max_blocks_per_seq * block_size``.
        workspace: CUDA only: split-K scratch from :func:`alloc_decode_workspace`;
            without it each call allocates one for its batch.
        batch_invariant: CPU only: every query token its own work item, so
            its result does not depend on the rest of the step (how a prompt
            is chunked, what else is batched); slower prefill.
        sliding_window: W > 0: each query attends to its last W positions,
            itself included (HF transformers' sliding-window causal mask);
            blocks wholly out of every query's window are skipped, so a decode
            costs O(W). 0: full causal attention.
        sinks: optional float32 ``[Hq]`` attention-sink logits on the query's
            device (gpt-oss; Xiao et al., "Efficient Streaming Language Models
            with Attention Sinks", 2023): head h's logit ``s_h`` joins each
            row's softmax normalisation without a value vector,
            ``out = sum_k exp(l_k - m) v_k / (sum_k exp(l_k - m) + exp(s_h - m))``
            with ``l_k = scale * q.k`` over the keys the row sees (causal,
            windowed) and ``m = max(max_k l_k, s_h)`` (HF transformers'
            ``gpt_oss`` eager attention). ``s_h`` is not scaled; ``-inf`` is
            no sink, a large one drives the row towards 0. None: no sinks.

    Returns:
        ``out`` (a new ``[T, Hq, D]`` tensor if not given).

    Raises:
        ValueError: naming the argument, for a wrong type, dtype, device, shape,
            non-contiguous tensor, an unsupported head or block size (CUDA), a
            negative ``sliding_window``, ``sinks`` other than float32 ``[Hq]``
            on the query's device; on
            CPU also for a block id outside the cache, a sequence whose
            ``seq_lens`` is below its query length or above
            ``max_blocks_per_seq * block_size``, or a bad ``query_start_loc``.
        RuntimeError: a CUDA launch error.
    """
    return backend_for(query.device).paged_attention(
        query, key_cache, value_cache, block_tables, seq_lens, query_start_loc, scale, out,
        max_query_len=max_query_len, max_seq_len=max_seq_len, workspace=workspace,
        batch_invariant=batch_invariant, sliding_window=sliding_window, sinks=sinks)


def alloc_decode_workspace(device: torch.device | str, max_num_seqs: int, num_heads: int,
                           num_kv_heads: int, head_size: int,
                           max_seq_len: int) -> torch.Tensor | None:
    """The split-K workspace for every decode batch of up to ``max_num_seqs``
    sequences with contexts up to ``max_seq_len`` tokens, on a CUDA ``device``.

    Allocate it once (before any CUDA graph capture) and pass it as
    ``workspace=`` to :func:`paged_attention`. Its size is
    ``max over B of B * Hq * splits(B) * (D + 2) * 4`` bytes, where
    ``splits(B)`` is the decode kernel's split count for ``B`` sequences on this
    device (enough thread blocks to fill it, each split at least 128 context
    tokens, at most 32 splits): float32 partial outputs, maxima and sums.

    Returns:
        A uint8 tensor, or None when no batch of these sizes splits.
    Raises:
        ValueError: the CUDA extension is not built (or ``device`` has no CUDA
            kernels), or sizes the kernels refuse.
    """
    return backend_for(device).alloc_decode_workspace(device, max_num_seqs, num_heads,
                                                      num_kv_heads, head_size, max_seq_len)
