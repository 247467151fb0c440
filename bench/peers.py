"""Paternoster vs llama.cpp on this CPU, side by side in one run.

Subcommands (``all`` runs the four in order)::

    .venv/bin/python bench/peers.py build      # llama.cpp tools into build/peers/ (once)
    .venv/bin/python bench/peers.py convert    # BF16 and Q8_0 GGUFs of the default model
    .venv/bin/python bench/peers.py decode     # decode and prefill tok/s, batch 1..128
    .venv/bin/python bench/peers.py capacity   # req/s within p95 TTFT/ITL objectives
    .venv/bin/python bench/peers.py all        # or: make peers

By default the model is the default one (SmolLM2-135M-Instruct): llama.cpp
reads GGUF files (the shipped Q4_1, and BF16 and Q8_0 made from it by
``llama-quantize``); Paternoster reads its default model directory, the same
Q4_1 weights dequantized to bf16. ``decode --files A.gguf,B.gguf`` and
``capacity --file A.gguf`` give both engines the same GGUF file instead
(``capacity --mix`` picks the request mix). See docs/benchmarks.md ("Peer:
llama.cpp", "GGUF files as published").
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import statistics
import sys
import time
from pathlib import Path

from paternoster.bench import llamacpp, peer_servers  # bench/ installed as paternoster.bench
from paternoster.entrypoints.engine_args import positive_int

KINDS = ("bf16", "q8_0", "q4_1")


# ------------------------------------------------------------------ decode


def _decode_args(args: argparse.Namespace) -> argparse.Namespace:
    """The namespace ``bench/offline.py``'s ``bench_decode`` reads."""
    return argparse.Namespace(
        dtype="bfloat16",
        threads=args.threads,
        seed=args.seed,
        decode_prompt_len=args.prompt_len,
        decode_warmup=args.decode_warmup,
        decode_steps=args.decode_steps,
    )


def ours_engine(model: str | Path, batches: list[int], args: argparse.Namespace):
    """The engine :func:`ours_decode` measures (``decode_llm`` of bench/offline.py),
    built once and reused by every round."""
    import torch

    from paternoster.bench.offline import decode_llm

    torch.set_num_threads(args.threads)
    return decode_llm(model, batches, _decode_args(args))


def ours_decode(
    model: str | Path, batches: list[int], args: argparse.Namespace, llm=None, round_index: int = 0
) -> list[dict]:
    """Paternoster's decode and prefill tok/s per batch (``bench_decode`` of
    bench/offline.py, in this process, bf16 activations), on ``llm`` when given."""
    import torch

    from paternoster.bench.offline import bench_decode

    torch.set_num_threads(args.threads)
    return bench_decode(model, batches, _decode_args(args), llm=llm, round_index=round_index)


def ours_quantized_engine(gguf: Path, batches: list[int], args: argparse.Namespace):
    """The hook for quantized weights: the engine on the GGUF file itself
    (``LLM(<path>.gguf)``).

    Returns:
        The engine, or ``None`` when Paternoster cannot load it (not supported
        yet); the error is printed.
    """
    try:
        return ours_engine(gguf, batches, args)
    except Exception as e:  # any refusal to load it means "not supported yet"
        print(f"Paternoster on {gguf.name}: {type(e).__name__}: {e}".splitlines()[0])
        return None


def _fmt(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.1f}"


def _ratio(ours: float | None, theirs: float | None) -> str:
    return f"{ours / theirs:.2f}×" if ours and theirs else "-"


def _spread(values: list[float]) -> str:
    """``median× (min–max)`` of per-round ratios; one round: just ``x×``."""
    if len(values) == 1:
        return f"{values[0]:.2f}×"
    return f"{statistics.median(values):.2f}× ({min(values):.2f}–{max(values):.2f})"


