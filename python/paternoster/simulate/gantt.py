"""A simulation as a request timeline, and its Gantt chart.

:func:`to_timeline` turns a :class:`SimulationResult` into the snapshot format
of the engine's request timelines (:mod:`paternoster.metrics.timeline`), so the
simulator and a real engine share one chart
(:func:`paternoster.metrics.gantt.plot_timeline_gantt`) and one Chrome/Perfetto
export (:func:`paternoster.metrics.chrome_trace.to_chrome_trace`).
"""

from __future__ import annotations

from pathlib import Path

from paternoster.metrics.timeline import TIMELINE_VERSION, append_span
from paternoster.simulate.results import SimulationResult


def to_timeline(result: SimulationResult) -> dict:
    """The simulation as a timeline snapshot (virtual time; steps 0-based).

    Args:
        result: a finished simulation.
    Returns:
        A snapshot dict (schema in :mod:`paternoster.metrics.timeline`) with
        ``clock = "virtual"``, ``origin = 0`` and the requests in trace order;
        every request is recorded (``sample_rate`` 1) and finished with
        ``finish_reason = "length"`` (the simulator ignores EOS).
    """
    metrics = result.requests
    events: list[list[dict]] = [[] for _ in metrics]
    computed = [0] * len(metrics)
    outputs = [0] * len(metrics)
    preemptions = [0] * len(metrics)
    steps = []
    for s in result.steps:
        step = s.index - 1
        for i in s.preempted:
            events[i].append({"kind": "preempt", "time": s.start, "step": step})
            computed[i] = 0
            preemptions[i] += 1
        prefill = decode = 0
        for i, n, kind in s.rows:
            if kind == "decode":
                decode += n
            else:
                prefill += n
            computed[i] += n
            sampled = int(computed[i] == metrics[i].prompt_len + outputs[i])
            outputs[i] += sampled
            recompute = kind == "prefill" and preemptions[i] > 0
            append_span(events[i], kind, s.start, s.end, step, n, sampled, recompute)
        steps.append(
            {
                "step": step, "start": s.start, "end": s.end, "num_requests": len(s.rows),
                "prefill_tokens": prefill, "decode_tokens": decode,
                "num_preempted": len(s.preempted),
                "rows": [[metrics[i].request_id, n, kind] for i, n, kind in s.rows],
            }
        )  # fmt: skip
    requests = [
        {
            "request_id": m.request_id, "num_prompt_tokens": m.prompt_len,
            "arrival": m.arrival_time, "first_scheduled": m.first_scheduled_time,
            "finish": m.token_times[-1] if m.token_times else None,
            "finish_reason": "length" if m.token_times else None,
            "num_output_tokens": m.num_output_tokens, "num_preemptions": preemptions[i],
            "num_events_dropped": 0, "events": events[i],
        }
        for i, m in enumerate(metrics)
    ]  # fmt: skip
    end = max((s.end for s in result.steps), default=0.0)
    return {
        "version": TIMELINE_VERSION, "clock": "virtual", "unix_offset": None, "now": end,
        "origin": 0.0, "size": len(steps), "sample_rate": 1.0, "max_requests": len(requests),
        "num_steps_total": len(steps), "num_steps_dropped": 0, "num_requests_evicted": 0,
        "steps": steps, "requests": requests,
    }  # fmt: skip


def plot_gantt(result: SimulationResult, path: str | Path, x: str = "time") -> None:
    """Write the Gantt chart of ``result`` as a PNG.

    Args:
        result: a finished simulation.
        path: output file (``.png``).
        x: ``"time"`` (virtual time on the x axis) or ``"step"`` (step number, 0-based).
    Raises:
        ValueError: ``x`` is neither ``"time"`` nor ``"step"``.
        ImportError: matplotlib is not installed.
    """
    from paternoster.metrics.gantt import plot_timeline_gantt

    per_token = ("a_prefill", "a_decode", "a_kv")
    unit = "s" if any(result.cost_model.get(k, 0) for k in per_token) else "time units"
    plot_timeline_gantt(
        to_timeline(result),
        path,
        x=x,
        title=f"{result.scheduler}: {len(result.requests)} requests, {len(result.steps)} steps",
        xlabel=f"virtual time ({unit})" if x == "time" else "step",
        ylabel="request (trace order)",
    )
