"""Benchmark statistics against an independent computation on hand-built records."""

from __future__ import annotations

import math

import numpy as np
import pytest

from paternoster.bench.client import RequestRecord
from paternoster.bench.stats import SLOs, describe, summarize


def _record(i, ttft, itl, output_tokens, e2e=None, *, sent=None, prompt_tokens=10, error=None):
    """A successful (or, with ``error``, failed) request of known timings."""
    if error is not None:
        return RequestRecord(i, "t", 10, 16, scheduled=0.1 * i, sent=0.1 * i, error=error)
    e2e = e2e if e2e is not None else ttft + sum(itl)
    return RequestRecord(
        i, "t", 10, 16, scheduled=0.1 * i, sent=0.1 * i if sent is None else sent,
        success=True, ttft=ttft, itl=list(itl), e2e=e2e, prompt_tokens=prompt_tokens,
        output_tokens=output_tokens, output_tokens_source="usage", num_chunks=len(itl) + 1,
    )  # fmt: skip


@pytest.fixture
def records():
    rng = np.random.default_rng(7)
    out = []
    for i in range(40):
        n = int(rng.integers(1, 30))
        itl = rng.uniform(0.01, 0.2, size=n - 1).tolist()
        out.append(_record(i, float(rng.uniform(0.05, 2.0)), itl, n, prompt_tokens=5 + i))
    out.append(_record(40, 0, [], 0, error="HTTP 500: boom"))
    out.append(_record(41, 0, [], 0, error="HTTP 500: boom"))
    out.append(RequestRecord(42, "t", 10, 16, scheduled=4.2))  # never sent
    return out


def test_describe_matches_numpy():
    v = np.random.default_rng(0).lognormal(size=1001)
    d = describe(v.tolist())
    for p in (50, 95, 99):
        assert d[f"p{p}"] == pytest.approx(np.percentile(v, p))
    assert d["mean"] == pytest.approx(v.mean())
    assert d["max"] == pytest.approx(v.max())
    assert describe([]) is None


def test_tpot_is_decode_time_over_tokens_after_the_first():
    r = _record(0, 0.5, [0.1, 0.2, 0.3], 4, e2e=1.4)
    assert r.tpot == pytest.approx((1.4 - 0.5) / 3)
    assert _record(1, 0.5, [], 1).tpot is None  # one token: no TPOT
    assert _record(2, 0, [], 0, error="x").tpot is None


def test_summary_percentiles_and_definitions(records):
    ok = [r for r in records if r.success]
    s = summarize(records, duration=10.0)
    ttft = np.array([r.ttft for r in ok])
    itl = np.concatenate([r.itl for r in ok])  # every gap of every request, pooled
    e2e = np.array([r.e2e for r in ok])
    tpot = np.array([(r.e2e - r.ttft) / (r.output_tokens - 1) for r in ok if r.output_tokens > 1])
    for name, v in (("ttft", ttft), ("itl", itl), ("e2e", e2e), ("tpot", tpot)):
        for p in (50, 95, 99):
            assert s[name][f"p{p}"] == pytest.approx(np.percentile(v, p)), (name, p)
        assert s[name]["mean"] == pytest.approx(v.mean())
    assert s["itl"]["mean"] != pytest.approx(np.mean([np.mean(r.itl) for r in ok if r.itl]))


def test_summary_counts_and_throughput(records):
    ok = [r for r in records if r.success]
    s = summarize(records, duration=10.0)
    assert (s["num_requests"], s["num_sent"], s["num_not_sent"]) == (43, 42, 1)
    assert (s["num_completed"], s["num_errors"]) == (40, 2)
    assert s["error_rate"] == pytest.approx(2 / 42)
    assert s["errors"] == {"HTTP 500: boom": 2}
    out = sum(r.output_tokens for r in ok)
    inp = sum(r.prompt_tokens for r in ok)
    assert s["total_output_tokens"] == out
    assert s["request_throughput"] == pytest.approx(4.0)
    assert s["output_throughput"] == pytest.approx(out / 10)
    assert s["total_token_throughput"] == pytest.approx((out + inp) / 10)
    assert s["offered_rate"] == pytest.approx(42 / 4.2)  # 43 due every 0.1 s
    assert s["send_rate"] == pytest.approx(41 / 4.1)
    assert s["max_send_lag"] == pytest.approx(0.0)


def test_goodput_counts_requests_meeting_every_slo(records):
    ok = [r for r in records if r.success]
    slos = SLOs(ttft=1.0, itl=0.18, tpot=0.15, e2e=3.0)
    good = [
        r for r in ok
        if r.ttft <= 1.0 and max(r.itl, default=0) <= 0.18 and r.e2e <= 3.0
        and (r.output_tokens < 2 or (r.e2e - r.ttft) / (r.output_tokens - 1) <= 0.15)
    ]  # fmt: skip
    assert 0 < len(good) < len(ok)
    s = summarize(records, duration=8.0, slos=slos)
    assert s["num_good"] == len(good)
    assert s["goodput"] == pytest.approx(len(good) / 8.0)
    assert s["slo_attainment"] == pytest.approx(len(good) / 42)
    assert s["slos"] == {"ttft": 1.0, "itl": 0.18, "tpot": 0.15, "e2e": 3.0}
    # Without SLOs every completed request is good.
    assert summarize(records, 8.0)["goodput"] == pytest.approx(40 / 8.0)


def test_slos_must_be_positive():
    with pytest.raises(ValueError, match="ttft"):
        SLOs(ttft=0)


def test_rates_when_everything_is_due_at_once():
    recs = [_record(i, 0.1, [0.01], 2, sent=0.0) for i in range(3)]
    for r in recs:
        r.scheduled = 0.0
    s = summarize(recs, 1.0)
    assert math.isinf(s["offered_rate"]) and math.isinf(s["send_rate"])
    assert summarize([], 0.0)["request_throughput"] is None
