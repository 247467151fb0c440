"""Type stubs for ``paternoster._core``, the pybind11 module over the C++ core
(``core/``): KV block pool, KV cache manager, batch builder, the CPU
paged-attention kernels and the fused elementwise ops of the decoder block
(RMSNorm, SwiGLU gating, RoPE).

Block tables and the KV layout follow PagedAttention (Kwon et al., SOSP'23);
automatic prefix caching follows vLLM's (chained block hashes, an LRU of freed
cached blocks; SGLang's RadixAttention is the radix-tree take on the same idea).
Request ids are caller-chosen int64. Errors: ``ValueError`` for bad arguments
(unknown request, double free, out-of-range id, bad shapes); ``OutOfBlocksError``
when ``BlockPool.allocate`` asks for more blocks than are free. None of the
classes is thread safe; use each from one thread.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import TypeAlias

import numpy as np
import numpy.typing as npt

IntArray: TypeAlias = npt.ArrayLike
"""Any 1-D integer array-like: a list of ints or a numpy integer array."""

class OutOfBlocksError(RuntimeError):
    """``BlockPool.allocate(n)`` with fewer than ``n`` free blocks (nothing was
    allocated)."""

class DType(enum.Enum):
    """Element type of the attention tensors (bfloat16 is stored as uint16)."""

    float32 = 0
    bfloat16 = 1

class BlockPool:
    """A fixed set of KV cache blocks with reference counts.

    Free blocks form an intrusive doubly linked list (O(1) take and return);
    blocks are taken from the front and returned to the back, so the free list
    is in least-recently-freed order. Block ids are in ``[0, num_blocks)``.

    With ``enable_caching`` a block may carry a 64-bit block hash and be found
    by it (:meth:`cached_block`). A cached block whose ref count drops to 0
    keeps its hash and contents and stays in the free list as an eviction
    candidate: :meth:`touch` revives it, :meth:`allocate` evicts it (drops the
    hash) when it reaches the front. Freed cached blocks go to the back and
    uncached ones to the front, so uncached blocks are reused first and cached
    ones are evicted least recently used first. The cache methods raise
    ``RuntimeError`` when caching is off.
    """

    def __init__(self, num_blocks: int, enable_caching: bool = False) -> None:
        """Args: num_blocks: number of blocks (>= 0); enable_caching: keep block
        hashes (prefix caching). Raises ValueError if ``num_blocks`` is negative."""
    def allocate(self, n: int) -> list[int]:
        """Take ``n`` free blocks from the front of the free list, each with ref
        count 1, all or nothing; cached ones taken are evicted (hash dropped,
        generation bumped).

        Raises:
            ValueError: ``n < 0``.
            OutOfBlocksError: fewer than ``n`` blocks free (nothing allocated).
        """
    def can_allocate(self, n: int) -> bool:
        """Whether ``allocate(n)`` would succeed."""
    def free(self, block_ids: IntArray) -> None:
        """Drop one reference per listed block (list a block k times to drop k
        references); blocks reaching 0 go back to the free list.

        Raises:
            ValueError: an id out of range, or a block with no reference left
                (double free). Then no ref count changes.
        """
    def incr_ref(self, block_ids: IntArray) -> None:
        """Add one reference per listed block (sharing). Raises ValueError if an id
        is out of range or a block is free (then nothing changes)."""
    def touch(self, block_ids: IntArray) -> None:
        """Add one reference per listed block, taking free ones out of the free
        list (a cache hit; the hash is kept). Raises ValueError if an id is out
        of range (then nothing changes)."""
    def cache_block(self, block_id: int, block_hash: int) -> bool:
        """Register in-use block ``block_id`` under ``block_hash`` (uint64).
        Returns False, changing nothing, if another block holds that hash.
        Raises ValueError if the block is out of range, free or already cached;
        RuntimeError with caching off."""
    def cached_block(self, block_hash: int) -> int | None:
        """The block registered under ``block_hash`` (in use or free), if any."""
    def reset_cache(self) -> int:
        """Drop every block's hash; cached free blocks move to the front of the
        free list. Returns the number of blocks uncached."""
    def block_hash(self, block_id: int) -> int | None:
        """The block's hash, or None if uncached (always None with caching off)."""
    def generation(self, block_id: int) -> int:
        """How many times :meth:`allocate` handed the block out; with the id it
        names one content of the block."""
    def num_cached_blocks(self) -> int:
        """Blocks with a hash (free or in use)."""
    def num_evictions(self) -> int:
        """Cached blocks evicted by :meth:`allocate` so far."""
    def enable_caching(self) -> bool: ...
    def free_block_ids(self) -> list[int]:
        """Free blocks in the order :meth:`allocate` takes them (O(free); for tests)."""
    def ref_count(self, block_id: int) -> int:
        """References held on a block (0 = free). Raises ValueError if out of range."""
    def num_blocks(self) -> int:
        """Total blocks."""
    def num_free_blocks(self) -> int:
        """Blocks with ref count 0."""
    def usage(self) -> float:
        """Fraction of blocks in use, in [0, 1] (0 for an empty pool)."""

