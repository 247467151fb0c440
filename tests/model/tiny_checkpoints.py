"""Tiny random Llama-, Qwen2- and Qwen3-shaped checkpoints that exercise the
tensor-parallel split (an odd vocabulary, biases, tied and untied heads, q/k
norms, an explicit head_dim), for the layer tests and the serving tests."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

KINDS = ("llama", "qwen2", "qwen3")


def tiny_checkpoint(kind: str, path: Path, *, sharp: bool = False,
                    tokenizer_from: Path | None = None, vocab_size: int | None = None):
    """Write a float32 2-layer model of ``kind`` (one of :data:`KINDS`) to
    ``path``; return the HF model (eval mode), the independent reference.

    Args:
        sharp: matrices drawn with std 0.08 instead of 0.02: sharper logits,
            so greedy ids have no near-ties that rounding could flip.
        tokenizer_from: a model directory whose tokenizer files are copied
            (``LLM`` and the server need one; token ids below the vocabulary
            decode to something).
        vocab_size: replaces the kind's own (e.g. the tokenizer's, so that
            text prompts and chat templates run).
    """
    import transformers

    small = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    torch.manual_seed(7)
    if kind == "llama":  # odd vocabulary (a padded shard), every bias, untied head
        cfg = transformers.LlamaConfig(**small, vocab_size=vocab_size or 131, attention_bias=True,
                                       mlp_bias=True, tie_word_embeddings=False)
        model = transformers.LlamaForCausalLM(cfg)
    elif kind == "qwen2":  # q/k/v biases, tied head
        cfg = transformers.Qwen2Config(**small, vocab_size=vocab_size or 128,
                                       tie_word_embeddings=True)
        model = transformers.Qwen2ForCausalLM(cfg)
    else:  # qwen3: q/k norms, head_dim != hidden / heads
        cfg = transformers.Qwen3Config(**small, vocab_size=vocab_size or 128, head_dim=24,
                                       tie_word_embeddings=True)
        model = transformers.Qwen3ForCausalLM(cfg)
    with torch.no_grad():  # biases and norms away from 0 and 1, so that they matter
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
            elif name.endswith("bias"):
                p.normal_(0, 0.1)
            elif sharp and p.dim() == 2:
                p.normal_(0, 0.08)
    model = model.float().eval()
    model.save_pretrained(path)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        if tokenizer_from is not None and (Path(tokenizer_from) / name).exists():
            shutil.copy(Path(tokenizer_from) / name, Path(path) / name)
    return model
