"""A tiny OpenAI-style streaming server for the benchmark tests, run in a
thread on a free loopback port.

It serves ``GET /v1/models`` (one model, ``stub``) and streams
``POST /v1/completions`` and ``POST /v1/chat/completions``: after a TTFT it
sends ``max_tokens`` tokens, ``tokens_per_chunk`` per SSE chunk, one chunk every
``itl`` seconds, then a usage chunk (when asked for) and ``[DONE]``. The TTFT is
``ttft + ttft_per_inflight * (requests in flight, this one included)``, after
waiting for a serial "prefill" slot of ``prefill_s`` seconds, so latency grows
with load. A request body field ``stub_mode`` breaks things: ``error`` (an
error event after the first chunk), ``nodone`` (the stream just stops),
``http500``, ``hang`` (never answers).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from dataclasses import dataclass

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from tests.entrypoints.utils import free_port


@dataclass
class StubOptions:
    """Latency knobs, seconds."""

    ttft: float = 0.01
    itl: float = 0.005
    ttft_per_inflight: float = 0.0
    prefill_s: float = 0.0
    tokens_per_chunk: int = 1
    max_model_len: int = 4096


class StubServer:
    """Context manager: the server runs while inside; ``url`` is its root."""

    def __init__(self, **options: float) -> None:
        self.opts = StubOptions(**options)
        self.in_flight = 0
        self.max_in_flight = 0
        self.num_requests = 0
        self.bodies: list[dict] = []
        self._lock: asyncio.Lock | None = None
        app = Starlette(
            routes=[
                Route("/v1/models", self._models, methods=["GET"]),
                Route("/v1/completions", self._complete, methods=["POST"]),
                Route("/v1/chat/completions", self._complete, methods=["POST"]),
            ]
        )
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(
            app, host="127.0.0.1", port=self.port, log_level="warning", lifespan="off"
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, daemon=True)

    def __enter__(self) -> StubServer:
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("stub server did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.should_exit = True
        self._thread.join(10)

    async def _models(self, request: Request) -> JSONResponse:
        card = {"id": "stub", "object": "model", "max_model_len": self.opts.max_model_len}
        return JSONResponse({"object": "list", "data": [card]})

    async def _complete(self, request: Request):
        body = await request.json()
        self.bodies.append(body)
        self.num_requests += 1
        if body.get("model") != "stub":
            msg = f"The model `{body.get('model')}` does not exist."
            return JSONResponse({"error": {"message": msg, "code": 404}}, status_code=404)
        mode = body.get("stub_mode")
        if mode == "http500":
            return JSONResponse({"error": {"message": "boom", "code": 500}}, status_code=500)
        chat = "messages" in body
        return StreamingResponse(self._stream(body, chat, mode), media_type="text/event-stream")

    async def _stream(self, body: dict, chat: bool, mode: str | None):
        o = self.opts
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if mode == "hang":
                await asyncio.sleep(3600)
            if self._lock is None:
                self._lock = asyncio.Lock()
            if o.prefill_s:
                async with self._lock:
                    await asyncio.sleep(o.prefill_s)
            await asyncio.sleep(o.ttft + o.ttft_per_inflight * self.in_flight)
            n = int(body["max_tokens"])
            prompt_tokens = len((body.get("prompt") or body["messages"][0]["content"]).split())
            if chat:
                yield _event(_chunk(chat, "", None, role=True))
            sent = 0
            while sent < n:
                k = min(o.tokens_per_chunk, n - sent)
                sent += k
                finish = "length" if sent == n else None
                yield _event(_chunk(chat, "tok " * k, finish))
                if mode == "error":
                    yield _event(json.dumps({"error": {"message": "engine died", "code": 503}}))
                    yield _event("[DONE]")
                    return
                if mode == "nodone" and sent >= 2:
                    return
                if sent < n:
                    await asyncio.sleep(o.itl)
            if (body.get("stream_options") or {}).get("include_usage"):
                usage = {"prompt_tokens": prompt_tokens, "completion_tokens": n,
                         "total_tokens": prompt_tokens + n}  # fmt: skip
                yield _event(json.dumps({"choices": [], "usage": usage}))
            yield _event("[DONE]")
        finally:
            self.in_flight -= 1


def _chunk(chat: bool, text: str, finish: str | None, role: bool = False) -> str:
    if chat:
        delta = {"role": "assistant", "content": ""} if role else {"content": text}
        choice = {"index": 0, "delta": delta, "finish_reason": finish}
    else:
        choice = {"index": 0, "text": text, "finish_reason": finish}
    return json.dumps({"id": "x", "choices": [choice], "usage": None})


def _event(data: str) -> str:
    return f"data: {data}\n\n"
