"""``paternoster simulate`` (also ``python -m paternoster.simulate``).

Runs scheduler policies on a trace (JSONL or a synthetic mix) with a cost
model instead of a model, prints a summary table (and, for a trace with
several tenants, one row per tenant) and writes, under ``--out``,
the trace used (``trace.jsonl``), per policy a results file (``NAME.json``)
and a Gantt chart (``NAME.png``), and the tables (``summary.md``).
``--calibrate`` first times the real ModelRunner and fits the cost model;
``--fit-timeline`` fits it to a running server's own steps instead.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

from paternoster.config import SchedulerConfig
from paternoster.scheduling.cost_model import DEFAULT_COST_MODEL, CostModel
from paternoster.scheduling.registry import load_scheduler_class
from paternoster.simulate.results import (
    SimulationResult,
    format_priority_table,
    format_table,
)
from paternoster.simulate.tenants import format_tenant_table


def _policy_names(text: str) -> list[str]:
    """Distinct policy names, comma-separated (blanks around them ignored).

    Raises:
        ValueError: no name, or a name given twice.
    """
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise ValueError(f"needs policy names, comma-separated, got {text!r}")
    if len(set(names)) != len(names):
        raise ValueError(f"needs distinct policy names, got {text!r}")
    return names


def _policy_list(text: str) -> str:
    """``--compare``'s value, checked by :func:`_policy_names` while parsing (an
    empty list would otherwise fall back to ``--scheduler`` without a word).

    Raises:
        argparse.ArgumentTypeError: a bad list (argparse prints it as a usage
            error naming ``--compare``).
    """
    try:
        _policy_names(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def add_simulate_args(parser: argparse.ArgumentParser) -> None:
    """Add the simulator's flags to ``parser`` (for a ``simulate`` subcommand)."""
    g = parser.add_argument_group("workload")
    src = g.add_mutually_exclusive_group()
    src.add_argument("--trace", default=None, help="JSONL trace (arrival_time, prompt_len, ...)")
    src.add_argument("--mix", action="store_true", help="synthetic mix (chat, summaries, long)")
    g.add_argument("--num-requests", type=int, default=100, help="requests in the mix")
    g.add_argument("--rate", type=float, default=1.0, help="mix arrival rate (requests/s)")
    g.add_argument("--seed", type=int, default=0, help="mix RNG seed")
    g = parser.add_argument_group("scheduler")
    g.add_argument("--scheduler", default="fcfs", help="scheduler plugin name")
    g.add_argument(
        "--scheduler-config", default=None,
        help="policy options: JSON object or JSON file path; with --compare, an object "
        "keyed by policy name, e.g. '{\"priority\": {\"aging_steps\": 50}}'",
    )  # fmt: skip
    g.add_argument(
        "--compare", default=None, metavar="A,B,...", type=_policy_list,
        help="run these policies on the same trace and print one table",
    )  # fmt: skip
    g.add_argument(
        "--num-kv-blocks", type=int, default=2912,
        help="KV cache blocks (default: what serve allocates for the default model, 1 GiB bf16)",
    )  # fmt: skip
    g.add_argument("--block-size", type=int, default=16, help="tokens per KV block")
    g.add_argument("--max-num-seqs", type=int, default=64, help="most requests per step")
    g.add_argument("--max-num-batched-tokens", type=int, default=2048, help="tokens per step")
    g.add_argument("--max-model-len", type=int, default=8192, help="context length (tokens)")
    g = parser.add_argument_group("cost model")
    g.add_argument("--cost-model", default=None, help="cost model JSON (default: built in)")
    g.add_argument("--unit-cost", action="store_true", help="every step costs 1 time unit")
    g.add_argument(
        "--calibrate", action="store_true",
        help="time the real model runner, fit the cost model, save it (to --cost-model "
        "if given, else OUT/cost_model.json) and use it",
    )  # fmt: skip
    g.add_argument(
        "--fit-timeline", default=None, metavar="URL_OR_JSON",
        help="fit the cost model to a server's own steps: its base URL (serve with "
        "--timeline-size N) or a saved GET /debug/timeline?format=snapshot; saved like "
        "--calibrate and used",
    )  # fmt: skip
    g.add_argument("--model", default=None, help="model to calibrate on (default: embedded)")
    g.add_argument("--dtype", default="bfloat16", help="dtype to calibrate with")
    g.add_argument("--num-threads", type=int, default=1, help="threads while calibrating")
    g = parser.add_argument_group("output")
    g.add_argument("--out", default="sim-results", help="output directory")
    g.add_argument("--gantt-x", choices=["time", "step"], default="time", help="Gantt x axis")
    g.add_argument("--no-plot", action="store_true", help="skip the Gantt PNGs")