class KVCacheManager:
    """Per-request block tables over a :class:`BlockPool`, with optional
    automatic prefix caching.

    Token at position ``p`` of request ``r`` lives in block
    ``block_table(r)[p // block_size]``, slot ``p % block_size``. Tables only grow
    until the request is freed.

    Prefix caching (``enable_caching=True``): each full block of a request gets
    a hash chained from its parent block's hash and its token ids (the first
    block's parent is a hash of the request's ``cache_salt``): FNV-1a 64 over a
    fixed little-endian encoding plus the splitmix64 finalizer, the same in
    every process and run. For N cached blocks the odds that two share a hash
    are about N**2 / 2**65, and a shared hash never returns wrong KV: a hit must
    also hold the same token ids, follow the same parent block (id and
    generation) and, for a first block, have the same salt; otherwise it is a
    miss. A new request calls :meth:`get_computed_blocks` (the longest cached
    prefix, in whole blocks, becomes the start of its table); once KV for
    tokens is written, :meth:`cache_blocks` / :meth:`cache_computed_blocks`
    registers the newly full blocks. Freed cached blocks stay reusable until
    evicted (LRU; a request's tail blocks first).
    """

    def __init__(self, num_blocks: int, block_size: int, enable_caching: bool = False,
                 sliding_windows: list[int] | None = None, recurrent: list[bool] | None = None,
                 num_state_slots: int = 0) -> None:
        """Args: num_blocks (>= 0) blocks of block_size (>= 1) tokens each;
        enable_caching: automatic prefix caching (off: exactly the behaviour
        without it); sliding_windows: one entry per KV cache group (the layers
        sharing a block table; vLLM's hybrid KV cache manager), the group's
        attention window in tokens or 0 for full attention (None: one
        full-attention group). All groups draw from the one pool; a request
        has one table per group and a token's block index is the same in each.
        recurrent: per group, whether it is a recurrent-state group
        (linear-attention layers: one state slot per request, from a pool of
        ``num_state_slots``, held from its first allocation until it is
        freed; its block table is that slot). Raises ValueError for bad
        sizes, no group, a negative window, a windowed recurrent group,
        recurrent groups without state slots or with ``enable_caching``."""
    def recurrent(self, group: int) -> bool:
        """Whether group ``group`` is a recurrent-state group."""
    def num_required_state_slots(self, req_id: int) -> int:
        """State slots the request would take (recurrent groups it holds
        none in; 0 without recurrent groups)."""
    def num_state_slots(self) -> int:
        """The recurrent groups' state slot pool size."""
    def num_free_state_slots(self) -> int:
        """Free state slots."""
    def state_usage(self) -> float:
        """Fraction of state slots in use, in [0, 1] (0 without any)."""
    def num_groups(self) -> int:
        """KV cache groups (1 unless ``sliding_windows`` named more)."""
    def sliding_window(self, group: int) -> int:
        """Group ``group``'s window in tokens (0: full attention); ValueError
        if out of range."""
    def num_required_blocks(self, req_id: int, num_tokens: int,
                            num_computed_tokens: int = 0) -> int:
        """Blocks the request needs beyond those it holds to have KV slots for
        its first ``num_tokens`` tokens once ``num_computed_tokens`` are
        computed: sliding-window groups first release the blocks wholly below
        ``num_computed_tokens - window + 1``, so this is the net growth over
        all groups (at least 0; with one full group ``max(0, ceil(num_tokens /
        block_size) - len(table))``). A planner may pass a future computed
        count to get that step's need. An unknown request holds nothing.
        Raises ValueError if a count is negative."""
    def can_allocate(self, req_id: int, num_tokens: int, num_computed_tokens: int = 0) -> bool:
        """Whether ``allocate_slots(req_id, num_tokens, num_computed_tokens)``
        would succeed."""
    def allocate_slots(self, req_id: int, num_tokens: int, num_computed_tokens: int = 0) -> bool:
        """Grow the request's tables to cover its first ``num_tokens`` tokens,
        all or nothing: returns False (changing nothing) when too few blocks
        are free. Sliding-window groups first release the blocks out of reach
        of position ``num_computed_tokens`` (entries become -1); pass the
        request's true computed count, which must not decrease while it lives.
        Creates the tables if the request is new."""
    def num_request_blocks(self, req_id: int) -> int:
        """Blocks the request holds in all groups (released ones not counted)."""
    def free(self, req_id: int) -> None:
        """Return all the request's blocks to the pool and forget it (no-op if
        unknown). With caching on, the last block is released first, so the
        request's tail is evicted before its prefix."""
    def get_computed_blocks(
        self, req_id: int, token_ids: IntArray, cache_salt: str | None = None
    ) -> int:
        """Look up the longest cached prefix of ``token_ids`` for a request with
        no table yet, in whole blocks, leaving at least the last token to compute.

        The hit blocks get one more reference each (they cannot be evicted) and
        become the request's block table; call :meth:`free` if the request is
        not admitted after all. Counts ``len(token_ids)`` queried tokens and the
        hit tokens.

        Args:
            req_id: the request.
            token_ids: all its tokens so far (prompt, plus outputs after a
                preemption), 1-D integers.
            cache_salt: requests share cached blocks only with requests of the
                same salt (None: no salt).
        Returns:
            Tokens whose KV is cached (a multiple of ``block_size``; 0 with
            caching off).
        Raises:
            ValueError: the request already has a table, or bad ``token_ids``.
        """
    def num_cached_prefix_tokens(self, token_ids: IntArray, cache_salt: str | None = None) -> int:
        """Tokens :meth:`get_computed_blocks` would find cached for ``token_ids``
        now, taking nothing: no reference, no block table, no counters (a
        planner's estimate for a request not admitted yet; the blocks may be
        evicted before it is). 0 with caching off.

        Raises:
            ValueError: bad ``token_ids``.
        """
    def cache_blocks(self, req_id: int, token_ids: IntArray, num_tokens: int | None = None) -> None:
        """Register the request's full blocks among its first ``num_tokens``
        tokens (default ``len(token_ids)``), whose KV must already be written.

        Incremental (blocks registered before are skipped). A block whose
        content another block already caches stays uncached; after a hash
        collision or an evicted parent the request caches nothing more. No-op
        with caching off.

        Raises:
            ValueError: unknown request, ``num_tokens`` negative or above
                ``len(token_ids)``, or fewer blocks allocated than
                ``num_tokens // block_size``.
        """
    def cache_computed_blocks(
        self, batch_builder: BatchBuilder, req_ids: IntArray, num_computed_tokens: IntArray
    ) -> None:
        """:meth:`cache_blocks` for many requests in one call, reading each
        request's token ids from ``batch_builder``: request ``req_ids[i]`` has
        KV written for its first ``num_computed_tokens[i]`` tokens. Requests
        with no newly full block cost one hash lookup each (and are not
        checked further).

        Raises:
            ValueError: arrays of different lengths, or (for a request with a
                new full block) a request unknown to the builder or to this
                manager, or more computed tokens than it holds.
        """
    def reset_prefix_cache(self) -> int:
        """Forget every cached block (running requests keep their blocks but
        cache nothing more). Returns the blocks uncached (0 with caching off).
        Counters are kept."""
    def enable_caching(self) -> bool: ...
    def prefix_cache_queries(self) -> int:
        """Tokens passed to :meth:`get_computed_blocks` so far."""
    def prefix_cache_hits(self) -> int:
        """Of those, tokens found cached."""
    def num_cached_blocks(self) -> int:
        """Blocks registered in the prefix cache (in use or free)."""
    def _set_hash_mask_for_testing(self, mask: int) -> None:
        """Test hook: and every block hash with ``mask`` (0: all collide)."""
    @property
    def pool(self) -> BlockPool:
        """The underlying pool (read it; changing it breaks the manager)."""
    def block_table(self, req_id: int, group: int = 0) -> np.ndarray:
        """A copy of the request's block table in KV cache group ``group``, int32
        ``[num_blocks_of_request]`` (-1 where a sliding window released the
        block). Raises ValueError if the request or group is unknown."""
    def has_request(self, req_id: int) -> bool: ...
    def num_requests(self) -> int:
        """Requests with a table."""
    def num_free_blocks(self) -> int: ...
    def num_blocks(self) -> int: ...
    def block_size(self) -> int:
        """Tokens per block."""
    def usage(self) -> float:
        """KV cache usage: fraction of blocks in use, in [0, 1]."""

