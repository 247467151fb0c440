"""Request timelines: which requests each engine step ran, and what happened to each.

A :class:`TimelineRecorder` sits in the engine's step loop (off by default:
``EngineCore.timeline`` is ``None`` and the loop pays one ``if`` per step). When
on it keeps, in bounded memory,

- a ring buffer of the last ``size`` steps: start/end times, batch size,
  prefill and decode tokens, preemptions (counted over the whole batch), and
  ``(request_id, tokens, kind)`` rows for the sampled requests;
- per sampled request: arrival, each prefill chunk, each run of consecutive
  decode steps (merged into one span), each preemption and the finish. At most
  ``max_requests`` requests are kept; the oldest finished one is evicted first
  (the oldest live one when none has finished), and a finished request whose
  finish is older than the oldest step in the ring is dropped.

:meth:`TimelineRecorder.snapshot` returns plain dicts and lists (msgpack- and
JSON-ready; the schema is below and in docs/metrics.md), which
:mod:`paternoster.metrics.chrome_trace` turns into a Chrome/Perfetto trace and
:mod:`paternoster.metrics.gantt` into a Gantt PNG.

Snapshot schema (times in seconds of the recorder's clock, ``time.monotonic()``
in the engine; add ``unix_offset`` for Unix time)::

    {"version": 1, "clock": "monotonic", "unix_offset": float, "now": float,
     "origin": float | None,          # where charts start (None: earliest time)
     "size": int, "sample_rate": float, "max_requests": int,
     "num_steps_total": int, "num_steps_dropped": int, "num_requests_evicted": int,
     "steps": [{"step": int, "start": float, "end": float, "num_requests": int,
                "prefill_tokens": int, "decode_tokens": int, "num_preempted": int,
                "rows": [[request_id, tokens, "prefill" | "decode"], ...]}],
     "requests": [{"request_id": str, "num_prompt_tokens": int, "arrival": float,
                   "first_scheduled": float | None, "finish": float | None,
                   "finish_reason": str | None, "num_output_tokens": int,
                   "num_preemptions": int, "num_events_dropped": int,
                   "events": [SPAN | PREEMPT, ...]}]}
    SPAN    = {"kind": "prefill" | "decode", "start": float, "end": float,
               "first_step": int, "last_step": int, "tokens": int,
               "sampled": int, "recompute": bool}
    PREEMPT = {"kind": "preempt", "time": float, "step": int}

A step row is ``decode`` when it computes exactly one token that lies past the
prompt (the last sampled token); anything else is ``prefill`` (a prompt chunk,
or a recompute after preemption: ``recompute`` is true). ``sampled`` counts the
tokens a span sampled (a prefill chunk samples 1 when it completes the prefill).
"""

from __future__ import annotations

import time
import zlib
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from paternoster.config import TimelineConfig
    from paternoster.engine.messages import EngineCoreOutput
    from paternoster.request import Request
    from paternoster.scheduling.output import SchedulerOutput

TIMELINE_VERSION = 1
#: Events kept per request; later ones are counted in ``num_events_dropped``.
MAX_EVENTS_PER_REQUEST = 1024


def is_sampled(request_id: str, sample_rate: float) -> bool:
    """Whether a request is recorded at ``sample_rate`` (a fraction in [0, 1]).

    Deterministic: the CRC-32 of the id decides, so a given id is always in or
    always out, in every process.
    """
    if sample_rate >= 1.0:
        return True
    if sample_rate <= 0.0:
        return False
    crc = zlib.crc32(request_id.encode("utf-8", "surrogatepass"))
    return crc < sample_rate * 4294967296.0


