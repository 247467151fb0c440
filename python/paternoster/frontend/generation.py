"""One API request in flight: its choices, run side by side, as one stream of deltas."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from paternoster.frontend.admission import Reservation
from paternoster.frontend.data_parallel import DataParallelClient
from paternoster.frontend.engine_client import EngineClient
from paternoster.frontend.output_processor import SequenceState, fan_out
from paternoster.metrics.requests import RequestMetrics
from paternoster.outputs import ChoiceDelta
from paternoster.sampling_params import SamplingParams

_DONE = object()


class Generation:
    """The choices of one API request: ``n`` per prompt, choice ``p * n + i``
    for prompt ``p``.

    Args:
        client: the engine client.
        tokenizer: for detokenization.
        request_id: id of the API request (engine ids append ``-<choice>``).
        prompts: tokenized prompts.
        params: validated sampling params (``n`` choices per prompt,
            ``max_tokens`` set).
        priority: scheduling priority (lower runs first).
        cache_salt: prefix-cache salt of every choice.
        arrival_time: ``time.time()`` the request arrived.
        metrics: where the request's latencies, tokens and finish reason are
            recorded, once per API request (``None``: not recorded).
        reservation: the waiting-queue room reserved for these choices. Each
            choice takes its share when it is sent; :meth:`deltas` gives back
            the rest when it ends, and :meth:`release` does when it never runs.
        tenant: who every choice is served for (``None``: the anonymous tenant).
        slo: ``(slo_ttft_s, slo_itl_s)`` targets of every choice, seconds
            (the ``slo`` scheduler; ``None``: the policy's defaults).
    """

    def __init__(self, client: EngineClient | DataParallelClient, tokenizer: Any, request_id: str,
                 prompts: list[list[int]], params: SamplingParams, priority: int = 0,
                 cache_salt: str | None = None, arrival_time: float | None = None,
                 metrics: RequestMetrics | None = None,
                 reservation: Reservation | None = None,
                 tenant: str | None = None,
                 slo: tuple[float | None, float | None] = (None, None)):  # fmt: skip
        self.client = client
        self.metrics = metrics
        self.tenant = tenant
        self.reservation = reservation
        self.request_id = request_id
        self.prompts = prompts
        self.n = params.n
        self._started: tuple[AsyncIterator[ChoiceDelta], list[ChoiceDelta]] | None = None
        self.jobs = []
        for p, ids in enumerate(prompts):
            for index, req in fan_out(request_id, ids, params, p * params.n, priority,
                                      cache_salt, arrival_time, tenant, slo):  # fmt: skip
                self.jobs.append((req, SequenceState(index, tokenizer, ids, req.sampling_params)))

    def release(self) -> None:
        """Give back the reserved waiting-queue room of the choices not sent to
        the engine (all of them when :meth:`deltas` never ran), and abort the
        requests :meth:`start` sent if :meth:`deltas` never took them over.
        Idempotent; call it on the event loop."""
        if self._started is not None:
            stream, self._started = self._started[0], None
            asyncio.ensure_future(stream.aclose())  # type: ignore[attr-defined]
        if self.reservation is not None:
            self.reservation.release()

    async def start(self) -> None:
        """Send the requests and wait for the first delta (or the end), which
        :meth:`deltas` then yields first.

        A stream awaits this before its HTTP status goes out, so that a
        request the engine refuses before any output (load shedding, queue
        timeout, a dead engine) gets its own status instead of 200 and an
        error event. Cancelling it aborts the requests.

        Raises:
            EngineDeadError, RequestRejectedError, EngineOverloadedError: from
                the engine client, before any output.
        """
        stream = self._deltas()
        try:
            head = [await anext(stream)]
        except StopAsyncIteration:
            head = []
        self._started = (stream, head)

    @property
    def states(self) -> list[SequenceState]:
        """Per-choice states, ordered by choice index."""
        return [s for _, s in self.jobs]

    def prompt_index(self, choice_index: int) -> int:
        """The prompt a choice belongs to (choices ``p * n .. p * n + n - 1``)."""
        return choice_index // self.n

    @property
    def num_prompt_tokens(self) -> int:
        """Prompt tokens, each prompt once."""
        return sum(len(p) for p in self.prompts)

    @property
    def num_generated_tokens(self) -> int:
        """Tokens delivered so far, all choices."""
        return sum(len(s.token_ids) for s in self.states)

    async def deltas(self) -> AsyncIterator[ChoiceDelta]:
        """Run every choice concurrently and yield their deltas as they come
        (after :meth:`start`, the run it began).

        Closing this iterator aborts the engine requests still running and
        releases the reserved room of choices that were never sent.

        Raises:
            EngineDeadError, RequestRejectedError, EngineOverloadedError: from
                the engine client (the other choices are aborted).
        """
        stream, head = self._started or (self._deltas(), [])
        self._started = None
        async with contextlib.aclosing(stream):  # type: ignore[type-var]
            for d in head:
                yield d
            async for d in stream:
                yield d

    async def _deltas(self) -> AsyncIterator[ChoiceDelta]:
        """The run behind :meth:`deltas`."""
        queue: asyncio.Queue = asyncio.Queue()
        tracker = (self.metrics.track(self.num_prompt_tokens, self.tenant)
                   if self.metrics else None)  # fmt: skip
        reasons: list[str] = []

        async def run(req, state: SequenceState) -> None:
            reason = "abort"  # unless it ends below: cancelled (client gone)
            try:
                outputs = self.client.generate(req, self.reservation)
                async with contextlib.aclosing(outputs):
                    async for out in outputs:
                        if tracker is not None:
                            tracker.on_output(out)
                        queue.put_nowait(state.process(out))
                        if state.finished:
                            break  # closing the iterator aborts a stop-string match
                reason = state.finish_reason or "abort"
            except Exception as e:
                reason = "error"
                queue.put_nowait(e)
            finally:
                reasons.append(reason)
                queue.put_nowait(_DONE)

        tasks = [asyncio.create_task(run(req, state)) for req, state in self.jobs]
        try:
            remaining = len(tasks)
            while remaining:
                item = await queue.get()
                if item is _DONE:
                    remaining -= 1
                elif isinstance(item, Exception):
                    raise item
                else:
                    yield item
        finally:
            for t in tasks:
                t.cancel()  # a task not started yet never sends its request
            with contextlib.suppress(BaseException):
                await asyncio.gather(*tasks, return_exceptions=True)
            self.release()
            if tracker is not None:
                reasons += ["abort"] * (len(tasks) - len(reasons))
                tracker.finish(reasons, self.num_generated_tokens)
