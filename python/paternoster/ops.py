"""Torch-facing wrappers of the kernels of the C++ core: paged attention, and
the fused elementwise ops of the decoder block (RMSNorm, residual add + RMSNorm,
SwiGLU gating, RoPE; see the end of this module).

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

Devices: ``cpu`` (the C++ core, float32 or bfloat16) and, when the CUDA
extension ``paternoster._cuda_ops`` is built and a GPU is present, ``cuda``
(float16 or bfloat16: the CUDA kernels have no float32 path, serving on a GPU
runs in 16-bit). On CUDA the kernels are launched on
``torch.cuda.current_stream()`` without any host synchronisation, so both
functions can be captured in a CUDA graph; the decode kernel's split-K
workspace (Flash-Decoding, Dao et al. 2023) is allocated once by the caller
(:func:`alloc_decode_workspace`) and passed in.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator, Mapping
from typing import Any, NamedTuple

import torch

from paternoster import _core

try:  # built only where a CUDA compiler was found
    from paternoster import _cuda_ops
except ImportError:  # pragma: no cover - depends on the build
    _cuda_ops = None

__all__ = [
    "paged_attention",
    "reshape_and_cache",
    "alloc_decode_workspace",
    "cuda_kernels_available",
    "cuda_emulation_available",
    "emulate_cuda_kernels",
    "set_num_threads",
    "get_num_threads",
    "rms_norm",
    "fused_add_rms_norm",
    "silu_and_mul",
    "rotary_embedding",
]

_DTYPES = {torch.float32: _core.DType.float32, torch.bfloat16: _core.DType.bfloat16}

set_num_threads = _core.set_num_threads
get_num_threads = _core.get_num_threads


class _Backend(NamedTuple):
    """Pointer-level kernels for one device type.

    Attributes:
        dtypes: accepted torch dtypes -> the kernel's dtype enum value.
        paged_attention, reshape_and_cache: take the CPU kernels' positional
            arguments (data pointers, sizes, kernel dtype); the CUDA kernels'
            also take keyword arguments (see :class:`_CudaKernels`).
        cuda: the :class:`_CudaKernels` behind a CUDA-kernel backend (also the
            CPU emulation's, :func:`emulate_cuda_kernels`), else None.
        check_indices: check index contents before a kernel call
            (:func:`_check_attention_indices`, :func:`_check_slots`): the
            emulation's, whose "device" memory is host memory; on a GPU they
            are trusted.
    """

    dtypes: Mapping[torch.dtype, Any]
    paged_attention: Callable[..., None]
    reshape_and_cache: Callable[..., None]
    cuda: _CudaKernels | None = None
    check_indices: bool = False


class _CudaKernels:
    """The CUDA backend: adds the device, its current stream and the split-K
    workspace to the pointer-level calls of ``paternoster._cuda_ops``.

    Args:
        module: the extension (a fake in tests).
        stream: device -> integer ``cudaStream_t`` handle of the current stream.
        num_sms: device -> its multiprocessor count.
    """

    def __init__(self, module, stream: Callable[[torch.device], int] | None = None,
                 num_sms: Callable[[torch.device], int] | None = None) -> None:
        self.module = module
        self.stream = stream or _current_stream
        self.num_sms = num_sms or _num_sms
        self.dtypes = {torch.float16: module.DType.float16,
                       torch.bfloat16: module.DType.bfloat16}

    def backend(self) -> _Backend:
        """These kernels as a :data:`_BACKENDS` entry."""
        return _Backend(self.dtypes, self.paged_attention, self.reshape_and_cache, self)

    def workspace_bytes(self, device: torch.device, max_num_seqs: int, num_heads: int,
                        num_kv_heads: int, head_size: int, max_seq_len: int) -> int:
        """Split-K workspace bytes for decode batches up to these sizes on ``device``."""
        return self.module.decode_workspace_bytes(max_num_seqs, num_heads, num_kv_heads,
                                                  head_size, max_seq_len, self.num_sms(device))

    def reshape_and_cache(self, key: int, value: int, key_cache: int, value_cache: int,
                          slot_mapping: int, num_tokens: int, num_kv_heads: int, head_size: int,
                          num_slots: int, dtype, *, device: torch.device) -> None:
        """Launch the cache write on ``device``'s current stream (slots past
        ``num_slots`` are skipped on the device, not reported)."""
        self.module.reshape_and_cache(
            key, value, key_cache, value_cache, slot_mapping, num_tokens, num_kv_heads,
            head_size, 0, 0, num_slots, dtype, _index(device), self.stream(device),
        )

    def paged_attention(self, out: int, query: int, key_cache: int, value_cache: int,
                        block_tables: int, seq_lens: int, query_start_loc: int,
                        num_tokens: int, num_seqs: int, num_heads: int, num_kv_heads: int,
                        head_size: int, num_blocks: int, block_size: int,
                        max_blocks_per_seq: int, scale: float, dtype, *,
                        device: torch.device, max_query_len: int | None,
                        max_seq_len: int | None, workspace: torch.Tensor | None) -> None:
        """Launch the decode (split-K + reduction) and prefill kernels on
        ``device``'s current stream. Without ``workspace``, one sized for this
        batch comes from torch's caching allocator (inside a graph capture, from
        the graph's pool)."""
        sms = self.num_sms(device)
        max_seq_len = max(1, max_seq_len or max_blocks_per_seq * block_size)
        if workspace is None and num_seqs:
            nbytes = self.workspace_bytes(device, num_seqs, num_heads, num_kv_heads, head_size,
                                          max_seq_len)
            if nbytes:
                workspace = torch.empty(nbytes, dtype=torch.uint8, device=device)
        ws_ptr, ws_bytes = (0, 0) if workspace is None else (
            workspace.data_ptr(), workspace.numel() * workspace.element_size()
        )
        self.module.paged_attention(
            out, query, key_cache, value_cache, block_tables, seq_lens, query_start_loc,
            num_tokens, num_seqs, num_heads, num_kv_heads, head_size, num_blocks, block_size,
            max_blocks_per_seq, 0, 0, num_tokens if max_query_len is None else max_query_len,
            max_seq_len, scale, dtype, ws_ptr, ws_bytes, sms, _index(device),
            self.stream(device),
        )


