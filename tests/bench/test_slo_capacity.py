"""bench/slo_capacity.py: the simulated probe sends what `paternoster bench
capacity` sends, and the tables (no server)."""

from __future__ import annotations

import argparse

import pytest

from paternoster.bench.capacity import Objectives, SearchPlan
from paternoster.bench.cli import _Workload
from paternoster.bench.serve import ServeConfig, schedule
from paternoster.bench.slo_capacity import (
    LONG_MIX,
    Policy,
    longest_prompt_within,
    parse_args,
    policies,
    scaled_mixes,
    sim_capacity,
    sim_trace,
    table,
)  # fmt: skip


def bench_capacity_probe(mix: str, rate: float, n: int, seed: int, max_model_len: int):
    """The requests and send offsets of one `paternoster bench capacity` probe."""
    args = argparse.Namespace(tokenizer=None, api="completions", prefix_len=0, mix=mix,
                              dataset="mix", seed=seed, output_len=128)  # fmt: skip
    requests = _Workload(args, max_model_len).make(n)
    config = ServeConfig(base_url="http://x", model="m", request_rate=rate, seed=seed)
    return requests, schedule(config, requests)


@pytest.mark.parametrize("seed", [0, 3])
def test_simulated_probe_is_the_real_probe(seed):
    requests, offsets = bench_capacity_probe(LONG_MIX, 1.5, 90, seed, 8192)
    trace = sim_trace(LONG_MIX, 1.5, 90, seed, 8192)
    assert [t.prompt_len for t in trace] == [r.prompt_len for r in requests]
    assert [t.output_len for t in trace] == [r.output_len for r in requests]
    assert [t.arrival_time for t in trace] == pytest.approx(offsets, abs=1e-6)


def test_policies_and_serve_flags():
    ps = policies([128, 2048], Objectives(2.0, 0.2), {"margin": 0.05})
    assert [p.label for p in ps] == ["fcfs", "chunked_prefill 128", "chunked_prefill 2048", "slo"]
    assert ps[1].serve_args() == ["--scheduler", "chunked_prefill",
                                  "--max-num-batched-tokens", "128"]  # fmt: skip
    slo = ps[-1].serve_args()
    assert slo[:2] == ["--scheduler", "slo"] and '"itl_s": 0.2' in slo[-1]
    assert '"margin": 0.05' in slo[-1]


def test_table_ratios_are_against_the_best_baseline():
    text = table("cpu", {"fcfs": 2.0, "chunked_prefill 256": 2.5, "slo": 3.0},
                 {"fcfs": 2.0, "chunked_prefill 256": 2.0, "slo": 2.5})  # fmt: skip
    assert "| cpu | slo | 3 | 1.20× | 2.5 | 1.25× | 1.20 |" in text
    assert "| cpu | fcfs | 2 | 0.80× |" in text


def test_a_simulated_search_runs_and_finds_a_capacity():
    args = parse_args(["--probe-duration", "20", "--probe-requests", "10"])
    plan = SearchPlan("rate", 0.5, 2.0, 1, 0.1)
    res = sim_capacity(Policy("slo", "slo"), LONG_MIX, plan, Objectives(2.0, 0.2), args, None)
    assert res.capacity is not None and res.capacity >= 0.5
    assert all(p.ok is not None for p in res.probes)


def test_unknown_mix_is_refused():
    with pytest.raises(SystemExit):
        parse_args(["--mixes", "gpu"])


def _prefill_alone(cost_model, n: int) -> float:
    """A prompt of ``n`` tokens prefilled alone, by the cost model's terms
    written out here: overhead + per token + per (token, key) of its causal
    attention (token i sees i + 1 keys)."""
    per_key = cost_model.a_kv_prefill if cost_model.a_kv_prefill is not None else cost_model.a_kv
    return cost_model.overhead + n * cost_model.a_prefill + per_key * n * (n + 1) / 2


def test_mixes_are_scaled_to_the_machine():
    from dataclasses import replace

    from paternoster.bench.slo_capacity import MIXES
    from paternoster.scheduling.cost_model import DEFAULT_COST_MODEL

    # The project VM's model: the mixes as set (2048-token prompts fit in 2 s).
    assert longest_prompt_within(DEFAULT_COST_MODEL, 2.0) == 2048
    assert scaled_mixes(DEFAULT_COST_MODEL, 2.0) == MIXES
    # A machine 1.5x slower at prefill: the longest prompt is the last one within 2 s.
    slow = replace(DEFAULT_COST_MODEL, **{k: getattr(DEFAULT_COST_MODEL, k) * 1.5
                                          for k in ("overhead", "a_prefill", "a_kv_prefill")})
    top = longest_prompt_within(slow, 2.0)
    assert top < 2048 and top % 64 == 0
    assert _prefill_alone(slow, top) <= 2.0 < _prefill_alone(slow, top + 64)
    f = top / 2048
    mixes = scaled_mixes(slow, 2.0)
    assert mixes["long"].endswith(f"long_prompt=0.05:{round(1024 * f)}-{top}:8-64")
    assert mixes["cpu"] == (f"short=0.6:{round(16 * f)}-{round(256 * f)}:8-64,"
                            f"summary=0.3:{round(256 * f)}-{round(1024 * f)}:64-256,"
                            f"long_gen=0.1:{round(16 * f)}-{round(128 * f)}:256-512")


