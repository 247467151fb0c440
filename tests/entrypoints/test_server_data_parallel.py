"""`paternoster serve --data-parallel-size 2`: two engine processes behind one
frontend. With the real default model: greedy outputs equal a single-engine
server's, both engines serve, a shared long prefix stays on one engine and
hits its prefix cache, /metrics and /health show each engine. With the fake
engine: killing one engine fails only its own in-flight request that had
output, the other keeps serving, and --restart-engine brings it back; a
request that had no output yet finishes on the other engine instead.

The suite sets PATERNOSTER_NUM_THREADS=1 (tests/conftest.py): each engine runs
one thread, pinned to a core of its own when the machine has two.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import threading
import time

import httpx
import pytest

from tests.entrypoints.utils import FAKE_ENGINE, start_server
from tests.metrics.utils import scrape, value

MODEL_ARGS = ("--num-kv-blocks", "256", "--max-model-len", "1024")
PROMPTS = [
    "The capital of France is",
    "Water boils at a temperature of",
    "def fibonacci(n):",
    "Once upon a time, in a small village,",
    "The three primary colors are",
    "To make a cup of tea, first",
]
LONG_PREFIX = " ".join(f"Rule {i}: answer briefly and politely." for i in range(30))


def _complete(url: str, prompt: str, max_tokens: int = 12) -> dict:
    r = httpx.post(url + "/v1/completions", timeout=60,
                   json={"prompt": prompt, "max_tokens": max_tokens, "temperature": 0})  # fmt: skip
    r.raise_for_status()
    return r.json()


@pytest.fixture(scope="module")
def dp_server(default_model_path):
    with start_server(str(default_model_path), *MODEL_ARGS, "--data-parallel-size", "2") as srv:
        yield srv


def test_greedy_outputs_equal_a_single_engine_server(dp_server, default_model_path):
    got = [_complete(dp_server.url, p)["choices"][0]["text"] for p in PROMPTS]
    with start_server(str(default_model_path), *MODEL_ARGS) as single:
        want = [_complete(single.url, p)["choices"][0]["text"] for p in PROMPTS]
    assert got == want
    engines = dp_server.get("/stats").json()["engines"]
    assert [e["index"] for e in engines] == [0, 1]
    # Requests one at a time tie on load: the router takes the engines in turn.
    assert all(e["engine"]["prefix_cache_queries"] > 0 for e in engines)
    assert engines[0]["engine_pid"] != engines[1]["engine_pid"]
    if engines[0]["cpus"] is not None:  # pinned (two physical cores): each to its own
        assert not set(engines[0]["cpus"]) & set(engines[1]["cpus"])


def test_shared_long_prefix_stays_on_one_engine_and_hits_its_cache(dp_server):
    before = dp_server.get("/stats").json()
    for question in ("What is 2+2?", "Name a fruit.", "Say hello.", "Count to three."):
        _complete(dp_server.url, LONG_PREFIX + " " + question, max_tokens=4)
    after = dp_server.get("/stats").json()
    hits = [a["engine"]["prefix_cache_hits"] - b["engine"]["prefix_cache_hits"]
            for a, b in zip(after["engines"], before["engines"])]  # fmt: skip
    queries = [a["engine"]["prefix_cache_queries"] - b["engine"]["prefix_cache_queries"]
               for a, b in zip(after["engines"], before["engines"])]  # fmt: skip
    served = [i for i, q in enumerate(queries) if q > 0]
    assert len(served) == 1  # all four went to one engine
    prefix_tokens = len(httpx.post(dp_server.url + "/tokenize", timeout=10,
                                   json={"prompt": LONG_PREFIX}).json()["tokens"])  # fmt: skip
    # The three after the first reuse at least the prefix's whole blocks, less one.
    assert hits[served[0]] >= 3 * (prefix_tokens // 16 - 1) * 16
    assert after["router"]["affinity"] - before["router"]["affinity"] == 3


def test_metrics_health_and_stats_show_each_engine(dp_server):
    for i in range(2):  # an idle server spreads unrelated prompts round-robin: one each
        body = {"prompt": [300 + i] * 5, "max_tokens": 2}
        assert httpx.post(dp_server.url + "/v1/completions", json=body, timeout=60).is_success
    samples = scrape(dp_server.url)
    for engine in ("0", "1"):
        assert ("paternoster:num_requests_running", (("engine", engine),)) in samples
        assert ("paternoster:iteration_tokens_total_count", (("engine", engine),)) in samples
    assert value(samples, "paternoster:iteration_tokens_total_count", engine="1") > 0
    health = dp_server.get("/health")
    assert health.status_code == 200
    assert health.json()["engines"] == [{"engine": 0, "status": "ok"},
                                        {"engine": 1, "status": "ok"}]  # fmt: skip
    stats = dp_server.get("/stats").json()
    assert stats["engine"]["prefix_cache_queries"] == sum(
        e["engine"]["prefix_cache_queries"] for e in stats["engines"])


# ------------------------------------------------------- engine death (fake)


@pytest.fixture(scope="module")
def fake_dp_server(default_model_path, tmp_path_factory):
    d = tmp_path_factory.mktemp("fake_model_dp")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        if (default_model_path / name).exists():
            shutil.copy(default_model_path / name, d / name)
    (d / "fake_engine.json").write_text(json.dumps({"step_delay": 0.02}))
    with start_server(str(d), "--engine-cls", FAKE_ENGINE, "--data-parallel-size", "2",
                      "--restart-engine") as srv:  # fmt: skip
        yield srv


def test_one_engine_dying_fails_only_its_requests_and_it_comes_back(fake_dp_server):
    srv = fake_dp_server
    results: dict[int, httpx.Response] = {}

    def run(i: int) -> None:
        body = {"prompt": [100 + i, 7, 7, 7], "max_tokens": 200, "ignore_eos": True}
        results[i] = httpx.post(srv.url + "/v1/completions", json=body, timeout=60)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    # Both have had output (none waits): a request that had none would be
    # re-routed to the other engine instead of failing.
    stats = srv.wait_for(lambda s: [e["num_in_flight"] for e in s["engines"]] == [1, 1]
                         and s["num_waiting"] == 0, timeout=30,
                         what="one request streaming on each engine")  # fmt: skip
    victim = stats["engines"][1]
    running = "paternoster:num_requests_running"
    srv.wait_for(lambda s: value(scrape(srv.url), running, engine="1") == 1, timeout=30,
                 what="engine 1's heartbeat with its request running")  # fmt: skip
    os.kill(victim["engine_pid"], signal.SIGKILL)
    deadline = time.monotonic() + 30
    while not any(r.status_code == 503 for r in list(results.values())):
        assert time.monotonic() < deadline, "the victim's request did not fail"
        time.sleep(0.05)
    # Its request failed: the dead engine's gauges read 0, not its last
    # heartbeat (scraped before the restart, which spawns a new process).
    assert value(scrape(srv.url), running, engine="1") == 0
    dead = srv.get("/stats").json()["engines"][1]["engine"]
    assert (dead.get("num_running"), dead.get("num_free_blocks")) in {(0, 0), (None, None)}
    for t in threads:
        t.join(60)
    codes = sorted(r.status_code for r in results.values())
    assert codes == [200, 503]  # the survivor's request finished, the victim's failed
    assert srv.get("/stats").json()["router"]["rerouted"] == 0  # it had output: not moved
    failed = next(r for r in results.values() if r.status_code == 503)
    assert "engine" in failed.json()["error"]["message"]
    done = next(r for r in results.values() if r.status_code == 200)
    assert done.json()["usage"]["completion_tokens"] == 200
    # The other engine keeps serving whatever the victim's state.
    for i in range(3):
        r = httpx.post(srv.url + "/v1/completions", timeout=30,
                       json={"prompt": [200 + i, 1, 2], "max_tokens": 3})  # fmt: skip
        assert r.status_code == 200
    assert srv.get("/health").status_code == 200
    back = srv.wait_for(lambda s: s["engines"][1]["num_restarts"] == 1
                        and s["engines"][1]["alive"], timeout=60, what="engine 1 restarted")
    assert back["engines"][1]["engine_pid"] != victim["engine_pid"]
    assert srv.get("/health").json()["engines"][1] == {"engine": 1, "status": "ok"}
    # ... and takes requests again: two at once land one on each engine.
    results.clear()
    threads = [threading.Thread(target=run, args=(i,)) for i in range(10, 12)]
    for t in threads:
        t.start()
    srv.wait_for(lambda s: [e["num_in_flight"] for e in s["engines"]] == [1, 1],
                 timeout=30, what="one request on each engine again")  # fmt: skip
    for t in threads:
        t.join(60)
    assert [r.status_code for r in results.values()] == [200, 200]


def test_a_request_whose_engine_dies_before_output_is_served_by_the_other(fake_dp_server):
    srv = fake_dp_server
    engines = srv.wait_for(lambda s: all(e["alive"] for e in s["engines"]), timeout=60,
                           what="both engines up")["engines"]  # fmt: skip
    before = srv.get("/stats").json()["router"]["rerouted"]
    victim = engines[1]["engine_pid"]
    os.kill(victim, signal.SIGSTOP)  # takes its request and never answers
    results: dict[int, httpx.Response] = {}

    def run(i: int) -> None:
        body = {"prompt": [400 + i, 7], "max_tokens": 50, "ignore_eos": True}
        results[i] = httpx.post(srv.url + "/v1/completions", json=body, timeout=60)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    try:
        for t in threads:
            t.start()
        srv.wait_for(lambda s: s["engines"][1]["num_in_flight"] == 1, timeout=30,
                     what="a request on the stopped engine")  # fmt: skip
    finally:
        os.kill(victim, signal.SIGKILL)
    for t in threads:
        t.join(60)
    # Both succeed, in full: the stranded one was sent to engine 0 once.
    assert [r.status_code for r in results.values()] == [200, 200]
    assert all(r.json()["usage"]["completion_tokens"] == 50 for r in results.values())
    assert srv.get("/stats").json()["router"]["rerouted"] == before + 1
    srv.wait_for(lambda s: s["engines"][1]["alive"], timeout=60, what="engine 1 restarted")
