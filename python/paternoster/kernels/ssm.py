"""The core's one-token state updates of the recurrent token mixers (CPU):
Mamba2's selective state update in place on each sequence's state slot, one
pass over the state (core/include/paternoster/ssm.h)."""

from __future__ import annotations

import torch

from paternoster import _core
from paternoster.kernels.checks import check_tensor

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
