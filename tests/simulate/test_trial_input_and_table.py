"""User-trial findings on ``paternoster simulate``: trace bounds (arrival time,
tenant length), an empty ``--compare``, and the comparison, tenant and
priority tables with refused requests or figures that have no value."""

from __future__ import annotations

import json

import pytest

from paternoster.frontend.processor import MAX_TENANT_LENGTH
from paternoster.simulate import TraceRequest, load_trace
from paternoster.simulate.cli import main
from paternoster.simulate.results import (
    RequestMetrics,
    SimulationResult,
    format_priority_table,
    format_table,
)
from paternoster.simulate.tenants import format_tenant_table, tenant_summary
from paternoster.simulate.trace import MAX_ARRIVAL_TIME


def _line(**fields) -> str:
    return json.dumps({"arrival_time": 0.0, "prompt_len": 10, "output_len": 5, **fields}) + "\n"


# ---------------------------------------------------------- arrival_time bound


def test_max_arrival_time_admits_unix_epoch_seconds():
    assert MAX_ARRIVAL_TIME >= 4e9  # year 2096
    assert TraceRequest(1.7e9, 10, 5).arrival_time == 1.7e9
    assert TraceRequest(MAX_ARRIVAL_TIME, 10, 5).arrival_time == MAX_ARRIVAL_TIME


@pytest.mark.parametrize("value", ["1e308", "1e16", "10000000001", "1" + "0" * 400])
def test_arrival_time_past_the_bound_is_a_file_line_error(tmp_path, value):
    path = tmp_path / "t.jsonl"
    path.write_text(_line() + f'{{"arrival_time": {value}, "prompt_len": 10, "output_len": 5}}\n')
    with pytest.raises(ValueError, match=r"t\.jsonl:2: arrival_time must be at most 1e\+10"):
        load_trace(path)