class BatchBuilder:
    """Keeps every live request's token ids and flattens a step's schedule into
    the arrays the forward pass needs, with no per-token Python work.

    Block tables come from the :class:`KVCacheManager` given at construction
    (kept alive by this object).
    """

    def __init__(self, kv_cache_manager: KVCacheManager) -> None: ...
    def add_request(self, req_id: int, token_ids: IntArray) -> None:
        """Register a request with its prompt token ids. Raises ValueError if the
        id is already registered or ``token_ids`` is not 1-D."""
    def append_tokens(self, req_ids: IntArray, token_ids: IntArray) -> None:
        """Append ``token_ids[i]`` to request ``req_ids[i]`` for every i (one token
        each; int64 ``[B]`` ids, int64 or int32 ``[B]`` tokens). Raises ValueError,
        appending nothing, if an id is unknown or the lengths differ."""
    def remove_request(self, req_id: int) -> None:
        """Forget a request's tokens (no-op if unknown). Does not free KV blocks."""
    def num_tokens(self, req_id: int) -> int:
        """Tokens held (prompt + appended). Raises ValueError if unknown."""
    def has_request(self, req_id: int) -> bool: ...
    def num_requests(self) -> int: ...
    def token_ids(self, req_id: int) -> np.ndarray:
        """A copy of the request's tokens, int64. Raises ValueError if unknown."""
    def build(
        self, req_ids: IntArray, num_computed_tokens: IntArray, num_scheduled_tokens: IntArray
    ) -> dict[str, np.ndarray]:
        """Flatten one step: request ``req_ids[b]`` computes its tokens
        ``num_computed_tokens[b] .. num_computed_tokens[b] + num_scheduled_tokens[b] - 1``.

        Args:
            req_ids: int64 ``[B]``, distinct.
            num_computed_tokens: int32 ``[B]``, tokens whose KV is already cached.
            num_scheduled_tokens: int32 ``[B]``, tokens to compute now (>= 1).

        Returns:
            With ``T = sum(num_scheduled_tokens)``, ``bs`` the block size and
            ``M = max_b ceil(seq_lens[b] / bs)``:

            - ``input_ids`` int64 ``[T]``: the scheduled tokens, concatenated.
            - ``positions`` int64 ``[T]``: their positions in their sequence.
            - ``slot_mapping`` int64 ``[T]``: ``table[pos // bs] * bs + pos % bs``.
            - ``block_tables`` int32 ``[B, M]``: first ``ceil(seq_lens[b] / bs)``
              blocks of each table, padded with 0.
            - ``seq_lens`` int32 ``[B]``: ``num_computed + num_scheduled``.
            - ``query_start_loc`` int32 ``[B + 1]``: offsets of each request's
              first token in the flat arrays.
            - ``logits_indices`` int64 ``[B]``: ``query_start_loc[1:] - 1``, the
              row of each request's last scheduled token.
            - With ``G > 1`` KV cache groups, also ``group_slot_mapping`` int64
              ``[G - 1, T]`` and ``group_block_tables`` int32 ``[G - 1, B, M]``:
              groups 1.. (``slot_mapping`` / ``block_tables`` are group 0's);
              -1 marks blocks a sliding window released.

        Raises:
            ValueError: a request unknown (to this builder or the KV cache
                manager) or listed twice, ``num_computed < 0``,
                ``num_scheduled < 1``, fewer tokens held than ``seq_lens[b]``,
                fewer KV slots allocated than ``seq_lens[b]``, or arrays of
                different lengths.
        """