def _index(device: torch.device) -> int:
    return 0 if device.index is None else device.index


def _current_stream(device: torch.device) -> int:
    return torch.cuda.current_stream(device).cuda_stream


@functools.cache
def _num_sms(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


# device type -> kernels; everything above this table is device independent.
_BACKENDS: dict[str, _Backend] = {
    "cpu": _Backend(_DTYPES, _core._paged_attention_ptr, _core._reshape_and_cache_ptr),
}
if _cuda_ops is not None:
    _BACKENDS["cuda"] = _CudaKernels(_cuda_ops).backend()


def cuda_kernels_available() -> bool:
    """True when the CUDA extension is built and torch sees a GPU."""
    return "cuda" in _BACKENDS and torch.cuda.is_available()


def cuda_emulation_available() -> bool:
    """True when ``paternoster._cuda_emu`` (the CUDA kernels on the CPU
    emulation of ``cuda/emu``) is built: where CMake found the CUDA toolkit on
    an x86-64 host."""
    try:
        from paternoster import _cuda_emu  # noqa: F401
    except ImportError:
        return False
    return True


@contextlib.contextmanager
def emulate_cuda_kernels(num_sms: int = 132, schedule_seed: int = 0,
                         check_indices: bool = True) -> Iterator[Any]:
    """Run :func:`paged_attention`, :func:`reshape_and_cache` and
    :func:`alloc_decode_workspace` on CPU tensors through the CUDA kernels'
    own code and host API, compiled against the CPU emulation of the CUDA
    execution model (``cuda/emu/cuda_emu.h``: every CUDA thread a fiber,
    barriers and warp shuffles exact, launches synchronous). Slow; for tests
    and ``bench/gpu_check.py --dry-run`` on a machine without a GPU.

    While active, CPU tensors take the CUDA dtypes (float16, bfloat16; no
    float32) and the CUDA path's keyword arguments (``max_query_len``,
    ``max_seq_len``, ``workspace``). Index contents are checked as on the CPU
    path (block ids, lengths, ``query_start_loc``, slots, and ``max_query_len``
    against the query lengths) unless ``check_indices`` is False; then they are
    trusted as on a GPU, and a bad one reads or writes outside its tensor.
    Blocks may nest and overlap (asyncio tasks): the CPU kernels come back when
    the last one exits. Not thread-safe: it swaps this module's CPU backend.

    Args:
        num_sms: multiprocessors the split-K plan aims to fill (132: H100/H200).
        schedule_seed: 0 runs emulated threads in index order between barriers;
            another value shuffles that order per round (a missing barrier then
            changes results between seeds).
        check_indices: check index contents before each launch (see above).
    Yields:
        the ``paternoster._cuda_emu`` module (``emu_stats()``, ``set_schedule_seed()``).
    Raises:
        ValueError: the emulation is not built (see :func:`cuda_emulation_available`),
            or ``num_sms < 1``.
    """
    try:
        from paternoster import _cuda_emu
    except ImportError as e:
        raise ValueError(f"the CUDA emulation (paternoster._cuda_emu) is not available ({e}); "
                         "it is built where CMake finds the CUDA toolkit, on x86-64") from e
    if num_sms < 1:
        raise ValueError(f"num_sms must be >= 1, got {num_sms}")
    kernels = _CudaKernels(_cuda_emu, stream=lambda device: 0, num_sms=lambda device: num_sms)
    backend = kernels.backend()
    if check_indices:
        backend = backend._replace(check_indices=True)
    old_seed = _cuda_emu.set_schedule_seed(schedule_seed)
    if _EMULATION["depth"] == 0:
        _EMULATION["saved"] = _BACKENDS["cpu"]
    _EMULATION["depth"] += 1
    _BACKENDS["cpu"] = backend
    try:
        yield _cuda_emu
    finally:
        _EMULATION["depth"] -= 1
        if _EMULATION["depth"] == 0:  # the last one out restores the CPU kernels
            _BACKENDS["cpu"] = _EMULATION.pop("saved")
        _cuda_emu.set_schedule_seed(old_seed)


# emulate_cuda_kernels() blocks now open, and the CPU backend before the first.
_EMULATION: dict[str, Any] = {"depth": 0}


def _check_attention_indices(block_tables: torch.Tensor, seq_lens: torch.Tensor,
                             query_start_loc: torch.Tensor, num_tokens: int, num_blocks: int,
                             block_size: int, max_query_len: int | None) -> None:
    """The CPU kernels' checks of index contents, for the CUDA emulation
    (index tensors live in host memory there, so reading them is free): a
    bad block id, length or row range is a ``ValueError`` instead of a read
    outside a tensor.

    Raises:
        ValueError: unless ``query_start_loc`` is non-decreasing within
            ``[0, num_tokens]``; every sequence with new tokens has
            ``q_len <= seq_lens[b] <= block_tables.shape[1] * block_size`` (a
            decode row may have ``seq_lens`` 0: padding); the block ids it
            reads are in ``[0, num_blocks)``; and ``max_query_len`` bounds the
            query lengths.
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
        used = block_tables[b, : -(-n // block_size)]
        bad = (used < 0) | (used >= num_blocks)
        if bool(bad.any()):
            j = int(bad.nonzero()[0])
            raise ValueError(f"block_tables[{b}, {j}] = {int(used[j])} out of range "
                                 f"[0, {num_blocks})")
    longest = int(q_lens.max()) if len(q_lens) else 0
    if max_query_len and max_query_len < longest:  # 0 / None: the default (T)
        raise ValueError(f"max_query_len = {max_query_len} is below the longest query "
                         f"({longest} tokens): its rows would not be computed")


def _check_slots(slot_mapping: torch.Tensor, num_slots: int) -> None:
    """Raises ValueError for a slot ``>= num_slots`` (as the CPU kernel does;
    the CUDA kernel skips it)."""
    if len(slot_mapping) and int(slot_mapping.max()) >= num_slots:
        raise ValueError(f"slot_mapping has slot {int(slot_mapping.max())} out of range "
                         f"(cache has {num_slots} slots)")


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
            kernels), or a non-positive size.
    """
    device = torch.device(device)
    backend = _BACKENDS.get(device.type)
    if backend is None or backend.cuda is None:
        if _cuda_ops is None:
            raise ValueError("the CUDA kernels (paternoster._cuda_ops) are not built")
        raise ValueError(f"device {device} has no CUDA kernels")
    nbytes = backend.cuda.workspace_bytes(device, max_num_seqs, num_heads, num_kv_heads,
                                          head_size, max_seq_len)
    return torch.empty(nbytes, dtype=torch.uint8, device=device) if nbytes else None


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


def _kernel_dtype(dtypes: Mapping[torch.dtype, Any], t: torch.Tensor, name: str) -> Any:
    kernel_dtype = dtypes.get(t.dtype)
    if kernel_dtype is None:
        names = " or ".join(str(d).removeprefix("torch.") for d in dtypes)
        raise ValueError(f"{name} must be {names} on {t.device.type}, got {t.dtype}")
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


class _CacheWriteSizes(NamedTuple):
    num_tokens: int
    num_kv_heads: int
    head_size: int
    num_slots: int


def _check_cache_write(key: object, value: object, key_cache: object, value_cache: object,
                       slot_mapping: object,
                       dtypes: Mapping[torch.dtype, Any] | None = None) -> _CacheWriteSizes:
    """The checks of :func:`reshape_and_cache` (no kernel call, any device,
    meta tensors too): ValueError naming the argument, else the sizes.
    ``dtypes``: the accepted dtypes (default: those of ``key``'s device's backend)."""
    t, hkv, d = _check(key, "key", 3)
    dtype, device = key.dtype, key.device  # type: ignore[attr-defined]
    if dtypes is None:
        dtypes = _backend(device).dtypes
    _kernel_dtype(dtypes, key, "key")  # type: ignore[arg-type]
    if _check(value, "value", 3, dtype, device) != key.shape:  # type: ignore[attr-defined]
        raise ValueError(
            f"value shape {tuple(value.shape)} != key shape {tuple(key.shape)}"  # type: ignore[attr-defined]
        )
    num_blocks, block_size, c_hkv, c_d = _check_cache(key_cache, value_cache, dtype, device)
    if (c_hkv, c_d) != (hkv, d):
        raise ValueError(f"key_cache has [Hkv, D] = [{c_hkv}, {c_d}], key has [{hkv}, {d}]")
    if _check(slot_mapping, "slot_mapping", 1, torch.int64, device)[0] != t:
        raise ValueError(
            f"slot_mapping has {slot_mapping.shape[0]} entries, key has {t} tokens"  # type: ignore[attr-defined]
        )
    return _CacheWriteSizes(t, hkv, d, num_blocks * block_size)


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
        key, value: ``[T, Hkv, D]``; float32 or bfloat16 on CPU, float16 or
            bfloat16 on CUDA.
        key_cache, value_cache: ``[num_blocks, block_size, Hkv, D]``, same dtype
            and device.
        slot_mapping: int64 ``[T]``; a negative slot skips the token.

    Raises:
        ValueError: naming the argument, for a wrong type, dtype, device, shape or
            non-contiguous tensor; on CPU also for a slot
            ``>= num_blocks * block_size`` (then nothing is written; on CUDA the
            slots stay on the device and such a token is skipped).
        RuntimeError: a CUDA launch error.
    """
    t, hkv, d, num_slots = _check_cache_write(key, value, key_cache, value_cache, slot_mapping)
    device = key.device
    backend = _BACKENDS[device.type]
    if backend.check_indices:
        _check_slots(slot_mapping, num_slots)
    args = (key.data_ptr(), value.data_ptr(), key_cache.data_ptr(), value_cache.data_ptr(),
            slot_mapping.data_ptr(), t, hkv, d, num_slots, backend.dtypes[key.dtype])
    if backend.cuda is None:
        backend.reshape_and_cache(*args)
    else:
        backend.reshape_and_cache(*args, device=device)


class _AttentionSizes(NamedTuple):
    num_tokens: int
    num_seqs: int
    num_heads: int
    num_kv_heads: int
    head_size: int
    num_blocks: int
    block_size: int
    max_blocks_per_seq: int


def _check_attention(query: object, key_cache: object, value_cache: object,
                     block_tables: object, seq_lens: object, query_start_loc: object,
                     out: object | None,
                     dtypes: Mapping[torch.dtype, Any] | None = None) -> _AttentionSizes:
    """The checks of :func:`paged_attention` (no kernel call, any device, meta
    tensors too): ValueError naming the argument, else the sizes. ``dtypes``:
    the accepted dtypes (default: those of ``query``'s device's backend)."""
    t, hq, d = _check(query, "query", 3)
    dtype, device = query.dtype, query.device  # type: ignore[attr-defined]
    if dtypes is None:
        dtypes = _backend(device).dtypes
    _kernel_dtype(dtypes, query, "query")  # type: ignore[arg-type]
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
    if out is not None and _check(out, "out", 3, dtype, device) != query.shape:  # type: ignore[attr-defined]
        raise ValueError(
            f"out shape {tuple(out.shape)} != query shape {tuple(query.shape)}"  # type: ignore[attr-defined]
        )
    return _AttentionSizes(t, b, hq, hkv, d, num_blocks, block_size, max_blocks)


def paged_attention(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
    out: torch.Tensor | None = None,
    *,
    max_query_len: int | None = None,
    max_seq_len: int | None = None,
    workspace: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal attention of this step's queries over the paged KV cache.

    Query row i of sequence b (``q_len = query_start_loc[b+1] - query_start_loc[b]``)
    sits at position ``seq_lens[b] - q_len + i`` and attends to the cached
    positions ``0 ..`` that position, read through ``block_tables[b]``:
    ``out = softmax(scale * q K^T) V`` per head. One call may mix whole prompts,
    prefill chunks over earlier cached context and single decode tokens. GQA /
    MQA: query head h reads kv head ``h // (Hq // Hkv)``. The cache must already
    hold this step's keys and values (:func:`reshape_and_cache`). 16-bit
    inputs are accumulated in float32.

    CPU: the C++ core on :func:`set_num_threads` threads; the index tensors
    are validated (block ids, lengths) before anything is written.
    CUDA: sequences with ``q_len == 1`` run the decode kernel (one thread block
    per sequence, kv head and context split; K/V read once per GQA group;
    split-K after Flash-Decoding with a reduction kernel), the others the
    prefill kernel (tiles of queries against tiles of keys with the online
    softmax of FlashAttention). Index contents are trusted (reading them would
    cost a sync); head size 64 or 128, block size a power of two >= 8. A
    decode row whose ``seq_lens`` entry is 0 is written as zeros (padding).

    Args:
        query: ``[T, Hq, D]``; float32 or bfloat16 on CPU, float16 or bfloat16
            on CUDA.
        key_cache, value_cache: ``[num_blocks, block_size, Hkv, D]``, same dtype;
            Hq must be a multiple of Hkv.
        block_tables: int32 ``[B, max_blocks_per_seq]``; only the first
            ``ceil(seq_lens[b] / block_size)`` entries of row b are read.
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

    Returns:
        ``out`` (a new ``[T, Hq, D]`` tensor if not given).

    Raises:
        ValueError: naming the argument, for a wrong type, dtype, device, shape,
            non-contiguous tensor, an unsupported head or block size (CUDA); on
            CPU also for a block id outside the cache, a sequence whose
            ``seq_lens`` is below its query length or above
            ``max_blocks_per_seq * block_size``, or a bad ``query_start_loc``.
        RuntimeError: a CUDA launch error.
    """
    sizes = _check_attention(query, key_cache, value_cache, block_tables, seq_lens,
                             query_start_loc, out)
    device = query.device
    backend = _BACKENDS[device.type]
    if backend.check_indices:
        _check_attention_indices(block_tables, seq_lens, query_start_loc, sizes.num_tokens,
                                 sizes.num_blocks, sizes.block_size, max_query_len)
    if out is None:
        out = torch.empty_like(query)
    args = (out.data_ptr(), query.data_ptr(), key_cache.data_ptr(), value_cache.data_ptr(),
            block_tables.data_ptr(), seq_lens.data_ptr(), query_start_loc.data_ptr(), *sizes,
            float(scale), backend.dtypes[query.dtype])
    if backend.cuda is None:
        backend.paged_attention(*args)
    else:
        backend.paged_attention(*args, device=device, max_query_len=max_query_len,
                                max_seq_len=max_seq_len, workspace=workspace)
    return out


# ---------------------------------------------------------------- fused elementwise ops
#
# One pass over the rows instead of a chain of small tensor ops (and their
# float32 copies): at decode sizes their dispatch costs more than their
# arithmetic. CPU tensors run the C++ core (float32 or bfloat16, float32
# arithmetic, parallel over rows on :func:`set_num_threads` threads for large
# calls); tensors on other devices (CUDA) run the torch code of
# :mod:`paternoster.model` (rms_norm_torch, silu_and_mul_torch,
# rotary_embedding_torch), without the CPU checks.


def _elsewhere(t: object) -> bool:
    """True for a tensor on a non-CPU device (the torch fallback runs)."""
    return isinstance(t, torch.Tensor) and t.device.type != "cpu"


def _check_rows(t: object, name: str) -> tuple[int, int]:
    """[rows, width] of a contiguous 2-D CPU-kernel tensor, else ValueError."""
    rows, w = _check(t, name, 2)
    _kernel_dtype(_DTYPES, t, name)  # type: ignore[arg-type]
    return rows, w


def _check_weight(weight: object, x: torch.Tensor, hidden: int) -> None:
    (n,) = _check(weight, "weight", 1, x.dtype, x.device)
    if n != hidden:
        raise ValueError(f"weight has {n} entries, x has hidden size {hidden}")


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float,
             out: torch.Tensor | None = None) -> torch.Tensor:
    """RMSNorm (Zhang & Sennrich 2019) of each row, with HF Llama's roundings.

    ``out = round(round(x * inv_rms) * weight)`` with
    ``inv_rms = 1 / sqrt(mean(x ** 2) + eps)`` in float32 and ``round`` to the
    dtype: the normalised row is cast to the model dtype before the weight is
    applied in that dtype, as HF's ``LlamaRMSNorm`` does, so bfloat16 results
    carry the same bits as torch's (up to the order of the float32 sum).

    Args:
        x: ``[T, H]``, contiguous; float32 or bfloat16 on CPU.
        weight: ``[H]``, same dtype and device.
        eps: added to the mean square (>= 0).
        out: optional ``[T, H]`` output (may be ``x``); new if not given.

    Returns:
        ``out``.

    Raises:
        ValueError: naming the argument, for a wrong type, dtype, device, shape
            or a non-contiguous tensor, or a negative ``eps``.
    """
    if _elsewhere(x):
        from paternoster.model.llama import rms_norm_torch

        y = rms_norm_torch(x, weight, eps)
        return y if out is None else out.copy_(y)
    t, h = _check_rows(x, "x")
    _check_weight(weight, x, h)
    if out is None:
        out = torch.empty_like(x)
    elif _check(out, "out", 2, x.dtype, x.device) != x.shape:
        raise ValueError(f"out shape {tuple(out.shape)} != x shape {tuple(x.shape)}")
    _core._rms_norm_ptr(out.data_ptr(), x.data_ptr(), weight.data_ptr(), t, h, float(eps),
                        _DTYPES[x.dtype])
    return out


