#!/usr/bin/env python
"""The frontend's cost at data parallel size N: requests/s over the model-free
null engine at a high concurrency, for N = 1, 2, 4 engines behind one
frontend, side by side in one run.

Each N starts ``paternoster serve --data-parallel-size N`` over
:class:`~paternoster.bench.null_engine.NullEngineCore` (no model: the figures
are the frontend's routing, the N links and the engine loops) and streams the
same requests (32 prompt token ids, 16 output tokens) through HTTP (aiohttp,
SSE) and through the ZeroMQ client; the N are visited in the order 1, 2, 4, 4,
2, 1 so the VM's drift falls on all of them, and each figure is the mean of its
two visits. The ratio to N = 1 shows whether more engines cost the frontend
throughput (it must not be the limit). Engines run one thread each and are
pinned only when there are cores for them (``PATERNOSTER_NUM_THREADS=1``).

    python bench/dp_overhead.py [--sizes 1,2,4] [--concurrency 256] [--num-requests 1000]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from zmq_vs_http import null_server, run_path  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    """Run the comparison and print a markdown table."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="1,2,4")
    ap.add_argument("--concurrency", type=int, default=256)
    ap.add_argument("--num-requests", type=int, default=1000)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--model", default=None, help="tokenizer dir (default: the default model)")
    args = ap.parse_args(argv)
    from paternoster.entrypoints.engine_args import resolve_model_dir

    os.environ.setdefault("PATERNOSTER_NUM_THREADS", "1")
    model_dir = resolve_model_dir(args.model)
    sizes = [int(n) for n in args.sizes.split(",")]
    results: dict[tuple[int, str], list[float]] = {}
    for n in sizes + sizes[::-1]:
        with null_server(model_dir, extra_args=("--data-parallel-size", str(n))) as (url, addr):
            import httpx

            model = httpx.get(url + "/v1/models").json()["data"][0]["id"]
            for path in ("http", "zmq"):
                r = asyncio.run(run_path(path, url, addr, model, args.concurrency,
                                         args.num_requests, args.max_tokens))  # fmt: skip
                results.setdefault((n, path), []).append(r["req_per_s"])
                print(f"dp={n} {path}: {r['req_per_s']:.1f} req/s", file=sys.stderr)
    print(f"| engines | HTTP req/s | vs 1 | ZMQ req/s | vs 1 |  (concurrency "
          f"{args.concurrency}, {args.num_requests} requests x {args.max_tokens} tokens)")
    print("|---:|---:|---:|---:|---:|")
    base = {p: sum(results[(sizes[0], p)]) / 2 for p in ("http", "zmq")}
    for n in sizes:
        h, z = (sum(results[(n, p)]) / 2 for p in ("http", "zmq"))
        print(f"| {n} | {h:.1f} | {h / base['http']:.2f}x | {z:.1f} | {z / base['zmq']:.2f}x |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