def prefix_block_hashes(
    token_ids: Sequence[int] | np.ndarray,
    block_size: int,
    cache_salt: str | None = None,
    max_blocks: int = ...,
) -> list[int]:
    """The prefix-cache hashes of the leading full blocks of ``token_ids``
    (at most ``max_blocks``), exactly as :class:`KVCacheManager` computes them
    for its full-attention group: chained from a root hash of ``cache_salt``
    (``None`` and ``""`` are the same: no salt). A partial last block has no
    hash. The data-parallel router uses them to send a prompt where its prefix
    is cached. Raises ValueError if ``block_size < 1`` or ``max_blocks < 0``."""

def set_num_threads(n: int) -> None:
    """Threads (including the caller) the CPU attention kernels and fused ops use;
    default 1.
    A persistent pool of std::threads (not OpenMP). Raises ValueError if n < 1."""

def get_num_threads() -> int:
    """The value set by :func:`set_num_threads`."""

def attention_isa() -> str:
    """SIMD variant of the CPU attention kernel picked for this CPU: ``"avx512"``,
    ``"avx2"`` or ``"baseline"`` (x86-64-v2); ``$PATERNOSTER_CPU_ISA`` can force a
    lower one."""

def _paged_attention_ptr(
    out: int,
    query: int,
    key_cache: int,
    value_cache: int,
    block_tables: int,
    seq_lens: int,
    query_start_loc: int,
    num_tokens: int,
    num_seqs: int,
    num_heads: int,
    num_kv_heads: int,
    head_size: int,
    num_blocks: int,
    block_size: int,
    max_blocks_per_seq: int,
    scale: float,
    dtype: DType,
    batch_invariant: bool = False,
    sliding_window: int = 0,
    sinks: int = 0,
) -> None:
    """Paged attention on raw CPU data pointers (contiguous layouts as documented
    in :func:`paternoster.kernels.paged_attention`); ``batch_invariant``: one
    work item per query token; ``sliding_window``: W > 0 limits each query to
    its last W positions (0: full causal; negative: ValueError); block ids of
    blocks wholly before the first query's window are neither read nor
    checked; ``sinks``: the address of float32 ``[num_heads]`` attention-sink
    logits (one more softmax term per head, no value), 0 = none. Releases the
    GIL. Checks sizes,
    ``query_start_loc``, ``seq_lens`` and block ids against ``num_blocks``, raising
    ValueError before writing; cannot check that the pointers are valid. Use
    :func:`paternoster.kernels.paged_attention` instead."""

