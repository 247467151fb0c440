"""Summary statistics of a serving benchmark run: throughput, latency
percentiles, errors and goodput.

Percentiles are numpy's default (linear interpolation). As in vLLM's
benchmark_serving, TTFT, TPOT and E2E have one value per successful request;
ITL pools every gap of every successful request.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

from paternoster.bench.client import RequestRecord

PERCENTILES = (50, 95, 99)
METRICS = ("ttft", "tpot", "itl", "e2e")


def chunk_times(sent: float, ttft: float, itl: Sequence[float]) -> np.ndarray:
    """When each content chunk of a request arrived: ``sent + ttft``, then
    each ITL gap added on (seconds on the run's clock; ``[len(itl) + 1]``
    float64)."""
    return sent + ttft + np.concatenate([[0.0], np.cumsum(itl, dtype=np.float64)])


def describe(values: Sequence[float]) -> dict | None:
    """``mean``, ``std``, ``min``, ``p50``, ``p95``, ``p99``, ``max`` of ``values``
    (same unit), or ``None`` when empty."""
    if len(values) == 0:
        return None
    a = np.asarray(values, dtype=np.float64)
    d = {"mean": float(a.mean()), "std": float(a.std()), "min": float(a.min())}
    d.update({f"p{p}": float(np.percentile(a, p)) for p in PERCENTILES})
    d["max"] = float(a.max())
    return d


@dataclass(frozen=True)
class SLOs:
    """Per-request service-level objectives for goodput, seconds (``None`` = none).

    A successful request meets them when its TTFT <= ``ttft``, every ITL gap
    <= ``itl`` (its largest gap), its TPOT <= ``tpot`` and its E2E <= ``e2e``;
    a request without ITL gaps or TPOT (one output chunk or token) meets those two.

    Raises:
        ValueError: a value that is not > 0.
    """

    ttft: float | None = None
    itl: float | None = None
    tpot: float | None = None
    e2e: float | None = None

    def __post_init__(self) -> None:
        for name, v in asdict(self).items():
            if v is not None and not v > 0:
                raise ValueError(f"SLO {name} must be > 0 seconds, got {v}")

    def active(self) -> dict[str, float]:
        """The objectives that are set, by name."""
        return {k: v for k, v in asdict(self).items() if v is not None}

    def met_by(self, r: RequestRecord) -> bool:
        """Whether ``r`` succeeded and meets every objective that is set."""
        if not r.success:
            return False
        checks = (
            (self.ttft, r.ttft),
            (self.itl, max(r.itl) if r.itl else None),
            (self.tpot, r.tpot),
            (self.e2e, r.e2e),
        )
        return all(slo is None or v is None or v <= slo for slo, v in checks)


def _rate(times: Sequence[float]) -> float | None:
    """Events per second over a run of send times: ``(n - 1) / span``."""
    if len(times) < 2:
        return None
    span = max(times) - min(times)
    return (len(times) - 1) / span if span > 0 else math.inf


def summarize(records: Sequence[RequestRecord], duration: float, slos: SLOs | None = None) -> dict:
    """The run's figures.

    Args:
        records: every request of the run (sent or not).
        duration: seconds from the start of the run to the end of the last request.
        slos: objectives for goodput (none: goodput counts every success).
    Returns:
        A dict: ``num_requests``, ``num_sent``, ``num_not_sent``,
        ``num_completed``, ``num_errors`` (sent and failed), ``error_rate``
        (errors / sent), ``errors`` (message -> count, 10 most common),
        ``duration`` (s), ``total_input_tokens``, ``total_output_tokens``,
        ``request_throughput`` (completed req/s), ``output_throughput`` and
        ``total_token_throughput`` (tok/s), ``offered_rate`` (req/s, from the
        schedule) and ``send_rate`` (req/s, from the actual send times; lower
        when the client or a concurrency cap held requests back),
        ``max_send_lag`` (s, latest send behind schedule), ``ttft``, ``tpot``,
        ``itl``, ``e2e`` (:func:`describe` dicts, seconds), ``slos``,
        ``num_good``, ``goodput`` (req/s of completed requests meeting every
        SLO) and ``slo_attainment`` (good / sent).
    """
    slos = slos or SLOs()
    sent = [r for r in records if r.sent is not None]
    ok = [r for r in records if r.success]
    errors = [r for r in sent if not r.success]
    good = [r for r in ok if slos.met_by(r)]
    out_tokens = sum(r.output_tokens or 0 for r in ok)
    in_tokens = sum(r.prompt_tokens if r.prompt_tokens is not None else r.prompt_len for r in ok)
    per_s = (lambda x: x / duration) if duration > 0 else (lambda x: None)
    counts = Counter((r.error or "unknown")[:160] for r in errors)
    return {
        "num_requests": len(records),
        "num_sent": len(sent),
        "num_not_sent": len(records) - len(sent),
        "num_completed": len(ok),
        "num_errors": len(errors),
        "error_rate": len(errors) / len(sent) if sent else 0.0,
        "errors": dict(counts.most_common(10)),
        "duration": duration,
        "total_input_tokens": in_tokens,
        "total_output_tokens": out_tokens,
        "request_throughput": per_s(len(ok)),
        "output_throughput": per_s(out_tokens),
        "total_token_throughput": per_s(in_tokens + out_tokens),
        "offered_rate": _rate([r.scheduled for r in records]),
        "send_rate": _rate([r.sent for r in sent]),
        "max_send_lag": max((r.sent - r.scheduled for r in sent), default=None),
        "ttft": describe([r.ttft for r in ok if r.ttft is not None]),
        "tpot": describe([r.tpot for r in ok if r.tpot is not None]),
        "itl": describe([g for r in ok for g in r.itl]),
        "e2e": describe([r.e2e for r in ok if r.e2e is not None]),
        "slos": slos.active(),
        "num_good": len(good),
        "goodput": per_s(len(good)),
        "slo_attainment": len(good) / len(sent) if sent else None,
    }
