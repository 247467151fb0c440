"""Capacity of fcfs, chunked_prefill and slo within p95 TTFT and p95 ITL
objectives, in the simulator and (``--real``) on the real server, in one run.

    .venv/bin/python bench/slo_capacity.py                 # simulator only, both mixes (~1 min)
    .venv/bin/python bench/slo_capacity.py --real          # + real servers (hours; quiet machine)
    .venv/bin/python bench/slo_capacity.py --ceiling       # + each policy with the queue full

The capacity is the highest Poisson request rate at which p95 TTFT and p95
ITL stay within their objectives (default 2 s and 0.2 s), found by
:func:`paternoster.bench.capacity.find_capacity` (ramp x2, then bisect).
Simulated probe at rate ``r``: the same requests ``paternoster bench capacity
--seed S --mix M`` sends at that rate (lengths from
:func:`~paternoster.bench.workload.make_mix`, send times from
:func:`~paternoster.bench.workload.arrival_offsets`, prompt length = words),
through :func:`paternoster.simulate.simulate` (the real scheduler classes on
the calibrated cost model). Real probe: ``paternoster serve`` started per
policy and searched by ``paternoster bench capacity`` with the same plan
(:mod:`paternoster.bench.peer_servers`). With ``--real`` the cost model is
first calibrated on this machine at the server's thread count
(``--cost-model`` to give one), so the prediction is for this machine. With
``--fit-timeline`` each server also records its request timeline; after its
search the cost model is fitted to the server's own steps
(:mod:`paternoster.simulate.timeline_fit`) and the simulator searched again
with it: a last table puts both predictions next to the measured capacity, so
the error of the step-time input and that of the queueing model separate.

Policies: ``fcfs``; ``chunked_prefill`` with a token budget
(``--max-num-batched-tokens``) of 128, 256, 512 and 2048 (``--chunks``; 2048
is the server's default); ``slo`` with the objectives as its targets (and,
with a calibrated model, that model as its starting point). Ratios are against the better of fcfs
and the best chunked_prefill. Mixes: ``cpu`` (prompts <= 1024 tokens, the
CPU mix of docs/benchmarks.md) and ``long`` (the same plus the default mix's
5 % long prompts, scaled to this CPU: 1024-2048 tokens).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from paternoster.bench import peer_servers
from paternoster.bench.capacity import CapacityResult, Objectives, SearchPlan, find_capacity
from paternoster.bench.workload import PromptMaker, arrival_offsets, make_mix, parse_mix

#: The CPU mix plus the default mix's 5 % long prompts, halved for this CPU
#: (the shares of :data:`~paternoster.bench.workload.DEFAULT_MIX`).
LONG_MIX = ("short=0.6:16-256:8-64,summary=0.25:256-1024:64-256,"
            "long_gen=0.1:16-128:256-512,long_prompt=0.05:1024-2048:8-64")  # fmt: skip
MIXES = {"cpu": peer_servers.CPU_MIX, "long": LONG_MIX}
#: ``--ceiling``: the offered rate as a multiple of the capacity found.
CEILING_OVERLOAD = 4.0
#: ``--ceiling-requests`` below this leave no steady stretch with the queue
#: full (the figure then swings by tens of percent between run lengths).
MIN_CEILING_REQUESTS = 500
#: Granularity of the scaled long class's lengths (tokens).
LONG_STEP = 64


def longest_prompt_within(cost_model, ttft_s: float, cap: int = 8192) -> int:
    """The longest prompt (a multiple of :data:`LONG_STEP` tokens, at least
    ``LONG_STEP``) that ``cost_model`` prefills whole, alone, within ``ttft_s``
    seconds: the length past which a prompt misses the TTFT objective even on
    an idle server."""
    import numpy as np

    from paternoster.scheduling.cost_model import StepWork

    def alone(n: int) -> float:
        return cost_model.step_time(StepWork.from_arrays(np.array([0]), np.array([n]),
                                                         np.array([n])))  # fmt: skip

    n = LONG_STEP
    while n + LONG_STEP <= cap and alone(n + LONG_STEP) <= ttft_s:
        n += LONG_STEP
    return n


def machine_scale(cost_model, ttft_s: float) -> float:
    """How much shorter prompts must be on the machine ``cost_model``
    describes than on the project's 2-core VM (where the mixes were set):
    ``min(1, L / 2048)``, ``L`` = :func:`longest_prompt_within` the TTFT
    objective (2048 with the default cost model)."""
    return min(1.0, longest_prompt_within(cost_model, ttft_s) / 2048)


def scale_mix(spec: str, factor: float) -> str:
    """``spec`` with every class's prompt lengths times ``factor`` (rounded,
    at least 1 token); output lengths and shares unchanged."""
    if factor == 1.0:
        return spec
    out = []
    for cls in parse_mix(spec):
        lo, hi = (max(1, round(n * factor)) for n in cls.prompt_len)
        o_lo, o_hi = cls.output_len
        out.append(f"{cls.tag}={cls.share:g}:{lo}-{hi}:{o_lo}-{o_hi}")
    return ",".join(out)


def scaled_mixes(cost_model, ttft_s: float) -> dict[str, str]:
    """:data:`MIXES` scaled to the machine ``cost_model`` describes
    (:func:`machine_scale`): unchanged with the default cost model; on a
    slower machine every prompt is shorter by the factor that lets the
    longest prompt of :data:`LONG_MIX` still meet the TTFT objective alone,
    so that neither mix asks for what no scheduler can give (on a VM where a
    1024-token prefill alone takes 1.2-1.5 s, the CPU mix's p95 TTFT misses
    2 s at 0.125 req/s under fcfs: there is no capacity to compare)."""
    f = machine_scale(cost_model, ttft_s)
    return {name: scale_mix(spec, f) for name, spec in MIXES.items()}


#: The default model's context (tokens); prompts are fitted to it as
#: ``paternoster bench capacity`` fits them (completions, no tokenizer).
DEFAULT_MAX_MODEL_LEN = 8192


@dataclass(frozen=True)
class Policy:
    """One contender: a label, the scheduler, its options and its step budget."""

    label: str
    scheduler: str
    config: dict = field(default_factory=dict)
    max_num_batched_tokens: int = 2048

    def serve_args(self) -> list[str]:
        """The ``paternoster serve`` flags that select it."""
        args = ["--scheduler", self.scheduler,
                "--max-num-batched-tokens", str(self.max_num_batched_tokens)]  # fmt: skip
        if self.config:
            args += ["--scheduler-config", json.dumps(self.config)]
        return args


def policies(chunks: list[int], objectives: Objectives, slo_config: dict) -> list[Policy]:
    """fcfs, chunked_prefill at each budget in ``chunks``, and slo whose targets
    are ``objectives`` (more options in ``slo_config``)."""
    out = [Policy("fcfs", "fcfs")]
    out += [Policy(f"chunked_prefill {c}", "chunked_prefill", max_num_batched_tokens=c)
            for c in chunks]  # fmt: skip
    slo = {"ttft_s": objectives.ttft_p95, "itl_s": objectives.itl_p95, **slo_config}
    out.append(Policy("slo", "slo", slo))
    return out


# -------------------------------------------------------------- simulator


def sim_trace(mix: str, rate: float, n: int, seed: int, max_model_len: int) -> list:
    """The requests ``paternoster bench capacity`` sends at ``rate`` as a
    simulator trace (lengths in words = tokens, Poisson send times)."""
    from paternoster.simulate import TraceRequest

    fit = max(2, int((max_model_len - 8) * 0.9))  # bench/cli.py: completions, no tokenizer
    reqs = make_mix(n, PromptMaker(None, seed), parse_mix(mix), fit, seed)
    times = arrival_offsets(n, rate, 1.0, seed)
    return [TraceRequest(round(float(t), 6), r.prompt_len, r.output_len, tag=r.tag)
            for r, t in zip(reqs, times)]  # fmt: skip


def sim_summary(result) -> dict:
    """A simulation's figures in the shape :meth:`Objectives.judge` reads."""
    s = result.summary()
    n, errors = s["num_requests"], s["num_errors"]
    return {"num_sent": n, "num_completed": n - errors, "error_rate": errors / n,
            "ttft": s["ttft"], "itl": s["itl"], "request_throughput": s["throughput_req_s"]}