def make_parser() -> argparse.ArgumentParser:
    """The standalone parser (``python -m paternoster.simulate``)."""
    parser = argparse.ArgumentParser(
        prog="paternoster simulate",
        description="Run scheduler policies on a trace with a cost model instead of a model.",
    )
    add_simulate_args(parser)
    return parser


def _policy_configs(names: list[str], raw: str | None, compare: bool) -> dict[str, dict]:
    """Each policy's options from ``--scheduler-config``, every one checked
    by its policy (``check_options``) before any policy runs.

    Raises:
        ValueError: an unknown policy, or options a policy refuses (prefixed
            ``policy NAME:``).
    """
    configs = _parse_policy_configs(names, raw, compare)
    for name, options in configs.items():
        try:
            load_scheduler_class(name).check_options(options)
        except ValueError as e:
            raise ValueError(f"policy {name}: {e}") from None
    return configs


def _parse_policy_configs(names: list[str], raw: str | None, compare: bool) -> dict[str, dict]:
    from paternoster.entrypoints.engine_args import parse_scheduler_config

    parsed = parse_scheduler_config(raw)
    if not compare:
        return {names[0]: parsed}
    unknown = set(parsed) - set(names)
    if unknown:
        raise ValueError(
            f"with --compare, --scheduler-config is keyed by policy name; {sorted(unknown)} "
            f"are not among {names}"
        )
    for name, value in parsed.items():
        if not isinstance(value, dict):
            raise ValueError(f"--scheduler-config[{name!r}] must be a JSON object")
    return {name: parsed.get(name, {}) for name in names}


def _cost_model(args: argparse.Namespace, out: Path) -> CostModel:
    if args.unit_cost:
        return CostModel.unit()
    if args.calibrate:
        from paternoster.simulate.calibrate import calibrate

        print(f"calibrating on {args.model or 'the default model'} ({args.dtype}, "
              f"{args.num_threads} thread(s)) ...")  # fmt: skip
        cal = calibrate(args.model, args.dtype, args.num_threads, args.block_size, log=print)
        return _saved(cal.report(), cal.cost_model, args, out)
    if args.fit_timeline is not None:
        from paternoster.simulate.timeline_fit import fit_timeline, load_snapshot

        fit = fit_timeline(load_snapshot(args.fit_timeline),
                           source=f"fitted to the timeline of {args.fit_timeline}")
        return _saved(fit.report(), fit.cost_model, args, out)
    if args.cost_model:
        return CostModel.load(args.cost_model)
    return DEFAULT_COST_MODEL


def _writable_dir(path: Path, what: str) -> None:
    """Create ``path`` (a folder) if needed, before any long work.

    Raises:
        ValueError: it cannot be created or written (e.g. a file is in the way).
    """
    if path.exists() and not path.is_dir():
        raise ValueError(f"{what} {path} is a file, not a folder")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ValueError(f"{what} {path} cannot be created: {e.strerror or e}") from None
    if not path.is_dir() or not os.access(path, os.W_OK):
        raise ValueError(f"{what} {path} is not a writable folder")


def _saved(report: str, model: CostModel, args: argparse.Namespace, out: Path) -> CostModel:
    """Print ``report``, save ``model`` to ``--cost-model`` (else OUT/cost_model.json);
    ``run`` has made both folders (:func:`_writable_dir`)."""
    print(report)
    path = Path(args.cost_model) if args.cost_model else out / "cost_model.json"
    try:
        model.save(path)
    except OSError as e:
        raise ValueError(f"cannot write the cost model to {path}: {e.strerror or e}") from None
    print(f"cost model written to {path}")
    return model


