"""Torch-facing wrappers of the paged-attention kernels of the C++ core.

The kernels (``paternoster._core``) take raw data pointers and sizes; these
functions check dtype, device, shape and contiguity first and raise
``ValueError`` naming the offending argument, so the C++ side never sees a
tensor it would misread.

Algorithms: PagedAttention (Kwon et al., "Efficient Memory Management for Large
Language Model Serving with PagedAttention", SOSP'23) for the block-table KV
layout; the online softmax of FlashAttention (Dao et al., 2022) inside the CPU
kernel, so memory use does not grow with the context length.

Layouts (all contiguous, same floating dtype, float32 or bfloat16):

- ``query``, ``out``: ``[T, Hq, D]`` (T tokens of the step, flattened over
  sequences; Hq query heads; head size D)
- ``key``, ``value``: ``[T, Hkv, D]``
- ``key_cache``, ``value_cache``: ``[num_blocks, block_size, Hkv, D]``
- ``block_tables``: int32 ``[B, max_blocks_per_seq]``
- ``seq_lens``: int32 ``[B]``, tokens of context per sequence including this
  step's tokens
- ``query_start_loc``: int32 ``[B + 1]``, sequence b owns query rows
  ``query_start_loc[b]:query_start_loc[b + 1]``
- ``slot_mapping``: int64 ``[T]``, slot = block id * block_size + offset;
  negative = skip the token

Only CPU tensors are supported for now; :data:`_BACKENDS` is the hook where
the CUDA kernels (``cuda/``) will register.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch

from paternoster import _core

__all__ = ["paged_attention", "reshape_and_cache", "set_num_threads", "get_num_threads"]

_DTYPES = {torch.float32: _core.DType.float32, torch.bfloat16: _core.DType.bfloat16}

set_num_threads = _core.set_num_threads
get_num_threads = _core.get_num_threads


class _Backend(NamedTuple):
    """Pointer-level kernels for one device type."""

    paged_attention: Callable[..., None]
    reshape_and_cache: Callable[..., None]


# device type -> kernels. The CUDA build adds "cuda" here (and will pass the
# current stream); everything above this table is device independent.
_BACKENDS: dict[str, _Backend] = {
    "cpu": _Backend(_core._paged_attention_ptr, _core._reshape_and_cache_ptr),
}


def _backend(device: torch.device) -> _Backend:
    backend = _BACKENDS.get(device.type)
    if backend is None:
        raise ValueError(
            f"paged attention kernels support devices {sorted(_BACKENDS)}, got {device}"
        )
    return backend


def _check(
    t: object,
    name: str,
    ndim: int,
    dtype: torch.dtype | None = None,
    device: torch.device | None = None,
) -> torch.Size:
    """Return ``t.shape``; raise ValueError naming ``name`` unless ``t`` is a
    contiguous ``ndim``-D tensor (of ``dtype``, on ``device``, when given).
    Kept lean: it runs several times per layer and step."""
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


def _kernel_dtype(t: torch.Tensor, name: str) -> _core.DType:
    kernel_dtype = _DTYPES.get(t.dtype)
    if kernel_dtype is None:
        raise ValueError(f"{name} must be float32 or bfloat16, got {t.dtype}")
    return kernel_dtype


def _check_cache(
    key_cache: object, value_cache: object, dtype: torch.dtype, device: torch.device
) -> torch.Size:
    shape = _check(key_cache, "key_cache", 4, dtype, device)
    if _check(value_cache, "value_cache", 4, dtype, device) != shape:
        raise ValueError(
            f"value_cache shape {tuple(value_cache.shape)} != key_cache shape "  # type: ignore[attr-defined]
            f"{tuple(shape)}"
        )
    return shape


def reshape_and_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Write this step's keys and values into their KV cache slots (in place).

    For every token t with ``slot_mapping[t] >= 0``, with
    ``block, offset = divmod(slot_mapping[t], block_size)``:
    ``key_cache[block, offset] = key[t]`` and ``value_cache[block, offset] = value[t]``.

    Args:
        key, value: ``[T, Hkv, D]``, float32 or bfloat16.
        key_cache, value_cache: ``[num_blocks, block_size, Hkv, D]``, same dtype.
        slot_mapping: int64 ``[T]``; a negative slot skips the token.

    Raises:
        ValueError: naming the argument, for a wrong type, dtype, device, shape or
            non-contiguous tensor, or a slot ``>= num_blocks * block_size`` (then
            nothing is written).
    """
    t, hkv, d = _check(key, "key", 3)
    dtype, device = key.dtype, key.device
    kernel_dtype = _kernel_dtype(key, "key")
    if _check(value, "value", 3, dtype, device) != key.shape:
        raise ValueError(f"value shape {tuple(value.shape)} != key shape {tuple(key.shape)}")
    num_blocks, block_size, c_hkv, c_d = _check_cache(key_cache, value_cache, dtype, device)
    if (c_hkv, c_d) != (hkv, d):
        raise ValueError(f"key_cache has [Hkv, D] = [{c_hkv}, {c_d}], key has [{hkv}, {d}]")
    if _check(slot_mapping, "slot_mapping", 1, torch.int64, device)[0] != t:
        raise ValueError(f"slot_mapping has {slot_mapping.shape[0]} entries, key has {t} tokens")
    _backend(device).reshape_and_cache(
        key.data_ptr(),
        value.data_ptr(),
        key_cache.data_ptr(),
        value_cache.data_ptr(),
        slot_mapping.data_ptr(),
        t,
        hkv,
        d,
        num_blocks * block_size,
        kernel_dtype,
    )