def _reshape_and_cache_ptr(
    key: int,
    value: int,
    key_cache: int,
    value_cache: int,
    slot_mapping: int,
    num_tokens: int,
    num_kv_heads: int,
    head_size: int,
    num_slots: int,
    dtype: DType,
) -> None:
    """Write K/V rows into cache slots on raw CPU data pointers; ``num_slots`` =
    num_blocks * block_size bounds the slots (ValueError before writing). Releases
    the GIL. Use :func:`paternoster.kernels.reshape_and_cache` instead."""

def _rms_norm_ptr(
    out: int,
    x: int,
    weight: int,
    num_tokens: int,
    hidden_size: int,
    eps: float,
    dtype: DType,
) -> None:
    """RMSNorm of ``x`` [T, H] into ``out`` (may be ``x``) on raw CPU data
    pointers, HF Llama's roundings. ValueError (before writing) for bad sizes or
    ``eps``; cannot check the pointers. Releases the GIL. Use
    :func:`paternoster.kernels.rms_norm` instead."""

def _fused_add_rms_norm_ptr(
    x: int,
    residual: int,
    weight: int,
    num_tokens: int,
    hidden_size: int,
    eps: float,
    dtype: DType,
) -> None:
    """``residual += x; x = rms_norm(residual)`` in place on raw CPU data pointers
    ([T, H] each, distinct). Releases the GIL. Use
    :func:`paternoster.kernels.fused_add_rms_norm` instead."""

