"""The most a machine finishes per second on a mix, per scheduling policy: a
ceiling for every capacity within latency objectives.

    .venv/bin/python bench/saturation.py --mix long --policies fcfs,slo,chunked_prefill:256

Per policy, ``paternoster serve`` is started and ``paternoster bench serve``
sends the mix in a closed loop (``--concurrency`` streams, ``--num-prompts``
requests, fresh server each). The whole-run request rate includes the drain
at the end, when few requests are left and steps are small, so the table
reports the **steady window** too: prompt tokens whose first token came, and
output tokens streamed, between ``--skip`` seconds in and the time three
quarters of the requests had finished, per second. ``req/s worth`` turns
those rates into requests of the mix: the mean of prompt rate / the mix's
mean prompt length and output rate / its mean output length (lengths are
drawn uniformly per class, so the means follow from the spec). A capacity
within objectives cannot exceed it for long: past it the backlog grows
whatever the order of work, only more slowly than a 60 s probe can see.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np

from paternoster.bench import peer_servers, slo_capacity
from paternoster.bench.stats import chunk_times
from paternoster.bench.workload import parse_mix
from paternoster.scheduling.registry import available_schedulers

#: Share of requests finished at which the steady window ends.
DONE_QUANTILE = 0.75


def mean_lengths(spec: str) -> tuple[float, float]:
    """``(mean prompt tokens, mean output tokens)`` of the mix ``spec`` (each
    class's lengths uniform over its inclusive range, weighted by share).

    Raises:
        ValueError: a malformed spec (from :func:`parse_mix`).
    """
    classes = parse_mix(spec)
    total = sum(c.share for c in classes)
    prompt = sum(c.share * sum(c.prompt_len) / 2 for c in classes) / total
    output = sum(c.share * sum(c.output_len) / 2 for c in classes) / total
    return prompt, output


def steady_rates(requests: list[dict], skip_s: float) -> tuple[float, float, float, float]:
    """Token rates in the steady window of a ``bench serve`` run.

    Args:
        requests: the JSON's ``requests`` (``sent``, ``ttft``, ``itl`` in
            seconds from the run's start, ``prompt_tokens``; failed ones skipped).
        skip_s: seconds at the start left out (the ramp up).
    Returns:
        ``(window start s, window end s, prompt tokens/s, output tokens/s)``:
        a prompt counts when its first token arrives in the window, an output
        token when it does; the window ends when :data:`DONE_QUANTILE` of the
        requests have finished.
    Raises:
        ValueError: no successful request, or the window is empty.
    """
    ok = [r for r in requests if r.get("success")]
    if not ok:
        raise ValueError("no successful request")
    done = np.sort([r["sent"] + r["ttft"] + sum(r["itl"]) for r in ok])
    start, end = skip_s, float(done[int(DONE_QUANTILE * (len(done) - 1))])
    if end <= start:
        raise ValueError(f"the steady window is empty: {DONE_QUANTILE:.0%} of the requests "
                         f"finished by {end:.1f} s, before --skip {start:g} s")  # fmt: skip
    prompt = output = 0
    for r in ok:
        times = chunk_times(r["sent"], r["ttft"], r["itl"])
        inside = (times >= start) & (times < end)
        prompt += r["prompt_tokens"] * int(inside[0])
        output += int(inside.sum())
    return start, end, prompt / (end - start), output / (end - start)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (module doc)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mix", default="long", choices=sorted(slo_capacity.MIXES))
    ap.add_argument("--policies", default="fcfs,slo,chunked_prefill:256",
                    help="fcfs, slo (TTFT 2 s, ITL 0.2 s) and chunked_prefill:BUDGET, "
                         "comma-separated")  # fmt: skip
    ap.add_argument("--concurrency", type=int, default=48, help="closed-loop streams (default 48)")
    ap.add_argument("--num-prompts", type=int, default=240,
                    help="requests per policy (default 240; few requests make the "
                         "steady window short and 'req/s worth' rough)")  # fmt: skip
    ap.add_argument("--skip", type=float, default=20.0,
                    help="seconds left out at the start (default 20)")  # fmt: skip
    ap.add_argument("--num-threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--out", type=Path, default=Path("build/saturation"))
    args = ap.parse_args(argv)
    try:
        args.serve = serve_flags(args.policies)
    except ValueError as e:
        ap.error(str(e))
    return args


def serve_flags(policies: str) -> list[tuple[str, list[str]]]:
    """``(label, paternoster serve flags)`` per comma-separated policy: fcfs,
    slo (TTFT 2 s, ITL 0.2 s) or chunked_prefill:BUDGET.

    Raises:
        ValueError: an unknown scheduler or a budget that is not a token count
            (the message names ``--policies``), before any server starts.
    """
    serve = []
    known = available_schedulers()
    for name in filter(None, (p.strip() for p in policies.split(","))):
        sched, _, budget = name.partition(":")
        if sched not in known:
            raise ValueError(f"--policies: unknown scheduler {sched!r}; installed: "
                             f"{', '.join(known)}")  # fmt: skip
        flags = ["--scheduler", sched]
        if sched == "slo":
            flags += ["--scheduler-config", '{"ttft_s": 2, "itl_s": 0.2}']
        if budget:
            if not budget.isdigit():
                raise ValueError(f"--policies: {name!r}: the budget after ':' must be tokens")
            flags += ["--max-num-batched-tokens", budget]
        serve.append((name, flags))
    return serve


def run_policy(name: str, flags: list[str], spec: str, args: argparse.Namespace,
               load: list[str] | None = None) -> dict:  # fmt: skip
    """Serve with ``flags``, send ``args.num_prompts`` requests of ``spec``
    (``load``: the ``bench serve`` load flags; default the closed loop at
    ``args.concurrency``), return the bench JSON (also written under
    ``args.out``)."""
    port = peer_servers.free_port()
    cli = peer_servers.paternoster_cli()
    out = args.out / f"{args.mix}-{name.replace(':', '-')}.json"
    cmd = [cli, "serve", "--port", str(port), "--num-threads", str(args.num_threads), *flags]
    load = load or ["--max-concurrency", str(args.concurrency)]
    with peer_servers.running_server(cmd, port, out.with_suffix(".log"), 600) as url:
        subprocess.run([cli, "bench", "serve", "--base-url", url, "--mix", spec, "--ignore-eos",
                        "--seed", str(args.seed), "--warmup", "4", "--no-progress", *load,
                        "--num-prompts", str(args.num_prompts),
                        "--max-model-len", str(slo_capacity.DEFAULT_MAX_MODEL_LEN),
                        "--json", str(out)], check=True)  # fmt: skip
    return json.loads(out.read_text())


def main(argv: list[str] | None = None) -> int:
    """Run every policy and print the table."""
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    spec = slo_capacity.MIXES[args.mix]
    mean_prompt, mean_output = mean_lengths(spec)
    rows = ["| policy | req/s, whole run | steady window (s) | prompt tok/s | output tok/s | "
            "req/s worth | p95 TTFT (s) | p95 ITL (ms) |",
            "|---|---:|---|---:|---:|---:|---:|---:|"]  # fmt: skip
    for name, flags in args.serve:
        res = run_policy(name, flags, spec, args)
        start, end, prompt, output = steady_rates(res["requests"], args.skip)
        worth = (prompt / mean_prompt + output / mean_output) / 2
        s = res["summary"]
        rows.append(f"| {name} | {s['request_throughput']:.2f} | {start:.0f}-{end:.0f} | "
                    f"{prompt:.0f} | {output:.0f} | {worth:.2f} | {s['ttft']['p95']:.2f} | "
                    f"{s['itl']['p95'] * 1e3:.0f} |")  # fmt: skip
    print(f"mix {args.mix}: {spec} (mean prompt {mean_prompt:g}, output {mean_output:g} "
          f"tokens); closed loop at {args.concurrency} streams, {args.num_prompts} requests")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
