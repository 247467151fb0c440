"""Elementwise functions applied so that a row's bits do not depend on the
other rows of its call (batch-invariant mode)."""

from __future__ import annotations

from collections.abc import Callable

import torch


def rowwise(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor,
            invariant: bool) -> torch.Tensor:
    """``fn(x)`` for an elementwise ``fn``; with ``invariant``, one row at a
    time, so a row's bits do not depend on how many rows the step has
    (torch's vectorized elementwise kernels compute a vector's tail with the
    scalar code, which rounds transcendental functions differently)."""
    if not invariant or x.shape[0] <= 1:
        return fn(x)
    return torch.cat([fn(x[i : i + 1]) for i in range(x.shape[0])])
