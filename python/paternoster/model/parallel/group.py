"""The tensor-parallel group: a rank, the group size and the collectives."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class TPGroup:
    """One rank's view of its tensor-parallel group.

    Attributes:
        rank: this rank, in ``[0, size)``.
        size: ranks in the group (the tensor-parallel size); 1 runs the
            collectives as no-ops and needs no process group.
        group: the ``torch.distributed`` process group (gloo on CPU, NCCL
            on GPUs), or None for the default group (or for ``size == 1``).
    Raises:
        ValueError: ``size < 1`` or ``rank`` outside ``[0, size)``.
    """

    rank: int = 0
    size: int = 1
    group: Any = None

    def __post_init__(self) -> None:
        if self.size < 1:
            raise ValueError(f"size must be >= 1, got {self.size}")
        if not 0 <= self.rank < self.size:
            raise ValueError(f"rank must be in [0, {self.size}), got {self.rank}")

    @classmethod
    def from_default(cls) -> TPGroup:
        """The default process group (``torch.distributed.init_process_group``
        already called) as one tensor-parallel group.

        Raises:
            ValueError: torch.distributed is not initialised.
        """
        if not dist.is_initialized():
            raise ValueError("torch.distributed is not initialised: call "
                             "init_process_group before TPGroup.from_default")
        return cls(rank=dist.get_rank(), size=dist.get_world_size())

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum ``x`` (any shape, the same on every rank) over the group, in
        place; returns ``x``. A no-op for ``size == 1``."""
        if self.size > 1:
            dist.all_reduce(x, group=self.group)
        return x

    def all_gather(self, x: torch.Tensor, dim: int = -1) -> torch.Tensor:
        """Every rank's ``x`` (the same shape on every rank) concatenated
        along ``dim`` in rank order: a new tensor, ``size`` times as wide.
        ``x`` itself for ``size == 1``."""
        if self.size == 1:
            return x
        parts = [torch.empty_like(x) for _ in range(self.size)]
        dist.all_gather(parts, x.contiguous(), group=self.group)
        return torch.cat(parts, dim=dim)

    def min_over_ranks(self, value: int) -> int:
        """The smallest of every rank's ``value`` (each rank calls this with
        its own): what all ranks can agree on, e.g. KV blocks sized from each
        GPU's free memory. ``value`` itself for ``size == 1``.

        The scalar travels as an int64 tensor on the backend's device (the
        current CUDA device for NCCL, the CPU for gloo)."""
        if self.size == 1:
            return value
        nccl = dist.get_backend(self.group) == "nccl"
        x = torch.tensor([value], dtype=torch.int64,
                         device=torch.device("cuda", torch.cuda.current_device()) if nccl
                         else "cpu")
        dist.all_reduce(x, op=dist.ReduceOp.MIN, group=self.group)
        return int(x.item())