def sim_capacity(policy: Policy, mix: str, plan: SearchPlan, objectives: Objectives,
                 args: argparse.Namespace, cost_model) -> CapacityResult:  # fmt: skip
    """Search ``policy``'s capacity on ``mix`` in the simulator."""
    from paternoster.simulate import simulate

    def probe(load: float, _time_left, _req_left):
        n = max(args.probe_requests, math.ceil(load * args.probe_duration))
        trace = sim_trace(mix, load, n, args.seed, args.max_model_len)
        res = simulate(trace, policy.scheduler, policy.config, cost_model,
                       max_num_batched_tokens=policy.max_num_batched_tokens,
                       max_model_len=args.max_model_len)  # fmt: skip
        return sim_summary(res), False

    return find_capacity(plan, objectives, probe)


def sim_probe(policy: Policy, mix: str, load: float, args: argparse.Namespace,
              cost_model) -> dict:  # fmt: skip
    """One simulated probe at ``load`` req/s: the requests a real probe sends
    (the same count rule), in :func:`sim_summary`'s shape."""
    from paternoster.simulate import simulate

    n = max(args.probe_requests, math.ceil(load * args.probe_duration))
    trace = sim_trace(mix, load, n, args.seed, args.max_model_len)
    res = simulate(trace, policy.scheduler, policy.config, cost_model,
                   max_num_batched_tokens=policy.max_num_batched_tokens,
                   max_model_len=args.max_model_len)  # fmt: skip
    return sim_summary(res)


