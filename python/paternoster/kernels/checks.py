"""Argument checks of the kernel wrappers: dtype, device, shape, contiguity and
(where index tensors are readable for free) index contents.

The kernels take raw pointers and sizes; these checks run first and raise
``ValueError`` naming the offending argument, so a kernel never sees a tensor
it would misread. They work on any device, meta tensors included (no data is
read except by :func:`check_attention_indices` and :func:`check_slots`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

import torch


def check_tensor(t: object, name: str, ndim: int, dtype: torch.dtype | None = None,
                 device: torch.device | None = None) -> torch.Size:
    """``t.shape`` of a contiguous ``ndim``-D tensor (of ``dtype``, on ``device``,
    when given). Kept lean: it runs several times per layer and step.

    Raises:
        ValueError: naming ``name``, for a non-tensor, a wrong rank, dtype or
            device, or a non-contiguous tensor.
    """
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    shape = t.shape
    if len(shape) != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got shape {tuple(shape)}")
    if dtype is not None and t.dtype != dtype:
        raise ValueError(f"{name} must be {dtype}, got {t.dtype}")
    if not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous")
    if device is not None and t.device != device:
        raise ValueError(f"{name} is on {t.device}, expected {device} (like the other tensors)")
    return shape


def kernel_dtype(dtypes: Mapping[torch.dtype, Any], t: torch.Tensor, name: str) -> Any:
    """The kernel's dtype value for ``t.dtype`` out of ``dtypes`` (torch dtype ->
    kernel enum value).

    Raises:
        ValueError: naming ``name`` and the accepted dtypes.
    """
    value = dtypes.get(t.dtype)
    if value is None:
        names = " or ".join(str(d).removeprefix("torch.") for d in dtypes)
        raise ValueError(f"{name} must be {names} on {t.device.type}, got {t.dtype}")
    return value


def _check_cache(key_cache: object, value_cache: object, dtype: torch.dtype,
                 device: torch.device) -> torch.Size:
    shape = check_tensor(key_cache, "key_cache", 4, dtype, device)
    if check_tensor(value_cache, "value_cache", 4, dtype, device) != shape:
        raise ValueError(f"value_cache shape {tuple(value_cache.shape)} != key_cache shape "  # type: ignore[attr-defined]
                         f"{tuple(shape)}")
    return shape


class CacheWriteSizes(NamedTuple):
    """Sizes of a :func:`~paternoster.kernels.reshape_and_cache` call."""

    num_tokens: int
    num_kv_heads: int
    head_size: int
    num_slots: int


def check_cache_write(key: object, value: object, key_cache: object, value_cache: object,
                      slot_mapping: object,
                      dtypes: Mapping[torch.dtype, Any]) -> CacheWriteSizes:
    """The checks of :func:`~paternoster.kernels.reshape_and_cache` with the
    accepted ``dtypes`` (no kernel call).

    Raises:
        ValueError: naming the argument.
    """
    t, hkv, d = check_tensor(key, "key", 3)
    dtype, device = key.dtype, key.device  # type: ignore[attr-defined]
    kernel_dtype(dtypes, key, "key")  # type: ignore[arg-type]
    if check_tensor(value, "value", 3, dtype, device) != key.shape:  # type: ignore[attr-defined]
        raise ValueError(f"value shape {tuple(value.shape)} != key shape {tuple(key.shape)}")  # type: ignore[attr-defined]
    num_blocks, block_size, c_hkv, c_d = _check_cache(key_cache, value_cache, dtype, device)
    if (c_hkv, c_d) != (hkv, d):
        raise ValueError(f"key_cache has [Hkv, D] = [{c_hkv}, {c_d}], key has [{hkv}, {d}]")
    if check_tensor(slot_mapping, "slot_mapping", 1, torch.int64, device)[0] != t:
        raise ValueError(f"slot_mapping has {slot_mapping.shape[0]} entries, key has {t} "  # type: ignore[attr-defined]
                         "tokens")
    return CacheWriteSizes(t, hkv, d, num_blocks * block_size)


class AttentionSizes(NamedTuple):
    """Sizes of a :func:`~paternoster.kernels.paged_attention` call, in the
    order of the kernels' arguments."""

    num_tokens: int
    num_seqs: int
    num_heads: int
    num_kv_heads: int
    head_size: int
    num_blocks: int
    block_size: int
    max_blocks_per_seq: int


