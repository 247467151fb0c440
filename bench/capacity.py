"""Capacity finder: the highest load at which p95 TTFT and p95 ITL stay within
their objectives.

The search is a sequence of probes, each one serving-benchmark run at a fixed
load (a request rate, or a concurrency):

1. **ramp**: from ``start``, multiply the load by ``factor`` while probes pass;
   if the very first probe fails, divide instead until one passes;
2. **bisect** between the last load that passed and the first that failed, for
   at most ``bisect_rounds`` probes or until the bracket is narrower than
   ``tolerance`` (relative; one in concurrency mode).

A probe passes when some request completed, the error rate (errors / sent) is
at most ``max_error_rate``, and the p95 TTFT and the p95 ITL (pooled gaps) are
within their objectives. The capacity is the highest passing load below the
first failing one. The search assumes latency grows with load; a probe is a
finite run, so short probes flatter loads just above capacity (queues have
not built up yet): give probes enough requests (``--probe-duration``).

The budget (``max_duration`` seconds, ``max_requests``) bounds the search: no
probe starts once it is spent, and the probe running when it runs out stops
sending (its requests in flight still finish, each within its timeout). A
probe cut short that passed is *inconclusive* and not used.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

#: ``probe(load, seconds_left, requests_left) -> (summary, cut_short)``, or
#: ``None`` when the budget left is too small to run it (``None`` = unbounded).
ProbeFn = Callable[[float, "float | None", "int | None"], "tuple[dict, bool] | None"]


@dataclass(frozen=True)
class Objectives:
    """What a probe must hold: p95 TTFT and p95 ITL in seconds (> 0), and the
    largest tolerated error rate (errors / sent, in ``[0, 1)``).

    Raises:
        ValueError: a value out of range (the message names it).
    """

    ttft_p95: float
    itl_p95: float
    max_error_rate: float = 0.0

    def __post_init__(self) -> None:
        for name in ("ttft_p95", "itl_p95"):
            v = getattr(self, name)
            if not (v > 0 and math.isfinite(v)):
                raise ValueError(f"{name} must be > 0 seconds, got {v}")
        if not 0 <= self.max_error_rate < 1:
            raise ValueError(f"max_error_rate must be in [0, 1), got {self.max_error_rate}")

    def judge(self, summary: dict) -> tuple[bool, str]:
        """Whether a run's summary (:func:`~paternoster.bench.stats.summarize`)
        holds the objectives, and a short reason."""
        if summary["num_completed"] == 0:
            return False, "no request completed"
        if summary["error_rate"] > self.max_error_rate:
            return False, f"error rate {summary['error_rate']:.1%}"
        ttft = summary["ttft"]["p95"] if summary.get("ttft") else 0.0
        itl = summary["itl"]["p95"] if summary.get("itl") else 0.0
        fails = []
        if ttft > self.ttft_p95:
            fails.append(f"p95 TTFT {ttft:.3g} s > {self.ttft_p95:g} s")
        if itl > self.itl_p95:
            fails.append(f"p95 ITL {itl:.3g} s > {self.itl_p95:g} s")
        if fails:
            return False, "; ".join(fails)
        return True, f"p95 TTFT {ttft:.3g} s, p95 ITL {itl:.3g} s"


@dataclass(frozen=True)
class SearchPlan:
    """How to step the load.

    Attributes:
        mode: ``"rate"`` (req/s) or ``"concurrency"`` (requests in flight).
        start: first load probed (> 0; an integer >= 1 in concurrency mode).
        factor: ramp multiplier (> 1).
        bisect_rounds: most bisection probes (>= 0).
        tolerance: rate mode: stop bisecting once ``hi - lo <= tolerance * hi``.
        max_load: never probe above this (``None``: no limit but the budget).
        min_load: never probe below this when ramping down (default: rate
            ``start / factor**4``, concurrency 1).
    Raises:
        ValueError: a field out of range (the message names it).
    """

    mode: str = "rate"
    start: float = 1.0
    factor: float = 2.0
    bisect_rounds: int = 4
    tolerance: float = 0.05
    max_load: float | None = None
    min_load: float | None = None

    def __post_init__(self) -> None:
        if self.mode not in ("rate", "concurrency"):
            raise ValueError(f"mode must be 'rate' or 'concurrency', got {self.mode!r}")
        if not (self.start > 0 and math.isfinite(self.start)):
            raise ValueError(f"start must be a finite load > 0, got {self.start}")
        if self.mode == "concurrency" and self.start != int(self.start):
            raise ValueError(f"start must be an integer concurrency, got {self.start}")
        if not self.factor > 1:
            raise ValueError(f"factor must be > 1, got {self.factor}")
        if self.bisect_rounds < 0:
            raise ValueError(f"bisect_rounds must be >= 0, got {self.bisect_rounds}")
        if not self.tolerance > 0:
            raise ValueError(f"tolerance must be > 0, got {self.tolerance}")
        if self.max_load is not None and self.max_load < self.start:
            raise ValueError(f"max_load ({self.max_load}) must be >= start ({self.start})")

    def up(self, load: float) -> float:
        """The next ramp load above ``load``."""
        if self.mode == "rate":
            return float(f"{load * self.factor:.4g}")
        return float(max(load + 1, round(load * self.factor)))

    def down(self, load: float) -> float | None:
        """The next load below ``load``, or ``None`` below ``min_load``."""
        if self.mode == "rate":
            lo = self.min_load if self.min_load is not None else self.start / self.factor**4
            nxt = float(f"{load / self.factor:.4g}")
        else:
            lo = self.min_load if self.min_load is not None else 1
            nxt = float(math.floor(load / self.factor))
        return nxt if nxt >= lo and nxt < load else None

    def middle(self, lo: float, hi: float) -> float | None:
        """A load between ``lo`` (passed) and ``hi`` (failed), or ``None`` once
        the bracket is narrow enough."""
        if self.mode == "concurrency":
            return float((int(lo) + int(hi)) // 2) if hi - lo > 1 else None
        if hi - lo <= self.tolerance * hi:
            return None
        mid = float(f"{(lo + hi) / 2:.4g}")
        return mid if lo < mid < hi else None


@dataclass
class Probe:
    """One probe: the load, the search phase (``ramp``, ``down``, ``bisect``),
    the run's summary, the verdict (``None``: cut short by the budget) and why."""

    load: float
    phase: str
    summary: dict
    ok: bool | None
    reason: str

    def to_dict(self) -> dict:
        """JSON-ready dict."""
        return asdict(self)


