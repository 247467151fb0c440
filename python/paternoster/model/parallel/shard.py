"""Which slice of a full checkpoint tensor a tensor-parallel rank holds.

Megatron's split (arXiv:1909.08053, section 3): a column-parallel matrix
(q/k/v, gate/up: ``[out, in]`` weights in torch's layout) keeps a block of
output rows, a row-parallel one (o, down) the matching block of input
columns, so the pair needs one all-reduce. Attention is split by heads:
rank ``r`` of ``n`` holds query heads ``r*Hq/n .. (r+1)*Hq/n`` and KV heads
``r*Hkv/n .. (r+1)*Hkv/n``, which keeps each query head with its GQA KV
head. The vocabulary is split in blocks of ``ceil(V/n)`` rows, the last one
padded with zero rows.
"""

from __future__ import annotations

import torch


def divide(total: int, size: int, what: str) -> int:
    """``total / size`` for a quantity split evenly over ``size`` ranks.

    Raises:
        ValueError: ``total`` is not a multiple of ``size`` (naming ``what``).
    """
    if total % size:
        raise ValueError(f"{what} ({total}) must be divisible by the tensor-parallel "
                         f"size ({size})")
    return total // size


def check_heads(num_heads: int, num_kv_heads: int, size: int) -> None:
    """Check that query and KV heads split evenly over ``size`` ranks (KV
    heads are split, never replicated).

    Raises:
        ValueError: either count is not a multiple of ``size``.
    """
    divide(num_heads, size, "num_attention_heads")
    divide(num_kv_heads, size, "num_key_value_heads")


def shard_rows(w: torch.Tensor, rank: int, size: int, what: str = "rows") -> torch.Tensor:
    """Rank ``rank``'s block of ``w``'s rows (dim 0): a column-parallel
    weight ``[out, in]`` or bias ``[out]`` -> ``[out/size, ...]`` (a view).

    Raises:
        ValueError: ``out`` is not a multiple of ``size``.
    """
    n = divide(w.shape[0], size, what)
    return w[rank * n : (rank + 1) * n]


def shard_cols(w: torch.Tensor, rank: int, size: int, what: str = "columns") -> torch.Tensor:
    """Rank ``rank``'s block of ``w``'s columns: a row-parallel weight
    ``[out, in]`` -> ``[out, in/size]`` (a view).

    Raises:
        ValueError: ``in`` is not a multiple of ``size``.
    """
    n = divide(w.shape[1], size, what)
    return w[:, rank * n : (rank + 1) * n]


def shard_qkv(w: torch.Tensor, num_heads: int, num_kv_heads: int, head_dim: int,
              rank: int, size: int) -> torch.Tensor:
    """A fused q/k/v weight ``[(Hq + 2 Hkv) * D, H]`` (or bias ``[(Hq + 2 Hkv) * D]``)
    -> rank ``rank``'s fused ``[(Hq + 2 Hkv) / size * D, ...]``: its query
    heads, then its KV heads' k rows, then their v rows (a new tensor).

    Raises:
        ValueError: head counts not multiples of ``size``, or ``w`` not of
            ``(Hq + 2 Hkv) * D`` rows.
    """
    check_heads(num_heads, num_kv_heads, size)
    q, kv = num_heads * head_dim, num_kv_heads * head_dim
    if w.shape[0] != q + 2 * kv:
        raise ValueError(f"fused qkv has {w.shape[0]} rows, expected {q + 2 * kv}")
    wq, wk, wv = w.split([q, kv, kv])
    return torch.cat([shard_rows(wq, rank, size), shard_rows(wk, rank, size),
                      shard_rows(wv, rank, size)])


def shard_gate_up(w: torch.Tensor, rank: int, size: int) -> torch.Tensor:
    """A fused gate/up weight ``[2 I, H]`` (or bias ``[2 I]``, gate rows
    first) -> rank ``rank``'s ``[2 I / size, ...]``, its gate rows then its
    up rows (a new tensor).

    Raises:
        ValueError: ``I`` not a multiple of ``size`` or an odd row count.
    """
    if w.shape[0] % 2:
        raise ValueError(f"fused gate/up has an odd row count {w.shape[0]}")
    gate, up = w.chunk(2)
    return torch.cat([shard_rows(gate, rank, size, "intermediate_size"),
                      shard_rows(up, rank, size, "intermediate_size")])


def vocab_range(vocab_size: int, rank: int, size: int) -> tuple[int, int, int]:
    """Rank ``rank``'s vocabulary block: ``(start, end, rows)`` with token
    ids ``[start, end)`` held and ``rows = ceil(vocab_size / size)`` rows
    stored (``end - start < rows`` on a padded last block; ``end == start``
    when ``vocab_size < size * rows`` leaves a rank nothing)."""
    rows = -(-vocab_size // size)
    start = min(rank * rows, vocab_size)
    return start, min(start + rows, vocab_size), rows


def shard_vocab(w: torch.Tensor, rank: int, size: int) -> torch.Tensor:
    """An embedding or LM head ``[V, H]`` -> rank ``rank``'s ``[ceil(V/size), H]``
    (rows past ``V`` zero; a new tensor when padded, else a view)."""
    start, end, rows = vocab_range(w.shape[0], rank, size)
    part = w[start:end]
    if end - start == rows:
        return part
    padded = part.new_zeros((rows, *w.shape[1:]))
    padded[: end - start] = part
    return padded
