"""Offline throughput: Paternoster vs HF transformers generate (one at a time, static batches).

64 prompts of mixed lengths, output lengths drawn from 16-512 tokens, greedy with
``ignore_eos`` so every system generates exactly the requested tokens, the same
dtype everywhere, one run, one machine. Prints output tokens per second of each
system and the ratios. Usage::

    .venv/bin/python bench/offline.py [--num-prompts 64] [--dtype bfloat16] [--threads 1]

HF static batching pads each batch on the left to its longest prompt and runs
until the longest requested output; only the requested tokens count as output.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import time

import torch


def make_workload(tokenizer, num_prompts: int, seed: int, min_out: int, max_out: int):
    """Prompts (token ids, 8-768 tokens, log-uniform) and output lengths (uniform)."""
    rng = random.Random(seed)
    words = (
        "the engine keeps every cabin moving while passengers step on and off at each "
        "floor and nobody waits forever for a ride to the top of the tower"
    ).split()
    prompts, outs = [], []
    for _ in range(num_prompts):
        n = int(round(2 ** rng.uniform(3, 9.6)))
        text = " ".join(rng.choice(words) for _ in range(n))
        prompts.append(tokenizer(text, add_special_tokens=False).input_ids[:n])
        outs.append(rng.randint(min_out, max_out))
    return prompts, outs


def bench_paternoster(model_dir, dtype, prompts, outs, args) -> float:
    from paternoster import LLM, SamplingParams

    llm = LLM(
        str(model_dir),
        dtype=dtype,
        max_num_seqs=args.max_num_seqs,
        num_threads=args.threads,
        max_model_len=2048,
    )
    params = [SamplingParams(temperature=0.0, max_tokens=o, ignore_eos=True) for o in outs]
    llm.generate(prompts[:2], params[:2])  # warm-up
    t = time.perf_counter()
    results = llm.generate(prompts, params)
    elapsed = time.perf_counter() - t
    got = sum(len(r.outputs[0].token_ids) for r in results)
    assert got == sum(outs), (got, sum(outs))
    return elapsed


def bench_hf(model, prompts, outs, batch_size: int) -> float:
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    t = time.perf_counter()
    with torch.inference_mode():
        for start in range(0, len(order), batch_size):
            idx = order[start : start + batch_size]
            width = max(len(prompts[i]) for i in idx)
            ids = torch.zeros(len(idx), width, dtype=torch.long)
            mask = torch.zeros(len(idx), width, dtype=torch.long)
            for row, i in enumerate(idx):
                ids[row, width - len(prompts[i]) :] = torch.tensor(prompts[i])
                mask[row, width - len(prompts[i]) :] = 1
            n = max(outs[i] for i in idx)
            model.generate(
                ids,
                attention_mask=mask,
                max_new_tokens=n,
                min_new_tokens=n,
                do_sample=False,
                pad_token_id=0,
            )
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="HF model dir (default: embedded SmolLM2)")
    ap.add_argument("--num-prompts", type=int, default=64)
    ap.add_argument("--min-output", type=int, default=16)
    ap.add_argument("--max-output", type=int, default=512)
    ap.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    ap.add_argument("--threads", type=int, default=1, help="torch (and core) threads")
    ap.add_argument("--max-num-seqs", type=int, default=64)
    ap.add_argument("--hf-batch-size", type=int, default=16)
    ap.add_argument("--skip-hf-single", action="store_true", help="skip HF one-at-a-time")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None, help="write results here")
    args = ap.parse_args()

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from paternoster.model.default_model import default_model_dir

    torch.set_num_threads(args.threads)
    model_dir = args.model or default_model_dir()
    tok = AutoTokenizer.from_pretrained(model_dir)
    prompts, outs = make_workload(
        tok, args.num_prompts, args.seed, args.min_output, args.max_output
    )
    total_out = sum(outs)
    dtype = getattr(torch, args.dtype)
    print(
        f"{len(prompts)} prompts, {sum(map(len, prompts))} prompt tokens, {total_out} output "
        f"tokens, dtype {args.dtype}, torch threads {torch.get_num_threads()}, "
        f"{platform.processor() or platform.machine()}"
    )
    results = {}
    results["paternoster"] = bench_paternoster(model_dir, args.dtype, prompts, outs, args)
    print(f"paternoster: {total_out / results['paternoster']:.1f} tok/s")
    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).eval()
    bench_hf(hf, prompts[:1], [4], 1)  # warm-up
    results["hf_static_batch"] = bench_hf(hf, prompts, outs, args.hf_batch_size)
    rate = total_out / results["hf_static_batch"]
    print(f"hf static batches of {args.hf_batch_size}: {rate:.1f} tok/s")
    if not args.skip_hf_single:
        results["hf_one_at_a_time"] = bench_hf(hf, prompts, outs, 1)
        print(f"hf one at a time: {total_out / results['hf_one_at_a_time']:.1f} tok/s")
    print("\n| system | output tok/s | Paternoster speed-up |")
    print("|---|---|---|")
    for name, secs in results.items():
        print(f"| {name} | {total_out / secs:.1f} | {secs / results['paternoster']:.2f}x |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"output_tokens": total_out, "seconds": results, "args": vars(args)}, f)


if __name__ == "__main__":
    main()
