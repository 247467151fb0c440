"""Paternoster vs llama.cpp on this CPU, side by side in one run.

Subcommands (``all`` runs the four in order)::

    .venv/bin/python bench/peers.py build      # llama.cpp tools into build/peers/ (once)
    .venv/bin/python bench/peers.py convert    # BF16 and Q8_0 GGUFs of the default model
    .venv/bin/python bench/peers.py decode     # decode and prefill tok/s, batch 1..128
    .venv/bin/python bench/peers.py capacity   # req/s within p95 TTFT/ITL objectives
    .venv/bin/python bench/peers.py all        # or: make peers

The model is the default one (SmolLM2-135M-Instruct) everywhere: llama.cpp
reads GGUF files (the shipped Q4_1, and BF16 and Q8_0 made from it by
``llama-quantize``); Paternoster reads its default model directory, the same
Q4_1 weights dequantized to bf16. See docs/benchmarks.md ("Peer: llama.cpp").
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from paternoster.bench import llamacpp, peer_servers  # bench/ installed as paternoster.bench

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


def ours_decode(model: str | Path, batches: list[int], args: argparse.Namespace) -> list[dict]:
    """Paternoster's decode and prefill tok/s per batch (``bench_decode`` of
    bench/offline.py, in this process, bf16 activations)."""
    import torch

    from paternoster.bench.offline import bench_decode

    torch.set_num_threads(args.threads)
    return bench_decode(model, batches, _decode_args(args))


def ours_decode_quantized(gguf: Path, batches: list[int], args: argparse.Namespace):
    """The hook for quantized weights: ``bench_decode`` on the GGUF file itself
    (``LLM(<path>.gguf)``).

    Returns:
        Its rows, or ``None`` when Paternoster cannot load it (not supported yet);
        the error is printed.
    """
    try:
        return ours_decode(gguf, batches, args)
    except Exception as e:  # any refusal to load it means "not supported yet"
        print(f"Paternoster on {gguf.name}: {type(e).__name__}: {e}".splitlines()[0])
        return None


def _fmt(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.1f}"


def _ratio(ours: float | None, theirs: float | None) -> str:
    return f"{ours / theirs:.2f}×" if ours and theirs else "-"


def decode_table(results: dict[str, dict]) -> str:
    """The markdown decode table: per weight format and batch, llama.cpp's and our
    decode and prefill tok/s and the ratios (ours / llama.cpp).

    ``results[kind]`` holds ``llama`` (batch -> :class:`llamacpp.BatchedBenchRow`)
    and ``ours`` (batch -> ``bench_decode`` row), or ``ours_note`` (a string
    shown instead of our figures).
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
            lines.append(
                f"| {kind.upper()} | {b} | {row.s_tg:.1f} | {our_dec} | {_ratio(dec, row.s_tg)} "
                f"| {row.s_pp:.1f} | {our_pre} | {_ratio(pre, row.s_pp)} |"
            )
    return "\n".join(lines)


def cmd_decode(args: argparse.Namespace) -> str:
    """Measure llama.cpp (``llama-batched-bench``) and Paternoster at every batch;
    print and return the table."""
    from paternoster.model.default_model import default_model_dir

    batches = args.batches
    gen_len = args.decode_warmup + args.decode_steps
    results: dict[str, dict] = {}
    for kind in args.weights:
        gguf = llamacpp.model_path(kind)
        if not gguf.is_file():
            raise FileNotFoundError(f"{gguf} is missing: run `python bench/peers.py convert` first")
        rows = llamacpp.batched_bench(gguf, batches, args.prompt_len, gen_len, args.threads)
        results[kind] = {"llama": {r.b: r for r in rows}}
        for r in rows:
            print(f"llama.cpp {kind} batch {r.b}: decode {r.s_tg:.1f}, prefill {r.s_pp:.1f} tok/s")
    for kind in args.weights:
        if kind == "bf16":
            ours = ours_decode(default_model_dir(), batches, args)
        elif args.ours_quantized:
            ours = ours_decode_quantized(llamacpp.model_path(kind), batches, args)
            if ours is None:
                results[kind]["ours_note"] = "n/a (not supported yet)"
                continue
        else:
            results[kind]["ours_note"] = "not run (--ours-quantized)"
            continue
        results[kind]["ours"] = {r["batch"]: r for r in ours}
    table = decode_table(results)
    print(
        f"\ndecode: {args.prompt_len}-token prompts, {gen_len} generated tokens per sequence "
        f"(Paternoster: {args.decode_steps} steps timed after {args.decode_warmup}), "
        f"{args.threads} thread(s)\n{table}"
    )
    return table


