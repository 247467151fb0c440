"""Causal depthwise convolution over a sequence with its last inputs kept as
state: the short convolution of Gated DeltaNet (Qwen3-Next, Qwen3.5), of
Mamba2 (Dao & Gu 2024, arXiv:2405.21060) and of LFM2's gated short-conv
blocks (Liquid AI 2025).

Channel ``c`` at token ``t`` is ``sum_i weight[c, i] * in[t - K + 1 + i, c]``
(+ ``bias[c]``), ``K`` the kernel width, inputs before a sequence's first
token zero: ``torch.nn.functional.conv1d`` with ``groups = C`` and ``K - 1``
zeros of left padding. A request's ``K - 1`` latest inputs are its conv
state (oldest first), so a sequence continues across steps, chunk by chunk
(:func:`causal_conv1d`) or one token at a time for many sequences at once
(:func:`causal_conv1d_step`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def causal_conv1d(x: torch.Tensor, state: torch.Tensor, weight: torch.Tensor,
                  bias: torch.Tensor | None = None, silu: bool = True) -> torch.Tensor:
    """The convolution over one sequence's chunk.

    Args:
        x: ``[L, C]``, the chunk's inputs.
        state: ``[C, K - 1]``, the ``K - 1`` inputs before the chunk, oldest
            first (zeros at a sequence's start); overwritten with the last
            ``K - 1`` inputs including this chunk's.
        weight: ``[C, K]``. bias: ``[C]`` or None.
        silu: apply SiLU to the output (Gated DeltaNet, Mamba2; LFM2 not).
    Returns:
        ``[L, C]`` in ``x``'s dtype (computed in ``weight``'s dtype).
    """
    k = weight.shape[1]
    full = torch.cat([state.to(x.dtype), x.t()], dim=1)  # [C, K - 1 + L]
    state.copy_(full[:, full.shape[1] - (k - 1):])
    out = F.conv1d(full[None].to(weight.dtype), weight[:, None, :], bias,
                   groups=weight.shape[0])[0]
    return (F.silu(out) if silu else out).t().to(x.dtype)


def causal_conv1d_step(x: torch.Tensor, states: torch.Tensor, weight: torch.Tensor,
                       bias: torch.Tensor | None = None, silu: bool = True) -> torch.Tensor:
    """:func:`causal_conv1d` for one token of each of ``B`` sequences.

    Args:
        x: ``[B, C]``. states: ``[B, C, K - 1]`` (gathered from the slots;
            updated in place). weight: ``[C, K]``. bias: ``[C]`` or None.
        silu: as :func:`causal_conv1d`.
    Returns:
        ``[B, C]`` in ``x``'s dtype; the ``K`` products summed in float32.
    """
    full = torch.cat([states.to(x.dtype), x[:, :, None]], dim=2)  # [B, C, K]
    states.copy_(full[:, :, 1:])
    out = (full.float() * weight.float()).sum(dim=-1)
    if bias is not None:
        out = out + bias.float()
    out = out.to(weight.dtype)
    return (F.silu(out) if silu else out).to(x.dtype)
