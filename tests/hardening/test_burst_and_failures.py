"""A burst of 200 streams with random disconnects, engine death mid-stream,
and graceful shutdown on SIGTERM, against the fake engine."""

from __future__ import annotations

import asyncio
import os
import random
import re
import signal
import threading
import time

import httpx

from tests.hardening.conftest import fake_server

NUM_CLIENTS = 200
DISCONNECT_FRACTION = 0.3


def _finished(metrics_text: str, reason: str) -> float:
    """``paternoster:request_success_total{finished_reason=reason}``."""
    pattern = rf'^paternoster:request_success_total\{{finished_reason="{reason}"\}} (\S+)$'
    m = re.search(pattern, metrics_text, re.M)
    return float(m.group(1)) if m else 0.0


async def _client(http: httpx.AsyncClient, url: str, rng: random.Random, result: dict) -> None:
    max_tokens = rng.randint(20, 50)
    # Cut in the first half, so that the server (which may run ahead of a slow
    # reader) still has tokens to generate when it notices.
    cut_after = rng.randint(1, max_tokens // 2) if rng.random() < DISCONNECT_FRACTION else None
    body = {"prompt": "Tell me a story", "max_tokens": max_tokens, "stream": True,
            "ignore_eos": True}  # fmt: skip
    events = []
    async with http.stream("POST", url, json=body) as r:
        assert r.status_code == 200
        async for line in r.aiter_lines():
            if not line:
                continue
            events.append(line)
            if cut_after is not None and len(events) >= cut_after:
                break  # leaving the block closes the connection mid-stream
    result.update(max_tokens=max_tokens, cut=cut_after is not None, events=events)


def test_burst_with_random_disconnects_leaks_nothing(fake_model_dir):
    with fake_server(fake_model_dir, {"step_delay": 0.02}, "--num-kv-blocks", "4096") as srv:
        before = srv.get("/metrics").text
        rng = random.Random(7)
        results = [{} for _ in range(NUM_CLIENTS)]

        async def burst() -> None:
            limits = httpx.Limits(max_connections=NUM_CLIENTS + 10)
            async with httpx.AsyncClient(timeout=60, limits=limits) as http:
                await asyncio.gather(*(
                    _client(http, srv.url + "/v1/completions", rng, res) for res in results
                ))  # fmt: skip

        t0 = time.monotonic()
        asyncio.run(burst())
        assert time.monotonic() - t0 < 40
        cut = [r for r in results if r["cut"]]
        assert 0.15 * NUM_CLIENTS < len(cut) < 0.45 * NUM_CLIENTS
        for r in results:
            if r["cut"]:
                continue
            events = r["events"]
            assert events[-1] == "data: [DONE]", events[-3:]
            assert '"finish_reason":"length"' in events[-2].replace(" ", ""), events[-2]
            assert len(events) == r["max_tokens"] + 1  # one token per chunk, then [DONE]
        stats = srv.wait_for(
            lambda s: s["num_in_flight"] == 0 and s["num_waiting"] == 0
            and s["engine"]["num_running"] == 0 and s["engine"]["num_waiting"] == 0
            and s["engine"]["kv_cache_usage"] == 0,
            timeout=10, what="idle engine",
        )  # fmt: skip
        assert stats["engine"]["num_free_blocks"] == stats["engine"]["num_kv_blocks"]
        # Each request is counted once: finished (length) or aborted (a disconnect
        # noticed before its last token; the server may run ahead of the reader).
        after = srv.get("/metrics").text
        aborts = _finished(after, "abort") - _finished(before, "abort")
        lengths = _finished(after, "length") - _finished(before, "length")
        assert 0 < aborts <= len(cut)
        assert aborts + lengths == NUM_CLIENTS


def test_killed_engine_ends_streams_with_an_error_within_2s(fake_model_dir):
    with fake_server(fake_model_dir, {"step_delay": 0.05}) as srv:
        result: dict = {}

        def stream() -> None:
            body = {"prompt": "Hi", "max_tokens": 200, "stream": True, "ignore_eos": True}
            with httpx.stream("POST", srv.url + "/v1/completions", json=body, timeout=30) as r:
                result["events"] = [line for line in r.iter_lines() if line]
            result["done"] = time.monotonic()

        t = threading.Thread(target=stream)
        t.start()
        srv.wait_for(lambda s: s["engine"].get("num_running") == 1, what="running")
        os.kill(srv.engine_pid(), signal.SIGKILL)
        killed = time.monotonic()
        t.join(10)
        assert result["done"] - killed < 2.0
        assert '"error"' in result["events"][-2] and result["events"][-1] == "data: [DONE]"
        health = srv.get("/health")
        assert health.status_code == 503 and "exited" in health.json()["reason"]


def test_sigterm_drains_then_ends_streams_and_exits_0(fake_model_dir):
    with fake_server(fake_model_dir, {"step_delay": 0.05}, "--shutdown-timeout", "2.5") as srv:
        results: dict = {}

        def stream(name: str, max_tokens: int) -> None:
            body = {"prompt": "Hi", "max_tokens": max_tokens, "stream": True, "ignore_eos": True}
            with httpx.stream("POST", srv.url + "/v1/completions", json=body, timeout=30) as r:
                results[name] = [line for line in r.iter_lines() if line]

        threads = [threading.Thread(target=stream, args=("short", 20)),
                   threading.Thread(target=stream, args=("long", 200))]  # fmt: skip
        for t in threads:
            t.start()
        srv.wait_for(lambda s: s["num_in_flight"] == 2, what="2 in flight")
        srv.proc.send_signal(signal.SIGTERM)
        t0 = time.monotonic()
        for t in threads:
            t.join(15)
        assert srv.proc.wait(15) == 0
        assert time.monotonic() - t0 < 8
        short, long_ = results["short"], results["long"]
        assert short[-1] == "data: [DONE]" and '"error"' not in "".join(short)  # finished
        assert '"error"' in long_[-2] and "shutting down" in long_[-2]  # cut at the timeout
        assert long_[-1] == "data: [DONE]"


def test_ctrl_c_to_the_process_group_drains_like_sigterm(fake_model_dir):
    """A terminal's Ctrl-C sends SIGINT to the frontend and the engine alike:
    the engine must keep running while the frontend drains."""
    with fake_server(fake_model_dir, {"step_delay": 0.05}, "--shutdown-timeout", "5",
                     new_session=True) as srv:
        result: dict = {}

        def stream() -> None:
            body = {"prompt": "Hi", "max_tokens": 30, "stream": True, "ignore_eos": True}
            with httpx.stream("POST", srv.url + "/v1/completions", json=body, timeout=30) as r:
                result["events"] = [line for line in r.iter_lines() if line]

        t = threading.Thread(target=stream)
        t.start()
        srv.wait_for(lambda s: s["num_in_flight"] == 1, what="1 in flight")
        engine = srv.engine_pid()
        os.killpg(os.getpgid(srv.proc.pid), signal.SIGINT)
        t.join(15)
        assert srv.proc.wait(15) == 0
        events = result["events"]
        assert events[-1] == "data: [DONE]" and '"error"' not in "".join(events), events[-3:]
        assert len([e for e in events if '"text"' in e]) == 30  # every token arrived
        deadline = time.monotonic() + 10  # the frontend stopped the engine afterwards
        while _alive(engine):
            assert time.monotonic() < deadline, "engine still running"
            time.sleep(0.1)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_restart_engine_brings_a_new_engine_up(fake_model_dir):
    with fake_server(fake_model_dir, {"step_delay": 0.05}, "--restart-engine") as srv:
        result: dict = {}

        def stream() -> None:
            body = {"prompt": "Hi", "max_tokens": 200, "stream": True, "ignore_eos": True}
            with httpx.stream("POST", srv.url + "/v1/completions", json=body, timeout=30) as r:
                result["events"] = [line for line in r.iter_lines() if line]
            result["done"] = time.monotonic()

        t = threading.Thread(target=stream)
        t.start()
        srv.wait_for(lambda s: s["engine"].get("num_running") == 1, what="running")
        old_pid = srv.engine_pid()
        os.kill(old_pid, signal.SIGKILL)
        killed = time.monotonic()
        t.join(10)
        assert result["done"] - killed < 2.0
        assert '"error"' in result["events"][-2] and result["events"][-1] == "data: [DONE]"
        deadline = time.monotonic() + 60
        while srv.get("/health").status_code != 200:
            assert time.monotonic() < deadline, srv.get("/health").text
            time.sleep(0.2)
        assert srv.engine_pid() != old_pid
        body = {"prompt": "Hi", "max_tokens": 3}
        r = httpx.post(srv.url + "/v1/completions", json=body, timeout=30)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3