def check_attention(query: object, key_cache: object, value_cache: object,
                    block_tables: object, seq_lens: object, query_start_loc: object,
                    out: object | None, dtypes: Mapping[torch.dtype, Any]) -> AttentionSizes:
    """The checks of :func:`~paternoster.kernels.paged_attention` with the
    accepted ``dtypes`` (no kernel call).

    Raises:
        ValueError: naming the argument.
    """
    t, hq, d = check_tensor(query, "query", 3)
    dtype, device = query.dtype, query.device  # type: ignore[attr-defined]
    kernel_dtype(dtypes, query, "query")  # type: ignore[arg-type]
    num_blocks, block_size, hkv, c_d = _check_cache(key_cache, value_cache, dtype, device)
    b, max_blocks = check_tensor(block_tables, "block_tables", 2, torch.int32, device)
    (b_seq,) = check_tensor(seq_lens, "seq_lens", 1, torch.int32, device)
    (b_qsl,) = check_tensor(query_start_loc, "query_start_loc", 1, torch.int32, device)
    if c_d != d:
        raise ValueError(f"key_cache head size {c_d} != query head size {d}")
    if hkv == 0 or hq % hkv:
        raise ValueError(f"query heads ({hq}) must be a multiple of key_cache kv heads ({hkv})")
    if b_seq != b:
        raise ValueError(f"seq_lens has {b_seq} entries, block_tables has {b} rows")
    if b_qsl != b + 1:
        raise ValueError(f"query_start_loc must have B + 1 = {b + 1} entries, got {b_qsl}")
    if out is not None and check_tensor(out, "out", 3, dtype, device) != query.shape:  # type: ignore[attr-defined]
        raise ValueError(f"out shape {tuple(out.shape)} != query shape {tuple(query.shape)}")  # type: ignore[attr-defined]
    return AttentionSizes(t, b, hq, hkv, d, num_blocks, block_size, max_blocks)


def check_sinks(sinks: object, num_heads: int, device: torch.device) -> None:
    """Attention-sink logits: a contiguous float32 ``[num_heads]`` tensor on
    ``device`` (the query's), whatever the query's dtype (gpt-oss keeps its
    sinks in the model dtype; the caller converts them once).

    Raises:
        ValueError: naming ``sinks``, for a non-tensor, a wrong dtype, shape or
            device, or a non-contiguous tensor.
    """
    if check_tensor(sinks, "sinks", 1, torch.float32, device)[0] != num_heads:
        raise ValueError(f"sinks must have shape ({num_heads},) (one logit per query head), "
                         f"got {tuple(sinks.shape)}")  # type: ignore[attr-defined]