def _silu_and_mul_ptr(
    out: int,
    x: int,
    num_tokens: int,
    intermediate_size: int,
    dtype: DType,
) -> None:
    """``out [T, I] = silu(x[:, :I]) * x[:, I:]`` on raw CPU data pointers
    (``out`` must not overlap ``x``). Releases the GIL. Use
    :func:`paternoster.kernels.silu_and_mul` instead."""

def _rotary_embedding_ptr(
    positions: int,
    query: int,
    key: int,
    cos_sin_cache: int,
    num_tokens: int,
    num_heads: int,
    num_kv_heads: int,
    head_size: int,
    query_stride: int,
    key_stride: int,
    max_positions: int,
    is_neox: bool,
    dtype: DType,
) -> None:
    """RoPE in place on raw CPU data pointers: ``query`` rows of ``num_heads``
    heads ``query_stride`` elements apart, ``key`` likewise, ``cos_sin_cache``
    [max_positions, head_size] (cos then sin), ``positions`` int64 [T].
    ValueError (before writing) for a position outside ``[0, max_positions)``,
    an odd head size or rows closer than their heads. Releases the GIL. Use
    :func:`paternoster.kernels.rotary_embedding` instead."""

class WeightFormat(enum.Enum):
    """Storage format of a linear layer's weight: dense ``float32``/``bfloat16``, or
    GGUF blocks (paternoster/linear.h; values are ggml's type numbers): of 32
    values ``q8_0``, ``q4_0``, ``q4_1``, ``q5_0``, ``q5_1``, ``iq4_nl``,
    ``mxfp4``; of 256 values ``q4_k``, ``q5_k``, ``q6_k``, ``iq4_xs``."""
    float32 = 0
    bfloat16 = 1
    q4_0 = 2
    q4_1 = 3
    q5_0 = 6
    q5_1 = 7
    q8_0 = 8
    q4_k = 12
    q5_k = 13
    q6_k = 14
    iq4_nl = 20
    iq4_xs = 23
    mxfp4 = 39


def weight_row_bytes(format: WeightFormat, in_features: int) -> int:
    """Bytes of one weight row; ValueError for a quantized format and
    ``in_features % 32 != 0``."""

def linear_isa() -> str:
    """SIMD variant of the linear kernel in use (``"avx512bf16"`` where the CPU
    has AVX-512 BF16, else the attention kernel's)."""

def available_linear_isas() -> list[str]:
    """Variants of the linear kernel this build and CPU can run, best first."""

def set_spin_micros(micros: int) -> None:
    """How long the kernel threads poll for the next call before sleeping
    (microseconds; 0 never polls). ValueError if negative."""

def get_spin_micros() -> int:
    """The value of :func:`set_spin_micros` (or ``$PATERNOSTER_SPIN_US``, default 30)."""

def _linear_ptr(
    out: int,
    out_dtype: DType,
    x: int,
    x_dtype: DType,
    weight: int,
    format: WeightFormat,
    bias: int,
    num_tokens: int,
    out_features: int,
    in_features: int,
    isa: str = "",
    batch_invariant: bool = False,
) -> None:
    """``out [T, N] = x [T, K] @ W^T (+ bias)`` on raw CPU data pointers (bias 0:
    none; isa "": the default variant; batch_invariant: quantized weights never
    take the 8-bit activation path). Releases the GIL. ValueError before
    writing for bad sizes or an unavailable variant. Use
    :func:`paternoster.kernels.linear` instead."""

