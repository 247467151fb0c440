#!/usr/bin/env python
"""Offline data parallel vs one engine on the same cores: ``LLM(model,
data_parallel_size=N, num_threads=T/N)`` against ``LLM(model, num_threads=T)``
on one workload, in one run.

The workload is bench/offline.py's (prompts of 8-768 tokens, log-uniform;
output lengths uniform in ``[--min-out, --max-out]``), greedy with
``ignore_eos`` so that every system generates the same tokens. The two
layouts are visited in the order A, B, B, A so that a shared machine's drift
falls on both; each figure is the mean of its two visits (output tokens per
second of wall time, after a 2-prompt warm-up). The greedy outputs of the
two layouts are compared too.

    .venv/bin/python bench/dp_offline.py [--num-prompts 64] [--threads 2] [--dp 2]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from offline import MAX_MODEL_LEN, make_workload  # noqa: E402


def run(llm, prompts, params) -> tuple[float, list[list[int]]]:
    """One timed ``generate``: ``(output tokens per second, token ids per prompt)``."""
    t = time.perf_counter()
    results = llm.generate(prompts, params)
    elapsed = time.perf_counter() - t
    ids = [r.outputs[0].token_ids for r in results]
    return sum(map(len, ids)) / elapsed, ids


def main(argv: list[str] | None = None) -> int:
    """Run both layouts and print a markdown table."""
    from paternoster import LLM, SamplingParams
    from paternoster.entrypoints.engine_args import resolve_model_dir
    from paternoster.model.loader import load_tokenizer

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="default: the embedded default model")
    ap.add_argument("--num-prompts", type=int, default=64)
    ap.add_argument("--min-out", type=int, default=16)
    ap.add_argument("--max-out", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2, help="cores in all (T)")
    ap.add_argument("--dp", type=int, default=2, help="engines of the data-parallel layout (N)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    model = resolve_model_dir(args.model)
    prompts, outs = make_workload(load_tokenizer(model), args.num_prompts, args.seed,
                                  args.min_out, args.max_out)  # fmt: skip
    params = [SamplingParams(temperature=0, max_tokens=o, ignore_eos=True) for o in outs]
    layouts = {f"DP={args.dp} x {args.threads // args.dp} thread(s)":
               dict(data_parallel_size=args.dp, num_threads=args.threads // args.dp),
               f"DP=1 x {args.threads} threads": dict(num_threads=args.threads)}  # fmt: skip
    llms = {name: LLM(model, max_model_len=MAX_MODEL_LEN, **kw) for name, kw in layouts.items()}
    for llm in llms.values():
        llm.generate(prompts[:2], params[:2])  # warm-up
    names = list(llms)
    rates: dict[str, list[float]] = {n: [] for n in names}
    outputs: dict[str, list[list[int]]] = {}
    for name in names + names[::-1]:
        rate, outputs[name] = run(llms[name], prompts, params)
        rates[name].append(rate)
    for llm in llms.values():
        llm.shutdown()
    total = sum(outs)
    print(f"{args.num_prompts} prompts, {total} output tokens, greedy; visits A, B, B, A\n")
    print("| layout | output tok/s (visit 1, visit 2) | mean |")
    print("| --- | --- | --- |")
    for name in names:
        r = rates[name]
        print(f"| {name} | {r[0]:.1f}, {r[1]:.1f} | {sum(r) / len(r):.1f} |")
    a, b = (sum(rates[n]) / 2 for n in names)
    print(f"\nratio {names[0]} / {names[1]}: {a / b:.2f}")
    same = sum(x == y for x, y in zip(outputs[names[0]], outputs[names[1]]))
    print(f"greedy outputs equal on {same}/{len(prompts)} prompts")
    return 0


if __name__ == "__main__":
    sys.exit(main())