def sim_ceiling(policy: Policy, mix: str, capacity: float | None, args: argparse.Namespace,
                cost_model) -> dict:  # fmt: skip
    """What ``policy`` finishes per second with the queue full, in the simulator.

    ``--ceiling-requests`` requests of ``mix`` arrive at :data:`CEILING_OVERLOAD`
    times ``capacity`` (at least ``--start``), so a backlog builds from the
    first seconds and lasts almost to the end. No policy's capacity within
    the objectives can exceed the highest such rate (the machine's ceiling
    for this mix), and a policy's own rate bounds its own capacity, whichever
    objective it keeps (docs/benchmarks.md, "The machine's ceiling").

    Returns:
        ``{"offered": req/s, "finished": req/s, "itl_p95": s}``, over the
        span the queue was full: from a quarter of the way to the last
        admission (the batch has filled) to that admission (after it the
        batch drains). ``finished`` is the tokens computed in that span
        (prompt and output) over the trace's mean per request
        (``prompt_len + output_len - 1``: the first output token comes with
        the prefill), so it does not depend on which requests a policy ran
        then; ``itl_p95`` pools the decode gaps that ended in the span.
    """
    from paternoster.simulate import simulate

    rate = CEILING_OVERLOAD * max(capacity or 0.0, args.start)
    trace = sim_trace(mix, rate, args.ceiling_requests, args.seed, args.max_model_len)
    res = simulate(trace, policy.scheduler, policy.config, cost_model,
                   max_num_batched_tokens=policy.max_num_batched_tokens,
                   max_model_len=args.max_model_len)  # fmt: skip
    done = [r for r in res.requests if r.token_times]
    end = max(r.first_scheduled_time for r in done)
    start = trace[0].arrival_time + (end - trace[0].arrival_time) / 4
    tokens = sum(s.prefill_tokens + s.decode_tokens for s in res.steps if start <= s.start < end)
    per_request = float(np.mean([t.prompt_len + t.output_len - 1 for t in trace]))
    gaps = [b - a for r in done for a, b in zip(r.token_times, r.token_times[1:])
            if start <= b < end]  # fmt: skip
    span = end - start
    return {"offered": rate, "finished": tokens / span / per_request if span > 0 else math.nan,
            "itl_p95": float(np.percentile(gaps, 95)) if gaps else math.nan}