def _linear_parts_ptr(out: int, out_dtype: DType, x: int, x_dtype: DType,
                      parts: list[tuple[int, WeightFormat, int]], bias: int, num_tokens: int,
                      in_features: int, batch_invariant: bool = False) -> None:
    """out = x W^T (+ bias) with W the rows of ``parts`` [(data, format, rows)]
    stacked (paternoster/linear.h: linear_parts). Releases the GIL. Use
    :func:`paternoster.kernels.linear` instead."""

def _dequantize_rows_ptr(out: int, weight: int, format: WeightFormat, num_rows: int,
                         in_features: int) -> None:
    """Rows of a weight in ``format`` -> float32 ``out [num_rows, in_features]``."""

class MoeExperts:
    """Routed SwiGLU experts run in one call (paternoster/moe.h). Use
    :class:`paternoster.kernels.moe.CpuMoeExperts` instead."""

    def __init__(
        self,
        hidden_size: int,
        intermediate_size: int,
        num_experts: int,
        top_k: int,
        norm_topk_prob: bool,
        dtype: DType,
        router: list[tuple[int, WeightFormat, int]],
        gate_up: list[tuple[int, WeightFormat, int]],
        down: list[tuple[int, WeightFormat, int]],
        router_bias: int = 0,
        gate_up_bias: int = 0,
        down_bias: int = 0,
        activation: int = 0,
        alpha: float = 0.0,
        limit: float = 0.0,
    ) -> None:
        """Each weight as the parts [(data, format, rows)] its rows are stored
        in: router [E, H], gate_up [E 2I, H], down [E H, I]; biases (0: none)
        [E], [E 2I], [E H] in dtype; activation 0 SwiGLU, 1 gpt-oss's clamped
        SwiGLU (alpha, limit > 0). ValueError for parts of the wrong rows or
        format, top_k outside [1, E], or a bad activation."""

    def _forward_ptr(self, out: int, x: int, num_tokens: int, batch_invariant: bool) -> None:
        """out [T, H] = the block on x [T, H]. Releases the GIL."""

def _moe_route_ptr(weights: int, experts: int, logits: int, num_tokens: int, num_experts: int,
                   top_k: int, renormalize: bool) -> None:
    """Softmax top-k routing: float32 logits [T, E] -> float32 weights and
    int32 experts [T, top_k] (paternoster/moe.h: moe_route)."""

class DecoderStack:
    """A Llama-family decoder stack run in one call (paternoster/decoder.h). Use
    :class:`paternoster.kernels.CpuDecoderStack` instead."""

    num_layers: int

    def __init__(
        self,
        hidden_size: int,
        num_heads: int,
        num_kv_heads: int,
        head_size: int,
        intermediate_size: int,
        rms_norm_eps: float,
        dtype: DType,
        cos_sin_cache: int,
        max_positions: int,
        is_neox: bool,
        num_blocks: int,
        block_size: int,
        batch_invariant: bool,
        layers: list[list[int]],
        final_norm: int,
        moe: list[MoeExperts | None] = ...,
    ) -> None:
        """``layers``: per layer 20 ints: input norm, post-attention norm, then
        (weight, format, bias) for qkv, o, gate_up, down, the key and value
        caches, the q and k norms (0: none), use_rope (0/1) and the sliding
        window (0: none). ``moe``: empty, or per layer its routed experts
        (kept alive by the stack) or None (the SwiGLU MLP of gate_up and
        down). ValueError naming a bad field."""

    def _forward_ptr(
        self,
        out: int,
        x: int,
        positions: int,
        slot_mapping: int,
        block_tables: int,
        seq_lens: int,
        query_start_loc: int,
        num_tokens: int,
        num_seqs: int,
        max_blocks_per_seq: int,
    ) -> None:
        """One step; releases the GIL; ValueError from the kernels' checks."""
