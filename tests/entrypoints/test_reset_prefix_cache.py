"""POST /reset_prefix_cache end to end: a real engine process over a tiny
random-weight model (prefix caching on by default), and the fake engine (no cache)."""

from __future__ import annotations

import shutil
import time

import httpx
import pytest

from tests.entrypoints.utils import FAKE_ENGINE, start_server
from tests.metrics.timeline_utils import write_tiny_model

PROMPT = list(range(10, 42))  # 32 tokens = 8 full blocks of 4
BODY = {"prompt": PROMPT, "max_tokens": 2, "ignore_eos": True, "temperature": 0}


@pytest.fixture(scope="module")
def server(default_model_path, tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny-prefix")
    write_tiny_model(d)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(default_model_path / name, d / name)
    with start_server(
        str(d), "--load-format", "dummy", "--dtype", "float32", "--max-model-len", "128",
        "--block-size", "4", "--num-kv-blocks", "64",
    ) as srv:  # fmt: skip
        yield srv


def _engine_stats(srv) -> dict:
    """The engine counters of the latest heartbeat (GET /stats)."""
    return httpx.get(srv.url + "/stats", timeout=5).json()["engine"]


def _hits_after(srv, body: dict) -> int:
    """Send ``body``, then the engine's prefix-cache hit counter (tokens) once the
    heartbeat stats reflect the finished request."""
    steps_before = _engine_stats(srv).get("num_steps", 0)
    r = httpx.post(srv.url + "/v1/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        stats = _engine_stats(srv)
        idle = stats.get("num_running") == 0 and stats.get("num_waiting") == 0
        if idle and stats.get("num_steps", 0) > steps_before:
            return int(stats["prefix_cache_hits"])
        time.sleep(0.2)
    raise AssertionError(f"engine still busy: {stats}")


def test_reset_makes_the_next_identical_prompt_miss(server):
    base = _hits_after(server, BODY)
    again = _hits_after(server, BODY)
    assert again - base == 28  # 7 whole blocks; the last block holds the last prompt token
    r = httpx.post(server.url + "/reset_prefix_cache", timeout=30)
    assert r.status_code == 200, r.text
    assert r.json()["num_blocks_reset"] >= 8
    assert _hits_after(server, BODY) == again  # nothing cached any more
    assert _hits_after(server, BODY) - again == 28  # cached again by the previous request


def test_engine_without_a_prefix_cache_answers_400(default_model_path, tmp_path):
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(default_model_path / name, tmp_path / name)
    with start_server(str(tmp_path), "--engine-cls", FAKE_ENGINE) as srv:
        r = httpx.post(srv.url + "/reset_prefix_cache", timeout=30)
    assert r.status_code == 400
    assert "prefix cache" in r.json()["error"]["message"]
