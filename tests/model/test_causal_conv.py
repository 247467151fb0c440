"""The causal depthwise convolution with state (model/causal_conv.py)
against torch's ``conv1d`` over the whole sequence with left zero padding:
in pieces, then one token at a time from the kept state, with and without
bias and SiLU (Gated DeltaNet and Mamba2 apply SiLU, LFM2 does not)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from paternoster.model.causal_conv import causal_conv1d, causal_conv1d_step


@pytest.mark.parametrize(("bias", "silu"), [(False, True), (True, True), (True, False)])
def test_causal_conv_in_pieces_matches_conv1d_of_the_whole_sequence(bias, silu):
    gen = torch.Generator().manual_seed(5)
    channels, width, length = 12, 4, 23
    x = torch.randn(length, channels, generator=gen)
    w = torch.randn(channels, width, generator=gen)
    b = torch.randn(channels, generator=gen) if bias else None
    ref = F.conv1d(x.t()[None], w[:, None, :], b, padding=width - 1,
                   groups=channels)[0, :, :length].t()
    ref = F.silu(ref) if silu else ref
    state = torch.zeros(channels, width - 1)
    pieces = [causal_conv1d(x[:2], state, w, b, silu), causal_conv1d(x[2:17], state, w, b, silu)]
    batched = state[None].clone()
    for t in range(17, length):
        pieces.append(causal_conv1d_step(x[t:t + 1], batched, w, b, silu))
    torch.testing.assert_close(torch.cat(pieces), ref, rtol=0, atol=1e-5)
    torch.testing.assert_close(batched[0], x[-(width - 1):].t(), rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_core_short_conv_step_matches_the_torch_form_in_place_on_slots(dtype):
    """The core's LFM2 step (kernels.short_conv_update) on sequences in
    slots 3, 0 of five: ``C * conv(B * x)`` with HF's roundings and the
    states shifted, as the torch one-token form computes them; the other
    slots untouched."""
    from paternoster import kernels

    gen = torch.Generator().manual_seed(8)
    hidden, width = 24, 3
    states = torch.randn(5, hidden, width - 1, generator=gen).to(dtype)
    weight = torch.randn(hidden, width, generator=gen).to(dtype)
    bias = torch.randn(hidden, generator=gen).to(dtype)
    bcx = torch.randn(2, 3 * hidden, generator=gen).to(dtype)
    slots = torch.tensor([3, 0])
    ref_states = states[slots].clone()
    b, c, x = bcx.split(hidden, dim=-1)
    ref = c * causal_conv1d_step(b * x, ref_states, weight, bias, silu=False)
    before = states.clone()
    out = kernels.short_conv_update(states, slots, bcx, weight, bias)
    torch.testing.assert_close(out, ref, rtol=0, atol=0)
    torch.testing.assert_close(states[slots], ref_states, rtol=0, atol=0)
    assert torch.equal(states[[1, 2, 4]], before[[1, 2, 4]])
