"""Soak (``pytest -m soak``; not in make test): 1,000 mixed requests with random
client aborts; afterwards nothing is in flight and the RSS of the frontend and
the engine process is within 10% of what it was after a warm-up."""

from __future__ import annotations

import asyncio
import random

import httpx
import pytest

from tests.hardening.conftest import fake_server

NUM_REQUESTS = 1000
CONCURRENCY = 64


def _rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError(f"no VmRSS for pid {pid}")


async def _one(http: httpx.AsyncClient, url: str, rng: random.Random) -> None:
    chat = rng.random() < 0.5
    stream = rng.random() < 0.6
    body = {"max_tokens": rng.randint(1, 60), "stream": stream, "n": rng.choice([1, 1, 2])}
    if chat:
        path, body["messages"] = "/v1/chat/completions", [{"role": "user", "content": "Hi " * 20}]
    else:
        path, body["prompt"] = "/v1/completions", "Once upon a time " * rng.randint(1, 10)
    abort_after = rng.uniform(0.01, 0.5) if rng.random() < 0.3 else None

    async def run() -> None:
        if stream:
            async with http.stream("POST", url + path, json=body) as r:
                async for _ in r.aiter_lines():
                    pass
        else:
            await http.post(url + path, json=body)

    if abort_after is None:
        await run()
    else:
        try:
            await asyncio.wait_for(run(), abort_after)
        except asyncio.TimeoutError:
            pass


async def _load(url: str, count: int, seed: int) -> None:
    rng = random.Random(seed)
    sem = asyncio.Semaphore(CONCURRENCY)
    limits = httpx.Limits(max_connections=CONCURRENCY + 8)
    async with httpx.AsyncClient(timeout=60, limits=limits) as http:

        async def bounded() -> None:
            async with sem:
                await _one(http, url, rng)

        await asyncio.gather(*(bounded() for _ in range(count)))


@pytest.mark.soak
def test_soak_mixed_requests_with_aborts_keeps_rss_flat(fake_model_dir):
    with fake_server(fake_model_dir, {"step_delay": 0.005}, "--num-kv-blocks", "8192") as srv:
        asyncio.run(_load(srv.url, 200, seed=1))  # warm-up: caches, pools, allocator
        idle = lambda s: s["num_in_flight"] == 0 and s["engine"]["num_running"] == 0  # noqa: E731
        srv.wait_for(idle, timeout=30, what="idle after warm-up")
        pids = {"frontend": srv.proc.pid, "engine": srv.engine_pid()}
        before = {k: _rss_kib(p) for k, p in pids.items()}
        asyncio.run(_load(srv.url, NUM_REQUESTS, seed=2))
        stats = srv.wait_for(idle, timeout=30, what="idle after the soak")
        assert stats["engine"]["kv_cache_usage"] == 0 and stats["num_waiting"] == 0
        after = {k: _rss_kib(p) for k, p in pids.items()}
        for k in pids:
            assert after[k] <= before[k] * 1.10, (k, before[k], after[k])