@dataclass
class CapacityResult:
    """The search: its settings, every probe in order, the capacity (highest
    passing load below ``first_fail``; ``None`` when no probe passed), why the
    search stopped, and its wall time in seconds."""

    mode: str
    objectives: Objectives
    plan: SearchPlan
    probes: list[Probe] = field(default_factory=list)
    capacity: float | None = None
    first_fail: float | None = None
    stopped: str = "converged"
    elapsed: float = 0.0

    def to_dict(self) -> dict:
        """JSON-ready dict (without per-request records)."""
        return {
            "mode": self.mode,
            "capacity": self.capacity,
            "first_fail": self.first_fail,
            "stopped": self.stopped,
            "elapsed": self.elapsed,
            "objectives": asdict(self.objectives),
            "plan": asdict(self.plan),
            "probes": [p.to_dict() for p in self.probes],
        }


class _Stop(Exception):
    pass


def find_capacity(
    plan: SearchPlan,
    objectives: Objectives,
    probe: ProbeFn,
    max_duration: float | None = None,
    max_requests: int | None = None,
    clock: Callable[[], float] = time.monotonic,
    on_probe: Callable[[Probe], None] | None = None,
) -> CapacityResult:
    """Run the search (module doc).

    Args:
        plan: how to step the load. objectives: what a probe must hold.
        probe: runs one probe (see :data:`ProbeFn`).
        max_duration: seconds for the whole search (``None``: unbounded).
        max_requests: requests for the whole search (``None``: unbounded).
        clock: seconds (tests may pass a fake).
        on_probe: called after each probe (e.g. to print it).
    Returns:
        The search; ``stopped`` is ``converged``, ``max_load``, ``min_load``,
        ``max_duration`` or ``max_requests``.
    """
    result = CapacityResult(plan.mode, objectives, plan)
    start = clock()
    used = 0
    lo: float | None = None
    hi: float | None = None

    def run(load: float, phase: str) -> bool:
        nonlocal used
        time_left = None if max_duration is None else max_duration - (clock() - start)
        req_left = None if max_requests is None else max_requests - used
        if time_left is not None and time_left <= 0:
            raise _Stop("max_duration")
        if req_left is not None and req_left <= 0:
            raise _Stop("max_requests")
        out = probe(load, time_left, req_left)
        if out is None:
            raise _Stop("max_requests" if time_left is None else "max_duration")
        summary, cut_short = out
        used += summary["num_sent"]
        ok, reason = objectives.judge(summary)
        p = Probe(load, phase, summary, ok if not (ok and cut_short) else None, reason)
        if p.ok is None:
            p.reason = "cut short by the budget; " + reason
        result.probes.append(p)
        if on_probe is not None:
            on_probe(p)
        if p.ok is None:  # cut short: by the budget it had used more of
            time_frac = 0.0 if max_duration is None else (clock() - start) / max_duration
            req_frac = 0.0 if max_requests is None else used / max_requests
            raise _Stop("max_duration" if time_frac >= req_frac else "max_requests")
        return ok

    try:
        load = float(plan.start)
        if run(load, "ramp"):
            lo = load
            while hi is None:
                nxt = plan.up(load)
                if plan.max_load is not None and nxt > plan.max_load:
                    if load >= plan.max_load:
                        raise _Stop("max_load")
                    nxt = float(plan.max_load)
                if run(nxt, "ramp"):
                    lo = load = nxt
                else:
                    hi = nxt
        else:
            hi = load
            while lo is None:
                nxt = plan.down(load)
                if nxt is None:
                    raise _Stop("min_load")
                if run(nxt, "down"):
                    lo = nxt
                else:
                    hi = load = nxt
        for _ in range(plan.bisect_rounds):
            mid = plan.middle(lo, hi)
            if mid is None:
                break
            if run(mid, "bisect"):
                lo = mid
            else:
                hi = mid
    except _Stop as e:
        result.stopped = str(e)
    result.capacity, result.first_fail = lo, hi
    result.elapsed = clock() - start
    return result
