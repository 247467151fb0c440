"""The engine process's main loop: :class:`EngineLoop` drains the frontend's
messages, steps the engine, pushes its outputs and beats (on a thread of its
own when given a second socket). :func:`paternoster.engine.process.run_engine`
builds it once the engine is up; the protocol is in that module's docstring.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

import msgspec
import zmq

from paternoster.engine.codec import CodecError, PullQueue, PushQueue
from paternoster.engine.messages import (
    Abort,
    Add,
    Config,
    EngineCoreOutput,
    FromEngine,
    Heartbeat,
    Outputs,
    ResetPrefixCache,
    ResetPrefixCacheReply,
    Shutdown,
    TimelineQuery,
    TimelineReply,
    ToEngine,
)

logger = logging.getLogger("paternoster.engine")

DEFAULT_HEARTBEAT_INTERVAL = 0.5



def _error_output(request_id: str, error: str) -> EngineCoreOutput:
    return EngineCoreOutput(request_id, [], finish_reason="error", error=error)


class _RequestId(msgspec.Struct):
    request_id: str


class _AddedId(msgspec.Struct, tag_field="type", tag="add"):
    request: _RequestId


def _salvage_request_id(frame: bytes | None) -> str | None:
    """The request id of an ``Add`` frame that failed to decode, if it has one."""
    if frame is None:
        return None
    try:
        return msgspec.msgpack.decode(frame, type=_AddedId).request.request_id
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None


class EngineLoop:
    """Drives one EngineCore: drain inputs, step, push outputs, beat.

    Args:
        engine: an EngineCore (or anything with its API).
        inputs: queue of frontend messages.
        outputs: queue to the frontend.
        parent_pid: exit when this process is no longer our parent.
        heartbeat_interval: seconds between heartbeats; also the idle poll timeout.
        beat_queue: builds the queue heartbeats go out on (a second PUSH socket
            to the frontend), called once inside the heartbeat thread, which
            then owns it; ``None`` sends heartbeats from the loop between steps
            (tests with in-memory queues).
    """

    def __init__(
        self,
        engine: Any,
        inputs: PullQueue,
        outputs: PushQueue,
        parent_pid: int | None,
        heartbeat_interval: float = DEFAULT_HEARTBEAT_INTERVAL,
        beat_queue: Callable[[], PushQueue] | None = None,
    ):
        self.engine = engine
        self.inputs = inputs
        self.outputs = outputs
        self.parent_pid = parent_pid
        self.heartbeat_interval = heartbeat_interval
        self._pending: list[EngineCoreOutput] = []
        self._iteration_tokens: list[int] = []
        self._shutdown = False
        self._last_beat = 0.0
        self._beat_queue = beat_queue
        # (time.monotonic() of the snapshot, EngineCore.stats()); replaced as a
        # whole, so the heartbeat thread always reads a matching pair.
        self._stats: tuple[float, dict] = (0.0, {})
        self._step_started: float | None = None
        self._stop_beats = threading.Event()
        self._parent_gone = threading.Event()
        # Checked between idle polls: raises when the engine can no longer step.
        self._check_health = getattr(engine, "check_health", None)

    def run(self) -> None:
        """Loop until a ``shutdown`` message arrives or the parent dies.

        Raises:
            Exception: whatever ``EngineCore.step`` or, between idle polls,
                ``EngineCore.check_health`` raised (the caller reports it).
        """
        self._snapshot_stats()
        beater = None
        if self._beat_queue is not None:
            beater = threading.Thread(target=self._beat_forever, name="heartbeat", daemon=True)
            beater.start()
        try:
            self._loop(threaded_beats=beater is not None)
        finally:
            self._stop_beats.set()
            if beater is not None:
                beater.join(timeout=5)

    def _loop(self, threaded_beats: bool) -> None:
        while not self._shutdown:
            if self._parent_gone.is_set():
                logger.warning("frontend process is gone; engine exiting")
                return
            busy = self.engine.has_unfinished_requests()
            if not busy and self._check_health is not None:
                self._check_health()  # e.g. a tensor-parallel worker died while idle
            self._drain(0 if busy else int(self.heartbeat_interval * 1000))
            if self._shutdown:
                break
            if self.engine.has_unfinished_requests():
                self._step_started = time.time()
                try:
                    self._pending.extend(self.engine.step())
                finally:
                    self._step_started = None
                self._iteration_tokens.extend(self._pop_iteration_tokens())
            if self._pending or self._iteration_tokens:
                pending, self._pending = self._pending, []
                tokens, self._iteration_tokens = self._iteration_tokens, []
                at, stats = self._snapshot_stats()
                out = Outputs(outputs=pending, iteration_tokens=tokens, stats=stats,
                              stats_time=at)
                if not self._put(out):
                    return
            now = time.monotonic()
            if now - self._last_beat >= self.heartbeat_interval:
                self._last_beat = now
                at, stats = self._snapshot_stats()
                if threaded_beats:
                    continue
                beat = Heartbeat(stats=stats, stats_time=at, time=time.time())
                if not self._parent_alive() or not self._put(beat):
                    logger.warning("frontend process is gone; engine exiting")
                    return

    def _beat_forever(self) -> None:
        """Heartbeat thread: one beat per interval, whatever the loop is doing
        (torch and the C++ kernels release the GIL during a step)."""
        queue = self._beat_queue()
        try:
            while not self._stop_beats.wait(self.heartbeat_interval):
                if not self._parent_alive():
                    self._parent_gone.set()
                    return
                at, stats = self._stats
                beat = Heartbeat(stats=stats, stats_time=at, time=time.time(),
                                 step_started=self._step_started)
                try:
                    queue.put(beat)
                except zmq.Again:  # the frontend is not reading; the next beat retries
                    continue
        except zmq.ZMQError:  # context terminated while shutting down
            return
        finally:
            queue.socket.close(linger=0)

    def _snapshot_stats(self) -> tuple[float, dict]:
        """Take ``EngineCore.stats()`` now (about 1 µs) and keep it for the heartbeats.

        Returns:
            ``(time.monotonic() seconds of the snapshot, the stats)``.
        """
        self._stats = (time.monotonic(), self.engine.stats())
        return self._stats

    def _pop_iteration_tokens(self) -> list[int]:
        """The engine's per-step token counts, if it keeps them (fakes may not)."""
        pop = getattr(self.engine, "pop_iteration_tokens", None)
        return [int(n) for n in pop()] if pop is not None else []

    def _parent_alive(self) -> bool:
        return self.parent_pid is None or os.getppid() == self.parent_pid

    def _put(self, msg: FromEngine) -> bool:
        """Send, retrying while the frontend is alive. False when it is gone."""
        while True:
            try:
                self.outputs.put(msg)
                return True
            except zmq.Again:  # SNDTIMEO expired: the frontend is not reading
                if not self._parent_alive():
                    return False

    def _drain(self, first_timeout_ms: int) -> None:
        """Handle every waiting input; wait up to ``first_timeout_ms`` for the first."""
        if first_timeout_ms > 0 and not self.inputs.poll(first_timeout_ms):
            return
        while True:
            try:
                msg = self.inputs.get_nowait()
            except CodecError as e:
                rid = _salvage_request_id(e.frame)
                if rid is not None:
                    self._pending.append(_error_output(rid, str(e)))
                else:
                    logger.error("dropping malformed frame: %s", e)
                continue
            if msg is None:
                return
            self._handle(msg)

    def _handle(self, msg: ToEngine) -> None:
        if isinstance(msg, Add):
            try:
                self.engine.add_request(msg.request)
            except ValueError as e:
                self._pending.append(_error_output(msg.request.request_id,
                                                   str(e) or type(e).__name__))  # fmt: skip
        elif isinstance(msg, Abort):
            self._pending.extend(self.engine.abort_requests(msg.request_ids))
        elif isinstance(msg, Shutdown):
            self._shutdown = True
        elif isinstance(msg, TimelineQuery):
            self._reply_timeline(msg.id)
        elif isinstance(msg, ResetPrefixCache):
            reset = getattr(self.engine, "reset_prefix_cache", None)
            if reset is None:
                reply = ResetPrefixCacheReply(id=msg.id, error="this engine has no prefix cache")
            else:
                reply = ResetPrefixCacheReply(id=msg.id, num_blocks=int(reset()))
            self._put(reply)
        elif isinstance(msg, Config):  # a restart's resent handshake: the first one counted
            logger.debug("ignoring a repeated Config")
        else:
            logger.error("dropping an unexpected %s message", type(msg).__name__)

    def _reply_timeline(self, request_id: int) -> None:
        """Answer a ``timeline`` request with the engine's snapshot (its newer half,
        quarter... when the whole does not fit one frame), or with an error."""
        from paternoster.metrics.timeline import shrink_snapshot

        snapshot_fn = getattr(self.engine, "timeline_snapshot", None)
        snapshot = snapshot_fn() if snapshot_fn is not None else None
        if snapshot is None:
            error = "request timelines are off (start the server with --timeline-size N)"
            self._put(TimelineReply(id=request_id, error=error))
            return
        while True:
            try:
                self._put(TimelineReply(id=request_id, timeline=snapshot))
                return
            except CodecError as e:  # over the frame size limit
                if not shrink_snapshot(snapshot):
                    self._put(TimelineReply(id=request_id, error=str(e)))
                    return
