#!/usr/bin/env python
"""Capacity of several ``paternoster serve`` configurations, side by side in
one run: each is started on a free port, searched by ``paternoster bench
capacity`` with the same plan (request-rate probes, Poisson arrivals, the
same mix, seed and objectives), and stopped; the table gives each capacity
and its ratio to the first configuration's.

A configuration is ``NAME=FLAGS``: the name in the table, then the ``serve``
flags as one string. Examples (docs/benchmarks.md):

    # data parallel on 2 cores: two engines of one thread vs one of two threads
    python bench/compare_capacity.py --config "dp1x2=--num-threads 2" \\
        --config "dp2x1=--data-parallel-size 2 --num-threads 1"
    # scheduling policies on the CPU mix
    python bench/compare_capacity.py --config "fcfs=--scheduler fcfs" \\
        --config "slo=--scheduler slo"

``--repeat 2`` visits the configurations in the order A B .. B A (the VM's
drift falls on all of them) and reports each search; the capacity in the
table is then the mean of the visits. Server logs and the searches' JSON go
to ``build/bench/compare_capacity/<time>/``.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import peer_servers  # noqa: E402


def parse_config(text: str) -> tuple[str, list[str]]:
    """``"NAME=FLAGS"`` -> ``(NAME, [flag, ...])``.

    Raises:
        argparse.ArgumentTypeError: no ``=`` or an empty name.
    """
    name, sep, flags = text.partition("=")
    if not sep or not name.strip():
        raise argparse.ArgumentTypeError(f"--config must be NAME=FLAGS, got {text!r}")
    return name.strip(), shlex.split(flags)


def table(searches: dict[str, list[dict]]) -> str:
    """Markdown: each configuration's capacity (req/s, mean of its visits),
    the ratio to the first, and every probe of every visit."""
    lines = ["| config | capacity (req/s) | vs first | probes (rate: p95 TTFT, p95 ITL) |",
             "|---|---:|---:|---|"]  # fmt: skip
    caps = {}
    for name, visits in searches.items():
        values = [v.get("capacity") for v in visits]
        caps[name] = None if None in values else sum(values) / len(values)
    first = next(iter(caps.values()))
    for name, visits in searches.items():
        cap = caps[name]
        ratio = "-" if cap is None or not first else f"{cap / first:.2f}x"
        probes = " / ".join(peer_servers.describe_probes(v) for v in visits)
        lines.append(f"| {name} | {'none' if cap is None else f'{cap:g}'} | {ratio} | {probes} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run every configuration's search and print the table."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", type=parse_config, action="append", required=True,
                    metavar="NAME=FLAGS", help="a serve configuration (repeat; the first is "
                    "the baseline of the ratios)")  # fmt: skip
    ap.add_argument("--model", default=None, help="model dir (default: the default model)")
    ap.add_argument("--repeat", type=int, choices=(1, 2), default=1,
                    help="2: visit A B .. B A and average")  # fmt: skip
    peer_servers.add_plan_args(ap)
    plan = peer_servers.CapacityPlan()
    ap.add_argument("--mix", default=plan.mix, help="bench capacity --mix (default: the CPU mix)")
    ap.add_argument("--slo-ttft-p95", type=float, default=plan.slo_ttft_p95, metavar="S")
    ap.add_argument("--slo-itl-p95", type=float, default=plan.slo_itl_p95, metavar="S")
    ap.add_argument("--max-model-len", type=int, default=2048)
    ap.add_argument("--startup-timeout", type=float, default=600.0)
    args = ap.parse_args(argv)
    names = [n for n, _ in args.config]
    if len(set(names)) != len(names):
        ap.error(f"--config names must differ, got {names}")
    plan = peer_servers.plan_from_args(args, slo_ttft_p95=args.slo_ttft_p95,
                                       slo_itl_p95=args.slo_itl_p95, mix=args.mix)  # fmt: skip
    out_dir = Path("build/bench/compare_capacity") / time.strftime("%Y%m%d-%H%M%S")
    order = args.config + (args.config[::-1] if args.repeat == 2 else [])
    searches: dict[str, list[dict]] = {n: [] for n in names}
    for visit, (name, flags) in enumerate(order):
        port = peer_servers.free_port()
        cmd = [peer_servers.paternoster_cli(), "serve", *([args.model] if args.model else []),
               "--port", str(port), "--max-model-len", str(args.max_model_len), *flags]  # fmt: skip
        tag = f"{visit}-{name}"
        with peer_servers.running_server(cmd, port, out_dir / f"{tag}.log",
                                         args.startup_timeout) as url:  # fmt: skip
            search = peer_servers.run_capacity(plan, url, args.max_model_len,
                                               out_dir / f"{tag}.json")  # fmt: skip
        searches[name].append(search)
        print(f"{name}: capacity {search.get('capacity')} req/s", flush=True)
    result = table(searches)
    (out_dir / "table.md").write_text(result + "\n")
    (out_dir / "configs.json").write_text(json.dumps(dict(args.config), indent=1))
    print(f"\ncapacity: mix {plan.mix}, Poisson arrivals, probes >= {plan.probe_duration:g} s, "
          f"p95 TTFT <= {plan.slo_ttft_p95:g} s, p95 ITL <= {plan.slo_itl_p95:g} s; "
          f"JSON and logs in {out_dir}\n{result}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
