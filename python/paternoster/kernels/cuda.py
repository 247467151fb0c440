"""The CUDA backend: the paged-attention kernels of ``paternoster._cuda_ops``
(float16, bfloat16) launched on the current stream without any host
synchronisation, so a call can be captured in a CUDA graph; the elementwise
ops are the torch reference (no fused CUDA kernels yet).

Sequences with one query token run the decode kernel (one thread block per
sequence, kv head and context split, K/V read once per GQA group; split-K
after Flash-Decoding, Dao et al. 2023, merged by a reduction kernel), the
others the prefill kernel (tiles of queries against tiles of keys with the
online softmax of FlashAttention). The split-K workspace is allocated once by
the caller (:meth:`CudaBackend.alloc_decode_workspace`) and passed in.

The same class drives the CPU emulation of these kernels
(:mod:`paternoster.kernels.emulation`): only the module, stream and
multiprocessor count differ.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from paternoster.kernels.backend import Backend
from paternoster.kernels.checks import AttentionSizes, CacheWriteSizes


def load_cuda_ops() -> Any | None:
    """``paternoster._cuda_ops``, or None where the build had no CUDA compiler.

    Raises:
        ImportError: the extension is there but does not load (a broken build
            fails loudly; only a missing module reads as "not built").
    """
    try:
        from paternoster import _cuda_ops
    except ModuleNotFoundError as e:
        if e.name != "paternoster._cuda_ops":
            raise
        return None
    return _cuda_ops


def _current_stream(device: torch.device) -> int:
    return torch.cuda.current_stream(device).cuda_stream


@functools.cache
def _num_sms(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def _index(device: torch.device) -> int:
    return 0 if device.index is None else device.index


class CudaBackend(Backend):
    """The CUDA kernels of ``module`` behind the :class:`Backend` interface.

    Args:
        module: ``paternoster._cuda_ops``, ``paternoster._cuda_emu`` or a fake
            with the same functions (``paged_attention``,
            ``reshape_and_cache``, ``decode_workspace_bytes``, ``DType``).
        stream: device -> integer ``cudaStream_t`` of the stream to launch on
            (default: torch's current stream).
        num_sms: device -> multiprocessor count (sizes the split-K grid).
        check_indices: check index contents before each launch (the
            emulation's, whose "device" memory is host memory; a GPU trusts
            them, since reading them would cost a sync).
    """

    def __init__(self, module: Any, stream: Callable[[torch.device], int] | None = None,
                 num_sms: Callable[[torch.device], int] | None = None,
                 check_indices: bool = False) -> None:
        self.module = module
        self.stream = stream or _current_stream
        self.num_sms = num_sms or _num_sms
        self.check_indices = check_indices
        self.dtypes = {torch.float16: module.DType.float16,
                       torch.bfloat16: module.DType.bfloat16}

    def workspace_bytes(self, device: torch.device, max_num_seqs: int, num_heads: int,
                        num_kv_heads: int, head_size: int, max_seq_len: int) -> int:
        """Split-K workspace bytes for decode batches up to these sizes on ``device``.

        Raises:
            ValueError: sizes the kernels refuse (head size, batch size).
        """
        return self.module.decode_workspace_bytes(max_num_seqs, num_heads, num_kv_heads,
                                                  head_size, max_seq_len, self.num_sms(device))

    def alloc_decode_workspace(self, device: torch.device | str, max_num_seqs: int,
                               num_heads: int, num_kv_heads: int, head_size: int,
                               max_seq_len: int) -> torch.Tensor | None:
        """A uint8 workspace for every decode batch up to these sizes, or None
        when none of them splits (see
        :func:`paternoster.kernels.alloc_decode_workspace`).

        Raises:
            ValueError: sizes the kernels refuse.
        """
        device = torch.device(device)
        nbytes = self.workspace_bytes(device, max_num_seqs, num_heads, num_kv_heads,
                                      head_size, max_seq_len)
        return torch.empty(nbytes, dtype=torch.uint8, device=device) if nbytes else None

    def _reshape_and_cache(self, key: torch.Tensor, value: torch.Tensor,
                           key_cache: torch.Tensor, value_cache: torch.Tensor,
                           slot_mapping: torch.Tensor, sizes: CacheWriteSizes) -> None:
        """Launch the cache write (slots past the cache are skipped on the
        device, not reported)."""
        device = key.device
        t, hkv, d, num_slots = sizes
        self.module.reshape_and_cache(
            key.data_ptr(), value.data_ptr(), key_cache.data_ptr(), value_cache.data_ptr(),
            slot_mapping.data_ptr(), t, hkv, d, 0, 0, num_slots, self.dtypes[key.dtype],
            _index(device), self.stream(device),
        )

    def _paged_attention(self, out: torch.Tensor, query: torch.Tensor,
                         key_cache: torch.Tensor, value_cache: torch.Tensor,
                         block_tables: torch.Tensor, seq_lens: torch.Tensor,
                         query_start_loc: torch.Tensor, sizes: AttentionSizes, scale: float,
                         max_query_len: int | None, max_seq_len: int | None,
                         workspace: torch.Tensor | None, batch_invariant: bool = False,
                         sliding_window: int = 0, sinks: torch.Tensor | None = None) -> None:
        """Launch the decode and prefill kernels. Without ``workspace``, one
        sized for this batch comes from torch's caching allocator (inside a
        graph capture, from the graph's pool)."""
        device = query.device
        sms = self.num_sms(device)
        max_seq_len = max(1, max_seq_len or sizes.max_blocks_per_seq * sizes.block_size)
        if workspace is None and sizes.num_seqs:
            nbytes = self.workspace_bytes(device, sizes.num_seqs, sizes.num_heads,
                                          sizes.num_kv_heads, sizes.head_size, max_seq_len)
            if nbytes:
                workspace = torch.empty(nbytes, dtype=torch.uint8, device=device)
        ws_ptr, ws_bytes = (0, 0) if workspace is None else (
            workspace.data_ptr(), workspace.numel() * workspace.element_size()
        )
        self.module.paged_attention(
            out.data_ptr(), query.data_ptr(), key_cache.data_ptr(), value_cache.data_ptr(),
            block_tables.data_ptr(), seq_lens.data_ptr(), query_start_loc.data_ptr(), *sizes,
            0, 0, sizes.num_tokens if max_query_len is None else max_query_len, max_seq_len,
            scale, self.dtypes[query.dtype], ws_ptr, ws_bytes, sms, _index(device),
            self.stream(device), sliding_window, 0 if sinks is None else sinks.data_ptr(),
        )