def ceiling_table(mix: str, sim: dict[str, float | None], ceilings: dict[str, dict]) -> str:
    """Markdown: per policy its simulated capacity, what it finishes with the
    queue full, and the capacity as a share of that; and the highest ratio
    over the better baseline that the machine's ceiling leaves."""
    best = max((c for k, c in sim.items() if k != "slo" and c is not None), default=None)
    top = max(c["finished"] for c in ceilings.values())
    lines = ["| mix | policy | sim capacity (req/s) | finished with the queue full (req/s) "
             "| p95 ITL then (s) | capacity / own ceiling |",
             "|---|---|---:|---:|---:|---:|"]  # fmt: skip
    for k, c in ceilings.items():
        share = f"{sim[k] / c['finished']:.2f}" if sim.get(k) and c["finished"] > 0 else "-"
        lines.append(f"| {mix} | {k} | {_cap(sim.get(k))} | {c['finished']:.2f} "
                     f"| {c['itl_p95']:.3f} | {share} |")  # fmt: skip
    if best:
        lines.append(f"\nNo policy can exceed {top / best:.2f}× the better baseline's "
                     f"capacity ({best:g} req/s) on {mix}: the highest rate finished with "
                     f"the queue full is {top:.2f} req/s.")  # fmt: skip
    return "\n".join(lines)


def probe_rows(label: str, mix: str, search: dict, sims: list[dict]) -> list[str]:
    """Markdown rows: per real probe, measured and simulated p95 TTFT (s) and
    p95 ITL (ms) at the same load."""

    def p95(summary: dict, key: str) -> float | None:
        return (summary.get(key) or {}).get("p95")

    def fmt(x: float | None, scale: float, digits: int) -> str:
        return "-" if x is None else f"{x * scale:.{digits}f}"

    rows = []
    for probe, sim in zip(search.get("probes", []), sims):
        real = probe["summary"]
        rows.append(f"| {mix} | {label} | {probe['load']:g} | {fmt(p95(real, 'ttft'), 1, 2)} | "
                    f"{fmt(p95(sim, 'ttft'), 1, 2)} | {fmt(p95(real, 'itl'), 1e3, 0)} | "
                    f"{fmt(p95(sim, 'itl'), 1e3, 0)} |")  # fmt: skip
    return rows


PROBE_HEAD = ("| mix | policy | req/s | p95 TTFT measured (s) | sim (s) | p95 ITL measured (ms) "
              "| sim (ms) |\n|---|---|---:|---:|---:|---:|---:|")  # fmt: skip


# ------------------------------------------------------------ real server


#: ``--fit-timeline``: steps the server's timeline keeps (a 15-min search at
#: 20-60 ms a step fits; the engine sends the newer part when it is larger
#: than a frame).
TIMELINE_STEPS = 40000


#: With ``--real-from-sim``: the real search starts at this share of the
#: simulator's capacity and ramps by :data:`NEAR_FACTOR`, so that its probes
#: land near the answer and bisect to a narrow bracket in the same time.
NEAR_START, NEAR_FACTOR = 0.8, 1.25


def real_capacity(policy: Policy, mix: str, args: argparse.Namespace,
                  out_dir: Path, sim: float | None = None) -> tuple[dict, dict | None]:
    """Start ``paternoster serve`` with ``policy`` and search its capacity with
    ``paternoster bench capacity``: from ``args.start`` doubling, or with
    ``args.real_from_sim`` and a simulator capacity ``sim``, from
    ``NEAR_START * sim`` by ``NEAR_FACTOR`` (the search itself, pass or fail
    per probe, is the same).

    Returns:
        (the search JSON it writes, and with ``args.fit_timeline`` the server's
        timeline snapshot taken after the search (saved next to the JSON), else
        ``None``).
    """
    near = args.real_from_sim and sim is not None
    plan = peer_servers.CapacityPlan(
        start=round(NEAR_START * sim, 2) if near else args.start,
        factor=NEAR_FACTOR if near else 2.0, probe_duration=args.probe_duration,
        probe_requests=args.probe_requests,
        max_duration=args.max_duration, bisect_rounds=args.real_bisect_rounds,
        warmup=args.warmup, slo_ttft_p95=args.slo_ttft_p95, slo_itl_p95=args.slo_itl_p95,
        mix=mix, seed=args.seed,
    )  # fmt: skip
    port = peer_servers.free_port()
    cmd = [peer_servers.paternoster_cli(), "serve", "--port", str(port), "--num-threads",
           str(args.num_threads), *policy.serve_args(), *args.serve_args]  # fmt: skip
    if args.fit_timeline:
        cmd += ["--timeline-size", str(TIMELINE_STEPS), "--timeline-sample-rate", "1"]
    name = policy.label.replace(" ", "-")
    with peer_servers.running_server(cmd, port, out_dir / f"{name}.log", 600) as url:
        search = peer_servers.run_capacity(plan, url, args.max_model_len,
                                           out_dir / f"{name}.json")  # fmt: skip
        if not args.fit_timeline:
            return search, None
        from paternoster.simulate.timeline_fit import load_snapshot

        snapshot = load_snapshot(url)
    (out_dir / f"{name}.timeline.json").write_text(json.dumps(snapshot))
    return search, snapshot