def decode_table(results: dict[str, dict]) -> str:
    """The markdown decode table: per weight format and batch, llama.cpp's and our
    decode and prefill tok/s and the ratios (ours / llama.cpp).

    ``results[kind]`` holds ``llama`` (batch -> :class:`llamacpp.BatchedBenchRow`)
    and ``ours`` (batch -> ``bench_decode`` row), or ``ours_note`` (a string
    shown instead of our figures); from paired rounds (:func:`combine_rounds`)
    also ``ratios`` (batch -> ``{"decode": [...], "prefill": [...]}``, one ratio
    a round), shown as their median and range instead of the ratio of the
    medians.
    """
    lines = [
        "| weights | batch | llama.cpp decode tok/s | Paternoster decode tok/s | ratio "
        "| llama.cpp prefill tok/s | Paternoster prefill tok/s | ratio |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for kind, res in results.items():
        for b, row in res["llama"].items():
            our = res.get("ours", {}).get(b)
            note = res.get("ours_note")
            dec = our["tokens_per_s"] if our else None
            pre = our.get("prefill_tokens_per_s") if our else None
            our_dec = note if note and our is None else _fmt(dec)
            our_pre = note if note and our is None else _fmt(pre)
            ratios = res.get("ratios", {}).get(b)
            dec_ratio = _spread(ratios["decode"]) if ratios else _ratio(dec, row.s_tg)
            pre_ratio = _spread(ratios["prefill"]) if ratios else _ratio(pre, row.s_pp)
            lines.append(
                f"| {kind.upper()} | {b} | {row.s_tg:.1f} | {our_dec} | {dec_ratio} "
                f"| {row.s_pp:.1f} | {our_pre} | {pre_ratio} |"
            )
    return "\n".join(lines)


def combine_rounds(rounds: list[dict[str, dict]]) -> dict[str, dict]:
    """Paired rounds (each :func:`decode_table`'s ``results`` of one round:
    llama.cpp, then Paternoster, on the same machine minutes apart) -> one
    ``results``: each engine's median tok/s per batch and, under ``ratios``,
    every round's own ratio, so a VM whose speed drifts between rounds moves
    both engines of a pair alike. A format where Paternoster has no figures
    keeps its ``ours_note``.

    Raises:
        ValueError: no rounds, or rounds with different formats or batches.
    """
    if not rounds:
        raise ValueError("rounds must not be empty")
    out: dict[str, dict] = {}
    for kind, first in rounds[0].items():
        per = [r.get(kind) for r in rounds]
        if any(p is None or p["llama"].keys() != first["llama"].keys() for p in per):
            raise ValueError(f"rounds differ in formats or batches ({kind})")
        llama, ours, ratios = {}, {}, {}
        for b, row in first["llama"].items():
            tg = [p["llama"][b].s_tg for p in per]
            pp = [p["llama"][b].s_pp for p in per]
            llama[b] = dataclasses.replace(
                row, s_tg=statistics.median(tg), s_pp=statistics.median(pp)
            )
            mine = [p.get("ours", {}).get(b) for p in per]
            if any(m is None for m in mine):
                continue
            dec = [m["tokens_per_s"] for m in mine]
            pre = [m["prefill_tokens_per_s"] for m in mine]
            ours[b] = {"batch": b, "tokens_per_s": statistics.median(dec),
                       "prefill_tokens_per_s": statistics.median(pre)}  # fmt: skip
            ratios[b] = {"decode": [d / t for d, t in zip(dec, tg)],
                         "prefill": [d / t for d, t in zip(pre, pp)]}  # fmt: skip
        out[kind] = {"llama": llama}
        if ours:
            out[kind].update(ours=ours, ratios=ratios)
        if "ours_note" in first:
            out[kind]["ours_note"] = first["ours_note"]
    return out


def cmd_decode(args: argparse.Namespace) -> str:
    """Measure llama.cpp (``llama-batched-bench``) and Paternoster at every batch,
    ``--rounds`` times alternately, one file (format) after the other (one
    engine of ours per file, reused over its rounds, freed after them);
    print and return the table (medians and per-round ratios when rounds > 1)."""
    from paternoster.model.default_model import default_model_dir

    batches = args.batches
    gen_len = args.decode_warmup + args.decode_steps
    if args.files:  # any GGUF files: both engines on each file itself
        paths = {p.name: p for p in args.files}
        args.weights, args.ours_quantized = list(paths), True
    else:
        paths = {kind: llamacpp.model_path(kind) for kind in args.weights}
    for kind in args.weights:
        gguf = paths[kind]
        if not gguf.is_file():
            raise FileNotFoundError(f"{gguf} is missing: run `python bench/peers.py convert` first")
    rounds: list[dict[str, dict]] = [{} for _ in range(args.rounds)]
    for kind in args.weights:
        # One file at a time: its engine is built, measured over every round
        # and freed before the next file's (engines left alive slow the one
        # measured: a Qwen3-4B batch-1 step was 0.75x llama.cpp with two
        # smaller engines in the process, 1.04x alone).
        note, llm = None, None
        if kind == "bf16" and not args.files:
            model, llm = default_model_dir(), ours_engine(default_model_dir(), batches, args)
        elif not args.ours_quantized:
            note = "not run (--ours-quantized)"
        elif (llm := ours_quantized_engine(paths[kind], batches, args)) is None:
            note = "n/a (not supported yet)"
        else:
            model = paths[kind]
        for r in range(args.rounds):
            rows = llamacpp.batched_bench(
                paths[kind], batches, args.prompt_len, gen_len, args.threads,
                repack=args.llama_repack,
            )
            result = rounds[r][kind] = {"llama": {row.b: row for row in rows}}
            for row in rows:
                print(f"round {r + 1}: llama.cpp {kind} batch {row.b}: "
                      f"decode {row.s_tg:.1f}, prefill {row.s_pp:.1f} tok/s")  # fmt: skip
            if note is not None:
                result["ours_note"] = note
                continue
            ours = ours_decode(model, batches, args, llm=llm, round_index=r)
            result["ours"] = {row["batch"]: row for row in ours}
        if llm is not None:
            llm.shutdown()
        del llm
        gc.collect()
    table = decode_table(combine_rounds(rounds))
    paired = (
        f"; {args.rounds} paired rounds (llama.cpp then Paternoster, per format): "
        "median tok/s, ratio = median of the rounds' ratios (range)"
        if args.rounds > 1 else ""
    )  # fmt: skip
    print(
        f"\ndecode: {args.prompt_len}-token prompts, {gen_len} generated tokens per sequence "
        f"(Paternoster: {args.decode_steps} steps timed after {args.decode_warmup}), "
        f"{args.threads} thread(s){paired}\n{table}"
    )
    return table


# ---------------------------------------------------------------- capacity


def capacity_plan(args: argparse.Namespace) -> peer_servers.CapacityPlan:
    """The search settings from the command line (the same for both servers)."""
    return peer_servers.plan_from_args(args, slo_ttft_p95=args.slo_ttft_p95,
                                       slo_itl_p95=args.slo_itl_p95, mix=args.mix)  # fmt: skip


def capacity_table(searches: dict[str, dict]) -> str:
    """Markdown: each server's capacity (req/s), its probes, and ours / llama.cpp."""
    lines = [
        "| server | capacity (req/s) | probes (rate: p95 TTFT, p95 ITL) | search s |",
        "|---|---:|---|---:|",
    ]
    for name, s in searches.items():
        cap = "none" if s.get("capacity") is None else f"{s['capacity']:g}"
        lines.append(
            f"| {name} | {cap} | {peer_servers.describe_probes(s)} | {s.get('elapsed', 0):.0f} |"
        )
    ours, theirs = (searches.get(k, {}).get("capacity") for k in ("Paternoster", "llama.cpp"))
    lines.append(f"\nratio (Paternoster / llama.cpp): {_ratio(ours, theirs)}")
    return "\n".join(lines)


def cmd_capacity(args: argparse.Namespace) -> str:
    """Serve llama.cpp, then Paternoster, each searched by ``paternoster bench
    capacity`` with the same plan; print and return the table."""
    plan = capacity_plan(args)
    out_dir = llamacpp.PEERS_DIR / "capacity" / time.strftime("%Y%m%d-%H%M%S")
    searches: dict[str, dict] = {}
    port = peer_servers.free_port()
    llama_model = args.file if args.file else llamacpp.model_path(args.llama_weights)
    llama_cmd = llamacpp.server_command(
        llama_model, port, args.llama_threads, args.slots, args.slot_ctx, args.llama_args,
    )  # fmt: skip
    with peer_servers.running_server(
        llama_cmd, port, out_dir / "llama-server.log", args.startup_timeout
    ) as url:
        searches["llama.cpp"] = peer_servers.run_capacity(
            plan, url, args.slot_ctx, out_dir / "llama.cpp.json"
        )
    port = peer_servers.free_port()
    ours_cmd = [peer_servers.paternoster_cli(), "serve", *([str(args.file)] if args.file else []),
                "--port", str(port), *args.ours_args]
    with peer_servers.running_server(
        ours_cmd, port, out_dir / "paternoster-serve.log", args.startup_timeout
    ) as url:
        searches["Paternoster"] = peer_servers.run_capacity(
            plan, url, args.slot_ctx, out_dir / "paternoster.json"
        )
    table = capacity_table(searches)
    print(
        f"\ncapacity: mix {plan.mix}, Poisson arrivals, probes >= {plan.probe_duration:g} s, "
        f"p95 TTFT <= {plan.slo_ttft_p95:g} s, p95 ITL <= {plan.slo_itl_p95:g} s; "
        f"llama-server {args.file.name if args.file else args.llama_weights.upper()} "
        f"{args.llama_threads} threads, "
        f"{args.slots} slots x {args.slot_ctx} tokens; JSON in {out_dir}\n{table}"
    )
    return table


# -------------------------------------------------------------------- main


def _ints(text: str) -> list[int]:
    """A comma-separated list of integers >= 1, at least one (argparse type)."""
    values = [positive_int(x.strip()) for x in text.split(",") if x.strip()]
    if not values:
        raise argparse.ArgumentTypeError("needs at least one integer >= 1, e.g. 1,8")
    return values


def _kinds(text: str) -> list[str]:
    kinds = [k.strip().lower() for k in text.split(",") if k.strip()]
    bad = sorted(set(kinds) - set(KINDS))
    if bad or not kinds:
        what = f"unknown weights {','.join(bad)}" if bad else "needs at least one format"
        raise argparse.ArgumentTypeError(f"{what}; choose from {','.join(KINDS)}")
    return kinds


def _add_decode_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("decode")
    g.add_argument("--batches", type=_ints, default=[1, 8, 32, 64, 128],
                   help="sequences per step, e.g. 1,8 (default 1,8,32,64,128)")  # fmt: skip
    g.add_argument("--weights", type=_kinds, default=list(KINDS),
                   help="llama.cpp weight formats (default: bf16,q8_0,q4_1)")  # fmt: skip
    g.add_argument("--threads", type=positive_int, default=1,
                   help="both engines: llama.cpp's -t/-tb, ours (default 1)")  # fmt: skip
    g.add_argument("--prompt-len", type=positive_int, default=128, help="tokens (default 128)")
    g.add_argument("--decode-warmup", type=int, default=2, help="ours: steps not timed")
    g.add_argument("--decode-steps", type=positive_int, default=16, help="ours: steps timed")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--rounds", type=positive_int, default=1,
                   help="alternate the engines N times (default 1)")  # fmt: skip
    g.add_argument("--files", type=lambda t: [Path(p) for p in t.split(",") if p],
                   default=None,
                   help="GGUF files, comma-separated: both engines on each (instead of "
                        "--weights)")  # fmt: skip
    g.add_argument("--llama-repack", action="store_true",
                   help="llama.cpp's weight repacking on (default off: --no-repack; "
                        "it crashes on the AMX Xeon VMs)")  # fmt: skip
    g.add_argument(
        "--ours-quantized",
        action="store_true",
        help="also run Paternoster on the Q8_0/Q4_1 GGUF files (LLM(path.gguf)); "
        "'n/a (not supported yet)' when it cannot load them",
    )