def paged_attention(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal attention of this step's queries over the paged KV cache.

    Query row i of sequence b (``q_len = query_start_loc[b+1] - query_start_loc[b]``)
    sits at position ``seq_lens[b] - q_len + i`` and attends to the cached
    positions ``0 ..`` that position, read through ``block_tables[b]``:
    ``out = softmax(scale * q K^T) V`` per head. One call may mix whole prompts,
    prefill chunks over earlier cached context and single decode tokens. GQA /
    MQA: query head h reads kv head ``h // (Hq // Hkv)``. The cache must already
    hold this step's keys and values (:func:`reshape_and_cache`). bfloat16
    inputs are accumulated in float32. Runs on :func:`set_num_threads` threads.

    Args:
        query: ``[T, Hq, D]``, float32 or bfloat16.
        key_cache, value_cache: ``[num_blocks, block_size, Hkv, D]``, same dtype;
            Hq must be a multiple of Hkv.
        block_tables: int32 ``[B, max_blocks_per_seq]``; only the first
            ``ceil(seq_lens[b] / block_size)`` entries of row b are read.
        seq_lens: int32 ``[B]``, context length in tokens including the new ones.
        query_start_loc: int32 ``[B + 1]``, non-decreasing, last entry <= T.
        scale: softmax scale, usually ``D ** -0.5``.
        out: optional ``[T, Hq, D]`` output of the query's dtype; rows outside
            ``query_start_loc[0]:query_start_loc[B]`` are left untouched.

    Returns:
        ``out`` (a new ``[T, Hq, D]`` tensor if not given).

    Raises:
        ValueError: naming the argument, for a wrong type, dtype, device, shape,
            non-contiguous tensor, a block id outside the cache, a sequence
            whose ``seq_lens`` is below its query length or above
            ``max_blocks_per_seq * block_size``, or a bad ``query_start_loc``.
    """
    t, hq, d = _check(query, "query", 3)
    dtype, device = query.dtype, query.device
    kernel_dtype = _kernel_dtype(query, "query")
    num_blocks, block_size, hkv, c_d = _check_cache(key_cache, value_cache, dtype, device)
    b, max_blocks = _check(block_tables, "block_tables", 2, torch.int32, device)
    (b_seq,) = _check(seq_lens, "seq_lens", 1, torch.int32, device)
    (b_qsl,) = _check(query_start_loc, "query_start_loc", 1, torch.int32, device)
    if c_d != d:
        raise ValueError(f"key_cache head size {c_d} != query head size {d}")
    if hkv == 0 or hq % hkv:
        raise ValueError(f"query heads ({hq}) must be a multiple of key_cache kv heads ({hkv})")
    if b_seq != b:
        raise ValueError(f"seq_lens has {b_seq} entries, block_tables has {b} rows")
    if b_qsl != b + 1:
        raise ValueError(f"query_start_loc must have B + 1 = {b + 1} entries, got {b_qsl}")
    if out is None:
        out = torch.empty_like(query)
    elif _check(out, "out", 3, dtype, device) != query.shape:
        raise ValueError(f"out shape {tuple(out.shape)} != query shape {tuple(query.shape)}")
    _backend(device).paged_attention(
        out.data_ptr(),
        query.data_ptr(),
        key_cache.data_ptr(),
        value_cache.data_ptr(),
        block_tables.data_ptr(),
        seq_lens.data_ptr(),
        query_start_loc.data_ptr(),
        t,
        b,
        hq,
        hkv,
        d,
        num_blocks,
        block_size,
        max_blocks,
        float(scale),
        kernel_dtype,
    )
    return out
