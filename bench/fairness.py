#!/usr/bin/env python
"""Per-tenant throughput under an unequal load, with and without the ``fair``
scheduler (issue 20; Virtual Token Counter, Sheng et al., OSDI'24).

Two tenants send Poisson arrivals for ``--duration`` seconds: ``heavy`` at
``--heavy-rate`` and ``light`` at a quarter of it (``--ratio``), together above
what the engine completes, so both queue. For each policy the tokens served to
each tenant *while both are sending* (``[0, duration)``) give its output
tokens/s; the table reports them, the light tenant's share and its ratio to
the heavy one, and TTFT percentiles. First come, first served gives each
tenant service in proportion to its arrivals (light gets about 1/5); ``fair``
gives two backlogged tenants equal service (ratio about 1).

``--mode sim`` (default) runs the scheduler simulator (docs/simulator.md) with
the calibrated CPU cost model: the real scheduler classes and KV cache
manager, no model. ``--mode server`` starts ``paternoster serve`` once per
policy (the default model unless ``--model``) and drives it over HTTP, the
tenant in the body's ``user`` field; requests still unanswered
``--drain`` seconds after the window are cut off (their tokens before the end
of the window count).

    python bench/fairness.py                                  # simulator, seconds
    python bench/fairness.py --mode server --heavy-rate 4 --duration 60
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

TENANTS = ("heavy", "light")


@dataclass
class TenantLoad:
    """What one tenant was served within the window.

    Attributes:
        requests: requests it sent in the window.
        output_tokens: output tokens delivered to it within the window.
        prefill_tokens, decode_tokens: tokens computed for it within the
            window (simulator only; ``None`` on a server).
        ttft_p50, ttft_p95: time to first token of its requests that got one (s).
    """

    requests: int = 0
    output_tokens: int = 0
    prefill_tokens: int | None = None
    decode_tokens: int | None = None
    ttft_p50: float = float("nan")
    ttft_p95: float = float("nan")


def arrivals(rate: float, duration: float, rng: np.random.Generator) -> list[float]:
    """Poisson arrival times in ``[0, duration)`` at ``rate`` per second."""
    out, t = [], 0.0
    while (t := t + rng.exponential(1.0 / rate)) < duration:
        out.append(round(t, 6))
    return out


def workload(args: argparse.Namespace) -> list[tuple[float, str, int, int]]:
    """``(arrival s, tenant, prompt_len, output_len)`` in arrival order, seeded."""
    rng = np.random.default_rng(args.seed)
    rates = {"heavy": args.heavy_rate, "light": args.heavy_rate / args.ratio}
    reqs = []
    for tenant in TENANTS:
        for t in arrivals(rates[tenant], args.duration, rng):
            reqs.append((t, tenant, int(rng.integers(args.prompt_min, args.prompt_max + 1)),
                         int(rng.integers(args.output_min, args.output_max + 1))))  # fmt: skip
    return sorted(reqs)


# ------------------------------------------------------------------ simulator


def run_sim(policy: str, args: argparse.Namespace, reqs) -> dict[str, TenantLoad]:
    """Simulate ``policy`` on the workload; per-tenant load within the window."""
    from paternoster.simulate import TraceRequest, simulate
    from paternoster.simulate.tenants import tenant_summary

    trace = [TraceRequest(t, p, o, request_id=f"r{i}", tenant=tenant)
             for i, (t, tenant, p, o) in enumerate(reqs)]  # fmt: skip
    res = simulate(trace, policy, max_num_batched_tokens=args.max_num_batched_tokens,
                   num_kv_blocks=args.num_kv_blocks, max_num_seqs=args.max_num_seqs)  # fmt: skip
    return {row["tenant"]: TenantLoad(row["num_requests"], row["output_tokens"],
                                      row["prefill_tokens"], row["decode_tokens"],
                                      row["ttft_p50"], row["ttft_p95"])
            for row in tenant_summary(res, until=args.duration)}  # fmt: skip


# --------------------------------------------------------------------- server


def run_server(policy: str, args: argparse.Namespace, reqs) -> dict[str, TenantLoad]:
    """Serve with ``--scheduler policy``; per-tenant load within the window."""
    import httpx
    from peer_servers import free_port, paternoster_cli, running_server
    from serve import ServeConfig, run_serve
    from stats import chunk_times
    from workload import BenchRequest, PromptMaker

    maker = PromptMaker(seed=args.seed)
    port = free_port()
    cmd = [paternoster_cli(), "serve", *([args.model] if args.model else []), "--port",
           str(port), "--scheduler", policy, "--log-level", "warning",
           "--max-num-batched-tokens", str(args.max_num_batched_tokens)]  # fmt: skip
    log = Path("build/bench/fairness") / f"{policy}-{time.strftime('%H%M%S')}.log"
    with running_server(cmd, port, log, args.startup_timeout) as url:
        model = httpx.get(url + "/v1/models").json()["data"][0]["id"]
        runs = []
        for tenant in TENANTS:
            mine = [BenchRequest(maker.make(p), p, o, tag=tenant, arrival_time=t)
                    for t, who, p, o in reqs if who == tenant]  # fmt: skip
            config = ServeConfig(url, model, trace_timing=True, ignore_eos=True,
                                 extra_body={"user": tenant}, progress=False,
                                 timeout=args.duration + args.drain)  # fmt: skip
            runs.append((tenant, mine, config))

        async def both():
            async def one(tenant, mine, config):
                # trace timing counts from a schedule's first arrival: start it then
                await asyncio.sleep(mine[0].arrival_time)
                return await run_serve(config, mine)

            return await asyncio.gather(*(one(*r) for r in runs))

        results = asyncio.run(both())
    loads = {}
    for (tenant, mine, _), result in zip(runs, results):
        load = loads[tenant] = TenantLoad(requests=len(mine))
        ttfts = []
        for r in result.records:
            if r.sent is None or r.ttft is None:
                continue
            ttfts.append(r.ttft)
            times = chunk_times(mine[0].arrival_time + r.sent, r.ttft, r.itl)
            per_chunk = (r.output_tokens or len(times)) / max(1, len(times))
            load.output_tokens += round(per_chunk * int((times < args.duration).sum()))
        if ttfts:
            load.ttft_p50, load.ttft_p95 = np.percentile(ttfts, [50, 95]).tolist()
    return loads


# ---------------------------------------------------------------------- table


def table(runs: dict[str, dict[str, TenantLoad]], args: argparse.Namespace) -> str:
    """Markdown: per policy and tenant, requests, output tok/s in the window,
    weighted service/s (simulator), share, TTFT p50/p95; light/heavy ratio."""
    w_p, w_q = 1.0, 2.0  # the fair policy's defaults
    lines = ["| policy | tenant | requests | output tok/s | service/s | share of output "
             "| TTFT p50 | TTFT p95 |", "|---|---|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    ratios = []
    for policy, loads in runs.items():
        total = sum(load.output_tokens for load in loads.values()) or 1
        for tenant in TENANTS:
            load = loads[tenant]
            service = "-"
            if load.prefill_tokens is not None:
                work = w_p * load.prefill_tokens + w_q * load.decode_tokens
                service = f"{work / args.duration:.1f}"
            p50, p95 = load.ttft_p50, load.ttft_p95
            rate, share = load.output_tokens / args.duration, load.output_tokens / total
            lines.append(f"| {policy} | {tenant} | {load.requests} | {rate:.1f} | {service} "
                         f"| {share:.2f} | {p50:.2f} | {p95:.2f} |")  # fmt: skip
        heavy = loads["heavy"].output_tokens or 1
        ratios.append(f"{policy} {loads['light'].output_tokens / heavy:.2f}")
    return "\n".join(lines) + "\n\nlight/heavy output tokens: " + ", ".join(ratios) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Run every policy on one workload and print the table."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mode", choices=["sim", "server"], default="sim")
    ap.add_argument("--policies", default="fcfs,chunked_prefill,fair")
    ap.add_argument("--heavy-rate", type=float, default=16.0, help="heavy tenant, req/s")
    ap.add_argument("--ratio", type=float, default=4.0, help="heavy rate / light rate")
    ap.add_argument("--duration", type=float, default=60.0, help="seconds of arrivals")
    ap.add_argument("--prompt-min", type=int, default=64)
    ap.add_argument("--prompt-max", type=int, default=256)
    ap.add_argument("--output-min", type=int, default=32)
    ap.add_argument("--output-max", type=int, default=128)
    ap.add_argument("--max-num-batched-tokens", type=int, default=512)
    ap.add_argument("--num-kv-blocks", type=int, default=2912, help="simulator KV blocks")
    ap.add_argument("--max-num-seqs", type=int, default=64, help="simulator sequence slots")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--model", default=None, help="server: model dir (default model)")
    ap.add_argument("--drain", type=float, default=30.0, help="server: seconds after the window")
    ap.add_argument("--startup-timeout", type=float, default=300.0)
    args = ap.parse_args(argv)
    reqs = workload(args)
    counts = defaultdict(int)
    for _, tenant, _, _ in reqs:
        counts[tenant] += 1
    print(f"{len(reqs)} requests over {args.duration:g} s: " +
          ", ".join(f"{t} {counts[t]}" for t in TENANTS), flush=True)  # fmt: skip
    run = run_sim if args.mode == "sim" else run_server
    runs = {}
    for policy in [p.strip() for p in args.policies.split(",") if p.strip()]:
        runs[policy] = run(policy, args, reqs)
    print(table(runs, args), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