def test_cli_arrival_time_1e308_is_a_clean_error(tmp_path, capsys):
    # It used to crash in format_table (TypeError on a None cell).
    path = tmp_path / "t.jsonl"
    path.write_text(_line(arrival_time=1e308))
    assert main(["--trace", str(path), "--no-plot", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert f"error: {path}:1: arrival_time must be at most 1e+10, got 1e+308" in err
    assert "Traceback" not in err


# ---------------------------------------------------------------- tenant length


def test_trace_tenant_follows_the_http_rule(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text(_line(tenant="a" * MAX_TENANT_LENGTH))
    assert load_trace(path)[0].tenant == "a" * MAX_TENANT_LENGTH
    path.write_text(_line() + _line(tenant="a" * (MAX_TENANT_LENGTH + 1)))
    with pytest.raises(ValueError, match=rf"t\.jsonl:2: tenant must be at most "
                                         rf"{MAX_TENANT_LENGTH} characters, got 257"):
        load_trace(path)
    path.write_text(_line(tenant=""))
    with pytest.raises(ValueError, match=r"t\.jsonl:1: tenant must be a non-empty string"):
        load_trace(path)


def test_cli_long_tenant_is_a_clean_error(tmp_path, capsys):
    path = tmp_path / "t.jsonl"
    path.write_text(_line(tenant="x" * 257))
    assert main(["--trace", str(path), "--no-plot", "--out", str(tmp_path / "o")]) == 2
    assert f"{path}:1: tenant must be at most 256 characters" in capsys.readouterr().err


# ------------------------------------------------------------------- --compare


@pytest.mark.parametrize("value", ["", " , ", "fcfs,fcfs"])
def test_empty_or_repeated_compare_is_a_usage_error(tmp_path, capsys, value):
    with pytest.raises(SystemExit) as e:
        main(["--mix", "--num-requests", "2", "--compare", value, "--no-plot",
              "--out", str(tmp_path / "o")])  # fmt: skip
    assert e.value.code == 2
    assert "argument --compare:" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()  # nothing ran


def test_paternoster_simulate_compare_empty_is_a_usage_error(tmp_path, capsys):
    from paternoster.entrypoints.cli import main as paternoster

    with pytest.raises(SystemExit) as e:
        paternoster(["simulate", "--mix", "--compare", "", "--out", str(tmp_path / "o")])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "paternoster simulate: error: argument --compare: needs policy names" in err


# ---------------------------------------------------------- comparison table


def _cells(table: str, policy: str) -> dict[str, str]:
    """The cells of `policy`'s first row in the Markdown `table`, by column name."""
    head = table.splitlines()[0]
    row = next(r for r in table.splitlines() if r.startswith(f"| {policy} |"))
    names = [c.strip() for c in head.strip("|").split("|")]
    return dict(zip(names, (c.strip() for c in row.strip("|").split("|"))))


def test_table_shows_dashes_when_no_request_produced_a_token():
    refused = RequestMetrics("r0", None, 0, 0.0, 10, 5, error="late")
    res = SimulationResult("slo", {}, {}, {}, [refused], [], 0, 16)
    assert res.summary()["throughput_req_s"] is None  # the None that crashed the table
    row = _cells(format_table([res]), "slo")
    assert row["refused"] == "1 of 1"
    assert row["TTFT p50"] == row["req/s"] == row["output tok/s"] == "-"
    assert row["preemptions"] == "0"


def test_cli_every_request_refused_prints_a_table(tmp_path, capsys):
    path = tmp_path / "t.jsonl"
    path.write_text(_line(prompt_len=4000))  # prefill alone misses a 10 ms TTFT target
    rc = main(["--trace", str(path), "--scheduler", "slo", "--no-plot",
               "--scheduler-config", '{"ttft_s": 0.01, "itl_s": 0.2, "load_shedding": true}',
               "--out", str(tmp_path / "o")])  # fmt: skip
    assert rc == 0
    row = _cells(capsys.readouterr().out.split("\n", 1)[1], "slo")
    assert row["refused"] == "1 of 1" and row["req/s"] == "-"


def test_compare_table_counts_the_requests_a_policy_refused(tmp_path, capsys):
    out = tmp_path / "o"
    rc = main(["--mix", "--num-requests", "40", "--compare", "fcfs,slo", "--no-plot",
               "--scheduler-config",
               '{"slo": {"ttft_s": 2, "itl_s": 0.2, "load_shedding": true}}',
               "--out", str(out)])  # fmt: skip
    assert rc == 0
    printed = capsys.readouterr().out
    errors = json.loads((out / "slo.json").read_text())["summary"]["num_errors"]
    assert errors > 0  # load shedding refused some: the figure the table hid
    for table in ((out / "summary.md").read_text(), printed.split("\n", 1)[1]):
        assert _cells(table, "slo")["refused"] == f"{errors} of 40"
        assert _cells(table, "fcfs")["refused"] == "0 of 40"


def test_tenant_and_priority_tables_count_refused_requests():
    """A tenant (and a priority) whose only request was refused has a row with
    it counted as refused and no latencies; it used to crash the tenant table
    (IndexError) and vanish from the priority table."""
    refused = RequestMetrics("r0", None, 1, 0.0, 4000, 5, tenant="a", error="late")
    served = RequestMetrics("r1", None, 0, 0.5, 10, 2, num_output_tokens=2,
                            first_scheduled_time=0.5, token_times=[1.0, 1.5],
                            tenant="b")  # fmt: skip
    res = SimulationResult("slo", {}, {}, {}, [refused, served], [], 0, 16)
    a, b = tenant_summary(res)
    assert (a["tenant"], a["num_requests"], a["num_errors"], a["ttft_p50"]) == ("a", 1, 1, None)
    assert (b["tenant"], b["num_errors"], b["ttft_p50"], b["e2e_p95"]) == ("b", 0, 0.5, 1.0)
    tenants = format_tenant_table([res])
    row_a = next(r for r in tenants.splitlines() if r.startswith("| slo | a |"))
    assert [c.strip() for c in row_a.strip("|").split("|")][2:4] == ["1", "1"]
    assert row_a.rstrip().endswith("| - | - | - |")
    by_prio = res.summary()["by_priority"]
    assert by_prio["1"]["num_requests"] == by_prio["1"]["num_errors"] == 1
    assert by_prio["0"] == {**by_prio["0"], "num_requests": 1, "num_errors": 0}
    prio = format_priority_table([res])
    assert "| slo | 1 | 1 | 1 | - | - | - |" in prio
    assert "| slo | 0 | 1 | 0 | 0.500 | 0.500 | 1.000 |" in prio


def test_trace_carries_per_request_slo_targets(tmp_path, capsys):
    """Two equal 2000-token prompts under slo with load shedding and a 10 s
    server target: the one whose own ``slo_ttft_s`` (10 ms) is under its
    prefill time is refused, the other served."""
    path = tmp_path / "t.jsonl"
    path.write_text(_line(prompt_len=2000, request_id="own", slo_ttft_s=0.01, slo_itl_s=5)
                    + _line(prompt_len=2000, request_id="server"))  # fmt: skip
    out = tmp_path / "o"
    config = '{"ttft_s": 10, "itl_s": 5, "load_shedding": true}'
    rc = main(["--trace", str(path), "--scheduler", "slo", "--no-plot", "--out", str(out),
               "--scheduler-config", config])  # fmt: skip
    assert rc == 0
    reqs = {r["request_id"]: r for r in json.loads((out / "slo.json").read_text())["requests"]}
    assert reqs["own"]["error"] and "TTFT target of 0.01 s" in reqs["own"]["error"]
    assert reqs["server"]["error"] is None and reqs["server"]["num_output_tokens"] == 5
    path.write_text(_line(slo_ttft_s=0))
    with pytest.raises(ValueError, match=r"t\.jsonl:1: slo_ttft_s must be a number of seconds > 0"):
        load_trace(path)
