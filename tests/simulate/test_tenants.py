"""Tenants in simulator traces and the per-tenant results (``fair`` policy)."""

from __future__ import annotations

import pytest

from paternoster.simulate import CostModel, TraceRequest, load_trace, save_trace, simulate
from paternoster.simulate.cli import main
from paternoster.simulate.tenants import format_tenant_table, tenant_summary


def two_tenants() -> list[TraceRequest]:
    """Six requests of "a" then two of ``None`` (the anonymous tenant), all at t = 0."""
    trace = [TraceRequest(0.0, 8, 4, tenant="a") for _ in range(6)]
    return trace + [TraceRequest(0.0, 8, 4) for _ in range(2)]


def test_tenant_round_trips_through_a_trace_file_and_is_validated(tmp_path):
    trace = [TraceRequest(0.0, 10, 3, tenant="acme"), TraceRequest(0.5, 20, 4)]
    save_trace(trace, tmp_path / "t.jsonl")
    assert load_trace(tmp_path / "t.jsonl") == trace
    assert '"tenant"' not in (tmp_path / "t.jsonl").read_text().splitlines()[1]
    with pytest.raises(ValueError, match="tenant must be a non-empty string"):
        TraceRequest(0.0, 1, 1, tenant="")


def test_summary_counts_every_token_of_every_tenant():
    trace = two_tenants()
    res = simulate(trace, "fair", cost_model=CostModel.unit(), max_num_seqs=2,
                   num_kv_blocks=16, block_size=4, max_model_len=16)  # fmt: skip
    rows = tenant_summary(res, until=float("inf"))
    assert [r["tenant"] for r in rows] == [None, "a"]
    anon, a = rows
    assert (anon["num_requests"], a["num_requests"]) == (2, 6)
    assert (anon["output_tokens"], a["output_tokens"]) == (8, 24)
    # every prompt once (no preemption here) and 3 decode tokens per request
    assert (a["prefill_tokens"], a["decode_tokens"]) == (48, 18)
    assert res.num_preemptions_total == 0


def test_fair_serves_the_anonymous_tenant_early_and_fcfs_last():
    """Two slots: fcfs runs a's six requests first; fair alternates."""
    kw = dict(cost_model=CostModel.unit(), max_num_seqs=2, num_kv_blocks=16, block_size=4,
              max_model_len=16)  # fmt: skip
    ttft = {p: tenant_summary(simulate(two_tenants(), p, **kw), float("inf"))[0]["ttft_p95"]
            for p in ("fcfs", "fair")}  # fmt: skip
    assert ttft["fair"] < ttft["fcfs"]
    table = format_tenant_table([simulate(two_tenants(), "fair", **kw)], until=float("inf"))
    assert "| fair | - | 2 |" in table and "| fair | a | 6 |" in table


def test_cli_prints_a_row_per_tenant(tmp_path, capsys):
    save_trace(two_tenants(), tmp_path / "t.jsonl")
    rc = main(["--trace", str(tmp_path / "t.jsonl"), "--compare", "fcfs,fair", "--unit-cost",
               "--max-model-len", "64", "--num-kv-blocks", "64", "--no-plot",
               "--out", str(tmp_path / "o")])  # fmt: skip
    assert rc == 0
    out = capsys.readouterr().out
    assert "by tenant" in out and "| fair | a |" in out and "| fcfs | - |" in out
    assert "| fair | a |" in (tmp_path / "o" / "summary.md").read_text()
