"""LFM2's gated short convolution (Liquid AI 2025, the LFM2 technical
report; HF ``Lfm2ShortConv``), the token mixer of most LFM2 / LFM2-MoE
layers: ``B, C, h = split(in_proj(x))``, ``y = C * conv(B * h)``,
``out = out_proj(y)``, where ``conv`` is a causal depthwise convolution of
width ``K = conv_L_cache`` (3 in the released models), without activation.

Its state per request is the conv's last ``K - 1`` inputs, ``[H, K - 1]``
in the model dtype, in one state slot of the recurrent-state group
(:mod:`paternoster.model.state_slots`).
"""

from __future__ import annotations

import torch
from torch import nn

from paternoster import kernels
from paternoster.model.attention import AttentionMetadata
from paternoster.model.causal_conv import causal_conv1d, causal_conv1d_step
from paternoster.model.state_slots import decode_index, slot_spans


def state_shape(config) -> tuple[int, int]:
    """One slot's conv state ``[H, K - 1]`` for an LFM2 config."""
    return config.hidden_size, int(config.conv_L_cache) - 1


class ShortConv(nn.Module):
    """One gated short-conv token mixer over a flattened batch.

    Parameters (model dtype): ``in_proj_weight`` ``[3 H, H]`` (rows of B, C,
    then h) and ``conv_weight`` ``[H, K]``, ``out_proj_weight`` ``[H, H]``;
    with ``config.conv_bias`` also ``in_proj_bias`` ``[3 H]``, ``conv_bias``
    and ``out_proj_bias`` ``[H]`` (else None).

    Args:
        config: an LFM2 config (``hidden_size``, ``conv_L_cache``, ``conv_bias``).
    Raises:
        ValueError: a conv width below 2.

    In batch-invariant mode every token takes the one-token form, so a
    row's bits do not depend on how its prompt was chunked.
    """

    #: The layer's KV cache group (the recurrent-state group; set by the model).
    kv_group = 0

    def __init__(self, config, dtype: torch.dtype, invariant: bool = False) -> None:
        super().__init__()
        h, k = config.hidden_size, int(config.conv_L_cache)
        if k < 2:
            raise ValueError(f"conv_L_cache must be >= 2, got {k}")
        bias = bool(getattr(config, "conv_bias", False))
        param = lambda *shape: nn.Parameter(torch.empty(*shape, dtype=dtype),  # noqa: E731
                                            requires_grad=False)
        self.hidden, self.invariant = h, invariant
        self.in_proj_weight = param(3 * h, h)
        self.conv_weight = param(h, k)
        self.out_proj_weight = param(h, h)
        self.in_proj_bias = param(3 * h) if bias else None
        self.conv_bias = param(h) if bias else None
        self.out_proj_bias = param(h) if bias else None

    def matrices(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The block's projection matrices (dense or quantized)."""
        return self.in_proj_weight, self.out_proj_weight

    def forward(self, x: torch.Tensor, state: tuple[torch.Tensor],
                attn: AttentionMetadata) -> torch.Tensor:
        """x ``[T, H]`` -> ``[T, H]``.

        Args:
            state: ``(conv_state [N, H, K - 1],)`` indexed by state slot; a
                sequence with no computed tokens before this step starts
                from zeros; this step's sequences' slots are updated in place.
            attn: the step's placement (``query_start_loc``, ``seq_lens``,
                the group's block tables: column 0 is the slot).
        """
        (conv_state,) = state
        bch = kernels.linear(x, self.in_proj_weight, self.in_proj_bias, invariant=self.invariant)
        spans = slot_spans(attn, self.kv_group)
        core = conv_state.device.type == "cpu" and all(
            isinstance(w, torch.Tensor) and w.dtype == conv_state.dtype
            for w in (self.conv_weight, bch))
        b, c, h = bch.split(self.hidden, dim=-1)
        out = torch.empty_like(b)  # C * conv(B * x)
        for s in spans:
            if s.decode:
                continue
            if s.fresh:
                conv_state[s.slot].zero_()
            if self.invariant:  # the one-token form for every token, as decode takes it
                for t in range(s.lo, s.hi):
                    out[t : t + 1] = self._step(conv_state, torch.tensor([s.slot]), bch[t : t + 1],
                                                core)
                continue
            conv = causal_conv1d(b[s.lo:s.hi] * h[s.lo:s.hi], conv_state[s.slot],
                                 self.conv_weight, self.conv_bias, silu=False)
            out[s.lo:s.hi] = c[s.lo:s.hi] * conv
        index = decode_index(spans, x.device)
        if index is not None:
            rows, slots = index
            out.index_copy_(0, rows, self._step(conv_state, slots, bch.index_select(0, rows),
                                                core))
        return kernels.linear(out, self.out_proj_weight, self.out_proj_bias,
                              invariant=self.invariant)

    def _step(self, conv_state: torch.Tensor, slots: torch.Tensor, bch: torch.Tensor,
              core: bool) -> torch.Tensor:
        """One token of each sequence in ``slots`` (int64 ``[B]``; ``bch``
        ``[B, 3 H]``): ``C * conv(B * x)`` ``[B, H]``. On the CPU the core's
        update in place on the slots; else the torch form on the gathered
        states, written back."""
        if core:
            return kernels.short_conv_update(conv_state, slots.cpu(), bch.contiguous(),
                                             self.conv_weight, self.conv_bias)
        b, c, h = bch.split(self.hidden, dim=-1)
        conv = conv_state.index_select(0, slots)
        y = causal_conv1d_step(b * h, conv, self.conv_weight, self.conv_bias, silu=False)
        conv_state.index_copy_(0, slots, conv)
        return c * y
