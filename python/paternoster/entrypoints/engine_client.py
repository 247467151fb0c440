"""The frontend's asyncio client of the engine process.

:class:`EngineClient` starts ``python -m paternoster.engine.process``, talks to
it over two ZeroMQ ``ipc://`` sockets in a private temp dir (msgpack frames,
see :mod:`paternoster.engine.process` for the messages), and routes each
engine output to the asyncio queue of its request. A watchdog ends every
in-flight request with :class:`EngineDeadError` within ~0.1 s of the engine
process exiting, or once no message (heartbeats included) arrived for
``stall_timeout`` seconds; no request waits forever.

Admission control: a request counts as *waiting* from the moment it is sent
until its first output arrives (queued in the engine or still in prefill).
:meth:`EngineClient.check_capacity` refuses new work with
:class:`EngineOverloadedError` once ``max_waiting_requests`` or
``max_waiting_tokens`` (prompt tokens) would be exceeded; work it admits
holds a :class:`Reservation` of its room at once, in the same step as the
check, so a burst admitted in one event-loop turn cannot overshoot a limit.
:meth:`EngineClient.generate` turns a reserved slot into a waiting entry when
the request is sent; whatever is never sent goes back with
:meth:`Reservation.release`. A request that waits longer than
``queue_timeout`` seconds is aborted with :class:`EngineOverloadedError`.

The config handshake carries a random token (passed to the child in the
``PATERNOSTER_ENGINE_TOKEN`` environment variable, never on the command line):
the engine ignores a ``config`` without it and the frontend a ``ready``
without it, so another local process cannot pose as either side.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterable
from pathlib import Path
from typing import Any

import zmq
import zmq.asyncio

from paternoster.config import EngineConfig
from paternoster.engine.codec import (
    AsyncPullQueue,
    AsyncPushQueue,
    CodecError,
    encode,
    message,
    message_type,
)
from paternoster.engine.messages import EngineCoreOutput, EngineCoreRequest
from paternoster.engine.process import DEFAULT_ENGINE_CLS, DEFAULT_HEARTBEAT_INTERVAL

logger = logging.getLogger("paternoster.client")

_WATCHDOG_PERIOD_S = 0.05


class EngineStartupError(RuntimeError):
    """The engine process did not become ready (bad model path, crash, timeout)."""


class EngineDeadError(RuntimeError):
    """The engine process exited or stalled; ``reason`` says which."""


class TimelineUnavailableError(RuntimeError):
    """The engine has no request timeline to give (timelines are off); the
    message says how to turn them on."""


class EngineOverloadedError(RuntimeError):
    """Too many requests (or prompt tokens) are waiting for the engine, or a
    request waited longer than the queue timeout. ``retry_after`` is the
    suggested wait in seconds (the HTTP server's ``Retry-After``)."""

    def __init__(self, message: str, retry_after: int = 1):
        super().__init__(message)
        self.retry_after = retry_after


class RequestRejectedError(ValueError):
    """The engine refused a request (``EngineCore.add_request`` raised
    ``ValueError``); the message says why."""


class Reservation:
    """Room in an :class:`EngineClient`'s waiting queue, set aside by
    :meth:`EngineClient.check_capacity` for requests not sent yet.

    It counts against ``max_waiting_requests`` and ``max_waiting_tokens``
    like requests that wait. :meth:`EngineClient.generate` takes one request's
    share of it when it sends a request (the request then waits instead);
    :meth:`release` gives back what is left, so call it (or leave a ``with``
    block) on every path where some of the requests are never sent: a
    validation error, a client that disconnected, a cancellation. Releasing
    twice, or after everything was taken, does nothing. A reservation dropped
    without a release gives its room back when it is garbage-collected (and
    logs a warning: a code path forgot to release it).

    Not created directly: :meth:`EngineClient.check_capacity` returns it.
    """

    def __init__(self, client: EngineClient, num_requests: int, num_tokens: int):
        self._requests = self._tokens = 0  # until counted below (see __del__)
        self._client = client
        client._reserved_requests += num_requests
        client._reserved_tokens += num_tokens
        self._requests, self._tokens = num_requests, num_tokens

    @property
    def num_requests(self) -> int:
        """Requests still reserved (not sent, not released)."""
        return self._requests

    @property
    def num_tokens(self) -> int:
        """Prompt tokens still reserved."""
        return self._tokens

    def take(self, num_tokens: int) -> None:
        """Hand one request's share (one request, ``num_tokens`` prompt tokens;
        the last request takes every token left) back to the client, which
        counts that request as waiting instead. Called by
        :meth:`EngineClient.generate`; does nothing once nothing is left.

        Args:
            num_tokens: the request's prompt tokens.
        """
        if self._requests <= 0:
            return
        tokens = self._tokens if self._requests == 1 else min(max(num_tokens, 0), self._tokens)
        self._requests -= 1
        self._tokens -= tokens
        self._client._unreserve(1, tokens)

    def release(self) -> None:
        """Give back the room of every request not sent yet. Idempotent; never raises."""
        requests, tokens = self._requests, self._tokens
        self._requests = self._tokens = 0
        if requests or tokens:
            self._client._unreserve(requests, tokens)

    def __enter__(self) -> Reservation:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()

    def __del__(self) -> None:
        requests, tokens = self._requests, self._tokens
        if not (requests or tokens):
            return
        self._requests = self._tokens = 0
        with contextlib.suppress(Exception):  # never raise from a finalizer
            logger.warning("a reservation of %d requests was never released; releasing it now",
                           requests)  # fmt: skip
            self._client._unreserve(requests, tokens)


class EngineClient:
    """Runs the engine process and multiplexes requests over ZeroMQ.

    Args:
        config: the engine's configuration (sent to it as a msgpack map).
        engine_cls: ``"module:Class"`` the engine process builds (tests use a fake).
        startup_timeout: seconds to wait for ``ready`` (model load included).
        stall_timeout: seconds without any message from a running engine after
            which it is declared dead. The engine beats from a thread of its
            own, so this bounds how long a dead or frozen process goes
            unnoticed, not how long a step may take.
        step_timeout: seconds one engine step may run (reported in the
            heartbeats) before the engine is declared stalled and killed;
            ``None``: no limit. Prefilling a long prompt in one step on a CPU
            can take minutes.
        heartbeat_interval: seconds between the engine's heartbeats.
        log_level: the engine process's log level.
        max_waiting_requests: most requests waiting for their first output
            (``None``: unbounded); see :meth:`check_capacity`.
        max_waiting_tokens: most prompt tokens of waiting requests (``None``:
            unbounded).
        queue_timeout: seconds a request may wait for its first output before
            it is aborted with :class:`EngineOverloadedError` (``None``: forever).
        restart_engine: once the engine died (and its in-flight requests
            failed), start a new engine process; retried with a backoff of
            1, 2, 4 ... 30 s while it fails to start. ``num_restarts`` counts them.
    """

    def __init__(
        self,
        config: EngineConfig,
        engine_cls: str = DEFAULT_ENGINE_CLS,
        startup_timeout: float = 600.0,
        stall_timeout: float = 30.0,
        heartbeat_interval: float = DEFAULT_HEARTBEAT_INTERVAL,
        log_level: str = "INFO",
        step_timeout: float | None = 600.0,
        max_waiting_requests: int | None = None,
        max_waiting_tokens: int | None = None,
        queue_timeout: float | None = None,
        restart_engine: bool = False,
    ):
        for name, value in (
            ("max_waiting_requests", max_waiting_requests),
            ("max_waiting_tokens", max_waiting_tokens),
            ("queue_timeout", queue_timeout),
            ("step_timeout", step_timeout),
        ):
            if value is not None and value <= 0:
                raise ValueError(f"{name} must be > 0 (or None for no limit), got {value}")
        self.config = config
        self.engine_cls = engine_cls
        self.startup_timeout = startup_timeout
        self.stall_timeout = stall_timeout
        self.step_timeout = step_timeout
        self._step_started: float | None = None  # time.time() of the running step
        self.heartbeat_interval = heartbeat_interval
        self.log_level = log_level
        self.max_waiting_requests = max_waiting_requests
        self.max_waiting_tokens = max_waiting_tokens
        self.queue_timeout = queue_timeout
        self.restart_engine = restart_engine
        self.num_restarts = 0
        self._restarting = False
        self._ready_waiter: asyncio.Future | None = None
        self._addrs: tuple[str, str] = ("", "")
        self.info: dict = {}
        self.stats: dict = {}
        self._stats_time = float("-inf")  # engine's time.monotonic() of self.stats
        self.dead_reason: str | None = None
        self._proc: subprocess.Popen | None = None
        self._ctx: zmq.asyncio.Context | None = None
        self._tmpdir: str | None = None
        self._push: AsyncPushQueue | None = None
        self._pull: AsyncPullQueue | None = None
        self._queues: dict[str, asyncio.Queue] = {}
        self._outbox: asyncio.Queue = asyncio.Queue()
        self._tasks: list[asyncio.Task] = []
        self._last_seen = 0.0
        self._closed = False
        self._iteration_listeners: list[Callable[[list[int]], None]] = []
        self._reply_waiters: dict[int, asyncio.Future] = {}  # timeline, reset_prefix_cache
        self._reply_ids = itertools.count()
        self._waiting: dict[str, int] = {}  # request id -> prompt tokens, until first output
        self._waiting_tokens = 0
        self._reserved_requests = 0  # admitted by check_capacity, not sent yet
        self._reserved_tokens = 0
        self._refusing: str | None = None  # why new requests are refused (shutdown)
        self._token = secrets.token_hex(16)

    # ----------------------------------------------------------------- life

    @property
    def is_alive(self) -> bool:
        """True while the engine is ready, neither dead nor shut down, and new
        requests are accepted."""
        return (
            bool(self.info)
            and self.dead_reason is None
            and not self._closed
            and self._refusing is None
        )

    @property
    def unavailable_reason(self) -> str | None:
        """Why new requests are refused (engine dead, shutting down), or ``None``."""
        if self.is_alive:
            return None
        if self.dead_reason is not None and self._restarting:
            return f"{self.dead_reason} (restarting the engine)"
        return self.dead_reason or self._refusing or "engine is not running"

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

    @property
    def pid(self) -> int | None:
        """The engine process id (``None`` before :meth:`start`)."""
        return self._proc.pid if self._proc else None

    async def start(self) -> dict:
        """Start the engine process and wait until it is ready.

        Returns:
            The engine's ``info`` map (model, max_model_len, num_kv_blocks, ...).
        Raises:
            EngineStartupError: the process exited, reported a startup error
                (message included, e.g. a bad model path) or was not ready
                within ``startup_timeout`` seconds. The process is reaped.
        """
        self._tmpdir = tempfile.mkdtemp(prefix="paternoster-")
        in_addr = f"ipc://{self._tmpdir}/in"
        out_addr = f"ipc://{self._tmpdir}/out"
        self._ctx = zmq.asyncio.Context()
        push = self._ctx.socket(zmq.PUSH)
        pull = self._ctx.socket(zmq.PULL)
        push.setsockopt(zmq.LINGER, 0)
        pull.setsockopt(zmq.LINGER, 0)
        push.bind(in_addr)
        pull.bind(out_addr)
        self._push, self._pull = AsyncPushQueue(push), AsyncPullQueue(pull)
        self._addrs = (in_addr, out_addr)
        self._proc = self._spawn()
        handshake = asyncio.create_task(self._handshake())
        deadline = time.monotonic() + self.startup_timeout
        try:
            while not handshake.done():
                await asyncio.wait({handshake}, timeout=_WATCHDOG_PERIOD_S)
                if handshake.done():
                    break
                if self._proc.poll() is not None:
                    # Give a startup_error already on the wire a moment to arrive.
                    await asyncio.wait({handshake}, timeout=1.0)
                    if not handshake.done():
                        raise EngineStartupError(
                            f"engine process exited with code {self._proc.returncode} "
                            "before it was ready (see its log above)"
                        )
                elif time.monotonic() > deadline:
                    raise EngineStartupError(
                        f"engine was not ready within {self.startup_timeout:.0f} s"
                    )
            self.info = handshake.result()
        except BaseException:
            handshake.cancel()
            await self._teardown(kill=True)
            raise
        self._last_seen = time.monotonic()
        self._tasks = [
            asyncio.create_task(self._recv_loop()),
            asyncio.create_task(self._send_loop()),
            asyncio.create_task(self._watchdog()),
        ]
        return self.info

    def _spawn(self) -> subprocess.Popen:
        """Start an engine process connecting to our two sockets."""
        in_addr, out_addr = self._addrs
        return subprocess.Popen(
            [
                sys.executable, "-m", "paternoster.engine.process",
                "--input", in_addr, "--output", out_addr,
                "--parent-pid", str(os.getpid()),
                "--engine-cls", self.engine_cls,
                "--heartbeat-interval", str(self.heartbeat_interval),
                "--log-level", self.log_level,
            ],
            env=_child_env(self._token),
        )  # fmt: skip

    async def _handshake(self) -> dict:
        await self._push.put(message("config", config=self.config.to_dict(), token=self._token))
        while True:
            try:
                msg = await self._pull.get()
                kind = message_type(msg)
            except CodecError as e:
                logger.error("dropping malformed frame from engine: %s", e)
                continue
            if msg.get("token") != self._token:
                logger.error("dropping a %r message without the handshake token", kind)
                continue
            if kind == "ready":
                return dict(msg.get("info") or {})
            if kind == "startup_error":
                raise EngineStartupError(f"engine failed to start: {msg.get('error')}")

    async def shutdown(self) -> None:
        """Fail in-flight requests, ask the engine to exit (kill it after 5 s)
        and release sockets and the temp dir. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._fail_all("engine client is shutting down")
        if self._proc is not None and self._proc.poll() is None and self._push is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._push.put(message("shutdown")), 1.0)
        await self._teardown(kill=False)

    async def _teardown(self, kill: bool) -> None:
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(BaseException):
                await t
        self._tasks = []
        if self._proc is not None:
            if kill and self._proc.poll() is None:
                self._proc.kill()
            deadline = time.monotonic() + 5.0
            while self._proc.poll() is None and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            if self._proc.poll() is None:
                self._proc.kill()
                self._proc.wait()
        if self._ctx is not None:
            self._ctx.destroy(linger=0)
            self._ctx = None
        if self._tmpdir is not None:
            shutil.rmtree(self._tmpdir, ignore_errors=True)
            self._tmpdir = None

    # ------------------------------------------------------------- requests

    async def generate(
        self, request: EngineCoreRequest, reservation: Reservation | None = None
    ) -> AsyncIterator[EngineCoreOutput]:
        """Send a request and yield its outputs until it finishes.

        Closing the iterator early (``aclose``, cancellation, a client that
        disconnected) aborts the engine request so its KV blocks are freed.

        Args:
            request: the tokenized request; ``request_id`` must be unique
                among in-flight requests.
            reservation: the :meth:`check_capacity` reservation the request
                was admitted under: one request's share of it becomes the
                request's waiting entry in the same step the request is sent.
                If the request is refused before it is sent (an error below),
                its share stays reserved; the caller releases it.
        Yields:
            EngineCoreOutput: in order; the last has ``finish_reason`` set.
        Raises:
            EngineDeadError: the engine is (or becomes) dead or shut down.
            RequestRejectedError: the engine refused the request.
            EngineOverloadedError: it waited more than ``queue_timeout`` seconds
                for its first output (it is aborted).
            ValueError: the id is already in flight.
        """
        self._check_alive()
        rid = request.request_id
        if rid in self._queues:
            raise ValueError(f"request id {rid!r} is already in flight")
        add = message("add", request=request.to_wire())
        try:
            encode(add)  # refuse here what the send loop could not encode
        except CodecError as e:
            raise RequestRejectedError(f"request cannot be sent to the engine: {e}") from e
        queue: asyncio.Queue = asyncio.Queue()
        self._queues[rid] = queue
        self._waiting[rid] = len(request.prompt_token_ids)
        self._waiting_tokens += self._waiting[rid]
        if reservation is not None:  # the same step: counted as one or the other
            reservation.take(self._waiting[rid])
        deadline = None if self.queue_timeout is None else time.monotonic() + self.queue_timeout
        done = False
        try:
            self._outbox.put_nowait(add)
            while not done:
                if rid in self._waiting and deadline is not None:
                    item = await self._first_output(queue, deadline)
                else:
                    item = await queue.get()
                self._stop_waiting(rid)
                if isinstance(item, EngineDeadError):
                    done = True
                    raise item
                if item.finish_reason == "error":
                    done = True
                    raise RequestRejectedError(item.error or "request rejected by the engine")
                done = item.finished
                yield item
        finally:
            self._queues.pop(rid, None)
            self._stop_waiting(rid)
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

    def _stop_waiting(self, rid: str) -> None:
        tokens = self._waiting.pop(rid, None)
        if tokens is not None:
            self._waiting_tokens -= tokens

    def check_capacity(self, num_requests: int, num_tokens: int) -> Reservation:
        """Admit new work unless it would overfill the waiting queue, and reserve
        its room in the same step.

        Requests already waiting and requests admitted but not sent yet (held
        in reservations) both count, so however many checks run before any of
        their requests is sent, no more than the limits are admitted. Work that
        alone exceeds a limit (more than ``max_waiting_requests`` requests or
        ``max_waiting_tokens`` tokens) is admitted only when nothing waits and
        nothing is reserved, so it is never refused forever.

        Args:
            num_requests: engine requests about to be sent (prompts x ``n``).
            num_tokens: their prompt tokens in total.
        Returns:
            The :class:`Reservation` of their room: pass it to
            :meth:`generate` with each request, and release it (or use it as a
            context manager) on every path where some are never sent.
        Raises:
            EngineOverloadedError: ``max_waiting_requests`` or
                ``max_waiting_tokens`` would be exceeded (nothing is reserved).
            ValueError: a negative count.
        """
        if num_requests < 0 or num_tokens < 0:
            raise ValueError(f"counts must be >= 0, got {num_requests} requests, "
                             f"{num_tokens} tokens")  # fmt: skip
        queued = len(self._waiting) + self._reserved_requests
        cap = self.max_waiting_requests
        if cap is not None and queued + num_requests > cap and queued > 0:
            raise EngineOverloadedError(
                f"server is overloaded: {queued} requests are waiting "
                f"(--max-waiting-requests {cap}); retry later"
            )
        tokens = self._waiting_tokens + self._reserved_tokens
        cap = self.max_waiting_tokens
        if cap is not None and tokens + num_tokens > cap and queued > 0:
            raise EngineOverloadedError(
                f"server is overloaded: {tokens} prompt tokens are waiting "
                f"(--max-waiting-tokens {cap}); retry later"
            )
        return Reservation(self, num_requests, num_tokens)

    def _unreserve(self, num_requests: int, num_tokens: int) -> None:
        """Take reserved room off the counts (a :class:`Reservation` calls this)."""
        self._reserved_requests = max(0, self._reserved_requests - num_requests)
        self._reserved_tokens = max(0, self._reserved_tokens - num_tokens)

    @property
    def num_waiting(self) -> int:
        """Requests sent to the engine that have not had their first output yet."""
        return len(self._waiting)

    @property
    def num_waiting_tokens(self) -> int:
        """Prompt tokens of the waiting requests."""
        return self._waiting_tokens

    @property
    def num_reserved(self) -> int:
        """Requests admitted by :meth:`check_capacity` and not sent yet (nor released)."""
        return self._reserved_requests

    @property
    def num_reserved_tokens(self) -> int:
        """Prompt tokens of the reserved requests."""
        return self._reserved_tokens

    def abort(self, request_ids: Iterable[str]) -> None:
        """Ask the engine to abort requests (non-blocking; unknown ids are
        ignored). Their iterators stop being fed once closed.

        Args:
            request_ids: engine request ids.
        """
        ids = [str(r) for r in request_ids]
        if ids and self.dead_reason is None and not self._closed:
            self._outbox.put_nowait(message("abort", request_ids=ids))

    async def timeline(self, timeout: float = 30.0) -> dict:
        """Ask the engine for its request timeline (docs/metrics.md).

        Args:
            timeout: seconds to wait for the reply (it comes between two steps).
        Returns:
            The snapshot (plain dicts and lists; schema in
            :mod:`paternoster.metrics.timeline`).
        Raises:
            TimelineUnavailableError: timelines are off in the engine.
            EngineDeadError: the engine is (or becomes) dead or shut down.
            TimeoutError: no reply within ``timeout`` seconds.
        """
        reply = await self._ask("timeline", timeout)
        snapshot = reply.get("timeline")
        if not isinstance(snapshot, dict):
            raise TimelineUnavailableError(str(reply.get("error") or "no timeline"))
        return snapshot

    async def reset_prefix_cache(self, timeout: float = 30.0) -> int:
        """Make the engine forget every cached KV block (running requests keep theirs).

        Args:
            timeout: seconds to wait for the reply (it comes between two steps).
        Returns:
            The number of blocks uncached (0 with prefix caching off).
        Raises:
            ValueError: the engine has no prefix cache (a test fake).
            EngineDeadError: the engine is (or becomes) dead or shut down.
            TimeoutError: no reply within ``timeout`` seconds.
        """
        reply = await self._ask("reset_prefix_cache", timeout)
        n = reply.get("num_blocks")
        if not isinstance(n, int):
            raise ValueError(str(reply.get("error") or "prefix cache reset failed"))
        return n

    async def _ask(self, kind: str, timeout: float) -> dict:
        """Send ``{"type": kind, "id": N}`` to the engine and await its reply of the
        same type and id.

        Raises:
            EngineDeadError: the engine is (or becomes) dead or shut down.
            TimeoutError: no reply within ``timeout`` seconds.
        """
        self._check_alive()
        rid = next(self._reply_ids)
        future: asyncio.Future = asyncio.get_running_loop().create_future()
        self._reply_waiters[rid] = future
        try:
            self._outbox.put_nowait(message(kind, id=rid))
            return await asyncio.wait_for(future, timeout)
        except asyncio.TimeoutError:  # not the builtin TimeoutError before Python 3.11
            raise TimeoutError(f"no {kind} reply from the engine within {timeout} s") from None
        finally:
            self._reply_waiters.pop(rid, None)

    def add_iteration_listener(self, listener: Callable[[list[int]], None]) -> None:
        """Call ``listener(tokens)`` for each ``outputs`` message: ``tokens`` holds
        the tokens each engine step since the previous message computed (for metrics)."""
        self._iteration_listeners.append(listener)

    @property
    def num_in_flight(self) -> int:
        """Requests whose outputs are still awaited."""
        return len(self._queues)

    def _check_alive(self) -> None:
        if self.dead_reason is not None:
            raise EngineDeadError(self.dead_reason)
        if self._closed or not self.info:
            raise EngineDeadError("engine is not running")
        if self._refusing is not None:
            raise EngineDeadError(self._refusing)

    # ------------------------------------------------------------ internals

    def _fail_all(self, reason: str) -> None:
        if self.dead_reason is None:
            self.dead_reason = reason
        for q in self._queues.values():
            q.put_nowait(EngineDeadError(self.dead_reason))
        for future in self._reply_waiters.values():
            if not future.done():
                future.set_exception(EngineDeadError(self.dead_reason))

    def _mark_dead(self, reason: str) -> None:
        if self.dead_reason is not None or self._closed:
            return
        logger.error("engine is dead: %s", reason)
        self._fail_all(reason)

    async def _send_loop(self) -> None:
        while True:
            msg = await self._outbox.get()
            try:
                await self._push.put(msg)
            except CodecError as e:  # never let one bad message stop the loop
                logger.error("dropping a message the codec refused: %s", e)

    async def _recv_loop(self) -> None:
        while True:
            try:
                msg = await self._pull.get()
                kind = message_type(msg)
            except CodecError as e:
                logger.error("dropping malformed frame from engine: %s", e)
                continue
            self._last_seen = time.monotonic()
            if kind == "outputs":
                self._take_stats(msg)  # first: whoever sees an output sees these stats
                self._dispatch(msg.get("outputs") or [])
                self._notify_iterations(msg.get("iteration_tokens"))
            elif kind == "heartbeat":
                self._take_stats(msg)
                started = msg.get("step_started")
                self._step_started = float(started) if isinstance(started, (int, float)) else None
            elif kind in ("timeline", "reset_prefix_cache"):
                tid = msg.get("id")
                future = self._reply_waiters.get(tid) if isinstance(tid, int) else None
                if future is not None and not future.done():
                    future.set_result(msg)
            elif kind == "fatal":
                self._mark_dead(f"engine failed: {msg.get('error')}")
            elif kind in ("ready", "startup_error"):
                self._on_restart_handshake(kind, msg)

    def _take_stats(self, msg: dict) -> None:
        """Keep ``msg["stats"]`` unless an already kept snapshot is newer
        (``stats_time``: outputs and heartbeats travel on two sockets)."""
        stats, at = msg.get("stats"), msg.get("stats_time")
        if not isinstance(stats, dict):
            return
        if isinstance(at, (int, float)):
            if at < self._stats_time:
                return
            self._stats_time = float(at)
        self.stats = dict(stats)

    def _dispatch(self, outputs: list) -> None:
        for raw in outputs:
            try:
                out = EngineCoreOutput.from_wire(raw)
            except (TypeError, ValueError) as e:
                logger.error("dropping malformed engine output: %s", e)
                continue
            queue = self._queues.get(out.request_id)
            if queue is not None:
                queue.put_nowait(out)

    def _notify_iterations(self, tokens: object) -> None:
        if not isinstance(tokens, list) or not tokens:
            return
        counts = [int(n) for n in tokens if isinstance(n, int)]
        for listener in self._iteration_listeners:
            try:
                listener(counts)
            except Exception:  # a metrics bug must not stop the receive loop
                logger.exception("iteration listener failed")

    async def _watchdog(self) -> None:
        backoff = 1.0
        while not self._closed:
            await asyncio.sleep(_WATCHDOG_PERIOD_S)
            if self.dead_reason is None:
                code = self._proc.poll()
                if code is not None:
                    self._mark_dead(f"engine process exited with code {code}")
                elif time.monotonic() - self._last_seen > self.stall_timeout:
                    self._mark_dead(f"engine stalled: no heartbeat for {self.stall_timeout:.1f} s")
                    self._proc.kill()
                elif (
                    self.step_timeout is not None
                    and self._step_started is not None
                    and time.time() - self._step_started > self.step_timeout
                ):
                    self._mark_dead(
                        f"engine stalled: one step has run for over {self.step_timeout:.1f} s "
                        "(--engine-step-timeout)"
                    )
                    self._step_started = None
                    self._proc.kill()
            elif not self.restart_engine:
                return
            elif await self._restart():
                backoff = 1.0
            else:
                await asyncio.sleep(backoff)
                backoff = min(30.0, backoff * 2)

    async def _restart(self) -> bool:
        """Replace a dead engine process with a new one (``--restart-engine``).

        Returns:
            True when the new engine is ready (the client is alive again).
        """
        self._restarting = True
        logger.warning("restarting the engine after: %s", self.dead_reason)
        try:
            if self._proc.poll() is None:
                self._proc.kill()
            while self._proc.poll() is None:
                await asyncio.sleep(_WATCHDOG_PERIOD_S)
            while not self._outbox.empty():  # meant for the dead engine
                self._outbox.get_nowait()
            self._proc = self._spawn()
            self._ready_waiter = asyncio.get_running_loop().create_future()
            config = message("config", config=self.config.to_dict(), token=self._token)
            self._outbox.put_nowait(config)
            deadline = time.monotonic() + self.startup_timeout
            while not self._ready_waiter.done():
                if self._proc.poll() is not None or time.monotonic() > deadline:
                    raise EngineStartupError("the new engine process did not become ready")
                await asyncio.wait({self._ready_waiter}, timeout=_WATCHDOG_PERIOD_S)
            self.info = self._ready_waiter.result()
        except EngineStartupError as e:
            logger.error("engine restart failed: %s", e)
            if self._proc.poll() is None:
                self._proc.kill()
            return False
        finally:
            self._ready_waiter = None
            self._restarting = False
        self.stats = {}
        self._last_seen = time.monotonic()
        self.num_restarts += 1
        self.dead_reason = None
        logger.warning("engine restarted (pid %d)", self._proc.pid)
        return True

    def _on_restart_handshake(self, kind: str, msg: dict) -> None:
        """A ``ready`` or ``startup_error`` from a restarted engine."""
        waiter = self._ready_waiter
        if waiter is None or waiter.done() or msg.get("token") != self._token:
            logger.error("dropping an unexpected %r message", kind)
            return
        if kind == "ready":
            waiter.set_result(dict(msg.get("info") or {}))
        else:
            waiter.set_exception(EngineStartupError(f"engine failed to start: {msg.get('error')}"))


def _child_env(token: str) -> dict[str, str]:
    """Our environment, with this package importable in the child and the
    handshake ``token`` in ``PATERNOSTER_ENGINE_TOKEN``."""
    env = dict(os.environ)
    env["PATERNOSTER_ENGINE_TOKEN"] = token
    root = str(Path(__file__).resolve().parents[2])  # the dir holding paternoster/
    parts = [root] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(parts))
    return env