def test_sim_at_real_puts_the_simulator_next_to_each_measured_probe(tmp_path):
    import json

    from paternoster.bench.slo_capacity import sim_at_real
    from paternoster.scheduling.cost_model import DEFAULT_COST_MODEL

    DEFAULT_COST_MODEL.save(tmp_path / "cost_model.json")

    def probe(load, ttft, itl):
        return {"load": load, "ok": True, "summary": {"ttft": {"p95": ttft}, "itl": {"p95": itl}}}

    real = {"capacity": 1.0, "probes": [probe(0.5, 0.25, 0.05), probe(4.0, 9.5, 0.7)]}
    results = {"mix_specs": {"long": LONG_MIX},
               "mixes": {"long": {"fcfs": {"sim": {}, "real": real}, "slo": {"sim": {}}}}}
    (tmp_path / "results.json").write_text(json.dumps(results))
    text = sim_at_real(tmp_path, parse_args(["--probe-duration", "20", "--probe-requests", "10"]))
    rows = [r for r in text.splitlines() if r.startswith("| long |")]
    assert len(rows) == 2  # slo has no real search
    cells = [[c.strip() for c in r.strip("|").split("|")] for r in rows]
    assert cells[0][:4] == ["long", "fcfs", "0.5", "0.25"] and cells[0][5] == "50"
    assert cells[1][:4] == ["long", "fcfs", "4", "9.50"] and cells[1][5] == "700"
    # Eight times the load: the simulated p95 TTFT grows (fcfs saturates).
    assert float(cells[1][4]) > float(cells[0][4])


def test_the_server_fit_of_a_simulated_server_predicts_what_that_simulator_measured():
    """A 'server' that is the simulator on a known cost model: its timeline's
    fit gives that model back, so the search on it finds the same capacity."""
    from paternoster.bench.slo_capacity import FIT_HEAD, server_fit_row
    from paternoster.scheduling.cost_model import CostModel
    from paternoster.simulate import simulate
    from paternoster.simulate.gantt import to_timeline

    true = CostModel(overhead=0.03, a_prefill=4e-4, a_decode=9e-4, a_kv=3e-6, a_kv_prefill=6e-7)
    args = parse_args(["--probe-duration", "20", "--probe-requests", "10"])
    plan = SearchPlan("rate", 0.5, 2.0, 1, 0.1)
    policy = Policy("chunked_prefill 256", "chunked_prefill", max_num_batched_tokens=256)
    measured = sim_capacity(policy, LONG_MIX, plan, Objectives(2.0, 0.2), args, true)
    trace = sim_trace(LONG_MIX, 1.0, 40, 0, args.max_model_len)
    snapshot = to_timeline(simulate(trace, "chunked_prefill", cost_model=true,
                                    max_num_batched_tokens=256))
    row, record = server_fit_row(policy, "long", LONG_MIX, {"capacity": measured.capacity},
                                 snapshot, plan, Objectives(2.0, 0.2), args, None)
    assert record["sim"]["capacity"] == measured.capacity is not None
    assert record["cost_model"]["a_decode"] == pytest.approx(true.a_decode, rel=1e-6)
    assert row.count("|") == FIT_HEAD.splitlines()[0].count("|")
    assert f"| long | chunked_prefill 256 | {measured.capacity:g} | - | " in row


def test_the_capacity_plan_passes_its_ramp_factor_to_bench_capacity(tmp_path):
    """--real-from-sim ramps by 1.25 from near the simulator's answer: the
    factor must reach `paternoster bench capacity`, whose parser accepts it."""
    from paternoster.bench.peer_servers import CapacityPlan
    from paternoster.entrypoints.cli import make_parser

    cmd = CapacityPlan(start=2.1, factor=1.25).command("http://h:1", 2048, tmp_path / "x.json")
    args = make_parser().parse_args(cmd[1:])
    assert (args.start, args.factor) == (2.1, 1.25)


