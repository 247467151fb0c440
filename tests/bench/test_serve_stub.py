"""The load generator and the streaming client against a loopback stub server."""

from __future__ import annotations

import asyncio
import json
import math
import statistics

import pytest

from paternoster.bench.cli import main as bench_main
from paternoster.bench.serve import ServeConfig, run_serve
from paternoster.bench.stats import SLOs
from paternoster.bench.workload import PromptMaker, make_random
from tests.bench.stub_server import StubServer
from tests.entrypoints.utils import free_port


def _run(url, n=8, output_len=5, **cfg):
    reqs = make_random(n, PromptMaker(), 12, output_len)
    config = ServeConfig(base_url=url, model=cfg.pop("model", "stub"), progress=False, **cfg)
    return asyncio.run(run_serve(config, reqs))


@pytest.mark.parametrize("api", ["completions", "chat"])
def test_streams_are_timed_and_tokens_come_from_usage(api):
    with StubServer(ttft=0.05, itl=0.02, tokens_per_chunk=2) as srv:
        res = _run(srv.url, n=6, output_len=7, api=api)
    s = res.summary
    assert (s["num_completed"], s["num_errors"]) == (6, 0)
    assert s["total_output_tokens"] == 6 * 7  # usage, though only 4 chunks each
    for r in res.records:
        assert r.output_tokens_source == "usage" and r.num_chunks == 4 and len(r.itl) == 3
        assert 0.05 <= r.ttft < 0.5
        # Each gap is one chunk's arrival after the previous one: a chunk the
        # client's loop reads late lengthens one gap and shortens the next,
        # so single gaps only bound loosely; their median is the stub's 20 ms.
        assert all(0.0 <= g < 1.0 for g in r.itl)
        assert r.e2e >= r.ttft + sum(r.itl) - 1e-6
        assert r.tpot == pytest.approx((r.e2e - r.ttft) / 6)
        assert r.prompt_tokens == 12 and r.finish_reason == "length"
    assert 0.015 <= statistics.median(g for r in res.records for g in r.itl) < 0.3
    body = srv.bodies[0]
    assert body["stream"] and body["stream_options"] == {"include_usage": True}
    assert ("messages" in body) == (api == "chat") and body["max_tokens"] == 7


def test_errors_are_counted_not_raised():
    with StubServer() as srv:
        wrong = _run(srv.url, n=3, model="nope").summary
        assert wrong["num_errors"] == 3 and wrong["num_completed"] == 0
        assert list(wrong["errors"]) == ["HTTP 404: The model `nope` does not exist."]
        for mode, msg in (("http500", "HTTP 500: boom"), ("error", "error in stream: engine died"),
                          ("nodone", "stream ended before [DONE]")):  # fmt: skip
            s = _run(srv.url, n=2, extra_body={"stub_mode": mode}).summary
            assert (s["num_errors"], s["num_completed"], list(s["errors"])) == (2, 0, [msg]), mode
        s = _run(srv.url, n=2, timeout=0.3, extra_body={"stub_mode": "hang"}).summary
        assert s["num_errors"] == 2 and list(s["errors"]) == ["timeout after 0.3 s"]
    closed = _run(f"http://127.0.0.1:{free_port()}", n=3).summary
    assert closed["num_errors"] == 3 and "ConnectError" in next(iter(closed["errors"]))


def test_the_schedule_is_absolute_so_a_slow_server_keeps_the_offered_load():
    with StubServer(ttft=0.5) as srv:  # every request takes 0.5 s, sends every ~50 ms
        res = _run(srv.url, n=20, request_rate=20.0, seed=1)
    s = res.summary
    assert s["num_completed"] == 20
    # A sender that waited for each answer would lag 19 x 0.45 s ~ 8.5 s and send
    # at ~2 req/s; the bounds leave room for a loaded CI machine (0.6 s seen).
    assert s["max_send_lag"] < 1.5
    assert s["send_rate"] > 0.5 * s["offered_rate"]
    assert srv.max_in_flight >= 5  # requests overlapped instead of queueing behind each other


def test_max_concurrency_caps_requests_in_flight():
    with StubServer(ttft=0.05) as srv:
        res = _run(srv.url, n=12, max_concurrency=3)
    assert res.summary["num_completed"] == 12 and srv.max_in_flight == 3
    assert math.isinf(res.summary["offered_rate"])


