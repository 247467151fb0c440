"""Human-readable output of the serving benchmark and the capacity finder:
text tables, the latency CDF PNG and the capacity curve PNG."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from paternoster.bench.client import RequestRecord
from paternoster.bench.stats import METRICS

if TYPE_CHECKING:
    from paternoster.bench.capacity import CapacityResult, Probe
    from paternoster.bench.serve import ServeResult

_NAMES = {"ttft": "TTFT", "tpot": "TPOT", "itl": "ITL", "e2e": "E2E"}


def _num(x: float | None, fmt: str = ".2f") -> str:
    if x is None:
        return "-"
    if isinstance(x, float) and math.isinf(x):
        return "inf"
    return format(x, fmt)


def describe_load(
    rate: float, burstiness: float, max_concurrency: int | None, trace_timing: bool = False
) -> str:
    """``"Poisson 4 req/s, max concurrency 8"`` and the like."""
    if trace_timing:
        load = "trace arrival times"
    elif math.isinf(rate):
        load = "all at once"
    else:
        kind = "Poisson" if burstiness == 1 else f"gamma (burstiness {burstiness:g})"
        load = f"{kind} {rate:g} req/s"
    if max_concurrency:
        load += f", max concurrency {max_concurrency}"
    return load


def format_summary(result: ServeResult) -> str:
    """The end-of-run table: counts, throughput, latency percentiles (ms),
    goodput and the most common errors."""
    s, c = result.summary, result.config
    w = 40

    def row(label: str, value: str) -> str:
        return f"{label + ':':<{w}}{value}\n"

    out = "=" * 22 + " Serving benchmark " + "=" * 22 + "\n"
    out += row("Endpoint", f"{c.url} (model {c.model})")
    out += row(
        "Load", describe_load(c.request_rate, c.burstiness, c.max_concurrency, c.trace_timing)
    )
    out += row(
        "Requests completed / sent / total",
        f"{s['num_completed']} / {s['num_sent']} / {s['num_requests']}",
    )
    out += row("Errors", f"{s['num_errors']} ({100 * s['error_rate']:.1f} % of sent)")
    out += row("Duration (s)", _num(s["duration"]))
    if math.isinf(c.request_rate) and not c.trace_timing:  # closed loop or burst: no schedule
        out += row("Send rate (req/s)", _num(s["send_rate"]))
    else:
        out += row(
            "Offered rate: schedule / sent (req/s)",
            f"{_num(s['offered_rate'])} / {_num(s['send_rate'])}",
        )
        lag = s["max_send_lag"]
        out += row("Max send lag behind schedule (ms)",
                   _num(None if lag is None else 1e3 * lag, ".1f"))  # fmt: skip
    out += row("Request throughput (req/s)", _num(s["request_throughput"]))
    out += row("Output token throughput (tok/s)", _num(s["output_throughput"], ".1f"))
    out += row("Total token throughput (tok/s)", _num(s["total_token_throughput"], ".1f"))
    out += row("Input / output tokens", f"{s['total_input_tokens']} / {s['total_output_tokens']}")
    out += "-" * 63 + "\n"
    out += f"{'(ms)':<8}" + "".join(f"{h:>11}" for h in ("mean", "p50", "p95", "p99", "max")) + "\n"
    for m in METRICS:
        d = s[m]
        cells = ("mean", "p50", "p95", "p99", "max")
        vals = "".join(f"{_num(None if d is None else 1e3 * d[k], '.1f'):>11}" for k in cells)
        out += f"{_NAMES[m]:<8}{vals}\n"
    out += "-" * 63 + "\n"
    if s["slos"]:
        slos = ", ".join(f"{_NAMES[k]} <= {v:g} s" for k, v in s["slos"].items())
        att = s["slo_attainment"]
        out += row("SLOs", slos)
        out += row(
            "Goodput (req/s)",
            f"{_num(s['goodput'])} ({s['num_good']} requests, "
            f"{_num(None if att is None else 100 * att, '.1f')} %)",
        )
    for msg, n in s["errors"].items():
        out += f"  {n} x {msg}\n"
    return out + "=" * 63 + "\n"


def plot_cdf(
    records: Sequence[RequestRecord], path: str | Path, slos: dict | None = None, title: str = ""
) -> None:
    """Write the empirical CDFs of TTFT, ITL, TPOT and E2E (seconds) of the
    successful requests as a PNG, with the SLOs (name -> seconds) as red lines.

    Raises:
        ImportError: matplotlib is not installed.
    """
    import numpy as np
    from matplotlib.figure import Figure

    ok = [r for r in records if r.success]
    values = {
        "ttft": [r.ttft for r in ok if r.ttft is not None],
        "itl": [g for r in ok for g in r.itl],
        "tpot": [r.tpot for r in ok if r.tpot is not None],
        "e2e": [r.e2e for r in ok if r.e2e is not None],
    }
    fig = Figure(figsize=(11, 7.5))
    for ax, (name, v) in zip(fig.subplots(2, 2).flat, values.items()):
        if v:
            x = np.sort(np.asarray(v))
            ax.step(x, np.arange(1, len(x) + 1) / len(x), where="post", color="tab:blue")
            p95 = float(np.percentile(x, 95))
            ax.axvline(p95, color="0.5", ls=":", lw=1, label=f"p95 {p95:.3g} s")
        else:
            ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
        if slos and name in slos:
            ax.axvline(slos[name], color="tab:red", ls="--", lw=1, label=f"SLO {slos[name]:g} s")
        ax.set_xlabel(f"{_NAMES[name]} (s)")
        ax.set_ylabel("fraction of " + ("gaps" if name == "itl" else "requests"))
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc="lower right", fontsize=8)
    fig.suptitle(title or f"latency CDFs ({len(ok)} requests)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def probe_header(mode: str) -> str:
    """The header line of the probe table (``mode``: ``rate`` or ``concurrency``).

    Columns: the probe's offered load (req/s, or requests in flight), requests
    sent and failed, p95 TTFT and p95 ITL (ms), completed requests per second
    and output tokens per second.
    """
    load = "offered" if mode == "rate" else "conc."
    return (
        f"{'#':>3} {'phase':<7} {load:>8} {'sent':>5} {'err':>4} {'p95 TTFT':>9} "
        f"{'p95 ITL':>8} {'done/s':>7} {'tok/s':>7}  verdict\n"
    )


def format_probe(i: int, p: Probe) -> str:
    """Probe number ``i`` as one table line: load, counts, p95 TTFT / ITL (ms),
    throughput (req/s, output tok/s) and verdict."""
    s = p.summary
    ttft = s["ttft"]["p95"] * 1e3 if s.get("ttft") else None
    itl = s["itl"]["p95"] * 1e3 if s.get("itl") else None
    verdict = {True: "ok", False: "FAIL", None: "inconclusive"}[p.ok]
    return (
        f"{i:>3} {p.phase:<7} {p.load:>8.4g} {s['num_sent']:>5} {s['num_errors']:>4} "
        f"{_num(ttft, '.0f'):>9} {_num(itl, '.0f'):>8} "
        f"{_num(s['request_throughput']):>7} {_num(s['output_throughput'], '.1f'):>7}"
        f"  {verdict}: {p.reason}\n"
    )


def format_probes(result: CapacityResult) -> str:
    """The probe table of a search, in probe order."""
    rows = (format_probe(i, p) for i, p in enumerate(result.probes, 1))
    return probe_header(result.mode) + "".join(rows)


def plot_capacity(result: CapacityResult, path: str | Path) -> None:
    """Write p95 TTFT and p95 ITL (seconds) against load as a PNG: green
    probes held both objectives, red ones did not, grey were cut short; dashed
    red lines are the objectives, the green vertical line the capacity.

    Raises:
        ImportError: matplotlib is not installed.
    """
    from matplotlib.figure import Figure

    probes = sorted(result.probes, key=lambda p: p.load)
    fig = Figure(figsize=(9, 7))
    axes = fig.subplots(2, 1, sharex=True)
    slo = {"ttft": result.objectives.ttft_p95, "itl": result.objectives.itl_p95}
    colors = {True: "tab:green", False: "tab:red", None: "0.6"}
    for ax, name in zip(axes, ("ttft", "itl")):
        pts = [(p.load, p.summary[name]["p95"], p.ok) for p in probes if p.summary.get(name)]
        if pts:
            ax.plot([x for x, _, _ in pts], [y for _, y, _ in pts], color="0.7", lw=1, zorder=1)
            for x, y, ok in pts:
                ax.scatter([x], [y], color=colors[ok], zorder=2, s=30)
        ax.axhline(slo[name], color="tab:red", ls="--", lw=1, label=f"SLO p95 {slo[name]:g} s")
        if result.capacity is not None:
            ax.axvline(
                result.capacity, color="tab:green", lw=1, label=f"capacity {result.capacity:g}"
            )
        ax.set_ylabel(f"p95 {_NAMES[name]} (s)")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(loc="upper left", fontsize=8)
    loads = [p.load for p in probes]
    if loads and max(loads) / min(loads) > 8:
        axes[1].set_xscale("log")
    axes[1].set_xlabel("request rate (req/s)" if result.mode == "rate" else "concurrency")
    fig.suptitle("capacity: highest load with p95 TTFT and p95 ITL within the SLOs")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