def append_span(
    events: list[dict],
    kind: str,
    start: float,
    end: float,
    step: int,
    tokens: int,
    sampled: int,
    recompute: bool,
    max_events: int | None = None,
) -> bool:
    """Add one step's work to a request's event list, merging consecutive decode steps.

    Args:
        events: the request's events (mutated).
        kind: ``"prefill"`` or ``"decode"``.
        start, end: the step's start and end (s).
        step: the step's index.
        tokens: tokens the step computed for the request.
        sampled: tokens it sampled (0 or 1).
        recompute: the prefill recomputes a preempted request.
        max_events: a new event is not appended once ``events`` holds this many.
    Returns:
        False when the work was dropped (the list is full), else True.
    """
    last = events[-1] if events else None
    if (
        kind == "decode"
        and last is not None
        and last["kind"] == "decode"
        and last["last_step"] == step - 1
    ):
        last["end"] = end
        last["last_step"] = step
        last["tokens"] += tokens
        last["sampled"] += sampled
        return True
    if max_events is not None and len(events) >= max_events:
        return False
    events.append(
        {
            "kind": kind, "start": start, "end": end, "first_step": step, "last_step": step,
            "tokens": tokens, "sampled": sampled, "recompute": recompute,
        }
    )  # fmt: skip
    return True


def queue_intervals(request: dict, now: float) -> list[tuple[float, float]]:
    """When a snapshot request waited: arrival to its first span, and each
    preemption to the next span (or to its finish, or ``now`` while it waits).

    Args:
        request: one entry of a snapshot's ``requests``.
        now: the snapshot's ``now`` (s).
    Returns:
        ``(start, end)`` pairs in seconds, in order, possibly of zero length.
    """
    out = []
    waiting_since: float | None = request["arrival"]
    for e in request["events"]:
        if e["kind"] == "preempt":
            waiting_since = e["time"]
        elif waiting_since is not None:
            out.append((waiting_since, max(waiting_since, e["start"])))
            waiting_since = None
    if waiting_since is not None:
        end = request["finish"] if request["finish"] is not None else now
        out.append((waiting_since, max(waiting_since, end)))
    return out


def timeline_origin(snapshot: dict) -> float:
    """Where a snapshot's charts and traces start (s): its ``origin`` when set,
    else the earliest step start or request arrival, else ``now``."""
    if snapshot.get("origin") is not None:
        return float(snapshot["origin"])
    times = [s["start"] for s in snapshot["steps"]] + [r["arrival"] for r in snapshot["requests"]]
    return min(times) if times else float(snapshot["now"])


def shrink_snapshot(snapshot: dict) -> bool:
    """Drop the older half of a snapshot's steps and requests (to fit a message).

    The counters ``num_steps_dropped`` and ``num_requests_evicted`` grow by
    what was dropped.

    Returns:
        False when there was nothing left to drop, else True.
    """
    steps, requests = snapshot["steps"], snapshot["requests"]
    if not steps and not requests:
        return False
    drop_steps, drop_requests = (len(steps) + 1) // 2, (len(requests) + 1) // 2
    snapshot["steps"] = steps[drop_steps:]
    snapshot["requests"] = requests[drop_requests:]
    snapshot["num_steps_dropped"] += drop_steps
    snapshot["num_requests_evicted"] += drop_requests
    return True


@dataclass(slots=True)
class _Step:
    step: int
    start: float
    end: float
    num_requests: int
    prefill_tokens: int
    decode_tokens: int
    num_preempted: int
    rows: list[tuple[str, int, str]]


@dataclass(slots=True)
class _RequestRecord:
    request_id: str
    num_prompt_tokens: int
    arrival: float
    first_scheduled: float | None = None
    finish: float | None = None
    finish_reason: str | None = None
    num_output_tokens: int = 0
    num_preemptions: int = 0
    num_events_dropped: int = 0
    events: list[dict] = field(default_factory=list)

    def add_event(self, event: dict) -> None:
        if len(self.events) < MAX_EVENTS_PER_REQUEST:
            self.events.append(event)
        else:
            self.num_events_dropped += 1

    def to_dict(self) -> dict:
        return {
            "request_id": self.request_id, "num_prompt_tokens": self.num_prompt_tokens,
            "arrival": self.arrival, "first_scheduled": self.first_scheduled,
            "finish": self.finish, "finish_reason": self.finish_reason,
            "num_output_tokens": self.num_output_tokens, "num_preemptions": self.num_preemptions,
            "num_events_dropped": self.num_events_dropped,
            "events": [dict(e) for e in self.events],
        }  # fmt: skip


