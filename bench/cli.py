"""``paternoster bench serve`` and ``paternoster bench capacity``.

``serve`` drives an OpenAI-compatible endpoint (Paternoster's or any other)
with a workload at a request rate or a concurrency, streams every response and
reports throughput, TTFT / TPOT / ITL / E2E percentiles, errors and goodput;
optionally a JSON result file and a latency CDF PNG. ``capacity`` repeats such
runs at rising loads, then bisects, to find the highest load at which p95 TTFT
and p95 ITL hold their objectives (see :mod:`paternoster.bench.capacity`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import sys
from dataclasses import asdict, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from paternoster.bench.stats import SLOs
from paternoster.bench.workload import BenchRequest

if TYPE_CHECKING:
    from paternoster.bench.serve import ServeConfig

#: Tokens kept free of the context when fitting prompts: the chat template's
#: own tokens (chat) or a BOS (completions).
_CONTEXT_RESERVE = {"chat": 64, "completions": 8}


_SERVE_DOC = (
    "Send a workload to an OpenAI-compatible endpoint at a request rate (Poisson or gamma "
    "arrivals) or a concurrency, stream every response, and report request and token "
    "throughput, TTFT / TPOT / ITL / E2E mean and percentiles, errors and goodput. "
    "Times follow vLLM's benchmark_serving; see docs/benchmarks.md."
)
_CAPACITY_DOC = (
    "Run serving-benchmark probes at rising loads (request rate or concurrency), then bisect, "
    "and report the highest load at which p95 TTFT and p95 ITL hold their objectives. "
    "Bounded by --max-duration and --max-requests."
)


def _add_endpoint_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("endpoint")
    g.add_argument(
        "--base-url",
        default="http://127.0.0.1:8000",
        help="server root URL (default: %(default)s; a trailing /v1 is dropped)",
    )
    g.add_argument(
        "--api",
        choices=["completions", "chat"],
        default="completions",
        help="OpenAI API to call (default: completions)",
    )
    g.add_argument(
        "--endpoint",
        default=None,
        help="request path (default: /v1/completions or /v1/chat/completions)",
    )
    g.add_argument("--model", default=None, help="model id (default: the first of GET /v1/models)")
    g.add_argument(
        "--api-key",
        default=os.environ.get("OPENAI_API_KEY"),
        help="bearer token (default: $OPENAI_API_KEY)",
    )
    g.add_argument(
        "--timeout",
        type=float,
        default=600.0,
        help="seconds one request may take before it counts as an error",
    )


def _add_workload_args(p: argparse.ArgumentParser, num_prompts: int | None) -> None:
    g = p.add_argument_group("workload")
    g.add_argument(
        "--dataset",
        default="mix",
        metavar="mix|random|jsonl:PATH",
        help="request source (default: mix)",
    )
    if num_prompts is not None:
        g.add_argument(
            "--num-prompts",
            type=int,
            default=None,
            help=f"requests to send (default: {num_prompts}; jsonl: every line)",
        )
    g.add_argument(
        "--mix",
        default=None,
        metavar="TAG=SHARE:PLO-PHI:OLO-OHI,...",
        help="mix classes with prompt/output token ranges (default: "
        "short=0.6:16-256:8-64,summary=0.25:512-2048:64-256,"
        "long_gen=0.1:16-128:256-768,long_prompt=0.05:2048-4096:8-64)",
    )
    g.add_argument("--input-len", type=int, default=256, help="random: prompt tokens")
    g.add_argument(
        "--output-len",
        type=int,
        default=128,
        help="random: output tokens; jsonl: for lines without output_len",
    )
    g.add_argument(
        "--range-ratio", type=float, default=0.0, help="random: lengths uniform in len*(1±ratio)"
    )
    g.add_argument(
        "--tokenizer",
        default=None,
        metavar="DIR",
        help="HF tokenizer for exact prompt token counts (default: ~1 token/word)",
    )
    g.add_argument(
        "--max-model-len",
        type=int,
        default=None,
        help="fit requests into this context (default: from GET /v1/models)",
    )
    g.add_argument(
        "--prefix-len",
        type=int,
        default=0,
        help="tokens of one shared prefix put before every prompt (a system prompt; "
        "vLLM's --random-prefix-len; exercises prefix caching)",
    )
    g.add_argument("--seed", type=int, default=0, help="seed of prompts, lengths and arrivals")
    g.add_argument(
        "--ignore-eos",
        action="store_true",
        help="send ignore_eos so every request generates its output length",
    )
    g.add_argument("--temperature", type=float, default=0.0, help="sampling temperature")
    g.add_argument(
        "--extra-body",
        default=None,
        metavar="JSON",
        help="more fields for every request body, e.g. '{\"top_p\": 0.9}'",
    )
    g.add_argument(
        "--warmup",
        type=int,
        default=0,
        help="requests sent (4 at a time) and discarded before measuring",
    )
    g.add_argument("--no-progress", action="store_true", help="no progress bar")


def add_bench_args(parser: argparse.ArgumentParser) -> None:
    """Add the ``serve`` and ``capacity`` subcommands to ``parser`` (the
    ``paternoster bench`` subparser)."""
    sub = parser.add_subparsers(dest="bench_command", required=True)
    s = sub.add_parser(
        "serve",
        help="benchmark an OpenAI-compatible endpoint",
        description=_SERVE_DOC,
    )
    _add_endpoint_args(s)
    _add_workload_args(s, num_prompts=100)
    g = s.add_argument_group("load")
    g.add_argument(
        "--request-rate",
        type=float,
        default=math.inf,
        help="mean requests/s (default: inf = all at once)",
    )
    g.add_argument(
        "--burstiness",
        type=float,
        default=1.0,
        help="gamma shape of inter-arrival gaps: 1 Poisson, <1 burstier",
    )
    g.add_argument("--max-concurrency", type=int, default=None, help="most requests in flight")
    g.add_argument(
        "--trace-timing",
        action="store_true",
        help="jsonl: send at each line's arrival_time (seconds)",
    )
    g = s.add_argument_group("goodput SLOs (seconds)")
    g.add_argument("--slo-ttft", type=float, default=None, help="time to first token")
    g.add_argument("--slo-itl", type=float, default=None, help="every inter-token gap")
    g.add_argument("--slo-tpot", type=float, default=None, help="time per output token")
    g.add_argument("--slo-e2e", type=float, default=None, help="end-to-end latency")
    g = s.add_argument_group("output")
    g.add_argument("--json", default=None, metavar="OUT", help="write the result JSON here")
    g.add_argument("--cdf-png", default=None, metavar="OUT", help="write latency CDFs here")

    c = sub.add_parser(
        "capacity",
        help="find the highest load within p95 TTFT/ITL objectives",
        description=_CAPACITY_DOC,
    )
    _add_endpoint_args(c)
    _add_workload_args(c, num_prompts=None)
    g = c.add_argument_group("objectives")
    g.add_argument("--slo-ttft-p95", type=float, required=True, help="p95 TTFT (s)")
    g.add_argument("--slo-itl-p95", type=float, required=True, help="p95 ITL (s)")
    g.add_argument(
        "--max-error-rate",
        type=float,
        default=0.0,
        help="largest tolerated errors/sent in a passing probe (default 0)",
    )
    g = c.add_argument_group("search")
    g.add_argument(
        "--mode",
        choices=["rate", "concurrency"],
        default="rate",
        help="step the request rate (Poisson/gamma) or the concurrency",
    )
    g.add_argument("--start", type=float, default=1.0, help="first load (req/s or concurrency)")
    g.add_argument("--factor", type=float, default=2.0, help="ramp multiplier")
    g.add_argument("--bisect-rounds", type=int, default=4, help="most bisection probes")
    g.add_argument(
        "--tolerance",
        type=float,
        default=0.05,
        help="rate: stop bisecting when the bracket is this narrow (relative)",
    )
    g.add_argument("--max-load", type=float, default=None, help="never probe above this load")
    g.add_argument("--min-load", type=float, default=None, help="never probe below this load")
    g.add_argument(
        "--probe-requests",
        type=int,
        default=50,
        help="requests per probe (concurrency mode: at least 3 x concurrency)",
    )
    g.add_argument(
        "--probe-duration",
        type=float,
        default=None,
        metavar="S",
        help="rate mode: at least rate x S requests per probe",
    )
    g.add_argument("--burstiness", type=float, default=1.0, help="rate mode: gamma shape")
    g.add_argument("--max-concurrency", type=int, default=None, help="rate mode: in-flight cap")
    g.add_argument(
        "--max-duration",
        type=float,
        default=600.0,
        help="seconds for the whole search (plus the last requests' timeout)",
    )
    g.add_argument("--max-requests", type=int, default=2000, help="requests for the whole search")
    g = c.add_argument_group("output")
    g.add_argument("--json", default=None, metavar="OUT", help="write the search JSON here")
    g.add_argument("--png", default=None, metavar="OUT", help="write the p95 curve here")


# ----------------------------------------------------------------- workload


class _Workload:
    """Builds the first ``n`` requests of the configured workload (seeded, so
    a longer list starts with the shorter one)."""

    def __init__(self, args: argparse.Namespace, max_model_len: int | None) -> None:
        from paternoster.bench.workload import DEFAULT_MIX, parse_mix

        self.args = args
        self.tokenizer = None
        if args.tokenizer:
            from transformers import AutoTokenizer

            self.tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
        self.max_len = None
        if max_model_len is not None:
            fit = max_model_len - _CONTEXT_RESERVE[args.api] - max(0, args.prefix_len)
            self.max_len = max(2, fit if self.tokenizer else int(fit * 0.9))
        if args.prefix_len < 0:
            raise ValueError(f"--prefix-len must be >= 0, got {args.prefix_len}")
        self.prefix = ""
        if args.prefix_len:
            from paternoster.bench.workload import PromptMaker

            self.prefix = PromptMaker(self.tokenizer, args.seed + 7919).make(args.prefix_len)
        self.mix = parse_mix(args.mix) if args.mix else DEFAULT_MIX
        ds = args.dataset
        if ds not in ("mix", "random") and not ds.startswith("jsonl:"):
            raise ValueError(f"--dataset must be mix, random or jsonl:PATH, got {ds!r}")
        self.trace: list[BenchRequest] | None = None
        if ds.startswith("jsonl:"):
            from paternoster.bench.workload import PromptMaker, load_jsonl

            maker = PromptMaker(self.tokenizer, args.seed)
            self.trace = load_jsonl(ds[6:], maker, args.output_len, self.max_len)

    def describe(self) -> dict:
        """The workload settings, JSON-ready."""
        a = self.args
        d: dict[str, Any] = {
            "dataset": a.dataset,
            "seed": a.seed,
            "tokenizer": a.tokenizer,
            "max_model_len_fitted": self.max_len,
            "prefix_len": a.prefix_len,
        }
        if a.dataset == "mix":
            d["mix"] = [asdict(c) for c in self.mix]
        elif a.dataset == "random":
            d.update(input_len=a.input_len, output_len=a.output_len, range_ratio=a.range_ratio)
        return d

    def num_literal_prompts(self) -> int:
        """JSONL lines with a literal ``prompt`` (sent as written in every
        probe, so a later probe finds them in the server's prefix cache); 0
        for the made-up workloads."""
        if self.trace is None:
            return 0
        other = self.make(len(self.trace), text_key=2**31 - 1)  # a key no probe gets
        return sum(a.prompt == b.prompt for a, b in zip(self.trace, other))

    def default_size(self) -> int:
        """Requests in a JSONL trace, else 100."""
        return len(self.trace) if self.trace is not None else 100

    def make(self, n: int, seed_offset: int = 0, text_key: int | None = None
             ) -> list[BenchRequest]:  # fmt: skip
        """``n`` requests (a JSONL trace is cycled when shorter).

        Args:
            n: how many.
            seed_offset: added to ``--seed`` for lengths, arrivals and text.
            text_key: ``None``: the text is seeded like the lengths. An int
                ``k``: the same lengths with text from an independent stream
                ``(seed, k)``, so that requests made with different keys share
                no prompt prefix (each capacity probe gets its own key: a
                repeated prompt would be served from the server's prefix cache
                and the probe would measure cache hits, not prefill).
        """
        from paternoster.bench.workload import PromptMaker, make_mix, make_random

        if n < 1:
            raise ValueError(f"the number of requests must be >= 1, got {n}")
        if self.trace is not None:
            trace = self.trace
            if text_key is not None:  # prompt_len lines get fresh text; literal prompts stay
                from paternoster.bench.workload import load_jsonl

                maker = PromptMaker(self.tokenizer, (self.args.seed, text_key))
                trace = load_jsonl(self.args.dataset[6:], maker, self.args.output_len,
                                   self.max_len)  # fmt: skip
            return [trace[i % len(trace)] for i in range(n)]
        a, seed = self.args, self.args.seed + seed_offset
        maker = PromptMaker(self.tokenizer, seed if text_key is None else (seed, text_key))
        if a.dataset == "random":
            reqs = make_random(
                n, maker, a.input_len, a.output_len, a.range_ratio, self.max_len, seed
            )
        else:
            reqs = make_mix(n, maker, self.mix, self.max_len, seed)
        if self.prefix:
            from paternoster.bench.workload import with_shared_prefix

            reqs = with_shared_prefix(reqs, self.prefix, a.prefix_len)
        return reqs


def _resolve_model(args: argparse.Namespace) -> tuple[str, int | None]:
    """The model id and context length (tokens): from the flags, else GET /v1/models.

    Raises:
        ValueError: no ``--model`` and the server cannot be asked.
    """
    from paternoster.bench.serve import fetch_model_info

    if args.model is not None and args.max_model_len is not None:
        return args.model, args.max_model_len
    try:
        info = fetch_model_info(args.base_url, args.api_key)
    except ValueError:
        if args.model is None:
            raise
        return args.model, args.max_model_len  # measure anyway: errors get counted
    max_len = args.max_model_len or info.get("max_model_len")
    return args.model or info["id"], int(max_len) if max_len else None


def _serve_config(args: argparse.Namespace, model: str, **load: Any) -> ServeConfig:
    from paternoster.bench.serve import ServeConfig

    extra = json.loads(args.extra_body) if args.extra_body else {}
    if not isinstance(extra, dict):
        raise ValueError("--extra-body must be a JSON object")
    return ServeConfig(
        base_url=args.base_url,
        model=model,
        api=args.api,
        endpoint=args.endpoint,
        seed=args.seed,
        temperature=args.temperature,
        ignore_eos=args.ignore_eos,
        extra_body=extra,
        timeout=args.timeout,
        api_key=args.api_key,
        progress=not args.no_progress,
        **load,
    )


def _warm_up(args: argparse.Namespace, config: ServeConfig, workload: _Workload) -> None:
    from paternoster.bench.serve import warm_up

    if args.warmup > 0:
        failed = asyncio.run(warm_up(config, workload.make(args.warmup, seed_offset=1000)))
        print(f"warm-up: {args.warmup} requests, {failed} failed", file=sys.stderr)


def _write_json(path: str, data: dict) -> None:
    from paternoster.bench.serve import jsonable

    Path(path).write_text(json.dumps(jsonable(data), indent=1, allow_nan=False) + "\n")


# ---------------------------------------------------------------- commands


def _run_serve(args: argparse.Namespace) -> int:
    from paternoster.bench.report import describe_load, format_summary, plot_cdf
    from paternoster.bench.serve import run_serve

    slos = SLOs(args.slo_ttft, args.slo_itl, args.slo_tpot, args.slo_e2e)
    model, max_len = _resolve_model(args)
    workload = _Workload(args, max_len)
    if args.trace_timing and workload.trace is None:
        raise ValueError("--trace-timing needs --dataset jsonl:PATH")
    config = _serve_config(
        args,
        model,
        request_rate=args.request_rate,
        burstiness=args.burstiness,
        max_concurrency=args.max_concurrency,
        trace_timing=args.trace_timing,
        slos=slos,
    )
    n = args.num_prompts if args.num_prompts is not None else workload.default_size()
    if args.trace_timing and n > workload.default_size():
        raise ValueError(f"--trace-timing: --num-prompts {n} is more than the trace's requests")
    requests = workload.make(n)
    _warm_up(args, config, workload)
    result = asyncio.run(run_serve(config, requests, desc="bench serve"))
    result.workload = {**workload.describe(), "num_prompts": n}
    print(format_summary(result), end="")
    if args.json:
        _write_json(args.json, result.to_dict())
        print(f"result JSON: {args.json}")
    if args.cdf_png:
        load = describe_load(
            args.request_rate, args.burstiness, args.max_concurrency, args.trace_timing
        )
        title = f"{model}: {result.summary['num_completed']} requests, {load}"
        plot_cdf(result.records, args.cdf_png, slos.active(), title)
        print(f"latency CDFs: {args.cdf_png}")
    return 0 if result.summary["num_completed"] > 0 else 1


def _run_capacity(args: argparse.Namespace) -> int:
    from paternoster.bench.capacity import Objectives, Probe, SearchPlan, find_capacity
    from paternoster.bench.report import format_probe, plot_capacity, probe_header
    from paternoster.bench.serve import run_serve

    objectives = Objectives(args.slo_ttft_p95, args.slo_itl_p95, args.max_error_rate)
    plan = SearchPlan(
        args.mode,
        args.start,
        args.factor,
        args.bisect_rounds,
        args.tolerance,
        args.max_load,
        args.min_load,
    )
    if args.probe_requests < 1:
        raise ValueError(f"--probe-requests must be >= 1, got {args.probe_requests}")
    model, max_len = _resolve_model(args)
    workload = _Workload(args, max_len)
    base = _serve_config(
        args, model, burstiness=args.burstiness, max_concurrency=args.max_concurrency
    )
    _warm_up(args, base, workload)
    rate_mode = args.mode == "rate"
    num_probes = 0

    def probe(load: float, time_left: float | None, req_left: int | None):
        if rate_mode:
            n = args.probe_requests
            if args.probe_duration:
                n = max(n, math.ceil(load * args.probe_duration))
            config = replace(base, request_rate=load)
        else:
            n = max(args.probe_requests, 3 * int(load))
            config = replace(base, request_rate=math.inf, max_concurrency=int(load))
        cap = n if req_left is None else min(n, req_left)
        if cap < min(n, 2):
            return None
        nonlocal num_probes
        num_probes += 1  # fresh prompt text per probe: no prefix-cache hits across probes
        unit = "req/s" if rate_mode else "concurrent"
        res = asyncio.run(
            run_serve(config, workload.make(cap, text_key=num_probes), time_left,
                      f"probe {load:g} {unit}")
        )
        return res.summary, cap < n or res.summary["num_not_sent"] > 0

    literal = workload.num_literal_prompts()
    if literal:
        print(f"note: {literal} JSONL prompts are literal text, sent as written in every "
              "probe: after the first probe the server serves them from its prefix cache "
              "(use prompt_len lines, which get fresh text per probe)")
    print(f"capacity search on {base.url} (model {model}), {args.mode} mode")
    print(probe_header(args.mode), end="", flush=True)
    count = 0

    def on_probe(p: Probe) -> None:
        nonlocal count
        count += 1
        print(format_probe(count, p), end="", flush=True)

    result = find_capacity(
        plan, objectives, probe, args.max_duration, args.max_requests, on_probe=on_probe
    )
    unit = "req/s" if rate_mode else "concurrent requests"
    if result.capacity is None:
        print(f"capacity: no probed load held the objectives (stopped: {result.stopped})")
    else:
        above = f", first failing {result.first_fail:g}" if result.first_fail else ""
        print(
            f"capacity: {result.capacity:g} {unit} with p95 TTFT <= {objectives.ttft_p95:g} s "
            f"and p95 ITL <= {objectives.itl_p95:g} s{above} "
            f"({len(result.probes)} probes, {result.elapsed:.0f} s, stopped: {result.stopped})"
        )
    if args.json:
        config = base.to_dict()
        config["request_rate" if rate_mode else "max_concurrency"] = None  # per probe
        data = {
            "config": config,
            "workload": workload.describe(),
            **result.to_dict(),
        }
        _write_json(args.json, data)
        print(f"search JSON: {args.json}")
    if args.png:
        plot_capacity(result, args.png)
        print(f"capacity curve: {args.png}")
    return 0


def run(args: argparse.Namespace) -> int:
    """Run ``paternoster bench serve`` or ``paternoster bench capacity``.

    Returns:
        0 on success; 1 when ``serve`` completed no request; 2 on a usage or
        input error (printed to stderr); 130 when interrupted.
    """
    base = args.base_url.rstrip("/")
    args.base_url = base[: -len("/v1")] if base.endswith("/v1") else base
    try:
        if args.bench_command == "serve":
            return _run_serve(args)
        return _run_capacity(args)
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


def main(argv: list[str] | None = None) -> int:
    """``python -m paternoster.bench.cli serve|capacity ...``."""
    parser = argparse.ArgumentParser(prog="paternoster bench")
    add_bench_args(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