def fused_add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                       eps: float) -> None:
    """Residual add and RMSNorm in one pass, in place (vLLM's ``fused_add_rms_norm``):
    ``residual = round(x + residual)``, then ``x = rms_norm(residual, weight, eps)``.

    A pre-norm decoder carries the residual stream through its layers this way:
    the add that closes one sub-block and the norm that opens the next are one
    kernel. The add rounds once, like torch's ``x + residual`` in the dtype,
    and the norm reads the rounded sum, so the bits equal the unfused code's.

    Args:
        x: ``[T, H]``, contiguous; float32 or bfloat16 on CPU. Overwritten
            with the normalised rows.
        residual: ``[T, H]``, same dtype and device, not ``x`` itself.
            Overwritten with ``x + residual``.
        weight: ``[H]``, same dtype and device.
        eps: added to the mean square (>= 0).

    Raises:
        ValueError: naming the argument, for a wrong type, dtype, device, shape
            or a non-contiguous tensor, ``residual`` starting where ``x`` does,
            or a negative ``eps``.
    """
    if _elsewhere(x):
        from paternoster.model.llama import rms_norm_torch

        residual.add_(x)
        x.copy_(rms_norm_torch(residual, weight, eps))
        return
    t, h = _check_rows(x, "x")
    if _check(residual, "residual", 2, x.dtype, x.device) != x.shape:
        raise ValueError(f"residual shape {tuple(residual.shape)} != x shape {tuple(x.shape)}")
    _check_weight(weight, x, h)
    _core._fused_add_rms_norm_ptr(x.data_ptr(), residual.data_ptr(), weight.data_ptr(), t, h,
                                  float(eps), _DTYPES[x.dtype])


