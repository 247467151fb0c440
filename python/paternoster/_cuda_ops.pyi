"""Type stubs for ``paternoster._cuda_ops``, the pybind11 module over the CUDA
kernels (``cuda/``): paged attention (a split-K decode kernel after
Flash-Decoding, Dao et al. 2023, plus a prefill kernel with FlashAttention's
online softmax) and ``reshape_and_cache``, over the PagedAttention layout
(Kwon et al., SOSP'23).

Built only where CMake found a CUDA compiler. Torch-free: every tensor is a
device address (``tensor.data_ptr()``), ``stream`` is a ``cudaStream_t`` as an
integer (``torch.cuda.Stream.cuda_stream``) and ``device`` the CUDA device
index, made current for the launch. Linked with the static CUDA runtime, so
the import works without a GPU or driver. Nothing reads device memory on the
host or allocates, so calls can be captured in a CUDA graph.

Errors: ``ValueError`` for arguments the kernels cannot handle (checked before
any CUDA call); ``RuntimeError`` naming the CUDA error for a failed launch or a
machine without a usable GPU. Use :mod:`paternoster.kernels`, which checks tensor
dtypes, devices and shapes first.
"""

from __future__ import annotations

import enum

MIN_SPLIT_TOKENS: int
"""Fewest context tokens one decode split handles (128)."""
MAX_SPLITS: int
"""Most splits of one sequence's context (32)."""

class DType(enum.Enum):
    """Element type (fp32 accumulation inside the kernels)."""

    float16 = 0
    bfloat16 = 1

def device_count() -> int:
    """CUDA devices this module's runtime sees; 0 without a GPU or driver."""

def reshape_and_cache(
    key: int, value: int, key_cache: int, value_cache: int, slot_mapping: int,
    num_tokens: int, num_kv_heads: int, head_size: int, key_stride: int, value_stride: int,
    num_slots: int, dtype: DType, device: int, stream: int,
) -> None:
    """Copy ``key[t]``/``value[t]`` ([Hkv, D], token strides ``key_stride`` /
    ``value_stride`` elements, 0 = dense) into cache slot ``slot_mapping[t]``
    (int64) of caches ``[num_blocks, block_size, Hkv, D]``; negative slots and
    slots ``>= num_slots`` are skipped. Head size even."""

def paged_attention(
    out: int, query: int, key_cache: int, value_cache: int, block_tables: int,
    seq_lens: int, query_start_loc: int, num_tokens: int, num_seqs: int, num_heads: int,
    num_kv_heads: int, head_size: int, num_blocks: int, block_size: int,
    max_blocks_per_seq: int, query_stride: int, out_stride: int, max_query_len: int,
    max_seq_len: int, scale: float, dtype: DType, workspace: int, workspace_bytes: int,
    num_sms: int, device: int, stream: int, sliding_window: int = 0, sinks: int = 0,
) -> None:
    """Causal paged attention, layouts as in :mod:`paternoster.kernels`
    (``sliding_window`` W > 0: each query sees its last W positions; blocks
    wholly before the first query's window are not read; ``sinks``: device
    address of float32 ``[num_heads]`` attention-sink logits, 0 = none); head size
    64, 128 or 256, block size a power of two >= 8, 16-byte aligned pointers,
    strides (0 = dense) multiples of 8 elements. ``max_query_len`` (0 = T) and
    ``max_seq_len`` (0 = max_blocks_per_seq * block_size) are upper bounds;
    ``max_query_len == 1`` runs only the decode kernel. ``workspace`` (16-byte
    aligned, ``workspace_bytes`` long, may be 0) bounds the decode splits;
    ``num_sms`` 0 = ask the runtime."""

def decode_num_splits(num_seqs: int, num_heads: int, num_kv_heads: int, max_seq_len: int,
                      num_sms: int) -> int:
    """Context splits of the decode kernel for a batch of these sizes (1..32)."""

def decode_workspace_bytes(max_num_seqs: int, num_heads: int, num_kv_heads: int,
                           head_size: int, max_seq_len: int, num_sms: int) -> int:
    """Workspace bytes for any decode batch of up to ``max_num_seqs`` sequences:
    ``max over B of B * Hq * splits(B) * (D + 2) * 4``; 0 if none splits."""