def server_fit_row(policy: Policy, mix: str, spec: str, search: dict, snapshot: dict,
                   plan: SearchPlan, objectives: Objectives, args: argparse.Namespace,
                   calibrated_capacity: float | None) -> tuple[str, dict]:  # fmt: skip
    """Fit the cost model to the server's own steps (``simulate --fit-timeline``)
    and search the simulator's capacity with it: the simulator's queueing model
    judged with the server's step times.

    Returns:
        (a markdown row for :data:`FIT_HEAD`, the JSON record).
    """
    from paternoster.simulate.timeline_fit import fit_timeline

    fit = fit_timeline(snapshot, source=f"server timeline: {mix} {policy.label}")
    res = sim_capacity(policy, spec, plan, objectives, args, fit.cost_model)
    m = search.get("capacity")

    def over(c: float | None) -> str:
        return f"{c / m:.2f}" if c and m else "-"

    row = (f"| {mix} | {policy.label} | {_cap(m)} | {over(calibrated_capacity)} | "
           f"{_cap(res.capacity)} | {over(res.capacity)} | {fit.num_steps} | {fit.r2:.3f} | "
           f"{fit.cost_model.step_noise:.3f} | {fit.cost_model.overhead * 1e3:.1f} |")
    record = {"cost_model": fit.cost_model.to_dict(), "r2": fit.r2, "num_steps": fit.num_steps,
              "num_skipped": fit.num_skipped, "report": fit.report(), "sim": res.to_dict()}
    print(f"server fit {mix} {policy.label}: {fit.report()}; sim capacity "
          f"{_cap(res.capacity)} req/s", flush=True)
    return row, record


FIT_HEAD = ("| mix | policy | measured (req/s) | sim calibrated / measured | "
            "sim on server steps (req/s) | sim on server steps / measured | steps fitted | "
            "R² | step noise | overhead (ms) |\n|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")


# ----------------------------------------------------------------- report


def _cap(x: float | None) -> str:
    return "none" if x is None else f"{x:g}"


def _ratios(caps: dict[str, float | None]) -> dict[str, float | None]:
    """Each capacity over the better of fcfs and the best chunked_prefill."""
    base = max((c for k, c in caps.items() if k != "slo" and c is not None), default=None)
    return {k: (c / base if c is not None and base else None) for k, c in caps.items()}


def table(mix: str, sim: dict[str, float | None], real: dict[str, float | None]) -> str:
    """Markdown: per policy the simulated capacity and ratio, and the measured
    ones with the simulator's error when there are any."""
    rs, rr = _ratios(sim), _ratios(real) if real else {}
    head = "| mix | policy | sim capacity (req/s) | sim ratio |"
    sep = "|---|---|---:|---:|"
    if real:
        head += " measured (req/s) | measured ratio | sim / measured |"
        sep += "---:|---:|---:|"
    lines = [head, sep]
    for k, c in sim.items():
        row = f"| {mix} | {k} | {_cap(c)} | {_fmt_ratio(rs[k])} |"
        if real:
            m = real.get(k)
            err = f"{c / m:.2f}" if c and m else "-"
            row += f" {_cap(m)} | {_fmt_ratio(rr.get(k))} | {err} |"
        lines.append(row)
    return "\n".join(lines)


def _fmt_ratio(r: float | None) -> str:
    return "-" if r is None else f"{r:.2f}×"


# ------------------------------------------------------------------- main


