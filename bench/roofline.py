"""CPU roofline for decode: how many tokens/s the model's matrix multiplies allow.

A decode step at batch ``B`` multiplies ``B`` hidden vectors by every weight
matrix of the model once: ``2 * B * P`` FLOPs, where ``P`` is the number of
matmul parameters (attention and MLP projections of every layer plus the LM
head; the embedding lookup and the norms do no matmul and are left out). We
time torch ``F.linear`` on exactly those shapes at batch ``B``, one weight
tensor per layer (so the weights stream from memory as in a real forward, not
from cache), in the model's dtype, with the current torch thread count. The
measured FLOP/s divided by ``2 * P`` is the roofline: the decode tokens/s the
matmuls alone reach at that batch, an upper bound for a whole decode step
(which also runs attention, norms, sampling and scheduling). Usage::

    .venv/bin/python bench/roofline.py [--model DIR] [--batches 1,8,32,64,128] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class MatmulShape:
    """One kind of weight matrix of the model.

    Attributes:
        name: projection name (``q_proj``, ``lm_head``...).
        out_features: rows of the weight.
        in_features: columns of the weight (the hidden size it reads).
        count: how many such matrices one forward multiplies (layers).
    """

    name: str
    out_features: int
    in_features: int
    count: int

    @property
    def params(self) -> int:
        """Parameters of all ``count`` matrices."""
        return self.out_features * self.in_features * self.count


@dataclass(frozen=True)
class RooflinePoint:
    """The matmul roofline at one batch size.

    Attributes:
        batch: decode tokens per step (requests).
        seconds_per_step: median wall seconds of one pass over all weights.
        flops_per_s: measured GEMM FLOP/s (``2 * batch * params / seconds``).
        tokens_per_s: roofline decode tokens/s (``flops_per_s / (2 * params)``).
    """

    batch: int
    seconds_per_step: float
    flops_per_s: float
    tokens_per_s: float


def decode_matmuls(config: dict) -> list[MatmulShape]:
    """The weight matrices a decoder-only Llama/Qwen2-style model multiplies per token.

    Args:
        config: the model's ``config.json`` as a dict.
    Returns:
        Per-layer projections (q, k, v, o, gate, up, down) and the LM head.
    Raises:
        KeyError: a required field (``hidden_size``, ``intermediate_size``,
            ``num_hidden_layers``, ``num_attention_heads``, ``vocab_size``) is missing.
    """
    hidden = int(config["hidden_size"])
    inter = int(config["intermediate_size"])
    layers = int(config["num_hidden_layers"])
    heads = int(config["num_attention_heads"])
    kv_heads = int(config.get("num_key_value_heads") or heads)
    head_dim = int(config.get("head_dim") or hidden // heads)
    return [
        MatmulShape("q_proj", heads * head_dim, hidden, layers),
        MatmulShape("k_proj", kv_heads * head_dim, hidden, layers),
        MatmulShape("v_proj", kv_heads * head_dim, hidden, layers),
        MatmulShape("o_proj", hidden, heads * head_dim, layers),
        MatmulShape("gate_proj", inter, hidden, layers),
        MatmulShape("up_proj", inter, hidden, layers),
        MatmulShape("down_proj", hidden, inter, layers),
        MatmulShape("lm_head", int(config["vocab_size"]), hidden, 1),
    ]


def matmul_params(shapes: list[MatmulShape]) -> int:
    """Total matmul parameters ``P`` (a decode token costs ``2 * P`` FLOPs in matmuls)."""
    return sum(s.params for s in shapes)


def measure_roofline(
    shapes: list[MatmulShape],
    batches: list[int],
    dtype: torch.dtype = torch.bfloat16,
    repeats: int = 5,
) -> list[RooflinePoint]:
    """Time one pass of ``F.linear`` over every weight matrix at each batch size.

    Weights are random, one tensor per matrix (``P`` parameters in ``dtype``,
    e.g. 269 MB for SmolLM2-135M in bf16), so each pass streams them from
    memory like a forward pass does. Uses the current torch thread count.

    Args:
        shapes: from :func:`decode_matmuls`.
        batches: batch sizes (rows of the activations), each >= 1.
        dtype: weight and activation dtype.
        repeats: timed passes per batch after one warm-up pass (median kept).
    Returns:
        One :class:`RooflinePoint` per batch, in the order given.
    Raises:
        ValueError: a batch size or ``repeats`` below 1.
    """
    if repeats < 1:
        raise ValueError("repeats must be >= 1")
    if any(b < 1 for b in batches):
        raise ValueError("batches must be >= 1")
    params = matmul_params(shapes)
    gen = torch.Generator().manual_seed(0)
    weights = [
        (torch.randn(s.out_features, s.in_features, generator=gen) * 0.02).to(dtype)
        for s in shapes
        for _ in range(s.count)
    ]
    points = []
    with torch.inference_mode():
        for batch in batches:
            inputs = {
                n: torch.randn(batch, n, generator=gen).to(dtype)
                for n in {s.in_features for s in shapes}
            }
            times = []
            for _ in range(repeats + 1):
                t = time.perf_counter()
                for w in weights:
                    F.linear(inputs[w.shape[1]], w)
                times.append(time.perf_counter() - t)
            secs = statistics.median(times[1:])
            flops = 2.0 * batch * params / secs
            points.append(RooflinePoint(batch, secs, flops, flops / (2.0 * params)))
    return points


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (else :func:`platform.processor`)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_info() -> dict:
    """Platform, CPU model, logical CPUs, torch version and torch threads."""
    import os

    return {
        "platform": platform.platform(),
        "cpu": cpu_model(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="HF model dir (default: embedded SmolLM2)")
    ap.add_argument("--batches", default="1,8,32,64,128")
    ap.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", default=None, help="write results here")
    args = ap.parse_args()

    from paternoster.model.default_model import default_model_dir

    torch.set_num_threads(args.threads)
    model_dir = Path(args.model or default_model_dir())
    shapes = decode_matmuls(json.loads((model_dir / "config.json").read_text()))
    params = matmul_params(shapes)
    batches = [int(b) for b in args.batches.split(",")]
    points = measure_roofline(shapes, batches, getattr(torch, args.dtype), args.repeats)
    print(f"{params / 1e6:.1f}M matmul parameters, {args.dtype}, {machine_info()}")
    print("\n| batch | GEMM GFLOP/s | roofline tok/s |")
    print("|---:|---:|---:|")
    for p in points:
        print(f"| {p.batch} | {p.flops_per_s / 1e9:.1f} | {p.tokens_per_s:.0f} |")
    if args.json:
        out = {"params": params, "machine": machine_info(), "points": [asdict(p) for p in points]}
        Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
