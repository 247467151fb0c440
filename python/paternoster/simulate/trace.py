"""Simulator input: request traces (JSONL) and a seeded synthetic mix.

A trace line is a JSON object::

    {"arrival_time": 0.42, "prompt_len": 180, "output_len": 64, "priority": 1}

``arrival_time`` in seconds from the start of the trace (or in steps with the
unit cost model), ``prompt_len`` and ``output_len`` in tokens; ``priority``
(default 0, lower runs first), ``request_id``, ``tag`` (a free label such as
``chat``) and ``tenant`` (who the request is served for, as the HTTP ``user``
field; the ``fair`` policy shares between tenants), ``slo_ttft_s`` and
``slo_itl_s`` (the request's own targets for the ``slo`` policy) are optional. Each request
generates exactly ``output_len`` tokens. ``arrival_time`` is at most
:data:`MAX_ARRIVAL_TIME` and a ``tenant`` is 1 to 256 characters, as over HTTP
(:func:`~paternoster.frontend.processor.check_tenant`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from paternoster.frontend.processor import check_tenant
from paternoster.request import check_slo_target

MAX_ARRIVAL_TIME = 1e10
"""The latest ``arrival_time`` a trace may give (seconds or steps). It admits
Unix epoch timestamps in seconds (1e10 s is the year 2286), where a float64
still resolves about 2 microseconds. Later times lose what the simulator
measures: a float64 resolves 2 ms at 1e13 and 2 s at 1e16 (a TTFT rounds to
0), and near 1e308 adding a step overflows."""


@dataclass(frozen=True)
class TraceRequest:
    """One request of a trace.

    Attributes:
        arrival_time: seconds (or steps) since the start of the trace, in
            ``[0, MAX_ARRIVAL_TIME]``.
        prompt_len: prompt tokens, >= 1.
        output_len: tokens to generate, >= 1 (EOS is ignored).
        priority: lower runs first under the ``priority`` policy.
        request_id: an id, unique in the trace; ``None`` means ``r<index>``.
        tag: free label (the synthetic mix uses ``chat``, ``summary``, ``long_prompt``).
        tenant: who the request is served for (``None``: the anonymous
            tenant); 1 to 256 characters, as over HTTP and ZeroMQ.
        slo_ttft_s, slo_itl_s: its own TTFT / ITL target for the ``slo``
            policy, > 0 in the trace's time unit (``None``: its priority
            class's or the policy's), as the HTTP fields.
    Raises:
        ValueError: a field out of range (the message names it).
    """

    arrival_time: float
    prompt_len: int
    output_len: int
    priority: int = 0
    request_id: str | None = None
    tag: str | None = None
    tenant: str | None = None
    slo_ttft_s: float | None = None
    slo_itl_s: float | None = None

    def __post_init__(self) -> None:
        t = self.arrival_time
        # Compared, not converted: a JSON integer too large for a float is refused too.
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not t >= 0:
            raise ValueError(f"arrival_time must be a finite number >= 0, got {t!r}")
        if not t <= MAX_ARRIVAL_TIME:
            raise ValueError(f"arrival_time must be at most {MAX_ARRIVAL_TIME:g}, got {t!r}")
        for name in ("prompt_len", "output_len"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
        if not isinstance(self.priority, int) or isinstance(self.priority, bool):
            raise ValueError(f"priority must be an integer, got {self.priority!r}")
        check_tenant(self.tenant, "tenant")  # the rule of HTTP and ZeroMQ
        for name in ("slo_ttft_s", "slo_itl_s"):
            check_slo_target(getattr(self, name), name)

    def to_dict(self) -> dict:
        """JSON-ready dict; ``None`` fields are left out."""
        return {k: v for k, v in asdict(self).items() if v is not None}


_FIELDS = {"arrival_time", "prompt_len", "output_len", "priority", "request_id", "tag",
           "tenant", "slo_ttft_s", "slo_itl_s"}  # fmt: skip


def load_trace(path: str | Path) -> list[TraceRequest]:
    """Read a JSONL trace (blank lines and lines starting with ``#`` are skipped).

    Raises:
        ValueError: unreadable file, malformed JSON, an unknown or missing
            field, or a value out of range; the message names the line.
    """
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as e:
        raise ValueError(f"cannot read trace {path}: {e}") from None
    trace = []
    for lineno, line in enumerate(lines, 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        try:
            d = json.loads(line)
            if not isinstance(d, dict):
                raise ValueError("not a JSON object")
            unknown = set(d) - _FIELDS
            if unknown:
                raise ValueError(f"unknown fields {sorted(unknown)}")
            trace.append(TraceRequest(**d))
        except (ValueError, TypeError) as e:
            raise ValueError(f"{path}:{lineno}: {e}") from None
    if not trace:
        raise ValueError(f"trace {path} has no requests")
    return trace


def save_trace(trace: Iterable[TraceRequest], path: str | Path) -> None:
    """Write ``trace`` as JSONL, one request per line."""
    Path(path).write_text("".join(json.dumps(r.to_dict()) + "\n" for r in trace))


#: The synthetic mix: (tag, share, prompt_len range, output_len range), tokens, inclusive.
MIX: tuple[tuple[str, float, tuple[int, int], tuple[int, int]], ...] = (
    ("chat", 0.75, (32, 512), (16, 256)),  # short chat answers
    ("summary", 0.20, (1024, 3072), (256, 768)),  # long summaries of documents
    ("long_prompt", 0.05, (4096, 7168), (16, 128)),  # a few very long prompts
)


def synthetic_mix(
    num_requests: int,
    rate: float,
    seed: int = 0,
    max_model_len: int = 8192,
    max_priority: int = 2,
) -> list[TraceRequest]:
    """A seeded mixed workload with Poisson arrivals.

    Classes (see :data:`MIX`): 75 % short chat answers, 20 % long summaries,
    5 % very long prompts; lengths uniform within each class's range, then
    capped so that ``prompt_len + output_len <= max_model_len`` (output at most
    a quarter of it). Priorities are uniform in ``[0, max_priority]``.

    Args:
        num_requests: requests to draw (>= 1).
        rate: mean arrivals per second (> 0); gaps are exponential.
        seed: RNG seed; the same arguments give the same trace.
        max_model_len: context cap in tokens (>= 2).
        max_priority: highest priority value drawn (>= 0).
    Returns:
        The requests in arrival order, ids ``r0``, ``r1``, ...
    Raises:
        ValueError: an argument out of range.
    """
    if num_requests < 1:
        raise ValueError(f"num_requests must be >= 1, got {num_requests}")
    if not rate > 0:
        raise ValueError(f"rate must be > 0 requests/s, got {rate}")
    if max_model_len < 2:
        raise ValueError(f"max_model_len must be >= 2, got {max_model_len}")
    if max_priority < 0:
        raise ValueError(f"max_priority must be >= 0, got {max_priority}")
    rng = np.random.default_rng(seed)
    shares = np.array([m[1] for m in MIX])
    kinds = rng.choice(len(MIX), size=num_requests, p=shares / shares.sum())
    arrivals = np.cumsum(rng.exponential(1.0 / rate, size=num_requests))
    arrivals -= arrivals[0]  # the first request arrives at t = 0
    trace = []
    for i, (k, t) in enumerate(zip(kinds, arrivals)):
        tag, _, (p_lo, p_hi), (o_lo, o_hi) = MIX[k]
        output_len = min(int(rng.integers(o_lo, o_hi + 1)), max(1, max_model_len // 4))
        prompt_len = min(int(rng.integers(p_lo, p_hi + 1)), max_model_len - output_len)
        priority = int(rng.integers(0, max_priority + 1))
        trace.append(
            TraceRequest(round(float(t), 6), prompt_len, output_len, priority, f"r{i}", tag)
        )
    return trace
