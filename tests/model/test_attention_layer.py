"""paternoster.model.attention.paged_attention_layer: the cache write, then the
attention with the metadata's hints and a layer's sliding window, against the
suite's float64 reference (tests/paged_attention_ref.py)."""

from __future__ import annotations

import pytest
import torch

from paternoster import kernels
from paternoster.model.attention import AttentionMetadata, paged_attention_layer

from ..paged_attention_ref import ReferenceAttentionOps

BLOCK_SIZE, NUM_BLOCKS, HQ, HKV, D = 8, 12, 4, 2, 32


class RecordingOps(ReferenceAttentionOps):
    """The reference ops, remembering the keyword arguments of each attention."""

    def __init__(self) -> None:
        self.calls: list[dict] = []

    def paged_attention(self, *args, **kwargs) -> torch.Tensor:
        self.calls.append(kwargs)
        return super().paged_attention(*args, **kwargs)


def _step(dtype=torch.float32, context=(29, 0), q_lens=(1, 17)):
    """Random q/k/v for a decode after ``context[0]`` cached tokens and a
    prompt of ``q_lens[1]``; its metadata; caches with the context filled."""
    gen = torch.Generator().manual_seed(0)
    seq_lens = [c + q for c, q in zip(context, q_lens, strict=True)]
    tables = torch.arange(NUM_BLOCKS, dtype=torch.int32).view(2, -1).flip(1).contiguous()
    slots = [int(tables[b, p // BLOCK_SIZE]) * BLOCK_SIZE + p % BLOCK_SIZE
             for b in range(2) for p in range(seq_lens[b] - q_lens[b], seq_lens[b])]
    t = sum(q_lens)
    q = torch.randn(t, HQ, D, generator=gen).to(dtype)
    k = torch.randn(t, HKV, D, generator=gen).to(dtype)
    v = torch.randn(t, HKV, D, generator=gen).to(dtype)
    cache = tuple(torch.randn(NUM_BLOCKS, BLOCK_SIZE, HKV, D, generator=gen).to(dtype)
                  for _ in range(2))
    attn = AttentionMetadata(slot_mapping=torch.tensor(slots), block_tables=tables,
                             seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
                             query_start_loc=torch.tensor([0, q_lens[0], t], dtype=torch.int32))
    return q, k, v, cache, attn


def test_window_keyword_is_passed_only_for_a_windowed_layer():
    q, k, v, cache, attn = _step()
    ops = RecordingOps()
    paged_attention_layer(ops, q, k, v, cache, attn, 0.2)
    paged_attention_layer(ops, q, k, v, cache, attn, 0.2, sliding_window=0)
    paged_attention_layer(ops, q, k, v, cache, attn, 0.2, sliding_window=5)
    hinted = AttentionMetadata(**{**attn.__dict__, "max_query_len": 17, "max_seq_len": 30})
    paged_attention_layer(ops, q, k, v, cache, hinted, 0.2, sliding_window=5)
    invariant = AttentionMetadata(**{**attn.__dict__, "batch_invariant": True})
    paged_attention_layer(ops, q, k, v, cache, invariant, 0.2, sliding_window=7)
    assert ops.calls == [{}, {}, {"sliding_window": 5},
                         {"max_query_len": 17, "max_seq_len": 30, "workspace": None,
                          "sliding_window": 5},
                         {"batch_invariant": True, "sliding_window": 7}]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("window", [1, 3, 8, 13, 100])
def test_windowed_layer_matches_reference(dtype, window):
    """The CPU kernels through the layer (cache write included) against the
    reference ops with the same window."""
    q, k, v, cache, attn = _step(dtype)
    ref_cache = tuple(c.clone() for c in cache)
    got = paged_attention_layer(kernels, q, k, v, cache, attn, D**-0.5, sliding_window=window)
    want = paged_attention_layer(ReferenceAttentionOps(), q, k, v, ref_cache, attn, D**-0.5,
                                 sliding_window=window)
    assert all(torch.equal(a, b) for a, b in zip(cache, ref_cache, strict=True))
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got.float(), want.float(), atol=tol, rtol=tol)
    if window < 13:  # the decode's window (positions 30 - W .. 29) leaves some context out
        full = paged_attention_layer(ReferenceAttentionOps(), q, k, v, ref_cache, attn,
                                     D**-0.5)
        assert not torch.allclose(got[0].float(), full[0].float(), atol=1e-2)


def test_negative_window_is_a_value_error():
    q, k, v, cache, attn = _step()
    with pytest.raises(ValueError, match="sliding_window"):
        paged_attention_layer(RecordingOps(), q, k, v, cache, attn, 0.2, sliding_window=-1)


def test_sinks_keyword_is_passed_only_when_given():
    q, k, v, cache, attn = _step()
    ops = RecordingOps()
    sinks = torch.tensor([0.5, -1.0, 2.0, 0.0])
    paged_attention_layer(ops, q, k, v, cache, attn, 0.2)
    paged_attention_layer(ops, q, k, v, cache, attn, 0.2, sinks=None)
    paged_attention_layer(ops, q, k, v, cache, attn, 0.2, sliding_window=5, sinks=sinks)
    assert ops.calls[:2] == [{}, {}]
    assert ops.calls[2].keys() == {"sliding_window", "sinks"}
    assert ops.calls[2]["sinks"] is sinks


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("window", [0, 5])
def test_layer_with_sinks_matches_reference(dtype, window):
    """The CPU kernels through the layer with sinks (one per query head, one
    of them dominating) against the reference ops; sinks change the output."""
    q, k, v, cache, attn = _step(dtype)
    sinks = torch.tensor([0.5, -1.0, 2.0, 9.0])
    ref_cache = tuple(c.clone() for c in cache)
    got = paged_attention_layer(kernels, q, k, v, cache, attn, D**-0.5, sliding_window=window,
                                sinks=sinks)
    want = paged_attention_layer(ReferenceAttentionOps(), q, k, v, ref_cache, attn, D**-0.5,
                                 sliding_window=window, sinks=sinks)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got.float(), want.float(), atol=tol, rtol=tol)
    plain = paged_attention_layer(kernels, q, k, v, cache, attn, D**-0.5, sliding_window=window)
    assert not torch.allclose(got.float(), plain.float(), atol=1e-2)