def test_send_window_leaves_late_requests_unsent():
    with StubServer() as srv:
        reqs = make_random(10, PromptMaker(), 5, 2)
        config = ServeConfig(base_url=srv.url, model="stub", request_rate=10.0, progress=False)
        res = asyncio.run(run_serve(config, reqs, send_window=0.35))
    s = res.summary
    assert 0 < s["num_sent"] < 10 and s["num_not_sent"] == 10 - s["num_sent"]
    assert s["num_errors"] == 0 and s["num_completed"] == s["num_sent"]


def test_goodput_against_slos():
    with StubServer(ttft=0.01, itl=0.01) as srv:
        res = _run(srv.url, n=4, slos=SLOs(ttft=5.0, e2e=5.0))
        assert res.summary["goodput"] == pytest.approx(4 / res.duration)
        res = _run(srv.url, n=4, slos=SLOs(ttft=1e-6))
        assert res.summary["num_good"] == 0 and res.summary["goodput"] == 0


def test_cli_serve_writes_json_and_png(tmp_path, capsys):
    out, png = tmp_path / "r.json", tmp_path / "cdf.png"
    with StubServer(ttft=0.02, itl=0.005) as srv:
        rc = bench_main([
            "serve", "--base-url", srv.url, "--dataset", "random", "--input-len", "20",
            "--output-len", "6", "--num-prompts", "10", "--request-rate", "50",
            "--burstiness", "0.5", "--slo-ttft", "2", "--slo-itl", "1", "--json", str(out),
            "--cdf-png", str(png), "--no-progress",
        ])  # fmt: skip
    assert rc == 0
    text = capsys.readouterr().out
    assert "Serving benchmark" in text and "Goodput" in text and "model stub" in text
    assert "Offered rate: schedule / sent" in text and "send lag" in text
    data = json.loads(out.read_text())
    assert data["summary"]["num_completed"] == 10
    assert data["summary"]["total_output_tokens"] == 60
    assert data["config"]["request_rate"] == 50 and data["config"]["burstiness"] == 0.5
    assert data["workload"]["dataset"] == "random" and len(data["requests"]) == 10
    assert all(r["success"] and r["output_tokens"] == 6 for r in data["requests"])
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_serve_against_a_closed_port_counts_errors(tmp_path, capsys):
    out = tmp_path / "r.json"
    rc = bench_main([
        "serve", "--base-url", f"http://127.0.0.1:{free_port()}", "--model", "m",
        "--num-prompts", "4", "--json", str(out), "--no-progress", "--cdf-png",
        str(tmp_path / "c.png"),
    ])  # fmt: skip
    assert rc == 1  # nothing completed
    data = json.loads(out.read_text())
    assert data["summary"]["num_errors"] == 4 and data["config"]["request_rate"] == "inf"
    assert "Errors:" in capsys.readouterr().out


def test_cli_serve_without_model_or_server_is_a_usage_error(capsys):
    rc = bench_main(["serve", "--base-url", f"http://127.0.0.1:{free_port()}", "--no-progress"])
    assert rc == 2 and "pass --model" in capsys.readouterr().err


def test_cli_trace_timing_replays_arrival_times(tmp_path):
    trace = tmp_path / "t.jsonl"
    times = [0.0, 0.3, 0.31, 0.6]
    trace.write_text("".join(
        json.dumps({"arrival_time": t + 5, "prompt_len": 4, "output_len": 2}) + "\n"
        for t in times
    ))  # fmt: skip
    out = tmp_path / "r.json"
    with StubServer() as srv:
        rc = bench_main([
            "serve", "--base-url", srv.url, "--dataset", f"jsonl:{trace}", "--trace-timing",
            "--json", str(out), "--no-progress",
        ])  # fmt: skip
    assert rc == 0
    recs = json.loads(out.read_text())["requests"]
    assert [r["scheduled"] for r in recs] == pytest.approx(times)
    assert all(abs(r["sent"] - r["scheduled"]) < 0.05 for r in recs)


def test_a_closed_loop_reports_no_schedule_or_send_lag(capsys):
    """A concurrency cap with no rate has no schedule: "offered inf" and a
    lag behind time 0 would mean nothing."""
    with StubServer(ttft=0.01, itl=0.005) as srv:
        rc = bench_main(["serve", "--base-url", srv.url, "--dataset", "random", "--input-len", "8",
                         "--output-len", "3", "--num-prompts", "6", "--max-concurrency", "2",
                         "--no-progress"])  # fmt: skip
    text = capsys.readouterr().out
    assert rc == 0 and "Send rate (req/s)" in text
    assert "Offered rate" not in text and "send lag" not in text and "inf" not in text
