#!/usr/bin/env python
"""Data-parallel routing: prefix-cache affinity against round-robin, side by
side in one run (issue 19).

The workload is groups of requests that share a long prefix (a system prompt,
a document, few-shot examples): ``--groups`` prefixes of ``--prefix-len``
tokens, each followed by its own ``--suffix-len``-token question, sent in a
shuffled order with Poisson arrivals at ``--rate`` req/s. Each policy starts
``paternoster serve MODEL --data-parallel-size 2 --num-threads 1
--data-parallel-routing POLICY`` (engines pinned to one core each) and is
visited in the order affinity, round_robin, round_robin, affinity so that the
VM's drift falls on both; each figure is the mean of its two visits.

Reported per policy: the prefix-cache hit rate (cached prompt tokens / looked-
up prompt tokens, from the engines' ``paternoster:prefix_cache_hits`` and
``..._queries`` counters on ``/metrics``, summed over the ``engine`` label,
during the measured requests only) and TTFT p50 / p95 as the client sees them.

``--num-kv-blocks`` sizes each engine's KV cache. The default (320 blocks of
16 tokens, 5120 tokens) holds about half of the groups' prefixes, as a real
server's cache holds part of a large working set: round-robin then sends every
prefix to both engines, which evict each other's groups, while affinity keeps
each group where it is cached. ``--num-kv-blocks 0`` leaves the engine's
default (a cache that holds every prefix: round-robin then loses only the
first request of each group on the second engine).

    python bench/dp_routing.py [--groups 16] [--prefix-len 512] [--rate 3]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))

from peer_servers import free_port, paternoster_cli, running_server  # noqa: E402
from serve import ServeConfig, run_serve, warm_up  # noqa: E402
from workload import BenchRequest, PromptMaker  # noqa: E402

POLICIES = ("affinity", "round_robin")
_COUNTERS = ("paternoster:prefix_cache_hits", "paternoster:prefix_cache_queries")


def prefix_cache_counters(base_url: str) -> dict[str, float]:
    """The prefix-cache counters on ``/metrics``, summed over engines (tokens).

    Returns:
        ``{"hits": ..., "queries": ...}``.
    Raises:
        httpx.HTTPError: the server did not answer.
    """
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(base_url + "/metrics", timeout=10).text
    sums = dict.fromkeys(_COUNTERS, 0.0)
    for family in text_string_to_metric_families(text):
        if family.name in sums:
            sums[family.name] += sum(s.value for s in family.samples if s.name.endswith("_total"))
    return {"hits": sums[_COUNTERS[0]], "queries": sums[_COUNTERS[1]]}


def make_workload(groups: int, per_group: int, prefix_len: int, suffix_len: int,
                  output_len: int, seed: int) -> list[BenchRequest]:  # fmt: skip
    """``groups`` x ``per_group`` requests sharing ``groups`` prefixes, shuffled.

    Raises:
        ValueError: a length < 1.
    """
    maker = PromptMaker(seed=seed)
    prefixes = [maker.make(prefix_len) for _ in range(groups)]
    reqs = [BenchRequest(f"{p} {maker.make(suffix_len)}", prefix_len + suffix_len, output_len,
                         tag=f"group{g}")
            for g, p in enumerate(prefixes) for _ in range(per_group)]  # fmt: skip
    random.Random(seed).shuffle(reqs)
    return reqs


def run_policy(policy: str, args: argparse.Namespace, workload: list[BenchRequest],
               warm: list[BenchRequest], log_dir: Path) -> dict:  # fmt: skip
    """Serve with ``policy``, warm up, run the workload; the hit rate and TTFTs."""
    port = free_port()
    cmd = [paternoster_cli(), "serve", *([args.model] if args.model else []), "--port", str(port),
           "--data-parallel-size", str(args.data_parallel_size), "--num-threads", "1",
           "--data-parallel-routing", policy, "--log-level", "warning"]  # fmt: skip
    if args.num_kv_blocks:
        cmd += ["--num-kv-blocks", str(args.num_kv_blocks)]
    log = log_dir / f"{policy}-{time.strftime('%H%M%S')}.log"
    with running_server(cmd, port, log, args.startup_timeout) as url:
        model = httpx.get(url + "/v1/models").json()["data"][0]["id"]
        config = ServeConfig(url, model, request_rate=args.rate, seed=args.seed,
                             ignore_eos=True, progress=False)  # fmt: skip
        asyncio.run(warm_up(config, warm))
        before = prefix_cache_counters(url)
        result = asyncio.run(run_serve(config, workload))
        after = prefix_cache_counters(url)
    s = result.summary
    queries = after["queries"] - before["queries"]
    return {
        "hit_rate": (after["hits"] - before["hits"]) / queries if queries else 0.0,
        "ttft_p50": s["ttft"]["p50"],
        "ttft_p95": s["ttft"]["p95"],
        "errors": s["num_errors"],
    }


def main(argv: list[str] | None = None) -> int:
    """Run both policies (twice each, ABBA) and print a markdown table."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="model dir (default: the default model)")
    ap.add_argument("--data-parallel-size", type=int, default=2)
    ap.add_argument("--groups", type=int, default=16)
    ap.add_argument("--requests-per-group", type=int, default=6)
    ap.add_argument("--prefix-len", type=int, default=512)
    ap.add_argument("--suffix-len", type=int, default=32)
    ap.add_argument("--output-len", type=int, default=16)
    ap.add_argument("--rate", type=float, default=3.0, help="Poisson arrivals, req/s")
    ap.add_argument("--num-kv-blocks", type=int, default=320,
                    help="KV blocks per engine (0: the engine's default)")  # fmt: skip
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--startup-timeout", type=float, default=300.0)
    args = ap.parse_args(argv)
    workload = make_workload(args.groups, args.requests_per_group, args.prefix_len,
                             args.suffix_len, args.output_len, args.seed)  # fmt: skip
    warm = make_workload(2, 2, 64, 8, 4, args.seed + 1)  # prefixes the workload never uses
    log_dir = Path("build/bench/dp_routing")
    runs: dict[str, list[dict]] = {p: [] for p in POLICIES}
    for policy in POLICIES + POLICIES[::-1]:
        r = run_policy(policy, args, workload, warm, log_dir)
        runs[policy].append(r)
        print(f"{policy}: hit rate {r['hit_rate']:.3f}, TTFT p50 {r['ttft_p50']:.3f} s, "
              f"p95 {r['ttft_p95']:.3f} s, errors {r['errors']}", file=sys.stderr)  # fmt: skip

    def mean(policy: str, key: str) -> float:
        return sum(r[key] for r in runs[policy]) / len(runs[policy])

    print(f"| routing | prefix-cache hit rate | TTFT p50 (s) | TTFT p95 (s) |  "
          f"(DP={args.data_parallel_size}, {args.groups} groups x {args.requests_per_group}, "
          f"prefix {args.prefix_len} + {args.suffix_len} tokens, {args.rate:g} req/s, "
          f"{args.num_kv_blocks or 'default'} KV blocks per engine)")  # fmt: skip
    print("|---|---:|---:|---:|")
    for p in POLICIES:
        print(f"| {p} | {mean(p, 'hit_rate'):.3f} | {mean(p, 'ttft_p50'):.3f} | "
              f"{mean(p, 'ttft_p95'):.3f} |")  # fmt: skip
    base = mean("round_robin", "ttft_p50")
    print(f"\nTTFT p50 affinity / round_robin: {mean('affinity', 'ttft_p50') / base:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
