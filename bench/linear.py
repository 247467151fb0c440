"""Linear layers side by side: torch's GEMM (oneDNN) against the core's kernel
(``paternoster.kernels.linear``) for dense bfloat16 weights, and the core's
kernel on GGUF Q8_0 / Q4_1 weights, at decode batch sizes.

One pass multiplies a batch by every weight matrix of SmolLM2-135M's 30
layers (q/k/v, o, gate/up, down; each layer its own matrices, so the weights
stream from memory as in a real forward) and the LM head. Prints milliseconds
per pass (best of ``--repeats``), the weight bytes read per second, and the
core/torch ratio (this picks ``DENSE_CORE_MAX_TOKENS`` in
``paternoster.kernels.cpu``); then the LM head alone, float32 logits from the
core against torch's bfloat16 GEMM (the cost of the float32-logits default). Usage::

    .venv/bin/python bench/linear.py [--batches 1,2,4,8,16,32,64] [--threads 2]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
import torch.nn.functional as F
from gguf import GGMLQuantizationType, quants

from paternoster import kernels
from paternoster.bench.roofline import machine_info
from paternoster.kernels import QuantizedWeight

#: (out_features, in_features) of one SmolLM2-135M layer's matrices, and its LM head.
LAYER = ((960, 576), (576, 576), (3072, 576), (576, 1536))
LM_HEAD = (49152, 576)
GGML = {"q8_0": GGMLQuantizationType.Q8_0, "q4_1": GGMLQuantizationType.Q4_1}


def make_weights(layers: int, fmt: str, seed: int = 0) -> list:
    """Random weights of every matrix, dense bfloat16 or quantized by gguf-py."""
    gen = torch.Generator().manual_seed(seed)
    shapes = [s for _ in range(layers) for s in LAYER] + [LM_HEAD]
    out = []
    for n, k in shapes:
        w = torch.randn(n, k, generator=gen) * 0.05
        if fmt == "bf16":
            out.append(w.bfloat16())
        else:
            blocks = quants.quantize(w.numpy(), GGML[fmt])
            out.append(QuantizedWeight(torch.from_numpy(np.ascontiguousarray(blocks)), fmt, k))
    return out


def one_pass(weights: list, batch: int, core: bool) -> float:
    """Seconds for ``batch`` rows through every matrix."""
    xs = {k: torch.randn(batch, k).bfloat16() for k in {w.shape[1] for w in weights}}
    t = time.perf_counter()
    for w in weights:
        x = xs[w.shape[1]]
        if core:
            kernels.linear(x, w, invariant=True)
        else:
            F.linear(x, w)
    return time.perf_counter() - t


def best(weights: list, batch: int, core: bool, repeats: int) -> float:
    """Best of ``repeats`` passes after one warm-up, in seconds."""
    one_pass(weights, batch, core)
    return min(one_pass(weights, batch, core) for _ in range(repeats))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", default="1,2,4,8,16,32,64")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--layers", type=int, default=30)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    kernels.set_num_threads(args.threads)
    print(machine_info())
    sets = {fmt: make_weights(args.layers, fmt) for fmt in ("bf16", "q8_0", "q4_1")}
    nbytes = {fmt: sum(w.nbytes if isinstance(w, QuantizedWeight) else w.numel() * 2
                       for w in ws) for fmt, ws in sets.items()}
    print("| batch | torch bf16 ms | core bf16 ms | torch/core | core q8_0 ms | core q4_1 ms |"
          " GB/s bf16 / q8_0 / q4_1 (core) |")
    print("|---:|---:|---:|---:|---:|---:|---|")
    for b in [int(x) for x in args.batches.split(",")]:
        torch_s = best(sets["bf16"], b, False, args.repeats)
        core = {fmt: best(ws, b, True, args.repeats) for fmt, ws in sets.items()}
        gbs = " / ".join(f"{nbytes[f] / core[f] / 1e9:.1f}" for f in ("bf16", "q8_0", "q4_1"))
        print(f"| {b} | {1e3 * torch_s:.2f} | {1e3 * core['bf16']:.2f} | "
              f"{torch_s / core['bf16']:.2f} | {1e3 * core['q8_0']:.2f} | "
              f"{1e3 * core['q4_1']:.2f} | {gbs} |")
    lm_head_table([int(x) for x in args.batches.split(",")], args.repeats)


def lm_head_table(batches: list[int], repeats: int) -> None:
    """The LM head alone: float32 logits from the core (unrounded sums, the
    default) against torch's bfloat16 GEMM converted to float32 afterwards."""
    w = make_weights(0, "bf16")[-1]
    print("\n| batch | LM head: torch bf16 + .float() ms | core float32 ms | core/torch time |")
    print("|---:|---:|---:|---:|")
    for b in batches:
        x = torch.randn(b, w.shape[1]).bfloat16()
        heads = (lambda x=x: F.linear(x, w).float(),
                 lambda x=x: kernels.linear(x, w, out_dtype=torch.float32))
        times = []
        for fn in heads:
            fn()
            times.append(min(_timed(fn) for _ in range(repeats)))
        print(f"| {b} | {1e3 * times[0]:.2f} | {1e3 * times[1]:.2f} | "
              f"{times[1] / times[0]:.2f} |")


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


if __name__ == "__main__":
    main()