class TimelineRecorder:
    """Bounded per-step and per-request records of an engine (see the module doc).

    Args:
        size: steps kept in the ring buffer (>= 1).
        sample_rate: fraction of requests recorded, in [0, 1] (chosen by
            :func:`is_sampled`); steps are always recorded, with rows for the
            sampled requests only.
        max_requests: requests kept at once (>= 1); default ``size``.
        clock: the time source (s); the engine's requests must use the same.
    Raises:
        ValueError: ``size`` or ``max_requests`` < 1, ``sample_rate`` outside [0, 1].
    """

    def __init__(
        self,
        size: int,
        sample_rate: float = 1.0,
        max_requests: int | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if size < 1:
            raise ValueError(f"timeline size must be >= 1 step, got {size}")
        if not 0.0 <= sample_rate <= 1.0:
            raise ValueError(f"timeline sample_rate must be in [0, 1], got {sample_rate}")
        max_requests = size if max_requests is None else max_requests
        if max_requests < 1:
            raise ValueError(f"timeline max_requests must be >= 1, got {max_requests}")
        self.size = size
        self.sample_rate = float(sample_rate)
        self.max_requests = max_requests
        self.clock = clock
        self._steps: deque[_Step] = deque(maxlen=size)
        self._requests: OrderedDict[str, _RequestRecord] = OrderedDict()
        self._finished: deque[str] = deque(maxlen=max_requests)
        self._num_steps_total = 0
        self._num_evicted = 0

    @classmethod
    def from_config(cls, config: TimelineConfig) -> TimelineRecorder | None:
        """A recorder for ``config``, or ``None`` when timelines are off (size 0)."""
        if config.size == 0:
            return None
        return cls(config.size, config.sample_rate, config.max_requests)

    # --------------------------------------------------------------- hooks

    def on_arrival(self, request: Request) -> None:
        """Start recording ``request`` (queued at ``request.arrival_time``) if sampled."""
        rid = request.request_id
        if not is_sampled(rid, self.sample_rate):
            return
        self._requests.pop(rid, None)  # an id reused after its request finished
        while len(self._requests) >= self.max_requests:
            self._evict_one()
        self._requests[rid] = _RequestRecord(rid, request.num_prompt_tokens, request.arrival_time)

    def on_step(
        self,
        step: int,
        plan: SchedulerOutput,
        sampled_rows: Iterable[int],
        start: float,
        end: float,
        outputs: Sequence[EngineCoreOutput],
    ) -> None:
        """Record one step that ran a forward pass, after ``update_from_output``.

        Args:
            step: the step's index (0-based, forward passes only).
            plan: the step's plan; its requests' ``num_computed_tokens`` already
                include this step's tokens.
            sampled_rows: rows of ``plan.scheduled`` that sampled a token (read
                only when a recorded request ran a prefill chunk).
            start, end: when the step began and ended (s, recorder's clock).
            outputs: the step's outputs (for the finishes).
        """
        records = self._requests
        rows: list[tuple[str, int, str]] = []
        sampled: set[int] | None = None
        decode = 0
        prev = step - 1
        for row, (r, n) in enumerate(zip(plan.scheduled, plan.num_scheduled_tokens)):
            is_decode = n == 1 and r.num_computed_tokens > len(r.prompt_token_ids)
            decode += is_decode
            rec = records.get(r.request_id)
            if rec is None:
                continue
            if is_decode:
                rows.append((r.request_id, 1, "decode"))
                rec.num_output_tokens += 1
                last = rec.events[-1] if rec.events else None
                if last is not None and last["last_step"] == prev and last["kind"] == "decode":
                    last["end"] = end  # the common case: one more step of a decode run
                    last["last_step"] = step
                    last["tokens"] += 1
                    last["sampled"] += 1
                    continue
                kind, took = "decode", 1
            else:
                rows.append((r.request_id, n, "prefill"))
                if sampled is None:
                    sampled = set(sampled_rows)
                kind, took = "prefill", int(row in sampled)
                rec.num_output_tokens += took
            if rec.first_scheduled is None:
                rec.first_scheduled = start
            recompute = not is_decode and rec.num_preemptions > 0
            if not append_span(
                rec.events, kind, start, end, step, n, took, recompute, MAX_EVENTS_PER_REQUEST
            ):
                rec.num_events_dropped += 1
        self.on_preempted(plan.preempted, step, start)
        for o in outputs:
            if o.finish_reason is not None:
                rec = records.get(o.request_id)
                if rec is not None:
                    self._mark_finished(rec, end, o.finish_reason)
        num_tokens = sum(plan.num_scheduled_tokens)
        self._steps.append(
            _Step(
                step, start, end, len(plan.scheduled), num_tokens - decode, decode,
                len(plan.preempted), rows,
            )
        )  # fmt: skip
        self._num_steps_total += 1
        self._drop_finished_before_window()

    def on_preempted(self, requests: Iterable[Request], step: int, time_s: float) -> None:
        """Record preemptions planned for step ``step`` (which began at ``time_s``)."""
        for r in requests:
            rec = self._requests.get(r.request_id)
            if rec is not None:
                rec.num_preemptions += 1
                rec.add_event({"kind": "preempt", "time": time_s, "step": step})

    def on_abort(self, requests: Iterable[Request], time_s: float) -> None:
        """Record that live ``requests`` were aborted at ``time_s``."""
        for r in requests:
            rec = self._requests.get(r.request_id)
            if rec is not None and rec.finish is None:
                self._mark_finished(rec, time_s, "abort")

    # ------------------------------------------------------------- export

    def snapshot(self) -> dict:
        """Everything recorded, as plain dicts and lists (schema: module doc).

        Returns:
            A new dict; later recording does not change it.
        """
        steps = [
            {
                "step": s.step, "start": s.start, "end": s.end, "num_requests": s.num_requests,
                "prefill_tokens": s.prefill_tokens, "decode_tokens": s.decode_tokens,
                "num_preempted": s.num_preempted, "rows": [list(r) for r in s.rows],
            }
            for s in self._steps
        ]  # fmt: skip
        return {
            "version": TIMELINE_VERSION,
            "clock": "monotonic",
            "unix_offset": time.time() - time.monotonic(),
            "now": self.clock(),
            "origin": None,
            "size": self.size,
            "sample_rate": self.sample_rate,
            "max_requests": self.max_requests,
            "num_steps_total": self._num_steps_total,
            "num_steps_dropped": self._num_steps_total - len(self._steps),
            "num_requests_evicted": self._num_evicted,
            "steps": steps,
            "requests": [rec.to_dict() for rec in self._requests.values()],
        }

    @property
    def num_requests(self) -> int:
        """Requests currently kept."""
        return len(self._requests)

    @property
    def num_steps(self) -> int:
        """Steps currently in the ring buffer (<= ``size``)."""
        return len(self._steps)

    # ----------------------------------------------------------- internals

    def _mark_finished(self, rec: _RequestRecord, time_s: float, reason: str) -> None:
        rec.finish = time_s
        rec.finish_reason = reason
        self._finished.append(rec.request_id)

    def _evict_one(self) -> None:
        """Drop the oldest finished request, else the oldest live one."""
        while self._finished:
            rec = self._requests.get(self._finished.popleft())
            if rec is not None and rec.finish is not None:
                del self._requests[rec.request_id]
                self._num_evicted += 1
                return
        self._requests.popitem(last=False)
        self._num_evicted += 1

    def _drop_finished_before_window(self) -> None:
        """Once the ring is full, forget requests that finished before its oldest step."""
        if len(self._steps) < self.size:
            return
        oldest = self._steps[0].start
        while self._finished:
            rec = self._requests.get(self._finished[0])
            if rec is not None and rec.finish is not None and rec.finish >= oldest:
                return
            self._finished.popleft()
            if rec is not None and rec.finish is not None:
                del self._requests[rec.request_id]
                self._num_evicted += 1
