#!/usr/bin/env python
"""The ZeroMQ client protocol vs the OpenAI HTTP API, side by side in one run.

Starts ``paternoster serve`` over the model-free :class:`NullEngineCore` (so
the figures are the frontend's, the links' and the engine loop's cost, not a
model's), then, at each concurrency, streams the same requests through HTTP
(httpx, SSE, ``/v1/completions`` with token-id prompts) and through
``paternoster.client.AsyncClient``, alternating the two paths twice. Reports
requests/s, tokens/s, TTFT and E2E percentiles per path and the ZMQ/HTTP
ratios; writes JSON with ``--json``.

Client and server share the machine, so each path's client-side cost (SSE
and JSON parsing vs msgpack) is part of what is measured, as a Python user of
either API would see it. The HTTP client is aiohttp by default (as vLLM's
``benchmark_serving`` and most load generators use); ``--http-client httpx``
uses httpx, whose connection pool costs the client a core at a few hundred
concurrent streams (the server then waits on the client: see
docs/benchmarks.md).

    python bench/zmq_vs_http.py --concurrency 1,64,256 --num-requests 1000 --json zmq.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from paternoster.client import AsyncClient

PROMPT = list(range(1000, 1032))  # 32 prompt tokens


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def null_server(model_dir: str, timeout: float = 120.0,
                extra_args: tuple[str, ...] = ()) -> Iterator[tuple[str, str]]:  # fmt: skip
    """``paternoster serve`` over the null engine (plus ``extra_args``); yields
    ``(http_url, zmq_address)``."""
    port, zport = _free_port(), _free_port()
    address = f"tcp://127.0.0.1:{zport}"
    cmd = [sys.executable, "-m", "paternoster.entrypoints.cli", "serve", model_dir,
           "--engine-cls", "paternoster.bench.null_engine:NullEngineCore", "--port", str(port),
           "--zmq-address", address, "--log-level", "warning", "--max-num-seqs", "4096",
           "--max-model-len", "4096", *extra_args]  # fmt: skip
    root = str(Path(__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen(cmd, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"server exited with code {proc.returncode}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise TimeoutError("server not healthy in time")
            time.sleep(0.2)
        yield url, address
    finally:
        proc.terminate()
        proc.wait(30)


def _body(model: str, max_tokens: int) -> dict:
    return {"model": model, "prompt": PROMPT, "max_tokens": max_tokens, "stream": True,
            "stream_options": {"include_usage": True}}  # fmt: skip


async def _read_sse(lines: Any, t0: float) -> tuple:
    """``(ttft s, e2e s, completion tokens)`` of one SSE stream of text lines."""
    ttft, tokens = None, 0
    async for line in lines:
        if not line.startswith("data:") or line == "data: [DONE]":
            continue
        chunk = json.loads(line[5:])
        if chunk.get("choices") and ttft is None:
            ttft = time.perf_counter() - t0
        if chunk.get("usage"):
            tokens = chunk["usage"]["completion_tokens"]
    return ttft, time.perf_counter() - t0, tokens


async def _http_one(http: httpx.AsyncClient, url: str, model: str, max_tokens: int) -> tuple:
    t0 = time.perf_counter()
    async with http.stream("POST", url + "/v1/completions", json=_body(model, max_tokens)) as r:
        if r.status_code != 200:
            raise RuntimeError(f"HTTP {r.status_code}")
        return await _read_sse(r.aiter_lines(), t0)


async def _aiohttp_one(session: Any, url: str, model: str, max_tokens: int) -> tuple:
    async def lines(content: Any) -> Any:
        async for raw in content:  # one SSE line at a time
            yield raw.decode().strip()

    t0 = time.perf_counter()
    async with session.post(url + "/v1/completions", json=_body(model, max_tokens)) as r:
        if r.status != 200:
            raise RuntimeError(f"HTTP {r.status}")
        return await _read_sse(lines(r.content), t0)


async def _zmq_one(c: AsyncClient, max_tokens: int) -> tuple:
    t0 = time.perf_counter()
    ttft, tokens = None, 0
    async for d in c.stream(prompt_token_ids=PROMPT, max_tokens=max_tokens):
        if ttft is None:
            ttft = time.perf_counter() - t0
        if d.usage is not None:
            tokens = d.usage.completion_tokens
    return ttft, time.perf_counter() - t0, tokens


async def run_path(path: str, url: str, address: str, model: str, concurrency: int,
                   num_requests: int, max_tokens: int, http_client: str = "aiohttp") -> dict:
    """``num_requests`` streamed requests, ``concurrency`` at a time, over ``path``
    (``"http"`` through ``http_client``, ``"aiohttp"`` or ``"httpx"``, or ``"zmq"``)."""
    sem = asyncio.Semaphore(concurrency)
    async with contextlib.AsyncExitStack() as stack:
        if path == "http" and http_client == "httpx":
            limits = httpx.Limits(max_connections=concurrency + 4,
                                  max_keepalive_connections=concurrency)  # fmt: skip
            http = await stack.enter_async_context(httpx.AsyncClient(timeout=120, limits=limits))
            one = lambda: _http_one(http, url, model, max_tokens)  # noqa: E731
        elif path == "http":
            import aiohttp

            session = await stack.enter_async_context(aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=concurrency + 4),
                timeout=aiohttp.ClientTimeout(total=120)))  # fmt: skip
            one = lambda: _aiohttp_one(session, url, model, max_tokens)  # noqa: E731
        else:
            c = await AsyncClient.connect(address, timeout=120)
            stack.push_async_callback(c.close)
            one = lambda: _zmq_one(c, max_tokens)  # noqa: E731

        async def bounded() -> tuple:
            async with sem:
                return await one()

        t0 = time.perf_counter()
        results = await asyncio.gather(*(bounded() for _ in range(num_requests)))
        duration = time.perf_counter() - t0
    ttft = np.array([r[0] for r in results]) * 1e3
    e2e = np.array([r[1] for r in results]) * 1e3
    tokens = sum(r[2] for r in results)
    if tokens != num_requests * max_tokens:
        raise RuntimeError(f"{path}: {tokens} tokens, expected {num_requests * max_tokens}")
    return {
        "path": path, "concurrency": concurrency, "num_requests": num_requests,
        "duration_s": duration, "req_per_s": num_requests / duration,
        "tok_per_s": tokens / duration,
        **{f"ttft_ms_p{q}": float(np.percentile(ttft, q)) for q in (50, 99)},
        **{f"e2e_ms_p{q}": float(np.percentile(e2e, q)) for q in (50, 99)},
        "e2e_ms_mean": float(e2e.mean()),
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model-dir", default=None,
                    help="a directory with tokenizer files (default: the embedded model's)")
    ap.add_argument("--concurrency", default="1,64,256")
    ap.add_argument("--num-requests", type=int, default=1000)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=2, help="HTTP/ZMQ alternations per point")
    ap.add_argument("--json", default=None)
    ap.add_argument("--http-client", choices=("aiohttp", "httpx"), default="aiohttp",
                    help="the HTTP path's client library")
    args = ap.parse_args(argv)
    model_dir = args.model_dir
    if model_dir is None:
        from paternoster.model.default_model import default_model_dir

        model_dir = str(default_model_dir())
    levels = [int(x) for x in args.concurrency.split(",")]
    rows = []
    with null_server(model_dir) as (url, address):
        model = httpx.get(url + "/v1/models").json()["data"][0]["id"]
        for c in levels:
            n = args.num_requests if c > 1 else min(args.num_requests, 300)
            for _ in range(args.rounds):
                for path in ("http", "zmq"):
                    row = asyncio.run(run_path(path, url, address, model, c, n,
                                               args.max_tokens, args.http_client))
                    rows.append(row)
                    print(f"  {path:4s} c={c:<4d} {row['req_per_s']:8.1f} req/s "
                          f"e2e p50 {row['e2e_ms_p50']:7.1f} ms", flush=True)  # fmt: skip
    table = summarize(rows, levels)
    print(table)
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "args": vars(args)}, indent=2))
    return 0


def summarize(rows: list[dict], levels: list[int]) -> str:
    """A markdown table: per concurrency and path the mean over rounds, and ZMQ/HTTP."""
    out = ["| concurrency | path | req/s | tok/s | TTFT p50 ms | E2E p50 ms | E2E p99 ms |",
           "|---:|---|---:|---:|---:|---:|---:|"]  # fmt: skip
    keys = ("req_per_s", "tok_per_s", "ttft_ms_p50", "e2e_ms_p50", "e2e_ms_p99")
    for c in levels:
        mean = {}
        for path in ("http", "zmq"):
            sel = [r for r in rows if r["concurrency"] == c and r["path"] == path]
            mean[path] = {k: float(np.mean([r[k] for r in sel])) for k in keys}
            m = mean[path]
            out.append(f"| {c} | {path} | {m['req_per_s']:.1f} | {m['tok_per_s']:.0f} | "
                       f"{m['ttft_ms_p50']:.2f} | {m['e2e_ms_p50']:.2f} | "
                       f"{m['e2e_ms_p99']:.2f} |")  # fmt: skip
        h, z = mean["http"], mean["zmq"]
        out.append(f"| {c} | **zmq / http** | **{z['req_per_s'] / h['req_per_s']:.2f}x** | "
                   f"{z['tok_per_s'] / h['tok_per_s']:.2f}x | "
                   f"{z['ttft_ms_p50'] / h['ttft_ms_p50']:.2f}x | "
                   f"{z['e2e_ms_p50'] / h['e2e_ms_p50']:.2f}x | "
                   f"{z['e2e_ms_p99'] / h['e2e_ms_p99']:.2f}x |")  # fmt: skip
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())
