"""Structured outputs' cost, measured side by side in one process on the
default model (or ``--model``): decode throughput of a batch whose every
request carries a JSON schema against the same batch without one, and the
grammar compile time of a 50-property schema, first and cached.

Each round runs both modes back to back on one engine (same weights,
threads and prompts; greedy, ``ignore_eos`` so both generate the same number
of tokens; the order alternates between rounds) and the ratio reported is
the median of the rounds' ratios, which this VM's drifting speed disturbs
least. Usage::

    .venv/bin/python bench/structured.py [--batch 32] [--max-tokens 64] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "address": {"type": "object", "properties": {"city": {"type": "string"},
                                                     "zip": {"type": "string"}}},
    },
    "required": ["name", "age", "tags", "address"],
}


def wide_schema(n: int = 50) -> dict:
    """An object of ``n`` required properties of mixed types."""
    kinds = ["string", "integer", "number", "boolean"]
    props = {f"field_{i}": {"type": kinds[i % 4]} for i in range(n)}
    return {"type": "object", "properties": props, "required": list(props)}


def compile_times(tokenizer, vocab_size: int, eos: int | None) -> tuple[float, float]:
    """Seconds to compile :func:`wide_schema`, first and again (cached)."""
    from paternoster.structured_outputs import GrammarCompiler, normalize_spec

    compiler = GrammarCompiler(tokenizer, vocab_size, [eos] if eos is not None else [])
    spec = normalize_spec({"json": wide_schema()})
    start = time.perf_counter()
    compiler.compile_async(spec).result()
    first = time.perf_counter() - start
    start = time.perf_counter()
    compiler.compile_async(normalize_spec({"json": json.dumps(wide_schema())})).result()
    return first, time.perf_counter() - start


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default=None, help="model directory (default: the embedded one)")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()

    from paternoster import LLM, SamplingParams

    kwargs = {"num_threads": args.threads, "max_num_seqs": args.batch}
    llm = LLM(args.model, **kwargs) if args.model else LLM(**kwargs)
    prompts = [f"Describe person number {i} as JSON with a name, age, tags and address."
               for i in range(args.batch)]
    free = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    constrained = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True,
                                 structured_outputs={"json": SCHEMA})
    llm.generate(prompts[:2], constrained)  # warm up: compile, first steps
    rates: dict[str, list[float]] = {"free": [], "json_schema": []}
    modes = [("free", free), ("json_schema", constrained)]
    for r in range(args.rounds):  # ABBA order: a drift in machine speed hits both
        for name, params in (modes if r % 2 == 0 else modes[::-1]):
            start = time.perf_counter()
            outs = llm.generate(prompts, params)
            elapsed = time.perf_counter() - start
            rates[name].append(sum(len(o.outputs[0].token_ids) for o in outs) / elapsed)
    ratios = [j / f for j, f in zip(rates["json_schema"], rates["free"])]
    first, cached = compile_times(llm.tokenizer, llm.engine.runner.vocab_size,
                                  llm.engine.runner.eos_token_id)
    print(f"batch {args.batch}, {args.max_tokens} tokens each, {args.rounds} rounds, "
          f"{args.threads} threads")
    print("| mode | tok/s (median) | runs |")
    print("|---|---:|---|")
    for name, values in rates.items():
        print(f"| {name} | {statistics.median(values):.1f} | "
              f"{', '.join(f'{v:.1f}' for v in values)} |")
    print(f"\njson_schema / free, median of the {args.rounds} rounds' ratios: "
          f"{statistics.median(ratios):.3f}x (target >= 0.9x; rounds: "
          f"{', '.join(f'{x:.2f}' for x in ratios)})")
    print(f"50-property schema compile: first {first * 1e3:.2f} ms, cached {cached * 1e3:.3f} ms")


if __name__ == "__main__":
    main()
