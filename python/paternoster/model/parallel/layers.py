"""Tensor-parallel layers (Megatron-LM, arXiv:1909.08053, section 3): each
rank holds a shard of the full layer's weight and the layer's collective
puts the pieces together.

Every layer is built from the rank's shard (see :mod:`.shard`) or with
``from_full`` from the full weight; its matmuls run in
:func:`paternoster.kernels.linear`. All ranks of the group must call
``forward`` together with inputs of the same shape (the collectives block
until every rank joins).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from paternoster import kernels
from paternoster.model.parallel.group import TPGroup
from paternoster.model.parallel.shard import shard_cols, shard_rows, shard_vocab, vocab_range


def _frozen(t: torch.Tensor | None) -> nn.Parameter | None:
    return None if t is None else nn.Parameter(t.contiguous(), requires_grad=False)


class ColumnParallelLinear(nn.Module):
    """``y = x W^T + b`` with W ``[out, in]`` split by output rows: rank ``r``
    computes ``y[:, r*out/n : (r+1)*out/n]``.

    Args:
        weight: this rank's rows ``[out/n, in]``. bias: its ``[out/n]`` or None.
        tp: the group. gather_output: all-gather the full ``[T, out]`` (else
            each rank returns its ``[T, out/n]`` slice, the input of a
            :class:`RowParallelLinear`).
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, tp: TPGroup,
                 gather_output: bool = False) -> None:
        super().__init__()
        self.weight, self.bias = _frozen(weight), _frozen(bias)
        self.tp, self.gather_output = tp, gather_output

    @classmethod
    def from_full(cls, weight: torch.Tensor, bias: torch.Tensor | None, tp: TPGroup,
                  gather_output: bool = False) -> ColumnParallelLinear:
        """The layer from the full ``[out, in]`` weight and ``[out]`` bias.

        Raises:
            ValueError: ``out`` is not a multiple of ``tp.size``.
        """
        return cls(shard_rows(weight, tp.rank, tp.size, "out_features"),
                   None if bias is None else shard_rows(bias, tp.rank, tp.size, "out_features"),
                   tp, gather_output)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x ``[T, in]`` (the same on every rank) -> ``[T, out/n]``, or
        ``[T, out]`` with ``gather_output``; x's dtype."""
        y = kernels.linear(x, self.weight, self.bias)
        return self.tp.all_gather(y, dim=-1) if self.gather_output else y


class RowParallelLinear(nn.Module):
    """``y = x W^T + b`` with W ``[out, in]`` split by input columns: rank
    ``r`` multiplies its slice ``x[:, r*in/n : (r+1)*in/n]`` by its columns,
    one all-reduce sums the partial products, the bias is added once after.

    Args:
        weight: this rank's columns ``[out, in/n]``. bias: the full ``[out]`` or None.
        tp: the group.
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, tp: TPGroup) -> None:
        super().__init__()
        self.weight, self.bias = _frozen(weight), _frozen(bias)
        self.tp = tp

    @classmethod
    def from_full(cls, weight: torch.Tensor, bias: torch.Tensor | None,
                  tp: TPGroup) -> RowParallelLinear:
        """The layer from the full ``[out, in]`` weight and ``[out]`` bias.

        Raises:
            ValueError: ``in`` is not a multiple of ``tp.size``.
        """
        return cls(shard_cols(weight, tp.rank, tp.size, "in_features"), bias, tp)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x ``[T, in/n]``, this rank's slice (a column-parallel layer's
        output) -> the full ``[T, out]`` on every rank, x's dtype."""
        y = self.tp.all_reduce(kernels.linear(x.contiguous(), self.weight))
        return y if self.bias is None else y + self.bias


class VocabParallelEmbedding(nn.Module):
    """Embedding table ``[V, H]`` split by vocabulary rows
    (:func:`~.shard.vocab_range`): each rank looks up the ids it holds,
    zeros for the others, and one all-reduce sums the rows.

    Args:
        weight: this rank's rows ``[ceil(V/n), H]`` (zero-padded past V).
        vocab_size: V. tp: the group.
    """

    def __init__(self, weight: torch.Tensor, vocab_size: int, tp: TPGroup) -> None:
        super().__init__()
        self.weight = _frozen(weight)
        self.vocab_size, self.tp = vocab_size, tp
        self.start, self.end, _ = vocab_range(vocab_size, tp.rank, tp.size)

    @classmethod
    def from_full(cls, weight: torch.Tensor, tp: TPGroup) -> VocabParallelEmbedding:
        """The layer from the full ``[V, H]`` table."""
        return cls(shard_vocab(weight, tp.rank, tp.size), weight.shape[0], tp)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """int64 ids ``[T]`` in ``[0, V)`` -> ``[T, H]`` rows in the table's dtype."""
        outside = (ids < self.start) | (ids >= self.end)
        local = torch.where(outside, 0, ids - self.start)
        rows = F.embedding(local, self.weight)
        rows.masked_fill_(outside.unsqueeze(-1), 0)
        return self.tp.all_reduce(rows)


class ParallelLMHead(nn.Module):
    """LM head ``[V, H]`` split by vocabulary rows like
    :class:`VocabParallelEmbedding` (the same shard when the embeddings are
    tied): each rank computes its block of logits, an all-gather joins them.

    Args:
        weight: this rank's rows ``[ceil(V/n), H]``. vocab_size: V. tp: the group.
    """

    def __init__(self, weight: torch.Tensor, vocab_size: int, tp: TPGroup) -> None:
        super().__init__()
        self.weight = weight if isinstance(weight, nn.Parameter) else _frozen(weight)
        self.vocab_size, self.tp = vocab_size, tp

    @classmethod
    def from_full(cls, weight: torch.Tensor, tp: TPGroup) -> ParallelLMHead:
        """The layer from the full ``[V, H]`` matrix."""
        return cls(shard_vocab(weight, tp.rank, tp.size), weight.shape[0], tp)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden ``[N, H]`` (the same on every rank) -> float32 logits
        ``[N, V]`` on every rank (the padding rows dropped)."""
        local = kernels.linear(hidden.contiguous(), self.weight, out_dtype=torch.float32)
        return self.tp.all_gather(local, dim=-1)[:, : self.vocab_size]