def silu_and_mul(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """SwiGLU's gating (Shazeer 2020, "GLU Variants Improve Transformer"):
    ``silu(gate) * up`` for ``x = [gate | up]``.

    ``silu(g) = g / (1 + exp(-g))``, computed in float32 together with the
    product and rounded once. Torch's ``F.silu(gate) * up`` rounds the SiLU
    output to the dtype first, so in bfloat16 an element may differ from it by
    one unit in the last place (relative 2**-8); in float32 by a few ulps.

    Args:
        x: ``[T, 2 * I]``, contiguous: the fused gate/up projection, gate
            columns first; float32 or bfloat16 on CPU.
        out: optional ``[T, I]`` output of ``x``'s dtype (not overlapping ``x``).

    Returns:
        ``out`` (a new ``[T, I]`` tensor if not given).

    Raises:
        ValueError: naming the argument, for a wrong type, dtype, device, shape
            (odd width), a non-contiguous tensor or ``out`` overlapping ``x``.
    """
    if _elsewhere(x):
        from paternoster.model.llama import silu_and_mul_torch

        y = silu_and_mul_torch(x)
        return y if out is None else out.copy_(y)
    t, w = _check_rows(x, "x")
    if w % 2:
        raise ValueError(f"x must have an even number of columns (gate, up), got {w}")
    inter = w // 2
    if out is None:
        out = torch.empty((t, inter), dtype=x.dtype, device=x.device)
    elif tuple(_check(out, "out", 2, x.dtype, x.device)) != (t, inter):
        raise ValueError(f"out must have shape {(t, inter)}, got {tuple(out.shape)}")
    _core._silu_and_mul_ptr(out.data_ptr(), x.data_ptr(), t, inter, _DTYPES[x.dtype])
    return out


def _check_heads(t: object, name: str, head_size: int, dtype: torch.dtype | None,
                 device: torch.device | None) -> tuple[int, int, int]:
    """(tokens, heads, row stride) of a [T, H, D] or [T, H * D] tensor whose
    heads are contiguous within a row; rows may be further apart."""
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


def rotary_embedding(positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor,
                     cos_sin_cache: torch.Tensor, head_size: int, is_neox: bool = True) -> None:
    """Rotary position embedding (RoPE, Su et al. 2021, "RoFormer"), in place on
    the queries and keys of a flattened batch; the table lookup is fused in.

    Token t's pair i turns by the angle of row ``positions[t]`` of the table:
    ``x_a' = x_a cos - x_b sin``, ``x_b' = x_b cos + x_a sin``, with pairs
    ``(i, i + D/2)`` when ``is_neox`` (GPT-NeoX / HF Llama "rotate half") and
    ``(2i, 2i + 1)`` otherwise (GPT-J). On CPU both products are rounded to
    the dtype before the sum, as HF's ``q * cos + rotate_half(q) * sin``.

    Args:
        positions: int64 ``[T]``, each in ``[0, max_positions)``.
        query: ``[T, Hq, D]`` or ``[T, Hq * D]``; float32 or bfloat16 on CPU.
            Heads must be contiguous within a row, rows may be further apart
            (a view into a fused qkv projection works, no copy).
        key: ``[T, Hkv, D]`` or ``[T, Hkv * D]``, same dtype and device, the
            same layout rules.
        cos_sin_cache: ``[max_positions, D]``, contiguous, the dtype of
            ``query``: the cos of a position's D/2 angles, then their sin (any
            frequency scaling folded in; see
            :class:`paternoster.model.rope.RotaryEmbedding`).
        head_size: D (even).
        is_neox: the pairing (above).

    Raises:
        ValueError: naming the argument, for a wrong type, dtype, device or
            shape, heads not contiguous within a row, an odd ``head_size``,
            or (CPU) a position outside the table (then nothing is written).
    """
    if _elsewhere(query):
        from paternoster.model.rope import rotary_embedding_torch

        rotary_embedding_torch(positions, query, key, cos_sin_cache, is_neox)
        return
    if head_size <= 0 or head_size % 2:
        raise ValueError(f"head_size must be even and > 0, got {head_size}")
    t, hq, q_stride = _check_heads(query, "query", head_size, None, None)
    dtype = _kernel_dtype(_DTYPES, query, "query")
    t_k, hkv, k_stride = _check_heads(key, "key", head_size, query.dtype, query.device)
    if t_k != t:
        raise ValueError(f"key has {t_k} tokens, query has {t}")
    if _check(positions, "positions", 1, torch.int64, query.device)[0] != t:
        raise ValueError(f"positions has {positions.shape[0]} entries, query has {t} tokens")
    max_pos, d = _check(cos_sin_cache, "cos_sin_cache", 2, query.dtype, query.device)
    if d != head_size:
        raise ValueError(f"cos_sin_cache has {d} columns, expected head_size={head_size}")
    _core._rotary_embedding_ptr(positions.data_ptr(), query.data_ptr(), key.data_ptr(),
                                cos_sin_cache.data_ptr(), t, hq, hkv, head_size, q_stride,
                                k_stride, max_pos, bool(is_neox), dtype)
