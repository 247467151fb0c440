"""The simulator's results as a request timeline: one chart and one trace format with the engine."""

from __future__ import annotations

import pytest

from paternoster.metrics.chrome_trace import to_chrome_trace
from paternoster.metrics.timeline import queue_intervals
from paternoster.simulate import CostModel, simulate, synthetic_mix
from paternoster.simulate.gantt import plot_gantt, to_timeline
from tests.metrics.timeline_utils import check_chrome_trace

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def preempting_result():
    trace = synthetic_mix(12, rate=2.0, seed=3, max_model_len=512)
    result = simulate(
        trace, "chunked_prefill", cost_model=CostModel.unit(), num_kv_blocks=48, block_size=16,
        max_num_seqs=8, max_num_batched_tokens=128, max_model_len=512,
    )  # fmt: skip
    assert result.num_preemptions_total > 0
    return result


def test_timeline_accounts_for_every_token(preempting_result):
    res = preempting_result
    snap = to_timeline(res)
    assert [r["request_id"] for r in snap["requests"]] == [m.request_id for m in res.requests]
    assert len(snap["steps"]) == len(res.steps) and snap["origin"] == 0.0
    for m, r in zip(res.requests, snap["requests"]):
        spans = [e for e in r["events"] if e["kind"] != "preempt"]
        assert sum(e["sampled"] for e in spans) == m.output_len == r["num_output_tokens"]
        first = [e for e in spans if not e["recompute"] and e["kind"] == "prefill"]
        if m.num_preemptions == 0:
            assert sum(e["tokens"] for e in first) == m.prompt_len
        assert r["num_preemptions"] == m.num_preemptions
        assert r["first_scheduled"] == spans[0]["start"] and r["finish"] == m.finish_time
        assert len(queue_intervals(r, snap["now"])) == 1 + m.num_preemptions
    check_chrome_trace(to_chrome_trace(snap))


@pytest.mark.parametrize("x", ["time", "step"])
def test_plot_gantt_writes_a_png(preempting_result, tmp_path, x):
    plot_gantt(preempting_result, tmp_path / "g.png", x=x)
    assert (tmp_path / "g.png").read_bytes()[:8] == PNG_MAGIC
