"""Server-sent events and client disconnects for the OpenAI endpoints: the SSE
framing (``data: ...``, OpenAI-shaped error events), a streaming response
that gives back a generation's reserved room however it ends, and running a
non-streamed generation until it ends or the client goes away."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

from fastapi import Request
from fastapi.responses import StreamingResponse

from paternoster.entrypoints.openai.errors import APIError, bad_request, error_body
from paternoster.frontend.errors import EngineDeadError, RequestRejectedError
from paternoster.frontend.generation import Generation


class ClientDisconnected(Exception):
    """The HTTP client went away before the response was ready."""


def event(data: str) -> str:
    """One SSE event carrying ``data``."""
    return f"data: {data}\n\n"


def error_event(e: Exception) -> str:
    """An SSE event with the OpenAI error body of an engine error."""
    status = 400 if isinstance(e, RequestRejectedError) else 503
    message = f"engine is not running: {e}" if isinstance(e, EngineDeadError) else str(e)
    return event(json.dumps(error_body(status, message)))


class EventStream(StreamingResponse):
    """An SSE response that calls ``on_close()`` once it is sent, or failed to
    be (the client went away), even when its body was never iterated: an
    async generator that never started runs none of its ``finally`` blocks."""

    def __init__(self, events: AsyncIterator[str], on_close: Callable[[], None]):
        super().__init__(
            events,
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
        self._on_close = on_close

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._on_close()

    def mapped(self, fn: Callable[[AsyncIterator[str]], AsyncIterator[str]]) -> EventStream:
        """A stream of ``fn(events)`` that takes over ``on_close`` (send the new
        stream instead of this one, or neither). ``fn`` should close ``events``
        when it is closed, so that a disconnect reaches the generation."""
        return EventStream(fn(self.body_iterator), self._on_close)


@contextlib.contextmanager
def api_errors() -> Iterator[None]:
    """Turn engine errors raised inside into :class:`APIError` (400 for a
    refused request, 503 for a dead engine); ``EngineOverloadedError`` passes
    through to the app's 503 with ``Retry-After``."""
    try:
        yield
    except RequestRejectedError as e:
        raise bad_request(str(e)) from e
    except EngineDeadError as e:
        raise APIError(503, f"engine is not running: {e}") from e


async def consume(gen: Generation) -> None:
    """Run a generation to the end; engine errors become :class:`APIError`."""
    with api_errors():
        async with contextlib.aclosing(gen.deltas()) as deltas:
            async for _ in deltas:
                pass


async def start_stream(raw: Request, gen: Generation) -> None:
    """Wait for a streamed generation's first output before its 200 goes out
    (:meth:`Generation.start`), so that a request refused before any output
    gets a real status: 503 with ``Retry-After`` when shed or timed out in the
    queue, 400 when refused, 503 when the engine is down.

    Raises:
        APIError, EngineOverloadedError: as above.
        ClientDisconnected: the client went away first (the requests are aborted).
    """
    with api_errors():
        await run_until_disconnect(raw, gen.start())


async def _wait_for_disconnect(raw: Request) -> None:
    while True:
        msg = await raw.receive()
        if msg["type"] == "http.disconnect":
            return


async def run_until_disconnect(raw: Request, coro) -> Any:
    """Await ``coro`` unless the client disconnects first; then cancel it
    (which aborts its engine requests) and raise :class:`ClientDisconnected`."""
    work = asyncio.create_task(coro)
    watch = asyncio.create_task(_wait_for_disconnect(raw))
    try:
        done, _ = await asyncio.wait({work, watch}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        work.cancel()
        watch.cancel()
        raise
    if work in done:
        watch.cancel()
        return work.result()
    work.cancel()
    with contextlib.suppress(BaseException):
        await work
    raise ClientDisconnected()