def _add_capacity_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("capacity")
    peer_servers.add_plan_args(g)
    plan = peer_servers.CapacityPlan()
    g.add_argument("--slo-ttft-p95", type=float, default=plan.slo_ttft_p95, metavar="S",
                   help=f"p95 TTFT objective (default {plan.slo_ttft_p95:g})")  # fmt: skip
    g.add_argument("--slo-itl-p95", type=float, default=plan.slo_itl_p95, metavar="S",
                   help=f"p95 ITL objective (default {plan.slo_itl_p95:g})")  # fmt: skip
    g.add_argument("--mix", default=plan.mix,
                   help="request mix, `paternoster bench capacity --mix` syntax (default: the "
                        "CPU mix)")  # fmt: skip
    g.add_argument("--slots", type=int, default=16, help="llama-server -np")
    g.add_argument("--slot-ctx", type=int, default=2048, help="context per slot (tokens)")
    g.add_argument("--llama-threads", type=int, default=2, help="llama-server -t/-tb")
    g.add_argument("--llama-weights", choices=KINDS, default="bf16")
    g.add_argument("--file", type=Path, default=None,
                   help="a GGUF file both servers serve (instead of the default model "
                        "and --llama-weights)")  # fmt: skip
    g.add_argument("--llama-args", default="",
                   help="more llama-server flags, one string: --llama-args='-fa on'")  # fmt: skip
    g.add_argument(
        "--ours-args",
        default="",
        help="more `paternoster serve` flags, one string: --ours-args='--num-threads 1'",
    )
    g.add_argument("--startup-timeout", type=float, default=600.0)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (see the module docstring)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True)
    sub.add_parser("build", help="download llama-cpp-python's sdist, build llama.cpp tools")
    sub.add_parser("convert", help="BF16 and Q8_0 GGUFs from the default Q4_1")
    _add_decode_args(sub.add_parser("decode", help="decode/prefill tok/s, both engines"))
    _add_capacity_args(sub.add_parser("capacity", help="serving capacity, both servers"))
    a = sub.add_parser("all", help="build, convert, decode, capacity")
    _add_decode_args(a)
    _add_capacity_args(a)
    for p in sub.choices.values():
        p.add_argument("--jobs", type=int, default=2, help="build: parallel compile jobs")
    args = ap.parse_args(argv)
    if hasattr(args, "ours_args"):
        args.ours_args, args.llama_args = args.ours_args.split(), args.llama_args.split()
    return args


def main(argv: list[str] | None = None) -> int:
    """Run one subcommand; 1 with a one-line error when a tool or file is missing."""
    args = parse_args(argv)
    try:
        if args.command in ("build", "all"):
            llamacpp.build(jobs=args.jobs)
        if args.command in ("convert", "all"):
            llamacpp.convert()
        tables = []
        if args.command in ("decode", "all"):
            tables.append(cmd_decode(args))
        if args.command in ("capacity", "all"):
            tables.append(cmd_capacity(args))
        if len(tables) > 1:
            print("\n\n".join(["", "== all tables ==", *tables]))
    except (FileNotFoundError, RuntimeError) as e:
        print(f"peers: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
