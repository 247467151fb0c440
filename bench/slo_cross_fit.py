"""Does the simulator predict a policy it never saw run? Fit the cost model to
one policy's server steps, then search every policy's capacity in the
simulator with that model, next to the measured capacities.

    .venv/bin/python bench/slo_cross_fit.py build/slo_capacity/long4

Input: a finished ``bench/slo_capacity.py --real --fit-timeline`` run
directory (its ``results.json``, ``cost_model.json`` and the
``<mix>/<policy>.timeline.json`` snapshots). For each mix and each policy
with a timeline, the cost model is fitted to that server's steps
(:func:`paternoster.simulate.timeline_fit.fit_timeline`), and each measured
policy's capacity is searched in the simulator with it
(:func:`paternoster.bench.slo_capacity.sim_capacity`, the same plan, mixes and seed as
``slo_capacity.py``; ``slo`` plans with the run's calibrated model, as on
the server, and corrects it online). The diagonal is ``slo_capacity.py``'s
"sim on server steps"; off the diagonal the step times come from another
policy's steps, so the prediction is out of sample: what a user gets from
``paternoster simulate --fit-timeline`` on a server running one policy when
choosing another.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from paternoster.bench import slo_capacity
from paternoster.bench.capacity import Objectives, SearchPlan


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (module doc); the search flags default to
    ``slo_capacity.py``'s."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run_dir", type=Path, help="a slo_capacity.py --real --fit-timeline run")
    ap.add_argument("--out", type=Path, default=None,
                    help="write the table here too (default: only print it)")  # fmt: skip
    defaults = slo_capacity.parse_args([])
    for name in ("slo_ttft_p95", "slo_itl_p95", "start", "probe_duration", "probe_requests",
                 "bisect_rounds", "seed", "max_model_len"):
        flag = "--" + name.replace("_", "-")
        value = getattr(defaults, name)
        ap.add_argument(flag, type=type(value), default=value, help=f"default {value}")
    args = ap.parse_args(argv)
    if not args.run_dir.is_dir():
        ap.error(f"{args.run_dir}: no such directory")
    if not (args.run_dir / "results.json").is_file():
        ap.error(f"{args.run_dir}: no results.json (not a slo_capacity.py --real run)")
    return args


def cross_fit(args: argparse.Namespace, log=print) -> str:
    """The markdown table: a row per (mix, policy whose steps were fitted),
    per measured policy its simulated capacity and sim / measured.

    Raises:
        ValueError: ``results.json`` is not a ``--real`` run's, no policy has a
            timeline (the run lacked ``--fit-timeline``), or a timeline cannot
            be fitted (fewer than 5 usable steps).
    """
    from paternoster.scheduling.cost_model import CostModel
    from paternoster.simulate.timeline_fit import fit_timeline

    run = args.run_dir
    try:
        results = json.loads((run / "results.json").read_text())
        mixes = dict(results["mixes"])
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{run}/results.json is not a slo_capacity.py --real run's: {e!r}") \
            from None
    calibrated = run / "cost_model.json"
    slo_config = {"cost_model": str(calibrated.resolve())} if calibrated.is_file() else {}
    objectives = Objectives(args.slo_ttft_p95, args.slo_itl_p95)
    plan = SearchPlan("rate", args.start, 2.0, args.bisect_rounds, 0.02)
    lines = []
    fitted = 0
    for mix, per_policy in mixes.items():
        spec = results.get("mix_specs", {}).get(mix, slo_capacity.MIXES[mix])
        measured = {label: (res.get("real") or {}).get("capacity")
                    for label, res in per_policy.items()}  # fmt: skip
        chunks = sorted({int(label.split()[1]) for label in per_policy
                         if label.startswith("chunked_prefill ")})  # fmt: skip
        by_label = {p.label: p for p in slo_capacity.policies(chunks, objectives, slo_config)}
        labels = [label for label in per_policy if label in by_label]
        if not lines:
            lines += [f"| mix | steps fitted from (R², knee) | {' | '.join(labels)} |",
                      "|---|---|" + "---:|" * len(labels)]  # fmt: skip
        for source in labels:
            path = run / mix / f"{source.replace(' ', '-')}.timeline.json"
            if not path.is_file():
                continue
            fit = fit_timeline(json.loads(path.read_text()), source=f"{mix} {source}")
            fitted += 1
            model: CostModel = fit.cost_model
            cells = []
            for label in labels:
                res = slo_capacity.sim_capacity(by_label[label], spec, plan, objectives, args,
                                                model)  # fmt: skip
                m = measured.get(label)
                ratio = f"{res.capacity / m:.2f}" if res.capacity and m else "-"
                cells.append(f"{slo_capacity._cap(res.capacity)} ({ratio})")
                log(f"{mix}: steps of {source} -> {label}: sim {res.capacity} req/s, "
                    f"measured {m}", flush=True)  # fmt: skip
            lines.append(f"| {mix} | {source} ({fit.r2:.3f}, {model.first_tokens}) | "
                         f"{' | '.join(cells)} |")  # fmt: skip
        lines.append(f"| {mix} | measured | "
                     f"{' | '.join(slo_capacity._cap(measured[k]) for k in labels)} |")  # fmt: skip
    if not fitted:
        raise ValueError(f"{run}: no <mix>/<policy>.timeline.json to fit; the run needs "
                         "slo_capacity.py --real --fit-timeline")  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Print (and with ``--out`` write) the table."""
    args = parse_args(argv)
    try:
        text = cross_fit(args)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print("cells: simulated capacity in req/s (simulated / measured)\n" + text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
