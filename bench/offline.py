"""Offline throughput: Paternoster vs HF transformers (one at a time, static batches,
continuous batching), plus Paternoster's decode throughput against the CPU roofline.

Throughput phase: 64 prompts of mixed lengths, output lengths drawn from 16-512
tokens, greedy, every system forced to generate exactly the requested tokens
(``ignore_eos`` / EOS disabled), the same model and dtype everywhere, one run,
one machine. Prints output tokens per second of each system and Paternoster's
speed-up over it. Systems:

- ``paternoster``: ``LLM.generate`` (continuous batching, paged KV cache, FCFS).
- ``hf-single``: HF ``generate``, one request at a time.
- ``hf-static``: HF ``generate`` on static batches, left-padded, sorted by
  prompt length, run to the batch's longest requested output; only the
  requested tokens count as output.
- ``hf-cb``: HF transformers' own continuous batching (the manager behind
  ``generate_batch``), its paged KV cache sized explicitly for this workload
  (see :func:`hf_cb_config`), one ``max_new_tokens`` per request.

Decode phase: Paternoster alone at each batch size, ``B`` prompts of 128
tokens, steady-state decode steps only (prefill excluded), against the roofline
of bench/roofline.py (measured torch GEMM FLOP/s / 2·parameters). Usage::

    .venv/bin/python bench/offline.py [--num-prompts 64] [--systems paternoster,hf-cb]
        [--decode-batches 1,8,32,64,128] [--threads 1] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import math
import random
import time
from pathlib import Path

import torch

from paternoster.bench.roofline import (
    decode_matmuls,
    machine_info,
    matmul_params,
    measure_roofline,
)

SYSTEMS = ("paternoster", "hf-single", "hf-static", "hf-cb")
MAX_MODEL_LEN = 2048  # Paternoster's context and (fcfs keeps prompts whole) token budget


def make_workload(
    tokenizer, num_prompts: int, seed: int, min_out: int, max_out: int
) -> tuple[list[list[int]], list[int]]:
    """Prompts (token ids, 8-768 tokens, log-uniform) and output lengths (uniform).

    Returns:
        ``(prompts, output_lengths)``, lengths in tokens.
    """
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


# ------------------------------------------------------------ throughput phase


def bench_paternoster(model_dir, prompts, outs, args) -> tuple[float, int]:
    """``LLM.generate`` on the whole workload.

    Returns:
        ``(seconds, output tokens generated)``.
    """
    from paternoster import LLM, SamplingParams

    llm = LLM(
        str(model_dir),
        dtype=args.dtype,
        max_num_seqs=args.max_num_seqs,
        num_threads=args.threads,
        max_model_len=MAX_MODEL_LEN,
    )
    params = [SamplingParams(temperature=0.0, max_tokens=o, ignore_eos=True) for o in outs]
    llm.generate(prompts[:2], params[:2])  # warm-up
    t = time.perf_counter()
    results = llm.generate(prompts, params)
    elapsed = time.perf_counter() - t
    return elapsed, sum(len(r.outputs[0].token_ids) for r in results)


def bench_hf(model, prompts, outs, batch_size: int) -> float:
    """HF ``generate`` on static left-padded batches (``batch_size`` 1: one at a time).

    Returns:
        Wall seconds. Each batch runs to its longest requested output
        (``min_new_tokens`` = ``max_new_tokens``, so EOS never stops it).
    """
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


def hf_cb_config(prompts, outs, args):
    """HF's ``ContinuousBatchingConfig`` sized for this workload, not from free RAM.

    On CPU its defaults size the KV cache to 60% of free RAM. Here: pages of
    ``--hf-cb-page-size`` tokens, enough blocks to hold every request whole at
    once (like Paternoster's default 1 GiB cache does for this workload), the
    same per-step caps as Paternoster (``max_num_seqs`` requests,
    ``MAX_MODEL_LEN`` tokens), no prefix sharing (Paternoster has none).
    """
    from transformers import ContinuousBatchingConfig

    page = args.hf_cb_page_size
    blocks = sum(math.ceil((len(p) + o) / page) for p, o in zip(prompts, outs))
    return ContinuousBatchingConfig(
        page_size=page,
        num_blocks=blocks + len(prompts),
        max_batch_tokens=MAX_MODEL_LEN,
        max_requests_per_batch=args.max_num_seqs,
        max_blocks_per_request=0,  # the fast decode path needs flash-attn (CUDA)
        allow_block_sharing=False,
        use_cuda_graph=False,
    )


def bench_hf_cb(model, prompts, outs, args) -> tuple[float, int, dict]:
    """HF continuous batching through ``continuous_batching_context_manager``.

    ``generate_batch`` takes one ``max_new_tokens`` for all prompts, so we add
    the requests to the same manager ourselves, each with its own
    ``max_new_tokens`` and ``eos_token_id=-1`` (EOS disabled). Timing starts
    after the manager is built (cache allocated) and started.

    Returns:
        ``(seconds, output tokens generated, resolved config)``.
    Raises:
        RuntimeError: a request failed or none came back for 600 s.
    """
    from transformers import GenerationConfig

    gen_config = GenerationConfig(do_sample=False, eos_token_id=-1, pad_token_id=0)
    cb_config = hf_cb_config(prompts, outs, args)
    with model.continuous_batching_context_manager(
        generation_config=gen_config, continuous_batching_config=cb_config, block=True
    ) as manager:
        t = time.perf_counter()
        ids = [
            manager.add_request(p, max_new_tokens=o, eos_token_id=-1) for p, o in zip(prompts, outs)
        ]
        done: dict[str, int] = {}
        while len(done) < len(ids):
            result = manager.get_result(timeout=600)
            if result is None:
                raise RuntimeError(f"hf-cb: no result for 600 s ({len(done)} done)")
            if result.error is not None:
                raise RuntimeError(f"hf-cb request {result.request_id}: {result.error}")
            if result.is_finished():
                done[result.request_id] = len(result.generated_tokens)
        elapsed = time.perf_counter() - t
        resolved = manager.continuous_batching_config
        info = {
            k: getattr(resolved, k)
            for k in ("page_size", "num_blocks", "max_batch_tokens", "max_requests_per_batch")
        }
        info["attn_implementation"] = model.config._attn_implementation
    return elapsed, sum(done.values()), info


# ---------------------------------------------------------------- decode phase


def decode_model_len(args) -> int:
    """The context :func:`decode_llm` gives: ``MAX_MODEL_LEN``, or room for
    a longer ``--decode-prompt-len`` and its timed steps."""
    need = args.decode_prompt_len + args.decode_warmup + args.decode_steps
    return max(MAX_MODEL_LEN, need + 16)


def decode_llm(model_dir, batches: list[int], args):
    """The :class:`paternoster.LLM` that :func:`bench_decode` measures: ``args``'
    dtype, threads and batch-invariant mode, ``max(batches)`` sequences a step,
    a context of :func:`decode_model_len`."""
    from paternoster import LLM

    return LLM(
        str(model_dir),
        dtype=args.dtype,
        max_num_seqs=max(batches),
        num_threads=args.threads,
        max_model_len=decode_model_len(args),
        batch_invariant=getattr(args, "batch_invariant", False),
    )


def bench_decode(model_dir, batches: list[int], args, llm=None, round_index: int = 0) -> list[dict]:
    """Paternoster's steady-state decode throughput at each batch size.

    For each ``B``: ``B`` requests of ``--decode-prompt-len`` random tokens are
    added to one :class:`EngineCore`; steps run until every request is past its
    prefill; then ``--decode-warmup`` decode steps are skipped and the next
    ``--decode-steps`` timed (each computes one token for all ``B``); the rest
    are aborted. One short request runs first, untimed (first-call costs).
    ``llm``: an engine from :func:`decode_llm` to reuse (paired rounds); by
    default one is built for this call. ``round_index`` > 0 draws other
    prompts (a reused engine's prefix cache must not serve them).

    Returns:
        Per batch: ``batch``, ``tokens_per_s``, ``step_ms`` (median),
        ``context_tokens`` (mean context at the timed steps), ``steps``, and
        ``prefill_tokens_per_s``: ``B`` x prompt tokens / the wall time of the
        steps until every request had its first token.
    Raises:
        RuntimeError: the engine ran out of work before enough decode steps.
    """
    from paternoster import SamplingParams
    from paternoster.engine.messages import EngineCoreRequest

    llm = decode_llm(model_dir, batches, args) if llm is None else llm
    engine = llm.engine
    gen = random.Random(f"{args.seed}/{round_index}" if round_index else args.seed)
    vocab = len(llm.tokenizer)
    plen = args.decode_prompt_len
    params = SamplingParams(temperature=0.0, max_tokens=decode_model_len(args) - plen,
                            ignore_eos=True)
    need = args.decode_warmup + args.decode_steps
    warm = [gen.randrange(3, vocab) for _ in range(plen)]
    llm.generate([warm], SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True))
    rows = []
    for b in batches:
        counts: dict[str, int] = {}
        for i in range(b):
            rid = f"decode-{round_index}-{b}-{i}"
            prompt = [gen.randrange(3, vocab) for _ in range(plen)]
            engine.add_request(EngineCoreRequest(rid, prompt, params))
            counts[rid] = 0
        times: list[float] = []
        prefill_s = 0.0
        while len(times) < need:
            if not engine.has_unfinished_requests():
                raise RuntimeError(f"batch {b}: only {len(times)} decode steps")
            decoding = all(c > 0 for c in counts.values())
            t = time.perf_counter()
            outputs = engine.step()
            dt = time.perf_counter() - t
            if not decoding:
                prefill_s += dt
            for o in outputs:
                counts[o.request_id] += len(o.new_token_ids)
            if decoding and sum(len(o.new_token_ids) for o in outputs) == b:
                times.append(dt)
        context = plen + sum(counts.values()) / b - args.decode_steps / 2
        engine.abort_requests(list(counts))
        timed = times[args.decode_warmup :]
        rows.append({
            "batch": b,
            "tokens_per_s": b * len(timed) / sum(timed),
            "step_ms": 1e3 * sorted(timed)[len(timed) // 2],
            "context_tokens": context,
            "steps": len(timed),
            "prefill_tokens_per_s": b * plen / prefill_s,
        })  # fmt: skip
        print(f"decode batch {b}: {rows[-1]['tokens_per_s']:.1f} tok/s")
    return rows


def decode_table(rows: list[dict], model_dir: Path, args) -> list[dict]:
    """Join decode rows with the roofline measured at the same batches (in place).

    Adds ``gemm_gflops`` (GEMM FLOP/s / 1e9 measured at that batch),
    ``roofline_tokens_per_s`` (that / 2·parameters) and ``pct_roofline``.
    """
    config = json.loads((Path(model_dir) / "config.json").read_text())
    shapes = decode_matmuls(config)
    batches = [r["batch"] for r in rows]
    points = measure_roofline(shapes, batches, getattr(torch, args.dtype), args.roofline_repeats)
    for r, p in zip(rows, points):
        r["gemm_gflops"] = p.flops_per_s / 1e9
        r["roofline_tokens_per_s"] = p.tokens_per_s
        r["pct_roofline"] = 100.0 * r["tokens_per_s"] / p.tokens_per_s
    return rows


# ------------------------------------------------------------------------ main


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="HF model dir (default: embedded SmolLM2)")
    ap.add_argument(
        "--systems",
        default=",".join(SYSTEMS),
        help=f"comma-separated subset of {','.join(SYSTEMS)} ('' to skip)",
    )
    ap.add_argument("--num-prompts", type=int, default=64)
    ap.add_argument("--min-output", type=int, default=16)
    ap.add_argument("--max-output", type=int, default=512)
    ap.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    ap.add_argument("--threads", type=int, default=1, help="torch (and core) threads")
    ap.add_argument("--batch-invariant", action="store_true",
                    help="decode phase: the engine in batch-invariant mode")
    ap.add_argument(
        "--max-num-seqs",
        type=int,
        default=64,
        help="most requests per step (Paternoster and hf-cb)",
    )
    ap.add_argument("--hf-batch-size", type=int, default=16, help="hf-static batch size")
    ap.add_argument(
        "--hf-cb-page-size",
        type=int,
        default=256,
        help="hf-cb tokens per KV page (HF's default 256)",
    )
    ap.add_argument(
        "--decode-batches", default="1,8,32,64,128", help="decode-phase batch sizes ('' to skip)"
    )
    ap.add_argument("--decode-prompt-len", type=int, default=128)
    ap.add_argument("--decode-warmup", type=int, default=2, help="decode steps not timed")
    ap.add_argument("--decode-steps", type=int, default=16, help="decode steps timed")
    ap.add_argument("--roofline-repeats", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None, help="write all numbers here")
    args = ap.parse_args()
    args.systems = [s for s in args.systems.split(",") if s]
    unknown = set(args.systems) - set(SYSTEMS)
    if unknown:
        ap.error(f"unknown systems {sorted(unknown)}; choose from {','.join(SYSTEMS)}")
    args.decode_batches = [int(b) for b in args.decode_batches.split(",") if b]
    return args


def run_throughput(model_dir, tok, args) -> dict:
    """The throughput phase: every selected system on the same workload."""
    from transformers import AutoModelForCausalLM

    prompts, outs = make_workload(
        tok, args.num_prompts, args.seed, args.min_output, args.max_output
    )
    total_out = sum(outs)
    print(
        f"{len(prompts)} prompts, {sum(map(len, prompts))} prompt tokens, {total_out} output "
        f"tokens, dtype {args.dtype}, torch threads {torch.get_num_threads()}"
    )
    dtype = getattr(torch, args.dtype)
    seconds: dict[str, float] = {}
    generated: dict[str, int] = {}
    extra: dict[str, dict] = {}
    for system in args.systems:
        if system == "paternoster":
            seconds[system], generated[system] = bench_paternoster(model_dir, prompts, outs, args)
        elif system in ("hf-single", "hf-static"):
            hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).eval()
            bench_hf(hf, prompts[:1], [4], 1)  # warm-up
            size = 1 if system == "hf-single" else args.hf_batch_size
            seconds[system], generated[system] = bench_hf(hf, prompts, outs, size), total_out
            extra[system] = {"batch_size": size}
        else:
            hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).eval()
            bench_hf_cb(hf, prompts[:2], [4, 4], args)  # warm-up
            seconds[system], generated[system], extra[system] = bench_hf_cb(hf, prompts, outs, args)
        if generated[system] != total_out:
            print(f"WARNING: {system} generated {generated[system]} of {total_out} tokens")
        print(f"{system}: {generated[system] / seconds[system]:.1f} tok/s")
    rates = {s: generated[s] / seconds[s] for s in seconds}
    ours = rates.get("paternoster")
    print("\n| system | output tok/s | seconds | Paternoster speed-up |")
    print("|---|---:|---:|---:|")
    for s, rate in rates.items():
        ratio = f"{ours / rate:.2f}x" if ours else "-"
        print(f"| {s} | {rate:.1f} | {seconds[s]:.1f} | {ratio} |")
    return {
        "num_prompts": len(prompts),
        "prompt_tokens": sum(map(len, prompts)),
        "output_tokens": total_out,
        "seconds": seconds,
        "generated_tokens": generated,
        "tokens_per_s": rates,
        "speedup": {s: ours / r for s, r in rates.items()} if ours else {},
        "config": extra,
    }


def main() -> None:
    args = parse_args()
    import transformers
    from transformers import AutoTokenizer

    from paternoster.model.default_model import default_model_dir

    torch.set_num_threads(args.threads)
    model_dir = Path(args.model or default_model_dir())
    tok = AutoTokenizer.from_pretrained(model_dir)
    machine = machine_info()
    print(f"{machine}, transformers {transformers.__version__}")
    out: dict = {"machine": machine, "transformers": transformers.__version__,
                 "model": str(model_dir), "args": vars(args)}  # fmt: skip
    if args.systems:
        out["throughput"] = run_throughput(model_dir, tok, args)
    if args.decode_batches:
        rows = decode_table(bench_decode(model_dir, args.decode_batches, args), model_dir, args)
        params = matmul_params(decode_matmuls(json.loads((model_dir / "config.json").read_text())))
        print(f"\nroofline: GEMM FLOP/s / (2 x {params / 1e6:.1f}M matmul parameters)")
        print("| batch | decode tok/s | step ms | GEMM GFLOP/s | roofline tok/s | % of roofline |")
        print("|---:|---:|---:|---:|---:|---:|")
        for r in rows:
            print(
                f"| {r['batch']} | {r['tokens_per_s']:.1f} | {r['step_ms']:.1f} "
                f"| {r['gemm_gflops']:.1f} | {r['roofline_tokens_per_s']:.0f} "
                f"| {r['pct_roofline']:.0f}% |"
            )
        out["decode"] = {"matmul_params": params, "prompt_tokens": args.decode_prompt_len,
                         "rows": rows}  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
