"""Chunked prefill keeps running decodes flowing when a long prompt arrives."""

from __future__ import annotations

from paternoster.simulate import DEFAULT_COST_MODEL, TraceRequest, simulate

DECODERS = [f"d{i}" for i in range(4)]


def trace() -> list[TraceRequest]:
    """Four short chats decoding from t=0; a 3000-token prompt arrives at t=1 s."""
    reqs = [TraceRequest(0.0, 64, 80, request_id=rid) for rid in DECODERS]
    return [*reqs, TraceRequest(1.0, 3000, 8, request_id="long")]


def run(policy: str):
    return simulate(
        trace(), policy, cost_model=DEFAULT_COST_MODEL,
        max_num_seqs=8, max_num_batched_tokens=512, max_model_len=4096,
        num_kv_blocks=512, block_size=16,
    )  # fmt: skip


def decode_itls(result) -> dict[str, float]:
    return {m.request_id: max(m.itls) for m in result.requests if m.request_id in DECODERS}


def test_chunked_prefill_lowers_max_itl_of_running_decodes():
    """FCFS computes the 3000-token prompt in one step, stalling every running
    decode for the whole prefill; chunked prefill (Sarathi-Serve, OSDI'24)
    computes it in chunks of at most 512 tokens next to the decodes, so the
    worst gap each decode sees is one chunk-sized step. (Its p95 ITL can be
    higher: the prefill's cost is spread over more steps; the stall is what
    it removes.)"""
    fcfs, chunked = run("fcfs"), run("chunked_prefill")
    itl_fcfs, itl_chunked = decode_itls(fcfs), decode_itls(chunked)
    for rid in DECODERS:
        assert itl_chunked[rid] < itl_fcfs[rid]
    assert max(itl_chunked.values()) < max(itl_fcfs.values())
    # The ordering comes from the structure of the steps, not from a timing.
    assert max(s.prefill_tokens for s in fcfs.steps) == 3000
    assert max(s.prefill_tokens + s.decode_tokens for s in chunked.steps) <= 512
    assert all(m.num_output_tokens == m.output_len for m in chunked.requests)
