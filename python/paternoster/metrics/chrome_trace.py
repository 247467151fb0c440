"""A request timeline as a Chrome trace (opens in https://ui.perfetto.dev and chrome://tracing).

The JSON Object Format of the Trace Event Format: ``{"traceEvents": [...],
"displayTimeUnit": "ms", "otherData": {...}}``, timestamps in microseconds
since the snapshot's origin (:func:`~paternoster.metrics.timeline.timeline_origin`;
``otherData.origin_unix`` is that origin as Unix time).

- Process 1, "engine": one thread, "steps", with a complete (``X``) event per
  engine step (args: batch size, prefill/decode tokens, preemptions and the
  sampled requests' rows) and a counter (``C``) track "batch" of requests and
  tokens per step.
- Process 2, "requests": one thread per recorded request, named by its id, in
  arrival order: ``X`` events ``queue`` (waiting: after arrival and after each
  preemption), ``prefill`` (one per chunk), ``recompute`` (a prefill chunk after
  a preemption) and ``decode`` (a run of consecutive decode steps); instant
  (``i``) events ``preempted`` and ``finish`` (args: finish reason, tokens).
  Events on one request's thread never overlap.
"""

from __future__ import annotations

import json
from pathlib import Path

from paternoster.metrics.timeline import queue_intervals, timeline_origin

ENGINE_PID = 1
REQUESTS_PID = 2
STEPS_TID = 1


def to_chrome_trace(snapshot: dict) -> dict:
    """Convert a timeline snapshot to a Chrome trace.

    Args:
        snapshot: ``TimelineRecorder.snapshot()`` (or the simulator's
            ``to_timeline``); times in seconds.
    Returns:
        The trace as a JSON-ready dict (``ts``/``dur`` in microseconds, >= 0).
    Raises:
        KeyError: ``snapshot`` lacks a required key.
    """
    origin = timeline_origin(snapshot)

    def us(t: float) -> float:
        return round((t - origin) * 1e6, 3)

    def complete(name: str, start: float, end: float, pid: int, tid: int, args: dict) -> dict:
        ts = us(start)
        dur = max(0.0, round(us(end) - ts, 3))
        return {"name": name, "cat": name, "ph": "X", "ts": ts, "dur": dur, "pid": pid,
                "tid": tid, "args": args}  # fmt: skip

    events: list[dict] = [
        _meta("process_name", ENGINE_PID, 0, name="engine"),
        _meta("process_sort_index", ENGINE_PID, 0, sort_index=0),
        _meta("thread_name", ENGINE_PID, STEPS_TID, name="steps"),
        _meta("process_name", REQUESTS_PID, 0, name="requests"),
        _meta("process_sort_index", REQUESTS_PID, 0, sort_index=1),
    ]
    for s in snapshot["steps"]:
        tokens = s["prefill_tokens"] + s["decode_tokens"]
        args = {
            "step": s["step"], "num_requests": s["num_requests"], "num_tokens": tokens,
            "prefill_tokens": s["prefill_tokens"], "decode_tokens": s["decode_tokens"],
            "num_preempted": s["num_preempted"], "rows": s["rows"],
        }  # fmt: skip
        events.append(complete("step", s["start"], s["end"], ENGINE_PID, STEPS_TID, args))
        events.append(
            {"name": "batch", "ph": "C", "ts": us(s["start"]), "pid": ENGINE_PID,
             "tid": STEPS_TID, "args": {"requests": s["num_requests"], "tokens": tokens}}
        )  # fmt: skip
    now = snapshot["now"]
    for tid, req in enumerate(snapshot["requests"], start=1):
        events.append(_meta("thread_name", REQUESTS_PID, tid, name=req["request_id"]))
        events.append(_meta("thread_sort_index", REQUESTS_PID, tid, sort_index=tid))
        for start, end in queue_intervals(req, now):
            events.append(complete("queue", start, end, REQUESTS_PID, tid, {}))
        for e in req["events"]:
            if e["kind"] == "preempt":
                events.append(_instant("preempted", us(e["time"]), tid, {"step": e["step"]}))
                continue
            name = "recompute" if e["recompute"] else e["kind"]
            args = {
                "tokens": e["tokens"], "sampled": e["sampled"], "first_step": e["first_step"],
                "last_step": e["last_step"], "num_steps": e["last_step"] - e["first_step"] + 1,
            }  # fmt: skip
            events.append(complete(name, e["start"], e["end"], REQUESTS_PID, tid, args))
        if req["finish"] is not None:
            args = {
                "finish_reason": req["finish_reason"],
                "num_prompt_tokens": req["num_prompt_tokens"],
                "num_output_tokens": req["num_output_tokens"],
                "num_preemptions": req["num_preemptions"],
            }
            events.append(_instant("finish", us(req["finish"]), tid, args))
    other = {
        key: snapshot.get(key)
        for key in ("version", "clock", "sample_rate", "size", "max_requests", "num_steps_total",
                    "num_steps_dropped", "num_requests_evicted")
    }  # fmt: skip
    offset = snapshot.get("unix_offset")
    other["origin_unix"] = origin + offset if offset is not None else None
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": other}


def write_chrome_trace(snapshot: dict, path: str | Path) -> None:
    """Write :func:`to_chrome_trace` of ``snapshot`` to ``path`` as JSON.

    Raises:
        OSError: the file cannot be written.
    """
    Path(path).write_text(json.dumps(to_chrome_trace(snapshot)) + "\n")


def _meta(kind: str, pid: int, tid: int, **args: object) -> dict:
    return {"name": kind, "ph": "M", "pid": pid, "tid": tid, "args": args}


def _instant(name: str, ts: float, tid: int, args: dict) -> dict:
    return {"name": name, "cat": name, "ph": "i", "s": "t", "ts": ts, "pid": REQUESTS_PID,
            "tid": tid, "args": args}  # fmt: skip