def check_attention_indices(block_tables: torch.Tensor, seq_lens: torch.Tensor,
                            query_start_loc: torch.Tensor, num_tokens: int, num_blocks: int,
                            block_size: int, max_query_len: int | None,
                            sliding_window: int = 0) -> None:
    """The CPU kernel's checks of index contents, for the CUDA emulation (its
    index tensors live in host memory, so reading them is free): a bad block
    id, length or row range is a ``ValueError`` instead of a read outside a
    tensor.

    Raises:
        ValueError: unless ``query_start_loc`` is non-decreasing within
            ``[0, num_tokens]``; every sequence with new tokens has
            ``q_len <= seq_lens[b] <= block_tables.shape[1] * block_size`` (a
            decode row may have ``seq_lens`` 0: padding); the block ids it
            reads are in ``[0, num_blocks)`` (with ``sliding_window`` W > 0,
            not those of blocks wholly before the first query's window,
            position ``seq_lens[b] - q_len - W + 1``: the kernels skip them);
            and ``max_query_len`` bounds the query lengths.
    """
    qsl = query_start_loc.long()
    if len(qsl) and (int(qsl[0]) < 0 or int(qsl[-1]) > num_tokens):
        raise ValueError(f"query_start_loc must stay within [0, {num_tokens}], got "
                         f"{int(qsl[0])}..{int(qsl[-1])}")
    q_lens = qsl[1:] - qsl[:-1]
    if bool((q_lens < 0).any()):
        raise ValueError("query_start_loc must be non-decreasing")
    lens = seq_lens.long()
    width = block_tables.shape[1]
    for b in range(len(lens)):
        q_len, n = int(q_lens[b]), int(lens[b])
        if q_len == 0 or (q_len == 1 and n == 0):
            continue
        if n < q_len:
            raise ValueError(f"seq_lens[{b}] = {n} is below its query length {q_len}")
        if n > width * block_size:
            raise ValueError(f"seq_lens[{b}] = {n} exceeds max_blocks_per_seq * block_size "
                             f"= {width * block_size}")
        first = max(0, n - q_len - sliding_window + 1) // block_size if sliding_window else 0
        used = block_tables[b, first : -(-n // block_size)]
        bad = (used < 0) | (used >= num_blocks)
        if bool(bad.any()):
            j = int(bad.nonzero()[0])
            raise ValueError(f"block_tables[{b}, {first + j}] = {int(used[j])} out of range "
                             f"[0, {num_blocks})")
    longest = int(q_lens.max()) if len(q_lens) else 0
    if max_query_len and max_query_len < longest:  # 0 / None: the default (T)
        raise ValueError(f"max_query_len = {max_query_len} is below the longest query "
                         f"({longest} tokens): its rows would not be computed")


def check_slots(slot_mapping: torch.Tensor, num_slots: int) -> None:
    """The CPU kernel's slot check, for the CUDA emulation.

    Raises:
        ValueError: a slot ``>= num_slots`` (the CUDA kernel skips it).
    """
    if len(slot_mapping) and int(slot_mapping.max()) >= num_slots:
        raise ValueError(f"slot_mapping has slot {int(slot_mapping.max())} out of range "
                         f"(cache has {num_slots} slots)")


def check_rows(t: object, name: str, dtypes: Mapping[torch.dtype, Any]) -> tuple[int, int]:
    """``[rows, width]`` of a contiguous 2-D tensor of one of ``dtypes``.

    Raises:
        ValueError: naming ``name``.
    """
    rows, width = check_tensor(t, name, 2)
    kernel_dtype(dtypes, t, name)  # type: ignore[arg-type]
    return rows, width


def check_weight(weight: object, x: torch.Tensor, hidden: int) -> None:
    """A norm weight: ``[hidden]``, ``x``'s dtype and device, contiguous.

    Raises:
        ValueError: naming ``weight``.
    """
    (n,) = check_tensor(weight, "weight", 1, x.dtype, x.device)
    if n != hidden:
        raise ValueError(f"weight has {n} entries, x has hidden size {hidden}")


def check_heads(t: object, name: str, head_size: int, dtype: torch.dtype | None,
                device: torch.device | None) -> tuple[int, int, int]:
    """(tokens, heads, row stride) of a ``[T, H, D]`` or ``[T, H * D]`` tensor
    whose heads are contiguous within a row; rows may be further apart (a view
    into a fused qkv projection).

    Raises:
        ValueError: naming ``name``.
    """
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() == 3:
        tokens, heads, d = t.shape
        if d != head_size:
            raise ValueError(f"{name} has head size {d}, expected head_size={head_size}")
        inner = t.stride(2) == 1 and (heads == 1 or t.stride(1) == head_size)
    elif t.dim() == 2:
        tokens, width = t.shape
        if width % head_size:
            raise ValueError(f"{name} width {width} is not a multiple of head_size={head_size}")
        heads, inner = width // head_size, t.stride(1) == 1
    else:
        raise ValueError(f"{name} must be [T, H, D] or [T, H * D], got shape {tuple(t.shape)}")
    if not inner:
        raise ValueError(f"{name} must have contiguous heads within each row")
    if dtype is not None and t.dtype != dtype:
        raise ValueError(f"{name} must be {dtype}, got {t.dtype}")
    if device is not None and t.device != device:
        raise ValueError(f"{name} is on {t.device}, expected {device} (like query)")
    stride = t.stride(0) if tokens > 1 else heads * head_size
    if stride < heads * head_size:
        raise ValueError(f"{name} rows overlap (row stride {stride})")
    return tokens, heads, stride