# ---------------------------------------------------------------- capacity


def capacity_plan(args: argparse.Namespace) -> peer_servers.CapacityPlan:
    """The search settings from the command line (the same for both servers)."""
    return peer_servers.plan_from_args(args)


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
    llama_cmd = llamacpp.server_command(
        llamacpp.model_path(args.llama_weights), port, args.llama_threads, args.slots,
        args.slot_ctx, args.llama_args,
    )  # fmt: skip
    with peer_servers.running_server(
        llama_cmd, port, out_dir / "llama-server.log", args.startup_timeout
    ) as url:
        searches["llama.cpp"] = peer_servers.run_capacity(
            plan, url, args.slot_ctx, out_dir / "llama.cpp.json"
        )
    port = peer_servers.free_port()
    ours_cmd = [peer_servers.paternoster_cli(), "serve", "--port", str(port), *args.ours_args]
    with peer_servers.running_server(
        ours_cmd, port, out_dir / "paternoster-serve.log", args.startup_timeout
    ) as url:
        searches["Paternoster"] = peer_servers.run_capacity(
            plan, url, args.slot_ctx, out_dir / "paternoster.json"
        )
    table = capacity_table(searches)
    print(
        f"\ncapacity: CPU mix, Poisson arrivals, probes >= {plan.probe_duration:g} s, "
        f"p95 TTFT <= {plan.slo_ttft_p95:g} s, p95 ITL <= {plan.slo_itl_p95:g} s; "
        f"llama-server {args.llama_weights.upper()} {args.llama_threads} threads, "
        f"{args.slots} slots x {args.slot_ctx} tokens; JSON in {out_dir}\n{table}"
    )
    return table


# -------------------------------------------------------------------- main


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def _kinds(text: str) -> list[str]:
    kinds = [k.strip().lower() for k in text.split(",") if k.strip()]
    bad = sorted(set(kinds) - set(KINDS))
    if bad:
        raise argparse.ArgumentTypeError(f"unknown weights {bad}; choose from {','.join(KINDS)}")
    return kinds


def _add_decode_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("decode")
    g.add_argument("--batches", type=_ints, default=[1, 8, 32, 64, 128], help="e.g. 1,8")
    g.add_argument("--weights", type=_kinds, default=list(KINDS),
                   help="llama.cpp weight formats (default: bf16,q8_0,q4_1)")  # fmt: skip
    g.add_argument("--threads", type=int, default=1, help="-t/-tb, and ours (default 1)")
    g.add_argument("--prompt-len", type=int, default=128)
    g.add_argument("--decode-warmup", type=int, default=2, help="ours: steps not timed")
    g.add_argument("--decode-steps", type=int, default=16, help="ours: steps timed")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument(
        "--ours-quantized",
        action="store_true",
        help="also run Paternoster on the Q8_0/Q4_1 GGUF files (LLM(path.gguf)); "
        "'n/a (not supported yet)' when it cannot load them",
    )


def _add_capacity_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("capacity")
    peer_servers.add_plan_args(g)
    g.add_argument("--slots", type=int, default=16, help="llama-server -np")
    g.add_argument("--slot-ctx", type=int, default=2048, help="context per slot (tokens)")
    g.add_argument("--llama-threads", type=int, default=2, help="llama-server -t/-tb")
    g.add_argument("--llama-weights", choices=KINDS, default="bf16")
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