def run(args: argparse.Namespace) -> int:
    """Run the simulator with parsed arguments.

    Returns:
        0 on success, 2 on a usage or input error (printed to stderr; an
        input error removes an ``--out`` folder this run made that holds
        nothing but the trace).
    """
    from paternoster.simulate.executor import simulate
    from paternoster.simulate.trace import load_trace, save_trace, synthetic_mix

    out = Path(args.out)
    made_out = not out.exists()
    try:
        if args.cost_model is not None and not args.cost_model.strip():
            raise ValueError(f"--cost-model needs a JSON file's path, got {args.cost_model!r}")
        if args.unit_cost and (args.calibrate or args.cost_model or args.fit_timeline is not None):
            raise ValueError("--unit-cost excludes --calibrate, --fit-timeline and --cost-model")
        if args.calibrate and args.fit_timeline is not None:
            raise ValueError("--calibrate and --fit-timeline both make the cost model: "
                             "give one")
        flag = "--compare" if args.compare else "--scheduler"
        try:
            names = _policy_names(args.compare or args.scheduler)
        except ValueError as e:
            raise ValueError(f"{flag} {e}") from None
        configs = _policy_configs(names, args.scheduler_config, bool(args.compare))
        # Settings shared by every policy fail here, unprefixed, not in the first run.
        SchedulerConfig(scheduler=names[0], max_num_seqs=args.max_num_seqs,
                        max_num_batched_tokens=args.max_num_batched_tokens)
        if args.trace is None and not args.mix and not args.calibrate and args.fit_timeline is None:
            raise ValueError("give --trace PATH or --mix (or --calibrate / --fit-timeline)")
        # The workload first: a bad one fails before any calibration.
        trace = load_trace(args.trace) if args.trace is not None else None
        if trace is None and args.mix:
            trace = synthetic_mix(args.num_requests, args.rate, args.seed, args.max_model_len)
        _writable_dir(out, "--out")
        if args.cost_model and (args.calibrate or args.fit_timeline is not None):
            _writable_dir(Path(args.cost_model).parent, "--cost-model's folder")
        cost_model = _cost_model(args, out)
        if trace is None:
            return 0
        save_trace(trace, out / "trace.jsonl")
        results: list[SimulationResult] = []
        for name in names:
            try:
                res = simulate(
                    trace, name, configs[name], cost_model,
                    num_kv_blocks=args.num_kv_blocks, block_size=args.block_size,
                    max_num_seqs=args.max_num_seqs,
                    max_num_batched_tokens=args.max_num_batched_tokens,
                    max_model_len=args.max_model_len,
                )  # fmt: skip
            except (ValueError, RuntimeError) as e:
                raise type(e)(f"policy {name}: {e}") from None
            res.save_json(out / f"{name}.json")
            if not args.no_plot:
                from paternoster.simulate.gantt import plot_gantt

                plot_gantt(res, out / f"{name}.png", x=args.gantt_x)
            results.append(res)
    except (ValueError, RuntimeError) as e:
        # An input error removes the --out folder this run made, unless it
        # holds more than the trace (e.g. a cost model calibrated before it).
        if (isinstance(e, ValueError) and made_out and out.is_dir()
                and {f.name for f in out.iterdir()} <= {"trace.jsonl"}):
            shutil.rmtree(out, ignore_errors=True)
        print(f"error: {e}", file=sys.stderr)
        return 2
    table = format_table(results)
    by_priority = format_priority_table(results)
    tenants = len({m.tenant for m in results[0].requests}) > 1
    by_tenant = format_tenant_table(results) if tenants else ""
    (out / "summary.md").write_text(table + "\n" + by_priority + (by_tenant and "\n" + by_tenant))
    unit = "time units (steps)" if args.unit_cost else "seconds"
    print(f"{len(trace)} requests; cost model: {cost_model.source or 'custom'}; times in {unit}")
    print(table, end="")
    if len({m.priority for m in results[0].requests}) > 1:
        print("\nby priority:\n" + by_priority, end="")
    if tenants:
        print("\nby tenant (output while requests arrive):\n" + by_tenant, end="")
    print(f"results in {out}/")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point: parse ``argv`` (default ``sys.argv[1:]``) and :func:`run`.

    Returns:
        The exit code (0 success, 2 bad input).
    """
    return run(make_parser().parse_args(argv))
