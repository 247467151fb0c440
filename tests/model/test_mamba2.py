"""Mamba2's two forms of the selective state space recurrence
(model/mamba2.py) against a float64 loop of the recurrence itself (the
module docstring's two lines per token): the chunked dual form across chunk
boundaries and from a non-zero state, the one-token form batched over
sequences, and the one continuing the other."""

from __future__ import annotations

import pytest
import torch

from paternoster.model.mamba2 import ssd_chunk_scan, ssd_step


def _loop(x, dt, a, b, c, d, state):
    """float64 reference: per token S = exp(dt A) S + dt x B^T; y = S C + D x."""
    heads = x.shape[1]
    rep = heads // b.shape[1]
    s = state.double().clone()
    ys = []
    for t in range(x.shape[0]):
        bh = b[t].double().repeat_interleave(rep, dim=0)  # [H, N]
        ch = c[t].double().repeat_interleave(rep, dim=0)
        decay = torch.exp(dt[t].double() * a.double())  # [H]
        s = decay[:, None, None] * s + dt[t].double()[:, None, None] * x[t].double()[..., None] \
            * bh[:, None, :]
        ys.append((s * ch[:, None, :]).sum(-1) + d.double()[:, None] * x[t].double())
    return torch.stack(ys), s


def _inputs(length: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    heads, head_dim, groups, n = 4, 8, 2, 16
    x = torch.randn(length, heads, head_dim, generator=g)
    dt = torch.nn.functional.softplus(torch.randn(length, heads, generator=g))
    a = -torch.rand(heads, generator=g) * 2 - 0.1
    b = torch.randn(length, groups, n, generator=g)
    c = torch.randn(length, groups, n, generator=g)
    d = torch.randn(heads, generator=g)
    state = torch.randn(heads, head_dim, n, generator=g)
    return x, dt, a, b, c, d, state


def test_chunked_dual_form_matches_the_recurrence_across_chunks():
    x, dt, a, b, c, d, state = _inputs(45, 1)
    ref, ref_state = _loop(x, dt, a, b, c, d, state)
    s = state.clone()
    ours = ssd_chunk_scan(x, dt, a, b, c, d, s, chunk_size=16)  # chunks of 16, 16, 13
    torch.testing.assert_close(ours.double(), ref, rtol=0, atol=1e-4)
    torch.testing.assert_close(s.double(), ref_state, rtol=0, atol=1e-4)


@pytest.mark.parametrize("invariant", [False, True])
def test_one_token_form_batched_continues_the_chunked_form(invariant):
    """Three sequences' prompts but the last token in the chunked form, then
    their last tokens together in the one-token form (batched matrix
    products, or the batch-invariant elementwise form)."""
    seqs = [_inputs(n, 10 + n) for n in (7, 20, 3)]
    a, d = seqs[0][2], seqs[0][5]  # one layer: A and D shared by the sequences
    refs = [_loop(x, dt, a, b, c, d, st) for x, dt, _, b, c, _, st in seqs]
    states = []
    for x, dt, _, b, c, _, st in seqs:
        s = st.clone()
        ssd_chunk_scan(x[:-1], dt[:-1], a, b[:-1], c[:-1], d, s, chunk_size=4)
        states.append(s)
    batched = torch.stack(states)
    last = [torch.stack([q[i][-1] for q in seqs]) for i in range(5)]
    outs = ssd_step(last[0], last[1], a, last[3], last[4], d, batched, invariant)
    for i, (ref, ref_state) in enumerate(refs):
        torch.testing.assert_close(outs[i].double(), ref[-1], rtol=0, atol=1e-4)
        torch.testing.assert_close(batched[i].double(), ref_state, rtol=0, atol=1e-4)


def test_core_state_update_matches_the_recurrence_in_place_on_slots():
    """The core's one-pass update (kernels.mamba2_state_update) on three
    sequences whose states lie in slots 4, 0 and 2 of six: their outputs and
    new states as the float64 loop's; the other slots untouched; a repeated
    slot refused."""
    from paternoster import kernels

    seqs = [_inputs(1, 30 + i) for i in range(3)]
    a, d = seqs[0][2], seqs[0][5]
    slots = torch.tensor([4, 0, 2])
    pool = torch.randn(6, 4, 8, 16, generator=torch.Generator().manual_seed(1))
    for i, s in enumerate(slots.tolist()):
        pool[s] = seqs[i][6]
    before = pool.clone()
    last = [torch.stack([q[i][0] for q in seqs]) for i in range(5)]
    out = kernels.mamba2_state_update(pool, slots, last[0], last[1], a, last[3], last[4], d)
    for i, s in enumerate(slots.tolist()):
        x, dt, _, b, c, _, st = seqs[i]
        ref, ref_state = _loop(x, dt, a, b, c, d, st)
        torch.testing.assert_close(out[i].double(), ref[0], rtol=0, atol=1e-5)
        torch.testing.assert_close(pool[s].double(), ref_state, rtol=0, atol=1e-5)
    assert torch.equal(pool[[1, 3, 5]], before[[1, 3, 5]])
    with pytest.raises(ValueError, match="repeated"):
        kernels.mamba2_state_update(pool, torch.tensor([1, 1, 2]), last[0], last[1], a, last[3],
                                    last[4], d)
