"""``paternoster bench capacity`` against stub servers whose latency grows with load."""

from __future__ import annotations

import json
import time

from paternoster.bench.cli import main as bench_main
from tests.bench.stub_server import StubServer

COMMON = ["--dataset", "random", "--input-len", "8", "--output-len", "3", "--no-progress"]


def test_concurrency_capacity_is_found_by_bisection(tmp_path, capsys):
    """TTFT = 80 ms x requests in flight: concurrency 6 gives 0.48 s, 7 gives
    0.56 s, so a quiet machine finds capacity 5 or 6. A stall of the machine
    only adds latency (one on a CI run took concurrency 4's p95 from 0.32 to
    0.58 s): the capacity found is at most 6, and the search is checked on
    the probes it made, whatever they measured: the ramp doubles from 1 to
    the first failure, the bisection converges between the last pass and it."""
    out, png = tmp_path / "cap.json", tmp_path / "cap.png"
    t0 = time.monotonic()
    with StubServer(ttft=0.0, ttft_per_inflight=0.08, itl=0.005) as srv:
        rc = bench_main([
            "capacity", "--base-url", srv.url, *COMMON, "--mode", "concurrency",
            "--slo-ttft-p95", "0.52", "--slo-itl-p95", "0.1", "--start", "1",
            "--bisect-rounds", "5", "--probe-requests", "1", "--json", str(out), "--png", str(png),
        ])  # fmt: skip
    assert rc == 0 and time.monotonic() - t0 < 60
    data = json.loads(out.read_text())
    assert 1 <= data["capacity"] <= 6 and data["first_fail"] == data["capacity"] + 1
    ramp = [p["load"] for p in data["probes"] if p["phase"] == "ramp"]
    assert ramp == [2**i for i in range(len(ramp))] and ramp[-1] >= data["first_fail"]
    assert [p["ok"] for p in data["probes"][:len(ramp)]] == [True] * (len(ramp) - 1) + [False]
    assert data["stopped"] == "converged"
    for p in data["probes"]:
        assert p["summary"]["num_sent"] == max(1, 3 * int(p["load"]))
        assert p["ok"] == (p["load"] <= data["capacity"])
    assert png.read_bytes()[:4] == b"\x89PNG"
    assert "capacity: " in capsys.readouterr().out


def test_rate_capacity_lies_in_the_expected_bracket(tmp_path):
    # One serial 25 ms prefill per request: the server saturates at 40 req/s.
    out = tmp_path / "cap.json"
    t0 = time.monotonic()
    with StubServer(ttft=0.0, prefill_s=0.025, itl=0.005) as srv:
        rc = bench_main([
            "capacity", "--base-url", srv.url, *COMMON, "--slo-ttft-p95", "0.25",
            "--slo-itl-p95", "0.1", "--start", "20", "--bisect-rounds", "2",
            "--tolerance", "0.1", "--probe-requests", "20", "--probe-duration", "1",
            "--json", str(out),
        ])  # fmt: skip
    assert rc == 0 and time.monotonic() - t0 < 60
    data = json.loads(out.read_text())
    assert 20 <= data["capacity"] < 80 and data["first_fail"] <= 80
    first = data["probes"][0]
    assert first["load"] == 20 and first["summary"]["num_sent"] == 20


