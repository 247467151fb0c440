"""The frontend's asyncio client of one engine process.

:class:`EngineClient` puts three parts together: the :class:`EngineLink`
(sockets and typed messages), the :class:`EngineSupervisor` (process,
watchdog, stalls, restarts) and the :class:`Admission` counts (a bounded
waiting queue). It routes each engine output to the asyncio queue of its
request; when the engine dies every in-flight request ends with
:class:`EngineDeadError` within ~0.1 s, so no request waits forever.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import secrets
import time
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any

from paternoster.config import EngineConfig
from paternoster.engine.codec import CodecError
from paternoster.engine.messages import (
    Abort,
    Add,
    EngineCoreOutput,
    EngineCoreRequest,
    Fatal,
    Heartbeat,
    Outputs,
    Ready,
    ResetPrefixCache,
    ResetPrefixCacheReply,
    Shutdown,
    StartupError,
    TimelineQuery,
    TimelineReply,
)
from paternoster.engine.process import DEFAULT_ENGINE_CLS, DEFAULT_HEARTBEAT_INTERVAL
from paternoster.frontend.admission import Admission, AdmissionCounts, Reservation
from paternoster.frontend.errors import (
    EngineDeadError,
    EngineOverloadedError,
    RequestRejectedError,
    TimelineUnavailableError,
)
from paternoster.frontend.launcher import EngineLauncher
from paternoster.frontend.link import EngineLink
from paternoster.frontend.supervisor import EngineSupervisor

logger = logging.getLogger("paternoster.frontend")
#: Heartbeat stats that describe the engine's present state (what a dead
#: engine holds is nothing): zeroed when it dies.
_LIVE_GAUGES = ("num_running", "num_waiting", "kv_cache_usage", "state_slot_usage",
                "num_free_blocks", "num_free_state_slots")


class EngineClient(AdmissionCounts):
    """Runs the engine process and multiplexes requests over its link.

    Args:
        config: the engine's configuration.
        engine_cls: ``"module:Class"`` the engine process builds (tests use a fake).
        startup_timeout: seconds to wait for the engine to be ready (model
            load included).
        stall_timeout: seconds without any message (heartbeats included)
            after which the engine is reported stalled: unhealthy, new
            requests refused, in-flight ones kept; healthy again once
            messages resume (``--engine-stall-timeout``).
        step_timeout: seconds one engine step, or one stall, may last before
            the engine is declared dead and killed (``None``: no limit).
        heartbeat_interval: seconds between the engine's heartbeats.
        log_level: the engine process's log level.
        max_waiting_requests: most requests waiting for their first output
            (``None``: unbounded); see :meth:`check_capacity`.
        max_waiting_tokens: most prompt tokens of waiting requests.
        queue_timeout: seconds a request may wait for its first output before
            it is aborted with :class:`EngineOverloadedError` (``None``: forever).
        restart_engine: once the engine died (and its in-flight requests
            failed), start a new engine process.
        admission: the waiting-queue counts to use instead of a new
            :class:`Admission` of ``max_waiting_requests`` and
            ``max_waiting_tokens`` (data-parallel engines share one, so the
            limits hold for the server as a whole).
        engine_env: environment variables added to the engine process's.
        launcher: where the engine runs (default: a local process; a
            :class:`~.ray_executor.RayLauncher` places it as a Ray actor and
            the link goes over tcp).
        index: the engine's data-parallel index (for the launcher).
    Raises:
        ValueError: a limit or timeout <= 0, naming it.
    """

    def __init__(
        self,
        config: EngineConfig,
        engine_cls: str = DEFAULT_ENGINE_CLS,
        startup_timeout: float = 600.0,
        stall_timeout: float = 10.0,
        heartbeat_interval: float = DEFAULT_HEARTBEAT_INTERVAL,
        log_level: str = "INFO",
        step_timeout: float | None = 600.0,
        max_waiting_requests: int | None = None,
        max_waiting_tokens: int | None = None,
        queue_timeout: float | None = None,
        restart_engine: bool = False,
        admission: Admission | None = None,
        engine_env: dict[str, str] | None = None,
        launcher: EngineLauncher | None = None,
        index: int = 0,
    ):
        if queue_timeout is not None and queue_timeout <= 0:
            raise ValueError(
                f"queue_timeout must be > 0 (or None for no limit), got {queue_timeout}"
            )
        self.admission = (admission if admission is not None
                          else Admission(max_waiting_requests, max_waiting_tokens))
        self.queue_timeout = queue_timeout
        self.link = EngineLink({
            Outputs: self._on_outputs, Heartbeat: self._on_heartbeat,
            ResetPrefixCacheReply: self._on_reply, TimelineReply: self._on_reply,
            Fatal: lambda m: self.supervisor.mark_dead(f"engine failed: {m.error}"),
            Ready: self._on_handshake, StartupError: self._on_handshake,
        })  # fmt: skip
        self.supervisor = EngineSupervisor(
            config, self.link, secrets.token_hex(16), self._fail_all, engine_cls,
            startup_timeout, stall_timeout, step_timeout, heartbeat_interval, log_level,
            restart_engine, engine_env, launcher, index,
        )  # fmt: skip
        self.stats: dict = {}
        self._stats_time = float("-inf")  # engine's time.monotonic() of self.stats
        self._queues: dict[str, asyncio.Queue] = {}
        self._watchdog: asyncio.Task | None = None
        self._closed = False
        self._refusing: str | None = None  # why new requests are refused (shutdown)
        self._iteration_listeners: list[Callable[[list[int]], None]] = []
        self._reply_waiters: dict[int, asyncio.Future] = {}
        self._reply_ids = itertools.count()

    # ------------------------------------------------------------ state

    @property
    def info(self) -> dict:
        """The engine's ``info`` (model, max_model_len, num_kv_blocks, ...);
        empty before :meth:`start`."""
        return self.supervisor.info

    @property
    def dead_reason(self) -> str | None:
        """Why the engine died, or ``None`` while it lives."""
        return self.supervisor.dead_reason

    @property
    def num_restarts(self) -> int:
        """Engine restarts so far (``restart_engine``)."""
        return self.supervisor.num_restarts

    @property
    def pid(self) -> int | None:
        """The engine process id (``None`` before :meth:`start`; on its own
        node for a Ray actor)."""
        proc = self.supervisor.proc
        return proc.pid if proc else None

    @property
    def location(self) -> dict:
        """Where the engine runs beyond this machine (a Ray actor's name, node
        IP and id); empty for a local process."""
        proc = self.supervisor.proc
        return proc.location() if proc else {}

    @property
    def is_alive(self) -> bool:
        """True while the engine is ready (not dead, stalled or restarting), the
        client is not shut down, and new requests are accepted."""
        return self.unavailable_reason is None

    @property
    def unavailable_reason(self) -> str | None:
        """Why new requests are refused (engine dead, stalled, restarting,
        shutting down), or ``None``."""
        if not self.info and self.dead_reason is None:
            return "engine is not running"
        problem = self.supervisor.health_problem
        if problem is not None:
            return problem
        if self._closed:
            return "engine is not running"
        return self._refusing

    def stop_accepting(self, reason: str = "server is shutting down") -> None:
        """Refuse new requests with :class:`EngineDeadError` (``reason``) from now
        on; in-flight requests go on. For a graceful shutdown."""
        if self._refusing is None:
            self._refusing = reason

    def fail_in_flight(self, reason: str) -> None:
        """End every in-flight request now with :class:`EngineDeadError` (``reason``);
        their generators abort them in the engine. The engine stays up."""
        for q in self._queues.values():
            q.put_nowait(EngineDeadError(reason))

    # ------------------------------------------------------------- life

    async def start(self) -> dict:
        """Start the engine process and wait until it is ready.

        Returns:
            The engine's ``info`` map.
        Raises:
            EngineStartupError: see :meth:`EngineSupervisor.start`.
        """
        self.link.bind(self.supervisor.launcher.bind_host)
        try:
            info = await self.supervisor.start()
        except BaseException:
            await self.link.close()
            raise
        self.link.run()
        self._watchdog = asyncio.create_task(self.supervisor.watch())
        return info

    async def shutdown(self) -> None:
        """Fail in-flight requests, ask the engine to exit (kill it after 5 s)
        and release sockets and the temp dir. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._fail_all("engine client is shutting down")
        if self._watchdog is not None:
            self._watchdog.cancel()
        proc = self.supervisor.proc
        if proc is not None and proc.poll() is None:
            try:
                await asyncio.wait_for(self.link.send_now(Shutdown()), 1.0)
            except (asyncio.TimeoutError, CodecError, OSError):
                pass
        await self.supervisor.stop(kill=False)
        await self.link.close()

    # --------------------------------------------------------- requests

    def check_capacity(self, num_requests: int, num_tokens: int) -> Reservation:
        """Admit new work unless the waiting queue is full, reserving its room
        (:meth:`Admission.check_capacity`).

        Raises:
            EngineOverloadedError: a waiting-queue limit would be exceeded.
        """
        return self.admission.check_capacity(num_requests, num_tokens)

    async def generate(
        self, request: EngineCoreRequest, reservation: Reservation | None = None
    ) -> AsyncIterator[EngineCoreOutput]:
        """Send a request and yield its outputs until it finishes.

        Closing the iterator early (``aclose``, cancellation, a client that
        disconnected) aborts the engine request so its KV blocks are freed.

        Args:
            request: the tokenized request; ``request_id`` must be unique
                among in-flight requests.
            reservation: the :meth:`check_capacity` reservation it was
                admitted under: its share becomes the request's waiting entry
                in the same step the request is sent. If the request is
                refused before it is sent, its share stays reserved.
        Yields:
            EngineCoreOutput: in order; the last has ``finish_reason`` set.
        Raises:
            EngineDeadError: the engine is (or becomes) dead, stalled or shut down.
            RequestRejectedError: the engine refused the request, or it cannot
                be encoded.
            EngineOverloadedError: it waited more than ``queue_timeout`` seconds
                for its first output (it is aborted).
            ValueError: the id is already in flight.
        """
        self._check_alive()
        rid = request.request_id
        if rid in self._queues:
            raise ValueError(f"request id {rid!r} is already in flight")
        try:
            self.link.send(Add(request=request))  # encoded once, here
        except CodecError as e:
            raise RequestRejectedError(f"request cannot be sent to the engine: {e}") from e
        queue: asyncio.Queue = asyncio.Queue()
        self._queues[rid] = queue
        self.admission.start_waiting(rid, len(request.prompt_token_ids), reservation)
        deadline = None if self.queue_timeout is None else time.monotonic() + self.queue_timeout
        done = False
        try:
            while not done:
                if deadline is not None and self.admission.is_waiting(rid):
                    item = await self._first_output(queue, deadline)
                else:
                    item = await queue.get()
                self.admission.stop_waiting(rid)
                if isinstance(item, EngineDeadError):
                    done = True
                    raise item
                if item.finish_reason == "error":
                    done = True
                    if item.overloaded:  # shed by the scheduler (e.g. slo's load_shedding)
                        raise EngineOverloadedError(item.error or "shed under load")
                    raise RequestRejectedError(item.error or "request rejected by the engine")
                done = item.finished
                yield item
        finally:
            self._queues.pop(rid, None)
            self.admission.stop_waiting(rid)
            if not done:
                self.abort([rid])

    async def _first_output(self, queue: asyncio.Queue, deadline: float) -> Any:
        """The next item of ``queue``; EngineOverloadedError after ``deadline``."""
        try:
            return await asyncio.wait_for(queue.get(), max(0.0, deadline - time.monotonic()))
        except asyncio.TimeoutError:
            raise EngineOverloadedError(
                f"request waited more than {self.queue_timeout:g} s in the queue"
            ) from None

    def abort(self, request_ids: Iterable[str]) -> None:
        """Ask the engine to abort requests (non-blocking; unknown ids are ignored).

        Args:
            request_ids: engine request ids.
        """
        ids = [str(r) for r in request_ids]
        if ids and self.dead_reason is None and not self._closed:
            self.link.send(Abort(request_ids=ids))

    @property
    def num_in_flight(self) -> int:
        """Requests whose outputs are still awaited."""
        return len(self._queues)

    # ------------------------------------------------------ control calls

    async def timeline(self, timeout: float = 30.0) -> dict:
        """Ask the engine for its request timeline (docs/metrics.md).

        Returns:
            The snapshot (schema in :mod:`paternoster.metrics.timeline`).
        Raises:
            TimelineUnavailableError: timelines are off in the engine.
            EngineDeadError: the engine is (or becomes) dead or shut down.
            TimeoutError: no reply within ``timeout`` seconds.
        """
        reply = await self._ask(TimelineQuery, timeout)
        if reply.timeline is None:
            raise TimelineUnavailableError(reply.error or "no timeline")
        return reply.timeline

    async def reset_prefix_cache(self, timeout: float = 30.0) -> int:
        """Make the engine forget every cached KV block (running requests keep theirs).

        Returns:
            The number of blocks uncached (0 with prefix caching off).
        Raises:
            ValueError: the engine has no prefix cache (a test fake).
            EngineDeadError: the engine is (or becomes) dead or shut down.
            TimeoutError: no reply within ``timeout`` seconds.
        """
        reply = await self._ask(ResetPrefixCache, timeout)
        if reply.num_blocks is None:
            raise ValueError(reply.error or "prefix cache reset failed")
        return reply.num_blocks

    async def _ask(self, kind: type, timeout: float) -> Any:
        """Send ``kind(id=N)`` and await the engine's reply with that id.

        Raises:
            EngineDeadError: the engine is (or becomes) dead or shut down.
            TimeoutError: no reply within ``timeout`` seconds.
        """
        self._check_alive()
        rid = next(self._reply_ids)
        future: asyncio.Future = asyncio.get_running_loop().create_future()
        self._reply_waiters[rid] = future
        try:
            self.link.send(kind(id=rid))
            return await asyncio.wait_for(future, timeout)
        except asyncio.TimeoutError:
            raise TimeoutError(f"no {kind.__name__} reply from the engine within "
                               f"{timeout} s") from None  # fmt: skip
        finally:
            self._reply_waiters.pop(rid, None)

    def add_iteration_listener(self, listener: Callable[[list[int]], None]) -> None:
        """Call ``listener(tokens)`` for each ``Outputs`` message: ``tokens`` holds
        the tokens each engine step since the previous message computed (metrics)."""
        self._iteration_listeners.append(listener)

    # ----------------------------------------------------------- handlers

    def _check_alive(self) -> None:
        reason = self.unavailable_reason
        if reason is not None:
            raise EngineDeadError(reason)

    def _fail_all(self, reason: str) -> None:
        """Every in-flight request and control call ends with ``reason``; the
        dead engine's gauges read 0 (its counters keep their last values) until
        a restarted engine reports."""
        self.stats = {**self.stats, **{k: 0 for k in _LIVE_GAUGES if k in self.stats}}
        for q in self._queues.values():
            q.put_nowait(EngineDeadError(reason))
        for future in self._reply_waiters.values():
            if not future.done():
                future.set_exception(EngineDeadError(reason))

    def _on_outputs(self, msg: Outputs) -> None:
        self._take_stats(msg.stats, msg.stats_time)  # first: whoever sees an output sees these
        for out in msg.outputs:
            queue = self._queues.get(out.request_id)
            if queue is not None:
                queue.put_nowait(out)
        if msg.iteration_tokens:
            for listener in self._iteration_listeners:
                try:
                    listener(msg.iteration_tokens)
                except Exception:  # a metrics bug must not stop the receive loop
                    logger.exception("iteration listener failed")

    def _on_heartbeat(self, msg: Heartbeat) -> None:
        self._take_stats(msg.stats, msg.stats_time)
        self.supervisor.step_started = msg.step_started

    def _on_reply(self, msg: ResetPrefixCacheReply | TimelineReply) -> None:
        future = self._reply_waiters.get(msg.id)
        if future is not None and not future.done():
            future.set_result(msg)

    def _on_handshake(self, msg: Ready | StartupError) -> None:
        self.supervisor.on_handshake(msg)
        if isinstance(msg, Ready):
            self.stats, self._stats_time = {}, float("-inf")

    def _take_stats(self, stats: dict, at: float) -> None:
        """Keep ``stats`` unless an already kept snapshot is newer (outputs and
        heartbeats travel on two sockets)."""
        if at < self._stats_time:
            return
        self._stats_time = at
        self.stats = stats
