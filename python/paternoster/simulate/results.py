"""Simulator output: per-request latencies, per-step records, summaries and tables.

Latency terms as in vLLM's serving benchmark: TTFT (arrival to first output
token), ITL (gap between consecutive output tokens of one request), E2E
(arrival to last token), queue time (arrival to the start of the first step
that computes any of the request's tokens). All in the simulator's time unit:
seconds with a calibrated cost model, steps with the unit cost model.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

PERCENTILES = (50, 95, 99)


@dataclass
class RequestMetrics:
    """What happened to one request.

    Attributes:
        request_id, tag, priority: from the trace.
        arrival_time: when it arrived.
        prompt_len, output_len: tokens, from the trace.
        num_output_tokens: tokens it actually received (== ``output_len``).
        first_scheduled_time: start of the first step that computed its tokens.
        token_times: end of the step that produced each output token, in order.
        finish_step: 1-based index of the step that produced its last token.
        num_preemptions: times it was preempted (recompute).
        tenant: from the trace (``None``: the anonymous tenant).
        error: why the policy refused it (load shedding), or ``None``; a
            refused request has no tokens and no latencies.
    """

    request_id: str
    tag: str | None
    priority: int
    arrival_time: float
    prompt_len: int
    output_len: int
    num_output_tokens: int = 0
    first_scheduled_time: float | None = None
    token_times: list[float] = field(default_factory=list)
    finish_step: int | None = None
    num_preemptions: int = 0
    tenant: str | None = None
    error: str | None = None

    @property
    def finish_time(self) -> float:
        """Time of the last output token."""
        return self.token_times[-1]

    @property
    def ttft(self) -> float:
        """Time to first token: first token time minus arrival."""
        return self.token_times[0] - self.arrival_time

    @property
    def e2e(self) -> float:
        """End-to-end latency: last token time minus arrival."""
        return self.token_times[-1] - self.arrival_time

    @property
    def queue_time(self) -> float:
        """Arrival to the start of the first step that computed its tokens."""
        return self.first_scheduled_time - self.arrival_time

    @property
    def itls(self) -> list[float]:
        """Inter-token latencies: gaps between consecutive tokens (``output_len - 1``)."""
        return np.diff(self.token_times).tolist()

    def to_dict(self) -> dict:
        """JSON-ready dict with the derived latencies (ITL mean and every gap)."""
        itls = self.itls
        d = asdict(self)
        d.pop("token_times")
        if not self.token_times:  # refused: no latencies
            return d
        d.update(
            ttft=self.ttft,
            e2e=self.e2e,
            queue_time=self.queue_time,
            finish_time=self.finish_time,
            itl_mean=float(np.mean(itls)) if itls else None,
            itls=itls,
        )
        return d


@dataclass(frozen=True)
class SimStep:
    """One simulated step.

    Attributes:
        index: 1-based step number.
        start, end: virtual times the step began and ended.
        rows: ``(request index in the trace, tokens computed, "prefill" | "decode")``
            per scheduled request, batch order.
        preempted: trace indices of the requests preempted while planning it.
        prefill_tokens, decode_tokens, kv_tokens: the cost model's inputs.
        num_waiting: requests waiting after planning.
        kv_cache_usage: fraction of KV blocks in use after planning.
    """

    index: int
    start: float
    end: float
    rows: tuple[tuple[int, int, str], ...]
    preempted: tuple[int, ...]
    prefill_tokens: int
    decode_tokens: int
    kv_tokens: int
    num_waiting: int
    kv_cache_usage: float


def _stats(values: list[float]) -> dict | None:
    if not values:
        return None
    a = np.asarray(values, dtype=np.float64)
    d = {"mean": float(a.mean())}
    d.update({f"p{p}": float(np.percentile(a, p)) for p in PERCENTILES})
    d["max"] = float(a.max())
    return d


@dataclass
class SimulationResult:
    """Everything one simulation produced.

    Attributes:
        scheduler: policy name. scheduler_config: its options.
        settings: the limits used (``num_kv_blocks``, ``block_size``,
            ``max_num_seqs``, ``max_num_batched_tokens`` (after the raise to
            ``max_model_len`` for whole-prompt policies), ``max_model_len``).
        cost_model: the cost model's fields.
        requests: per-request metrics, trace order.
        steps: per-step records.
        num_preemptions_total: preemptions over the run.
        num_free_blocks_at_end: free KV blocks once every request finished
            (equals ``settings["num_kv_blocks"]`` when nothing leaked).
    """

    scheduler: str
    scheduler_config: dict
    settings: dict
    cost_model: dict
    requests: list[RequestMetrics]
    steps: list[SimStep]
    num_preemptions_total: int
    num_free_blocks_at_end: int

    @property
    def duration(self) -> float:
        """First arrival to last token."""
        start = min(r.arrival_time for r in self.requests)
        return max((r.finish_time for r in self.requests if r.token_times), default=start) - start

    def summary(self) -> dict:
        """Percentiles and throughput.

        Returns:
            ``num_requests``, ``num_errors`` (requests the policy refused;
            left out of every other figure), ``num_steps``, ``duration``,
            ``throughput_req_s``,
            ``throughput_output_tok_s``, ``num_preemptions``,
            ``max_preemptions_per_request`` (the most times one request was
            preempted: above 1, requests take turns evicting each other), and for ``ttft``,
            ``itl`` (all gaps of all requests pooled), ``itl_mean`` (one mean per
            request), ``e2e`` and ``queue_time`` a dict of ``mean``, ``p50``,
            ``p95``, ``p99``, ``max`` (``None`` when there is no value, e.g. no
            ITL when every request generates one token); ``by_priority`` maps
            each priority value (as a string) to its ``num_requests``,
            ``num_errors`` (as above, of that priority), ``ttft`` and ``e2e``
            stats (of the requests served).
        """
        reqs = [r for r in self.requests if r.error is None]
        duration = self.duration
        out_tokens = sum(r.num_output_tokens for r in reqs)
        itls = [g for r in reqs for g in r.itls]
        return {
            "num_requests": len(self.requests),
            "num_errors": len(self.requests) - len(reqs),
            "num_steps": len(self.steps),
            "duration": duration,
            "throughput_req_s": len(reqs) / duration if duration > 0 else None,
            "throughput_output_tok_s": out_tokens / duration if duration > 0 else None,
            "num_preemptions": self.num_preemptions_total,
            "max_preemptions_per_request": max(
                (r.num_preemptions for r in self.requests), default=0),
            "ttft": _stats([r.ttft for r in reqs]),
            "itl": _stats(itls),
            "itl_mean": _stats([float(np.mean(r.itls)) for r in reqs if r.output_len > 1]),
            "e2e": _stats([r.e2e for r in reqs]),
            "queue_time": _stats([r.queue_time for r in reqs]),
            "by_priority": {
                str(p): {
                    "num_requests": sum(r.priority == p for r in self.requests),
                    "num_errors": sum(r.priority == p and r.error is not None
                                      for r in self.requests),
                    "ttft": _stats([r.ttft for r in reqs if r.priority == p]),
                    "e2e": _stats([r.e2e for r in reqs if r.priority == p]),
                }
                for p in sorted({r.priority for r in self.requests})
            },
        }

    def to_dict(self) -> dict:
        """JSON-ready dict: config, summary, per-request metrics and per-step records."""
        return {
            "scheduler": self.scheduler,
            "scheduler_config": self.scheduler_config,
            "settings": self.settings,
            "cost_model": self.cost_model,
            "num_free_blocks_at_end": self.num_free_blocks_at_end,
            "summary": self.summary(),
            "requests": [r.to_dict() for r in self.requests],
            "steps": [asdict(s) for s in self.steps],
        }

    def save_json(self, path: str | Path) -> None:
        """Write :meth:`to_dict` to ``path``."""
        Path(path).write_text(json.dumps(self.to_dict(), indent=1) + "\n")


def format_cell(value: float | None, digits: int = 3) -> str:
    """A number to ``digits`` decimals, ``-`` for ``None`` (no such figure)."""
    return "-" if value is None else f"{value:.{digits}f}"


def format_table(results: list[SimulationResult]) -> str:
    """A Markdown table comparing policies: requests refused (``num_errors``:
    load shedding; every other column covers only the requests served), TTFT
    and ITL p50/p95, E2E p95, throughput and preemptions (in all, and the most
    of one request), one row per result (times in the results' unit). A
    figure with no value (e.g. no request produced a token) is ``-``."""
    head = (
        "| policy | refused | TTFT p50 | TTFT p95 | ITL p50 | ITL p95 | ITL max | E2E p95 "
        "| req/s | output tok/s | preemptions | most of one request |\n"
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n"
    )
    rows = []
    for res in results:
        s = res.summary()

        def get(metric: str, key: str, s=s) -> str:
            """One cell: ``summary[metric][key]`` to 3 decimals, ``-`` if absent."""
            v = s[metric]
            return format_cell(None if v is None else v.get(key))

        rows.append(
            f"| {res.scheduler} | {s['num_errors']} of {s['num_requests']} "
            f"| {get('ttft', 'p50')} | {get('ttft', 'p95')} "
            f"| {get('itl', 'p50')} | {get('itl', 'p95')} | {get('itl', 'max')} "
            f"| {get('e2e', 'p95')} | {format_cell(s['throughput_req_s'])} "
            f"| {format_cell(s['throughput_output_tok_s'], 1)} | {s['num_preemptions']} "
            f"| {s['max_preemptions_per_request']} |"
        )
    return head + "\n".join(rows) + "\n"


def format_priority_table(results: list[SimulationResult]) -> str:
    """A Markdown table of TTFT p50/p95 and E2E p95 per priority value, one row per
    (result, priority), for seeing what a priority policy trades between classes."""
    lines = [
        "| policy | priority | requests | refused | TTFT p50 | TTFT p95 | E2E p95 |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for res in results:
        for prio, s in res.summary()["by_priority"].items():
            ttft, e2e = s["ttft"] or {}, s["e2e"] or {}
            cells = [ttft.get("p50"), ttft.get("p95"), e2e.get("p95")]
            lines.append(
                f"| {res.scheduler} | {prio} | {s['num_requests']} | {s['num_errors']} | "
                + " | ".join(map(format_cell, cells)) + " |"
            )
    return "\n".join(lines) + "\n"