def test_capacity_search_is_bounded_in_time_and_requests(tmp_path):
    out = tmp_path / "cap.json"
    with StubServer(ttft=0.01, itl=0.005) as srv:  # never saturates
        t0 = time.monotonic()
        rc = bench_main([
            "capacity", "--base-url", srv.url, *COMMON, "--slo-ttft-p95", "1",
            "--slo-itl-p95", "1", "--start", "10", "--probe-duration", "0.5",
            "--probe-requests", "5", "--max-duration", "2", "--max-requests", "1000",
            "--json", str(out),
        ])  # fmt: skip
        elapsed = time.monotonic() - t0
        assert rc == 0 and elapsed < 5
        data = json.loads(out.read_text())
        assert data["stopped"] == "max_duration" and data["capacity"] >= 10
        rc = bench_main([
            "capacity", "--base-url", srv.url, *COMMON, "--slo-ttft-p95", "1",
            "--slo-itl-p95", "1", "--start", "50", "--max-requests", "70", "--json", str(out),
        ])  # fmt: skip
    data = json.loads(out.read_text())
    assert data["stopped"] == "max_requests"
    assert sum(p["summary"]["num_sent"] for p in data["probes"]) <= 70
    assert [p["ok"] for p in data["probes"]] == [True, None]  # the second was cut to 20


def test_each_probe_sends_fresh_prompts_of_the_same_lengths(tmp_path):
    # A prompt repeated in a later probe would hit the server's prefix cache:
    # the probe would time cache hits, not prefill. Each probe gets its own
    # text, and the same lengths (what the simulator replays).
    with StubServer(ttft=0.0, itl=0.001) as srv:
        rc = bench_main([
            "capacity", "--base-url", srv.url, "--dataset", "mix", "--mix", "a=1:4-40:2-3",
            "--no-progress", "--mode", "concurrency", "--slo-ttft-p95", "5",
            "--slo-itl-p95", "5", "--start", "1", "--bisect-rounds", "0",
            "--probe-requests", "1", "--max-load", "4", "--warmup", "0",
            "--json", str(tmp_path / "cap.json"),
        ])  # fmt: skip
    assert rc == 0
    prompts = [b["prompt"] for b in srv.bodies]
    sizes = [max(1, 3 * load) for load in (1, 2, 4)]
    assert len(prompts) == sum(sizes)
    probes = [prompts[:3], prompts[3:9], prompts[9:]]
    heads = [{" ".join(p.split()[:4]) for p in probe} for probe in probes]
    assert not heads[0] & heads[1] and not heads[0] & heads[2] and not heads[1] & heads[2]
    # Lengths: the first n requests of the workload, as without fresh text
    # (max_model_len 4096 of the stub, fitted as bench capacity fits it).
    from paternoster.bench.workload import PromptMaker, make_mix, parse_mix

    same = make_mix(12, PromptMaker(None, 0), parse_mix("a=1:4-40:2-3"), None, 0)
    for probe, n in zip(probes, sizes):
        assert sorted(len(p.split()) for p in probe) == sorted(r.prompt_len for r in same[:n])


def test_jsonl_prompt_len_lines_get_fresh_text_per_probe_and_literal_ones_are_noted(
        tmp_path, capsys):  # fmt: skip
    trace = tmp_path / "trace.jsonl"
    lines = [json.dumps({"prompt_len": n, "output_len": 2}) for n in (8, 12, 16)]
    trace.write_text("\n".join([*lines, json.dumps({"prompt": "the same words", "output_len": 2})]))
    with StubServer(ttft=0.0, itl=0.001) as srv:
        rc = bench_main([
            "capacity", "--base-url", srv.url, "--dataset", f"jsonl:{trace}", "--no-progress",
            "--mode", "concurrency", "--slo-ttft-p95", "5", "--slo-itl-p95", "5", "--start", "1",
            "--bisect-rounds", "0", "--probe-requests", "4", "--max-load", "2", "--warmup", "0",
        ])  # fmt: skip
    assert rc == 0
    assert "note: 1 JSONL prompts are literal text" in capsys.readouterr().out
    prompts = [b["prompt"] for b in srv.bodies]
    first, second = prompts[:4], prompts[4:10]  # 4 requests at 1, then 6 at 2
    made = lambda probe: {p for p in probe if p != "the same words"}  # noqa: E731
    assert len(made(first)) == 3 and not made(first) & made(second)
    assert sorted(len(p.split()) for p in made(first)) == [8, 12, 16]
