"""The frontend's asyncio client of the engine process.

:class:`EngineClient` starts ``python -m paternoster.engine.process``, talks to
it over two ZeroMQ ``ipc://`` sockets in a private temp dir (msgpack frames,
see :mod:`paternoster.engine.process` for the messages), and routes each
engine output to the asyncio queue of its request. A watchdog ends every
in-flight request with :class:`EngineDeadError` within ~0.1 s of the engine
process exiting, or once no message (heartbeats included) arrived for
``stall_timeout`` seconds; no request waits forever.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterable
from pathlib import Path

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


class RequestRejectedError(ValueError):
    """The engine refused a request (``EngineCore.add_request`` raised
    ``ValueError``); the message says why."""


class EngineClient:
    """Runs the engine process and multiplexes requests over ZeroMQ.

    Args:
        config: the engine's configuration (sent to it as a msgpack map).
        engine_cls: ``"module:Class"`` the engine process builds (tests use a fake).
        startup_timeout: seconds to wait for ``ready`` (model load included).
        stall_timeout: seconds without any message from a running engine after
            which it is declared dead (must exceed the longest step).
        heartbeat_interval: seconds between the engine's heartbeats.
        log_level: the engine process's log level.
    """

    def __init__(
        self,
        config: EngineConfig,
        engine_cls: str = DEFAULT_ENGINE_CLS,
        startup_timeout: float = 600.0,
        stall_timeout: float = 30.0,
        heartbeat_interval: float = DEFAULT_HEARTBEAT_INTERVAL,
        log_level: str = "INFO",
    ):
        self.config = config
        self.engine_cls = engine_cls
        self.startup_timeout = startup_timeout
        self.stall_timeout = stall_timeout
        self.heartbeat_interval = heartbeat_interval
        self.log_level = log_level
        self.info: dict = {}
        self.stats: dict = {}
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
        self._timeline_waiters: dict[int, asyncio.Future] = {}
        self._timeline_ids = itertools.count()

    # ----------------------------------------------------------------- life

    @property
    def is_alive(self) -> bool:
        """True while the engine is ready and neither dead nor shut down."""
        return bool(self.info) and self.dead_reason is None and not self._closed

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
        self._proc = subprocess.Popen(
            [
                sys.executable, "-m", "paternoster.engine.process",
                "--input", in_addr, "--output", out_addr,
                "--parent-pid", str(os.getpid()),
                "--engine-cls", self.engine_cls,
                "--heartbeat-interval", str(self.heartbeat_interval),
                "--log-level", self.log_level,
            ],
            env=_child_env(),
        )  # fmt: skip
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

    async def _handshake(self) -> dict:
        await self._push.put(message("config", config=self.config.to_dict()))
        while True:
            try:
                msg = await self._pull.get()
                kind = message_type(msg)
            except CodecError as e:
                logger.error("dropping malformed frame from engine: %s", e)
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

    async def generate(self, request: EngineCoreRequest) -> AsyncIterator[EngineCoreOutput]:
        """Send a request and yield its outputs until it finishes.

        Closing the iterator early (``aclose``, cancellation, a client that
        disconnected) aborts the engine request so its KV blocks are freed.

        Args:
            request: the tokenized request; ``request_id`` must be unique
                among in-flight requests.
        Yields:
            EngineCoreOutput: in order; the last has ``finish_reason`` set.
        Raises:
            EngineDeadError: the engine is (or becomes) dead or shut down.
            RequestRejectedError: the engine refused the request.
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
        done = False
        try:
            self._outbox.put_nowait(add)
            while not done:
                item = await queue.get()
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
            if not done:
                self.abort([rid])

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
        self._check_alive()
        tid = next(self._timeline_ids)
        future: asyncio.Future = asyncio.get_running_loop().create_future()
        self._timeline_waiters[tid] = future
        try:
            self._outbox.put_nowait(message("timeline", id=tid))
            reply = await asyncio.wait_for(future, timeout)
        except asyncio.TimeoutError:  # not the builtin TimeoutError before Python 3.11
            raise TimeoutError(f"no timeline from the engine within {timeout} s") from None
        finally:
            self._timeline_waiters.pop(tid, None)
        snapshot = reply.get("timeline")
        if not isinstance(snapshot, dict):
            raise TimelineUnavailableError(str(reply.get("error") or "no timeline"))
        return snapshot

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

    # ------------------------------------------------------------ internals

    def _fail_all(self, reason: str) -> None:
        if self.dead_reason is None:
            self.dead_reason = reason
        for q in self._queues.values():
            q.put_nowait(EngineDeadError(self.dead_reason))
        for future in self._timeline_waiters.values():
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
                self._dispatch(msg.get("outputs") or [])
                self._notify_iterations(msg.get("iteration_tokens"))
            elif kind == "heartbeat":
                self.stats = dict(msg.get("stats") or {})
            elif kind == "timeline":
                tid = msg.get("id")
                future = self._timeline_waiters.get(tid) if isinstance(tid, int) else None
                if future is not None and not future.done():
                    future.set_result(msg)
            elif kind == "fatal":
                self._mark_dead(f"engine failed: {msg.get('error')}")

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
        while self.dead_reason is None:
            await asyncio.sleep(_WATCHDOG_PERIOD_S)
            code = self._proc.poll()
            if code is not None:
                self._mark_dead(f"engine process exited with code {code}")
            elif time.monotonic() - self._last_seen > self.stall_timeout:
                self._mark_dead(f"engine stalled: no heartbeat for {self.stall_timeout:.1f} s")
                self._proc.kill()


def _child_env() -> dict[str, str]:
    """Our environment, with this package importable in the child."""
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[2])  # the dir holding paternoster/
    parts = [root] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(parts))
    return env
