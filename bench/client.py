"""One streamed request to an OpenAI-compatible endpoint, timed chunk by chunk.

The definitions follow vLLM's ``benchmarks/backend_request_func.py`` (the
client behind ``benchmark_serving.py``):

- **TTFT**: from just before the request is sent to the arrival of the first
  SSE chunk that carries content (non-empty ``choices[0].text`` for
  completions, ``choices[0].delta.content`` for chat; the chat role chunk and
  the usage chunk do not count). Seconds.
- **ITL**: the gaps between the arrivals of successive content chunks of one
  request (seconds; a request of ``k`` content chunks has ``k - 1``). A chunk
  may hold more than one token; then its gap covers them all.
- **E2E latency**: from just before sending to the end of the stream
  (``data: [DONE]``, or the connection closing after a finish reason). Seconds.
- **TPOT**: ``(e2e - ttft) / (output_tokens - 1)`` for requests of more than
  one output token (see :attr:`RequestRecord.tpot`).

Output tokens are the server's ``usage.completion_tokens`` (the request asks
for ``stream_options: {"include_usage": true}``); a server that sends no usage
falls back to the number of content chunks (``output_tokens_source``).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx


@dataclass
class RequestRecord:
    """What happened to one benchmark request (times in seconds).

    Attributes:
        index: position in the workload. tag: its workload class.
        prompt_len: intended prompt tokens. output_len: requested ``max_tokens``.
        scheduled: when it was due, seconds from the start of the run.
        sent: when it was sent, seconds from the start (``None``: never sent,
            e.g. past the run's send deadline).
        success: the stream ended normally (``[DONE]`` or a finish reason).
        error: why not (HTTP status and message, broken stream, timeout...).
        status_code: the HTTP status, when a response came.
        ttft: time to first content chunk. itl: gaps between content chunks.
        e2e: time to the end of the stream.
        prompt_tokens, output_tokens: from the server's usage (or chunk count).
        output_tokens_source: ``"usage"`` or ``"chunks"``.
        num_chunks: content chunks received. output_chars: characters generated.
        finish_reason: the last finish reason seen.
    """

    index: int
    tag: str | None
    prompt_len: int
    output_len: int
    scheduled: float
    sent: float | None = None
    success: bool = False
    error: str | None = None
    status_code: int | None = None
    ttft: float | None = None
    itl: list[float] = field(default_factory=list)
    e2e: float | None = None
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    output_tokens_source: str | None = None
    num_chunks: int = 0
    output_chars: int = 0
    finish_reason: str | None = None

    @property
    def tpot(self) -> float | None:
        """Time per output token after the first, seconds:
        ``(e2e - ttft) / (output_tokens - 1)``; ``None`` unless a successful
        request generated more than one token."""
        n = self.output_tokens
        if not self.success or n is None or n < 2 or self.ttft is None or self.e2e is None:
            return None
        return (self.e2e - self.ttft) / (n - 1)

    def to_dict(self) -> dict:
        """JSON-ready dict (with ``tpot``)."""
        return {**asdict(self), "tpot": self.tpot}


def build_payload(
    api: str,
    model: str,
    prompt: str,
    max_tokens: int,
    *,
    temperature: float = 0.0,
    ignore_eos: bool = False,
    extra: dict | None = None,
) -> dict:
    """The JSON body of one streamed request.

    Args:
        api: ``"completions"`` or ``"chat"`` (the prompt becomes one user message).
        model: model id. prompt: text. max_tokens: output tokens to ask for.
        temperature: sampling temperature (0 = greedy).
        ignore_eos: send vLLM's ``ignore_eos`` extension (keeps generating past EOS).
        extra: more fields merged in last (e.g. ``{"top_p": 0.9}``).
    Raises:
        ValueError: unknown ``api``.
    """
    body: dict[str, Any] = {"model": model, "max_tokens": max_tokens, "temperature": temperature}
    if api == "completions":
        body["prompt"] = prompt
    elif api == "chat":
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        raise ValueError(f"api must be 'completions' or 'chat', got {api!r}")
    body["stream"] = True
    body["stream_options"] = {"include_usage": True}
    if ignore_eos:
        body["ignore_eos"] = True
    body.update(extra or {})
    return body


def _content(data: dict, api: str) -> tuple[str, str | None]:
    """``(text, finish_reason)`` of the first choice of a chunk (``""`` if none)."""
    choices = data.get("choices") or []
    if not choices:
        return "", None
    c = choices[0]
    text = c.get("text") if api == "completions" else (c.get("delta") or {}).get("content")
    return text or "", c.get("finish_reason")


def _error_message(body: bytes) -> str:
    try:
        err = json.loads(body).get("error")
        msg = err.get("message") if isinstance(err, dict) else err
        return str(msg) if msg else body[:200].decode(errors="replace")
    except (ValueError, AttributeError):
        return body[:200].decode(errors="replace")


async def stream_request(
    client: httpx.AsyncClient,
    url: str,
    payload: dict,
    api: str,
    record: RequestRecord,
    headers: dict | None = None,
) -> None:
    """POST ``payload`` to ``url`` and read the SSE stream into ``record``.

    Fills ``record`` as chunks arrive (so a caller that cancels it on a timeout
    keeps what was measured). Never raises for HTTP or stream failures: they
    set ``record.error`` and leave ``success`` false. Cancellation propagates.
    """
    done = False
    usage = None
    text_len = 0
    start = time.perf_counter()
    last = start
    try:
        async with client.stream("POST", url, json=payload, headers=headers) as resp:
            record.status_code = resp.status_code
            if resp.status_code != 200:
                body = await resp.aread()
                record.error = f"HTTP {resp.status_code}: {_error_message(body)}"
                return
            async for line in resp.aiter_lines():
                line = line.strip()
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    record.e2e = time.perf_counter() - start
                    done = True
                    break
                now = time.perf_counter()
                chunk = json.loads(data)
                err = chunk.get("error")
                if err:
                    msg = err.get("message") if isinstance(err, dict) else err
                    record.error = f"error in stream: {msg}"
                    return
                text, finish = _content(chunk, api)
                if text:
                    if record.ttft is None:
                        record.ttft = now - start
                    else:
                        record.itl.append(now - last)
                    last = now
                    record.num_chunks += 1
                    text_len += len(text)
                record.finish_reason = finish or record.finish_reason
                usage = chunk.get("usage") or usage
        if not done:
            record.e2e = time.perf_counter() - start
            if record.finish_reason is None:
                record.error = "stream ended before [DONE]"
                return
    except Exception as e:  # any failure of this request is recorded, never raised
        record.error = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
        return
    finally:
        record.output_chars = text_len
    if usage and usage.get("completion_tokens") is not None:
        record.output_tokens = int(usage["completion_tokens"])
        record.prompt_tokens = usage.get("prompt_tokens")
        record.output_tokens_source = "usage"
    else:
        record.output_tokens = record.num_chunks
        record.output_tokens_source = "chunks"
    if record.ttft is None and record.output_tokens:
        record.error = "no content chunk in the stream"
        return
    record.success = True