def test_the_ceiling_is_what_littles_law_gives_with_the_queue_full():
    """Unit cost (one time unit per step), every request 16 prompt tokens and
    8 output tokens, fcfs with 64 sequence slots: with the queue full each
    slot holds a request for 8 steps (the prefill step gives the first
    token), so 64 / 8 = 8 requests finish per step."""
    from paternoster.bench.slo_capacity import sim_ceiling
    from paternoster.scheduling.cost_model import CostModel

    args = parse_args(["--ceiling-requests", "1500"])
    got = sim_ceiling(Policy("fcfs", "fcfs"), "same=1.0:16-16:8-8", 10.0, args, CostModel.unit())
    assert got["offered"] == 40.0
    assert got["finished"] == pytest.approx(8.0, rel=0.03)
    assert got["itl_p95"] == pytest.approx(1.0)


def test_ceiling_table_bounds_the_ratio_by_the_fastest_policy_with_the_queue_full():
    from paternoster.bench.slo_capacity import ceiling_table

    text = ceiling_table("long", {"fcfs": 2.0, "chunked_prefill 256": 1.5, "slo": 2.2},
                         {"fcfs": {"finished": 2.5, "itl_p95": 0.7},
                          "chunked_prefill 256": {"finished": 2.4, "itl_p95": 0.4},
                          "slo": {"finished": 2.2, "itl_p95": 0.19}})  # fmt: skip
    assert "| long | fcfs | 2 | 2.50 | 0.700 | 0.80 |" in text
    assert "| long | slo | 2.2 | 2.20 | 0.190 | 1.00 |" in text
    assert "1.25×" in text  # 2.5 / 2.0


@pytest.mark.parametrize("argv", [
    ["--ceiling-requests", "0"], ["--ceiling-requests", "10"], ["--policies", "fcfs,bogus"],
    ["--probe-duration", "0"], ["--probe-requests", "0"], ["--bisect-rounds", "-1"],
    ["--chunks", "0"], ["--start", "-1"],
    ["--slo-ttft-p95", "0"], ["--slo-ttft-p95", "-1"], ["--slo-ttft-p95", "nan"],
    ["--slo-ttft-p95", "inf"], ["--slo-itl-p95", "0"], ["--slo-itl-p95", "-1"],
    ["--slo-itl-p95", "nan"], ["--slo-config", "xx"], ["--slo-config", "[1]"],
    ["--slo-config", '{"bogus": 1}'], ["--slo-config", '{"margin": 5}'],
    ["--slo-config", '{"cost_model": "/nonexistent/cm.json"}'], ["--chunks", "abc"],
    ["--chunks", "128,x"], ["--cost-model", "/nonexistent/cm.json"], ["--cost-model", " "],
])  # fmt: skip
def test_bad_arguments_are_refused(argv, capsys):
    with pytest.raises(SystemExit) as e:
        parse_args(argv)
    assert e.value.code == 2  # argparse's usage error, not a traceback
    assert argv[0] in capsys.readouterr().err


@pytest.mark.parametrize(("argv", "message"), [
    (["--slo-ttft-p95", "0"], "--slo-ttft-p95 must be a finite number > 0, got 0.0"),
    (["--slo-itl-p95", "nan"], "--slo-itl-p95 must be a finite number > 0, got nan"),
    (["--slo-config", '{"bogus": 1}'], "--slo-config: unknown scheduler_config keys for 'slo'"),
    (["--slo-config", '{"margin": 5}'], "--slo-config: margin must be"),
    (["--slo-config", "[1]"], "argument --slo-config: must be a JSON object, got '[1]'"),
    (["--chunks", "abc"], "--chunks must be token budgets (integers), comma-separated, "
                          "got 'abc'"),
    (["--cost-model", "/nonexistent/cm.json"], "--cost-model: cannot read cost model"),
])  # fmt: skip
def test_bad_arguments_fail_before_any_work_with_a_usage_error(argv, message, tmp_path, capsys):
    from paternoster.bench.slo_capacity import main

    out = tmp_path / "out"
    with pytest.raises(SystemExit) as e:
        main([*argv, "--out", str(out)])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert f"error: {message}" in err and "Traceback" not in err
    assert not out.exists()


def test_a_cost_model_file_and_slo_options_are_accepted(tmp_path):
    from paternoster.scheduling.cost_model import DEFAULT_COST_MODEL

    DEFAULT_COST_MODEL.save(tmp_path / "cm.json")
    args = parse_args(["--cost-model", str(tmp_path / "cm.json"), "--slo-ttft-p95", "1.5",
                       "--slo-config", '{"margin": 0.05, "load_shedding": true}'])  # fmt: skip
    assert args.slo_config == {"margin": 0.05, "load_shedding": True}
    assert args.slo_ttft_p95 == 1.5 and args.cost_model == str(tmp_path / "cm.json")


def test_known_policies_are_accepted():
    args = parse_args(["--policies", "fcfs,chunked_prefill 256,slo", "--chunks", "256"])
    assert args.policies == "fcfs,chunked_prefill 256,slo"
