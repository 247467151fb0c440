"""Whether a policy holds a request rate within latency objectives for as
long as the run lasts, not only for the first minute.

    .venv/bin/python bench/sustained.py --mix cpu --rates 2.0,2.25 --duration 600

A capacity search probes each rate for 60 s. A mix with long generations
fills the running batch over minutes, so a server can pass a 60 s probe at
a rate it cannot sustain (docs/benchmarks.md, "300 s probes"). Per policy
and rate this starts a fresh ``paternoster serve``, sends the mix at the
Poisson rate for ``--duration`` seconds with ``paternoster bench serve``,
and reports p95 TTFT / p95 ITL of the requests sent in each window of
``--window`` seconds and of the whole run. A rate **holds** when the whole
run and its last window both meet the objectives: a backlog that grows
shows in the last window's TTFT, a running batch that grows in its ITL.

Each row also gives the read bandwidth sampled every
``--bandwidth-interval`` seconds during the run (minimum / median). It is
what the server leaves over, so compare it only between runs at one load;
it tells apart runs made on a VM whose bandwidth drifts.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np

from paternoster.bench import saturation, slo_capacity
from paternoster.bench.capacity import Objectives
from paternoster.bench.memory_limit import BandwidthMonitor

#: A window with fewer successful requests than this reports no percentile.
MIN_WINDOW_REQUESTS = 5


def window_p95(requests: list[dict], start: float, end: float) -> tuple[float, float, int]:
    """p95 TTFT and p95 ITL of the successful requests sent in ``[start, end)``.

    Args:
        requests: a ``bench serve`` JSON's ``requests`` (``sent``, ``ttft``
            and ``itl`` in seconds, ``success``).
        start, end: seconds on the run's clock.
    Returns:
        ``(p95 TTFT s, p95 ITL s, requests)``; NaN for a percentile with
        fewer than :data:`MIN_WINDOW_REQUESTS` requests or no gaps. ITL pools
        every gap of those requests (as vLLM's benchmark_serving).
    """
    ok = [r for r in requests if r.get("success") and r.get("sent") is not None
          and start <= r["sent"] < end]  # fmt: skip
    if len(ok) < MIN_WINDOW_REQUESTS:
        return math.nan, math.nan, len(ok)
    gaps = [g for r in ok for g in r["itl"]]
    itl = float(np.percentile(gaps, 95)) if gaps else math.nan
    return float(np.percentile([r["ttft"] for r in ok], 95)), itl, len(ok)


def verdict(requests: list[dict], duration: float, window: float,
            objectives: Objectives) -> tuple[list[str], bool]:  # fmt: skip
    """Cells ``"TTFT s / ITL ms"`` per window and for the whole run, and
    whether the rate holds (whole run and last window within ``objectives``;
    a failed request fails the run).

    Raises:
        ValueError: ``window`` not in ``(0, duration]``.
    """
    if not 0 < window <= duration:
        raise ValueError(f"--window must be in (0, --duration], got {window:g}")
    edges = np.arange(0.0, duration, window).tolist() + [math.inf]
    cells, passes = [], []
    for start, end in [*zip(edges[:-1], edges[1:]), (0.0, math.inf)]:
        ttft, itl, n = window_p95(requests, start, end)
        ok = ttft <= objectives.ttft_p95 and itl <= objectives.itl_p95  # False on NaN
        cells.append("-" if n < MIN_WINDOW_REQUESTS
                     else f"{ttft:.2f} s / {itl * 1e3:.0f} ms{'' if ok else ' ✗'}")  # fmt: skip
        passes.append(ok)
    failed = any(not r.get("success") for r in requests)
    return cells, passes[-1] and passes[-2] and not failed


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (module doc)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mix", default="cpu", choices=sorted(slo_capacity.MIXES))
    ap.add_argument("--policies", default="fcfs,slo",
                    help="fcfs, slo (TTFT 2 s, ITL 0.2 s) and chunked_prefill:BUDGET, "
                         "comma-separated (default fcfs,slo)")  # fmt: skip
    ap.add_argument("--rates", required=True,
                    help="Poisson request rates (req/s), comma-separated; each policy "
                         "runs every rate on a fresh server")  # fmt: skip
    ap.add_argument("--duration", type=float, default=600.0,
                    help="seconds of arrivals per run (default 600)")  # fmt: skip
    ap.add_argument("--window", type=float, default=120.0,
                    help="seconds per reported window (default 120)")  # fmt: skip
    ap.add_argument("--slo-ttft-p95", type=float, default=2.0, help="seconds (default 2)")
    ap.add_argument("--slo-itl-p95", type=float, default=0.2, help="seconds (default 0.2)")
    ap.add_argument("--num-threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--bandwidth-interval", type=float, default=30.0,
                    help="seconds between read-bandwidth samples during a run (default 30)")
    ap.add_argument("--out", type=Path, default=Path("build/sustained"))
    args = ap.parse_args(argv)
    try:
        args.serve = saturation.serve_flags(args.policies)
        args.rate_list = [float(r) for r in args.rates.split(",") if r.strip()]
    except ValueError as e:
        ap.error(str(e))
    if not args.rate_list or not all(0 < r < math.inf for r in args.rate_list):
        ap.error(f"--rates: request rates > 0, got {args.rates!r}")
    if not 0 < args.window <= args.duration:
        ap.error(f"--window must be in (0, --duration], got {args.window:g}")
    if not args.bandwidth_interval > 0:
        ap.error(f"--bandwidth-interval must be > 0, got {args.bandwidth_interval:g}")
    return args


def bandwidth_cell(samples: list[float]) -> str:
    """``"min / median"`` of read-bandwidth samples in GB/s, or ``"-"``.

    Args:
        samples: bytes per second.
    """
    if not samples:
        return "-"
    return f"{min(samples) / 1e9:.1f} / {float(np.median(samples)) / 1e9:.1f}"


def main(argv: list[str] | None = None) -> int:
    """Run every policy at every rate and print the table."""
    args = parse_args(argv)
    objectives = Objectives(args.slo_ttft_p95, args.slo_itl_p95)
    spec = slo_capacity.MIXES[args.mix]
    edges = np.arange(0.0, args.duration, args.window)
    heads = [f"{a:.0f}-{b:.0f} s" for a, b in zip(edges, [*edges[1:], args.duration])]
    rows = [f"| policy | rate (req/s) | offered | {' | '.join(heads)} | whole run | holds "
            "| read GB/s (min / median) |",
            "|---|---:|---:|" + "---|" * len(heads) + "---|---|---:|"]  # fmt: skip
    for rate in args.rate_list:
        for name, flags in args.serve:
            args.num_prompts = max(1, round(rate * args.duration))
            run = argparse.Namespace(**{**vars(args), "out": args.out / f"rate-{rate:g}"})
            run.out.mkdir(parents=True, exist_ok=True)
            monitor = BandwidthMonitor(args.bandwidth_interval).start()
            try:
                res = saturation.run_policy(name, flags, spec, run,
                                            ["--request-rate", str(rate)])  # fmt: skip
            finally:
                bandwidth = monitor.stop()
            cells, holds = verdict(res["requests"], args.duration, args.window, objectives)
            rows.append(f"| {name} | {rate:g} | {res['summary']['offered_rate']:.2f} | "
                        f"{' | '.join(cells)} | {'yes' if holds else 'no'} | "
                        f"{bandwidth_cell(bandwidth)} |")  # fmt: skip
            print(rows[-1], flush=True)
    print(f"mix {args.mix}: {spec}; p95 TTFT / p95 ITL of the requests sent in each "
          f"window; objectives p95 TTFT <= {args.slo_ttft_p95:g} s, p95 ITL <= "
          f"{args.slo_itl_p95 * 1e3:g} ms")  # fmt: skip
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
