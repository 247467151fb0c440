"""The core's one-token state updates of the recurrent token mixers (CPU),
in place on each sequence's state slot, one pass over the state
(core/include/paternoster/ssm.h): Mamba2's selective state update and LFM2's
gated short convolution."""

from __future__ import annotations

import torch

from paternoster import _core
from paternoster.kernels.checks import check_tensor
from paternoster.kernels.cpu import CPU_DTYPES

_CPU = torch.device("cpu")


def mamba2_state_update(state: torch.Tensor, slots: torch.Tensor, x: torch.Tensor,
                        dt: torch.Tensor, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor,
                        d: torch.Tensor) -> torch.Tensor:
    """One token of Mamba2's recurrence for each of ``B`` sequences, their
    states updated where they lie (:func:`paternoster.model.mamba2.ssd_step`'s
    arithmetic; a sequence's bits do not depend on the others).

    Args:
        state: float32 ``[num_slots, H, P, N]``, contiguous, on the CPU.
        slots: int64 ``[B]``, distinct, in ``[0, num_slots)``.
        x: float32 ``[B, H, P]``. dt: float32 ``[B, H]`` (after softplus and
            the clamp). a, d: float32 ``[H]``. b, c: float32 ``[B, G, N]``.
    Returns:
        float32 ``[B, H, P]``: ``S C + D x``.
    Raises:
        ValueError: a tensor of the wrong rank, dtype, device or shape, or
            not contiguous; a slot out of range or repeated.
    """
    f32 = torch.float32
    num_slots, heads, head_dim, n = check_tensor(state, "state", 4, f32, _CPU)
    (batch,) = check_tensor(slots, "slots", 1, torch.int64, _CPU)
    shapes = {"x": (x, (batch, heads, head_dim)), "dt": (dt, (batch, heads)), "a": (a, (heads,)),
              "d": (d, (heads,))}
    for name, (t, want) in shapes.items():
        if tuple(check_tensor(t, name, len(want), f32, _CPU)) != want:
            raise ValueError(f"{name} must have shape {want}, got {tuple(t.shape)}")
    groups = check_tensor(b, "b", 3, f32, _CPU)[1]
    for name, t in (("b", b), ("c", c)):
        if tuple(check_tensor(t, name, 3, f32, _CPU)) != (batch, groups, n):
            raise ValueError(f"{name} must have shape {(batch, groups, n)}, got {tuple(t.shape)}")
    y = torch.empty(batch, heads, head_dim, dtype=f32)
    _core._mamba2_state_update_ptr(state.data_ptr(), slots.data_ptr(), batch, num_slots, heads,
                                   head_dim, groups, n, x.data_ptr(), dt.data_ptr(),
                                   a.data_ptr(), b.data_ptr(), c.data_ptr(), d.data_ptr(),
                                   y.data_ptr())
    return y


def short_conv_update(conv_state: torch.Tensor, slots: torch.Tensor, bcx: torch.Tensor,
                      weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """LFM2's gated short convolution for one token of each of ``B``
    sequences, their conv states updated where they lie
    (:class:`paternoster.model.short_conv.ShortConv`'s arithmetic: ``B x``
    rounded, the K products summed in float32 and rounded, times ``C``).

    Args:
        conv_state: ``[num_slots, H, K - 1]``, float32 or bfloat16, contiguous.
        slots: int64 ``[B]``, distinct, in ``[0, num_slots)``.
        bcx: ``[B, 3 H]``: B, C, then x (the in-projection), state's dtype.
        weight: ``[H, K]``; bias: ``[H]`` or None; state's dtype.
    Returns:
        ``[B, H]`` in the state's dtype.
    Raises:
        ValueError: a tensor of the wrong rank, dtype, device or shape, or
            not contiguous; a slot out of range or repeated.
    """
    dtype = conv_state.dtype
    if dtype not in CPU_DTYPES:
        raise ValueError(f"conv_state must be float32 or bfloat16, got {dtype}")
    num_slots, hidden, window = check_tensor(conv_state, "conv_state", 3, dtype, _CPU)
    (batch,) = check_tensor(slots, "slots", 1, torch.int64, _CPU)
    checks = [("bcx", bcx, (batch, 3 * hidden)), ("weight", weight, (hidden, window + 1))]
    if bias is not None:
        checks.append(("bias", bias, (hidden,)))
    for name, t, want in checks:
        if tuple(check_tensor(t, name, len(want), dtype, _CPU)) != want:
            raise ValueError(f"{name} must have shape {want}, got {tuple(t.shape)}")
    y = torch.empty(batch, hidden, dtype=dtype)
    _core._short_conv_update_ptr(conv_state.data_ptr(), slots.data_ptr(), batch, num_slots,
                                 hidden, window + 1, bcx.data_ptr(), weight.data_ptr(),
                                 0 if bias is None else bias.data_ptr(), y.data_ptr(),
                                 CPU_DTYPES[dtype])
    return y
