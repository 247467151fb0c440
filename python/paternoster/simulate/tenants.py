"""Per-tenant results of a simulation: what each tenant was served, for
comparing how policies share the engine (the ``fair`` policy, docs/schedulers.md).

A tenant is a trace request's ``tenant`` (``None``: the anonymous tenant,
shown as ``-``). Service is counted as the ``fair`` policy counts it (after
Sheng et al., OSDI'24): prefill tokens computed (prompt chunks and
recomputation) and decode tokens computed, per tenant, from the step records.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from paternoster.simulate.results import SimulationResult, format_cell


def tenant_summary(result: SimulationResult, until: float | None = None) -> list[dict]:
    """What each tenant received by time ``until``.

    Args:
        result: a simulation.
        until: count tokens delivered and steps ended by this time (default:
            the last arrival, i.e. while requests were still coming, before
            the queue drains; the end of the run when every request arrived
            at once).
    Returns:
        One dict per tenant (the anonymous one first, then by name):
        ``tenant``, ``num_requests``, ``num_errors`` (refused by the policy),
        ``output_tokens`` (delivered by ``until``), ``prefill_tokens`` and
        ``decode_tokens`` (computed in steps that ended by ``until``),
        ``window`` (``until`` minus the first arrival), ``ttft_p50``,
        ``ttft_p95``, ``e2e_p95`` (its requests served; ``None`` if none was).
    """
    reqs = result.requests
    start = min(r.arrival_time for r in reqs)
    if until is None:
        until = max(r.arrival_time for r in reqs)
        if until <= start:
            until = max((r.finish_time for r in reqs if r.token_times), default=start)
    rows: dict = defaultdict(lambda: {"num_requests": 0, "num_errors": 0, "output_tokens": 0,
                                      "prefill_tokens": 0, "decode_tokens": 0,
                                      "ttft": [], "e2e": []})  # fmt: skip
    for r in reqs:
        row = rows[r.tenant]
        row["num_requests"] += 1
        if r.error is not None:  # refused: no tokens, no latencies
            row["num_errors"] += 1
            continue
        row["output_tokens"] += sum(t <= until for t in r.token_times)
        row["ttft"].append(r.ttft)
        row["e2e"].append(r.e2e)
    for step in result.steps:
        if step.end > until:
            break
        for i, n, kind in step.rows:
            rows[reqs[i].tenant][f"{kind}_tokens"] += n
    out = []
    for tenant in sorted(rows, key=lambda t: (t is not None, t or "")):
        row = rows[tenant]
        ttft, e2e = row.pop("ttft"), row.pop("e2e")
        out.append({"tenant": tenant, **row, "window": until - start,
                    "ttft_p50": _percentile(ttft, 50), "ttft_p95": _percentile(ttft, 95),
                    "e2e_p95": _percentile(e2e, 95)})  # fmt: skip
    return out


def _percentile(values: list[float], q: float) -> float | None:
    """The ``q``-th percentile of ``values``, ``None`` when there are none."""
    return float(np.percentile(values, q)) if values else None


def format_tenant_table(results: list[SimulationResult], until: float | None = None) -> str:
    """A Markdown table, one row per (result, tenant): requests, those refused,
    output tokens/s and share of them while requests arrive
    (:func:`tenant_summary`), TTFT p50/p95 and E2E p95 (``-``: none served)."""
    lines = ["| policy | tenant | requests | refused | output tok/s | share | TTFT p50 "
             "| TTFT p95 | E2E p95 |", "|---|---|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for res in results:
        rows = tenant_summary(res, until)
        total = sum(r["output_tokens"] for r in rows) or 1
        for r in rows:
            rate = r["output_tokens"] / r["window"] if r["window"] > 0 else float("nan")
            lines.append(
                f"| {res.scheduler} | {r['tenant'] or '-'} | {r['num_requests']} "
                f"| {r['num_errors']} | {rate:.1f} | {r['output_tokens'] / total:.2f} | "
                + " | ".join(format_cell(r[k]) for k in ("ttft_p50", "ttft_p95", "e2e_p95"))
                + " |"
            )
    return "\n".join(lines) + "\n"
