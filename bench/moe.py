"""Mixture-of-experts decode, three ways interleaved in one process
(``bench/decode_ab.py``'s rounds), at the batch sizes given:

- ``core``: the model as it runs: each layer's experts one call into the
  core (``paternoster/moe.h``), whole steps in the core's decoder stack;
- ``python``: the Python layers with the experts grouped per expert in
  Python (:class:`~paternoster.model.moe.SparseMoeBlock`'s torch path: two
  core matmuls and an activation per expert);
- ``per-token``: the Python layers with each token's k experts called one at
  a time (the naive baseline).

The model: Qwen3-30B-A3B's proportions scaled down (64 experts, 8 per token,
hidden 512, expert width 128, 4 layers, head size 64), the default model's
tokenizer, built with transformers into a temporary directory.

Usage (``--model``: any MoE model instead, e.g. a GGUF file of
``bench/make_gguf.py qwen3-30b-a3b``)::

    .venv/bin/python bench/moe.py --batches 1,8,32 [--threads 2] [--rounds 4] [--model PATH]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch

# Run as a script, bench/ is sys.path[0]: import bench.decode_ab through the
# repository root instead.
_ROOT = Path(__file__).resolve().parent.parent
if sys.path and Path(sys.path[0]).resolve() == _ROOT / "bench":
    sys.path[0] = str(_ROOT)
from bench.decode_ab import run_ab  # noqa: E402

SHAPE = dict(hidden_size=512, intermediate_size=1024, moe_intermediate_size=128,
             num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4, head_dim=64,
             num_experts=64, num_experts_per_tok=8, norm_topk_prob=True,
             max_position_embeddings=4096, tie_word_embeddings=True)


def build_model(out: Path) -> Path:
    """A random-weight Qwen3-MoE checkpoint with the default model's tokenizer."""
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    from paternoster.model.default_model import default_model_dir
    from paternoster.model.loader import load_tokenizer

    tokenizer = load_tokenizer(default_model_dir())
    torch.manual_seed(0)
    cfg = Qwen3MoeConfig(vocab_size=len(tokenizer), pad_token_id=0, **SHAPE)
    model = Qwen3MoeForCausalLM(cfg).to(torch.bfloat16)
    with torch.no_grad():  # HF starts the router at zero: spread the tokens
        for layer in model.model.layers:
            layer.mlp.gate.weight.normal_(0, 0.5)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def per_token_forward(self, x: torch.Tensor) -> torch.Tensor:
    """The baseline: each (token, expert) pair multiplied on its own."""
    from paternoster import kernels

    weights, experts = self.route(x)
    out = torch.zeros_like(x)
    two_i, h = 2 * self.inter, self.hidden
    for t in range(x.shape[0]):
        for s in range(self.top_k):
            e = int(experts[t, s])
            gate_up = kernels.linear(x[t:t + 1], self.gate_up_weight[e * two_i:(e + 1) * two_i])
            y = kernels.linear(kernels.silu_and_mul(gate_up), self.down_weight[e * h:(e + 1) * h])
            out[t] += y[0] * weights[t, s]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--model", default=None, help="an MoE model (default: the small one built)")
    args = ap.parse_args()

    from paternoster import LLM
    from paternoster.bench.roofline import machine_info
    from paternoster.model.moe import SparseMoeBlock

    grouped, core_experts = SparseMoeBlock.forward, SparseMoeBlock.core_experts
    batches = [int(b) for b in args.batches.split(",")]
    with tempfile.TemporaryDirectory() as d:
        path = args.model or str(build_model(Path(d)))
        llm = LLM(path, dtype="bfloat16", num_threads=args.threads,
                  max_model_len=4096, max_num_seqs=max(batches))
        model = llm.engine.runner.model

        def setting(core: bool, forward) -> Callable[[], None]:
            def apply() -> None:
                model.fused_steps = core
                SparseMoeBlock.core_experts = core_experts if core else lambda self, n: None
                SparseMoeBlock.forward = forward
            return apply

        choices = {"core": setting(True, grouped), "python": setting(False, grouped),
                   "per-token": setting(False, per_token_forward)}
        print(machine_info())
        results = run_ab(llm.engine, choices, batches, args.rounds, args.steps,
                         args.prompt_len, len(llm.tokenizer), "moe")
        setting(True, grouped)()
    print("\n| batch | core ms/step | python ms/step | per-token ms/step | python / core |")
    print("|---:|---:|---:|---:|---:|")
    for b, r in results.items():
        print(f"| {b} | {r['core']:.2f} | {r['python']:.2f} | {r['per-token']:.2f} | "
              f"{r['python'] / r['core']:.2f}× |")


if __name__ == "__main__":
    main()