def _json_object(text: str) -> dict:
    """``--slo-config``'s value: a JSON object.

    Raises:
        argparse.ArgumentTypeError: anything else (argparse prints it as a
            usage error naming the option).
    """
    try:
        value = json.loads(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"not valid JSON ({e}): {text!r}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"must be a JSON object, got {text!r}")
    return value


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (module doc)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--mixes", default="cpu,long", help="cpu, long or both (comma-separated)")
    ap.add_argument("--chunks", default="128,256,512,2048",
                    help="chunked_prefill token budgets (comma-separated)")  # fmt: skip
    ap.add_argument("--slo-ttft-p95", type=float, default=2.0, help="seconds")
    ap.add_argument("--slo-itl-p95", type=float, default=0.2, help="seconds")
    ap.add_argument("--start", type=float, default=0.5, help="first rate (req/s)")
    ap.add_argument("--probe-duration", type=float, default=60.0, metavar="S",
                    help="seconds of arrivals per probe: a probe at rate r sends r x S "
                         "requests (at least --probe-requests)")  # fmt: skip
    ap.add_argument("--probe-requests", type=int, default=50,
                    help="fewest requests per probe")  # fmt: skip
    ap.add_argument("--bisect-rounds", type=int, default=6,
                    help="bisection rounds of the simulated search after its ramp")  # fmt: skip
    ap.add_argument("--seed", type=int, default=0, help="seed of the mix and the arrivals")
    ap.add_argument("--slo-config", type=_json_object, default={},
                    help="more slo options, JSON (e.g. '{\"margin\": 0.05}')")  # fmt: skip
    ap.add_argument("--policies", default=None,
                    help="only these labels, comma-separated (e.g. fcfs,slo)")  # fmt: skip
    ap.add_argument("--max-model-len", type=int, default=DEFAULT_MAX_MODEL_LEN,
                    help="context (tokens) the prompts are fitted to")  # fmt: skip
    ap.add_argument("--cost-model", default=None,
                    help="cost model JSON (default: calibrated default, or with --real "
                         "calibrated now at --num-threads)")  # fmt: skip
    ap.add_argument("--out", default=None, help="directory (default build/slo_capacity/<time>)")
    ap.add_argument("--ceiling", action="store_true",
                    help="also simulate each policy with the queue full: what it finishes "
                         "per second then is the most it can sustain (a capacity found with "
                         "short probes can sit a little above it: a backlog shows only "
                         "after the probe)")  # fmt: skip
    ap.add_argument("--ceiling-requests", type=int, default=1500,
                    help=f"requests per --ceiling run (at least {MIN_CEILING_REQUESTS}: a "
                         "shorter run has no steady stretch with the queue full)")  # fmt: skip
    g = ap.add_argument_group("real servers (--real)")
    g.add_argument("--real", action="store_true", help="also measure on the real server")
    g.add_argument("--num-threads", type=int, default=1, help="engine threads (and calibration)")
    g.add_argument("--real-bisect-rounds", type=int, default=3,
                   help="bisection rounds of each real search")  # fmt: skip
    g.add_argument("--real-from-sim", action="store_true",
                   help=f"start each real search at {NEAR_START:g} x the simulator's capacity, "
                        f"ramping by {NEAR_FACTOR:g} (a narrower bracket in the same time)")
    g.add_argument("--max-duration", type=float, default=900.0, help="seconds per search")
    g.add_argument("--warmup", type=int, default=4, help="warm-up requests per server")
    g.add_argument("--serve-args", default="", help="more `paternoster serve` flags, one string")
    g.add_argument("--fit-timeline", action="store_true",
                   help="record each server's timeline, fit the cost model to its steps and "
                        "search the simulator's capacity with that model too")  # fmt: skip
    g.add_argument("--sim-at-real", default=None, metavar="DIR",
                   help="no search: the simulator at each load a finished --real run in DIR "
                        "probed (its cost model, mixes and policies), next to the measured "
                        "p95s")  # fmt: skip
    args = ap.parse_args(argv)
    args.mixes = [m.strip() for m in args.mixes.split(",") if m.strip()]
    bad = sorted(set(args.mixes) - set(MIXES))
    if bad:
        ap.error(f"unknown mixes {bad}; choose from {sorted(MIXES)}")
    try:
        args.chunks = [int(c) for c in args.chunks.split(",") if c.strip()]
    except ValueError:
        ap.error(f"--chunks must be token budgets (integers), comma-separated, "
                 f"got {args.chunks!r}")  # fmt: skip
    if any(c < 1 for c in args.chunks):
        ap.error(f"--chunks must be token budgets >= 1, got {args.chunks}")
    floors = {"start": (0.0, "> 0"), "probe_duration": (0.0, "> 0"),
              "probe_requests": (0.5, ">= 1"), "bisect_rounds": (-0.5, ">= 0"),
              "real_bisect_rounds": (-0.5, ">= 0"),
              "slo_ttft_p95": (0.0, "a finite number > 0"),
              "slo_itl_p95": (0.0, "a finite number > 0")}  # fmt: skip
    for name, (floor, rule) in floors.items():
        v = getattr(args, name)
        if not v > floor or (name.startswith("slo_") and not math.isfinite(v)):
            ap.error(f"--{name.replace('_', '-')} must be {rule}, got {v}")
    # The slo policy's options as it will get them (policies()), checked now,
    # not by the first simulated probe.
    from paternoster.scheduling.registry import load_scheduler_class

    slo = {"ttft_s": args.slo_ttft_p95, "itl_s": args.slo_itl_p95, **args.slo_config}
    try:
        load_scheduler_class("slo").check_options(slo)
    except ValueError as e:
        ap.error(f"--slo-config: {e}")
    if args.cost_model is not None:
        from paternoster.scheduling.cost_model import CostModel

        if not args.cost_model.strip():
            ap.error(f"--cost-model needs a JSON file's path, got {args.cost_model!r}")
        try:
            CostModel.load(args.cost_model)
        except ValueError as e:
            ap.error(f"--cost-model: {e}")
    if args.ceiling_requests < MIN_CEILING_REQUESTS:
        ap.error(f"--ceiling-requests must be >= {MIN_CEILING_REQUESTS}, got "
                 f"{args.ceiling_requests}")  # fmt: skip
    if args.policies:
        labels = policies(args.chunks, Objectives(1.0, 1.0), {})
        known = {p.label for p in labels} | {p.scheduler for p in labels}
        unknown = sorted({p.strip() for p in args.policies.split(",")} - known)
        if unknown:
            ap.error(f"--policies: unknown {unknown}; choose from {sorted(known)}")
    args.serve_args = args.serve_args.split()
    return args


def _cost_model(args: argparse.Namespace, out_dir: Path):
    """The cost model to simulate with (module doc), and the JSON file it is
    in (``None`` for the built-in default); a calibration is saved there."""
    from paternoster.scheduling.cost_model import DEFAULT_COST_MODEL, CostModel

    if args.cost_model:
        return CostModel.load(args.cost_model), str(Path(args.cost_model).resolve())
    if not args.real:
        return DEFAULT_COST_MODEL, None
    from paternoster.simulate.calibrate import calibrate

    cal = calibrate(num_threads=args.num_threads, log=print)
    print(cal.report(), flush=True)
    path = (out_dir / "cost_model.json").resolve()
    cal.cost_model.save(path)
    return cal.cost_model, str(path)


def sim_at_real(run_dir: Path, args: argparse.Namespace) -> str:
    """The probe table (:func:`probe_rows`) of the finished ``--real`` run in
    ``run_dir``: its cost model, its mixes, every policy it measured."""
    from paternoster.scheduling.cost_model import CostModel

    results = json.loads((run_dir / "results.json").read_text())
    cost_model = CostModel.load(run_dir / "cost_model.json")
    objectives = Objectives(args.slo_ttft_p95, args.slo_itl_p95)
    slo = {"cost_model": str((run_dir / "cost_model.json").resolve()), **args.slo_config}
    by_label = {p.label: p for p in policies(args.chunks, objectives, slo)}
    lines = []
    for mix, per_policy in results["mixes"].items():
        spec = results.get("mix_specs", {}).get(mix, MIXES[mix])
        for label, res in per_policy.items():
            if "real" in res and label in by_label:
                sims = [sim_probe(by_label[label], spec, pr["load"], args, cost_model)
                        for pr in res["real"].get("probes", [])]  # fmt: skip
                lines += probe_rows(label, mix, res["real"], sims)
    return "\n".join([PROBE_HEAD, *lines])


def main(argv: list[str] | None = None) -> int:
    """Run the searches and print one table per mix; 1 on a server failure."""
    args = parse_args(argv)
    if args.sim_at_real:
        print(sim_at_real(Path(args.sim_at_real), args))
        return 0
    objectives = Objectives(args.slo_ttft_p95, args.slo_itl_p95)
    plan = SearchPlan("rate", args.start, 2.0, args.bisect_rounds, 0.02)
    out_dir = Path(args.out or f"build/slo_capacity/{time.strftime('%Y%m%d-%H%M%S')}")
    out_dir.mkdir(parents=True, exist_ok=True)
    cost_model, cost_model_path = _cost_model(args, out_dir)
    slo_config = dict(args.slo_config)
    if cost_model_path is not None:  # slo plans with the model the simulator runs on
        slo_config.setdefault("cost_model", cost_model_path)
    contenders = policies(args.chunks, objectives, slo_config)
    if args.policies:
        keep = {p.strip() for p in args.policies.split(",")}
        contenders = [p for p in contenders if p.label in keep or p.scheduler in keep]
    results: dict = {"cost_model": cost_model.to_dict(), "mixes": {}}
    tables = []
    mixes = scaled_mixes(cost_model, args.slo_ttft_p95)
    print(f"machine scale {machine_scale(cost_model, args.slo_ttft_p95):.3f} (the long "
          "prompts' lengths are scaled by it, so that the longest fits the TTFT objective "
          "alone on this cost model)", flush=True)
    results["mix_specs"] = {m: mixes[m] for m in args.mixes}
    probe_lines: list[str] = []
    fit_lines: list[str] = []
    for mix in args.mixes:
        print(f"mix {mix}: {mixes[mix]}", flush=True)
        sim: dict[str, float | None] = {}
        real: dict[str, float | None] = {}
        for p in contenders:
            t0 = time.monotonic()
            res = sim_capacity(p, mixes[mix], plan, objectives, args, cost_model)
            sim[p.label] = res.capacity
            print(f"sim {mix} {p.label}: {_cap(res.capacity)} req/s "
                  f"({len(res.probes)} probes, {time.monotonic() - t0:.1f} s)", flush=True)
            results["mixes"].setdefault(mix, {})[p.label] = {"sim": res.to_dict()}
        if args.real:
            for p in contenders:
                try:
                    search, snapshot = real_capacity(p, mixes[mix], args, out_dir / mix,
                                                     sim[p.label])
                except (RuntimeError, ValueError) as e:
                    print(f"real {mix} {p.label}: {e}", file=sys.stderr)
                    return 1
                real[p.label] = search.get("capacity")
                results["mixes"][mix][p.label]["real"] = search
                sims = [sim_probe(p, mixes[mix], pr["load"], args, cost_model)
                        for pr in search.get("probes", [])]  # fmt: skip
                results["mixes"][mix][p.label]["sim_at_real_loads"] = sims
                probe_lines += probe_rows(p.label, mix, search, sims)
                if snapshot is not None:
                    row, record = server_fit_row(p, mix, mixes[mix], search, snapshot, plan,
                                                 objectives, args, sim[p.label])  # fmt: skip
                    fit_lines.append(row)
                    results["mixes"][mix][p.label]["server_fit"] = record
                print(f"real {mix} {p.label}: {_cap(real[p.label])} req/s "
                      f"({peer_servers.describe_probes(search)})", flush=True)
        tables.append(table(mix, sim, real))
        if args.ceiling:
            ceilings = {p.label: sim_ceiling(p, mixes[mix], sim[p.label], args, cost_model)
                        for p in contenders}  # fmt: skip
            for label, c in ceilings.items():
                results["mixes"][mix][label]["sim_ceiling"] = c
            tables.append(ceiling_table(mix, sim, ceilings))
    if probe_lines:
        tables.append("\n".join([PROBE_HEAD, *probe_lines]))
    if fit_lines:
        tables.append("\n".join([FIT_HEAD, *fit_lines]))
    report = "\n\n".join(tables)
    (out_dir / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    (out_dir / "table.md").write_text(report + "\n")
    specs = "; ".join(f"{m}: {mixes[m]}" for m in args.mixes)
    print(f"\np95 TTFT <= {args.slo_ttft_p95:g} s, p95 ITL <= {args.slo_itl_p95:g} s; "
          f"cost model: {cost_model.source}; mixes: {specs}; JSON in {out_dir}\n\n{report}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
