"""GGUF files of random-weight models at the shapes people run, made the way
published files are: an HF checkpoint (transformers ``from_config``, random
weights, bfloat16), llama.cpp's own ``convert_hf_to_gguf.py`` to BF16, then
``llama-quantize`` to each type asked for.

    .venv/bin/python bench/make_gguf.py llama-3.2-1b --types Q4_K_M,Q8_0
    -> build/gguf/llama-3.2-1b/llama-3.2-1b-{BF16,Q4_K_M,Q8_0}.gguf

Needs the llama.cpp tools and source (``bench/peers.py build``). The
tokenizer is the default model's (SmolLM2's 49k BPE, which the converter
recognises), its vocabulary padded to the model's size by the converter:
speed and memory depend on the vocabulary's size, not on its strings. Shapes
are the published configs' (hidden, layers, heads, widths, vocabulary).
Qwen3-30B-A3B's BF16 intermediate (61 GB), gpt-oss-20b's (42 GB) and
LFM2-8B-A1B's (17 GB) do not fit this disk: they are built with 16, 4 and 4
experts per layer and their quantized files widened to 128, 32 and 32
(:mod:`gguf_expand`). gpt-oss-20b is
published as MXFP4 experts with the rest in Q8_0: ``--types MXFP4_MOE``.
Random weights make near-flat next-token distributions: use these files for
speed and memory, and for correctness only through measures that do not need
a confident model.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))

import gguf_expand  # noqa: E402
import llamacpp  # noqa: E402

OUT_DIR = REPO / "build" / "gguf"

_LLAMA3_ROPE = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}

#: name -> (HF config class, its arguments): the published configs' shapes.
SHAPES: dict[str, tuple[str, dict]] = {
    "qwen3-0.6b": ("Qwen3Config", dict(
        hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
        num_attention_heads=16, num_key_value_heads=8, head_dim=128, vocab_size=151936,
        tie_word_embeddings=True, rope_theta=1_000_000.0, max_position_embeddings=40960)),
    "llama-3.2-1b": ("LlamaConfig", dict(
        hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
        num_attention_heads=32, num_key_value_heads=8, head_dim=64, vocab_size=128256,
        tie_word_embeddings=True, rope_theta=500_000.0, max_position_embeddings=131072,
        rope_scaling=_LLAMA3_ROPE)),
    "qwen3-4b": ("Qwen3Config", dict(
        hidden_size=2560, intermediate_size=9728, num_hidden_layers=36,
        num_attention_heads=32, num_key_value_heads=8, head_dim=128, vocab_size=151936,
        tie_word_embeddings=True, rope_theta=1_000_000.0, max_position_embeddings=40960)),
    "llama-3.1-8b": ("LlamaConfig", dict(
        hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=8, head_dim=128, vocab_size=128256,
        tie_word_embeddings=False, rope_theta=500_000.0, max_position_embeddings=131072,
        rope_scaling=dict(_LLAMA3_ROPE, factor=8.0))),
    "qwen3-30b-a3b": ("Qwen3MoeConfig", dict(
        hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768,
        num_hidden_layers=48, num_attention_heads=32, num_key_value_heads=4, head_dim=128,
        num_local_experts=128, num_experts_per_tok=8, norm_topk_prob=True,
        vocab_size=151936, tie_word_embeddings=False, rope_theta=1_000_000.0,
        max_position_embeddings=40960)),
    "gpt-oss-20b": ("GptOssConfig", dict(
        hidden_size=2880, intermediate_size=2880, num_hidden_layers=24,
        num_attention_heads=64, num_key_value_heads=8, head_dim=64,
        num_local_experts=32, num_experts_per_tok=4, vocab_size=201088, sliding_window=128,
        layer_types=["sliding_attention", "full_attention"] * 12, tie_word_embeddings=False,
        max_position_embeddings=131072, rope_theta=150_000.0,
        rope_scaling=dict(rope_type="yarn", factor=32.0, beta_fast=32.0, beta_slow=1.0,
                          original_max_position_embeddings=4096, truncate=False))),
    # Issue 39's families at their smallest released shapes.
    "olmo-2-1b": ("Olmo2Config", dict(
        hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
        num_attention_heads=16, num_key_value_heads=16, vocab_size=100352,
        tie_word_embeddings=False, rope_theta=500_000.0, max_position_embeddings=4096)),
    "exaone-4.0-1.2b": ("Exaone4Config", dict(
        hidden_size=2048, intermediate_size=4096, num_hidden_layers=30,
        num_attention_heads=32, num_key_value_heads=8, head_dim=64, vocab_size=102400,
        tie_word_embeddings=True, sliding_window=None, layer_types=["full_attention"] * 30,
        rope_parameters=dict(rope_type="llama3", rope_theta=1_000_000.0, factor=16.0,
                             low_freq_factor=1.0, high_freq_factor=4.0,
                             original_max_position_embeddings=8192),
        max_position_embeddings=65536)),
    "ministral-3-3b": ("Ministral3Config", dict(
        hidden_size=3072, intermediate_size=9216, num_hidden_layers=26,
        num_attention_heads=32, num_key_value_heads=8, head_dim=128, vocab_size=131072,
        tie_word_embeddings=True, max_position_embeddings=262144)),
    # LiquidAI/LFM2-1.2B: 10 short-conv layers and 6 attention layers; the
    # MLP's 12288 adjusted to 8192.
    "lfm2-1.2b": ("Lfm2Config", dict(
        hidden_size=2048, intermediate_size=12288, num_hidden_layers=16,
        num_attention_heads=32, num_key_value_heads=8, vocab_size=65536,
        full_attn_idxs=[2, 5, 8, 10, 12, 14], conv_L_cache=3, norm_eps=1e-5,
        block_multiple_of=256, block_ffn_dim_multiplier=1.0, block_auto_adjust_ff_dim=True,
        tie_word_embeddings=True, max_position_embeddings=128000,
        rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0})),
    # LiquidAI/LFM2-8B-A1B: 24 layers (18 short-conv, 6 attention), the first
    # two with a dense MLP, the others 32 experts of 1792, 4 per token.
    "lfm2-8b-a1b": ("Lfm2MoeConfig", dict(
        hidden_size=2048, intermediate_size=7168, moe_intermediate_size=1792,
        num_hidden_layers=24, num_attention_heads=32, num_key_value_heads=8,
        vocab_size=65536, num_experts=32, num_experts_per_tok=4, num_dense_layers=2,
        layer_types=["full_attention" if i in (2, 6, 10, 14, 18, 21) else "conv"
                     for i in range(24)],
        conv_L_cache=3, norm_eps=1e-5, tie_word_embeddings=True,
        max_position_embeddings=128000,
        rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0})),
}

#: Shapes whose BF16 intermediate does not fit this disk: built with this many
#: experts per layer, converted and quantized, then widened to the real count
#: (:func:`gguf_expand.expand_experts`; no BF16 file of the real model).
BUILT_EXPERTS = {"qwen3-30b-a3b": 16, "gpt-oss-20b": 4, "lfm2-8b-a1b": 4}


def hf_checkpoint(name: str, out: Path, overrides: dict | None = None) -> Path:
    """A random-weight bfloat16 HF directory of shape ``name`` (its config
    arguments updated by ``overrides``) with the default model's tokenizer
    files (made once)."""
    import torch
    import transformers

    from paternoster.model.default_model import default_model_dir

    if (out / "config.json").is_file():
        return out
    cls_name, kwargs = SHAPES[name]
    config = getattr(transformers, cls_name)(**{**kwargs, **(overrides or {})})
    config.architectures = [cls_name.replace("Config", "ForCausalLM")]
    torch.manual_seed(0)
    with torch.device("cpu"):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, max_shard_size="2GB")
    del model
    tok_dir = default_model_dir()
    for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (tok_dir / f).is_file():
            shutil.copy(tok_dir / f, tmp / f)
    tmp.replace(out)
    return out


def convert(name: str, types: list[str]) -> dict[str, Path]:
    """BF16 GGUF by llama.cpp's converter, then each of ``types`` by
    ``llama-quantize`` (each made once). For :data:`BUILT_EXPERTS` shapes:
    those files with fewer experts, then each quantized one widened to the
    real count (the BF16 one is not)."""
    experts = BUILT_EXPERTS.get(name)
    if experts is None:
        return _convert(name, name, types, {})
    out = {t: OUT_DIR / name / f"{name}-{t}.gguf" for t in types}
    todo = [t for t in types if not out[t].is_file()]
    if todo:
        stem = f"{name}-{experts}-experts"
        key = _expert_key(name)
        small = _convert(name, stem, todo, {key: experts})
        # the narrow model's BF16 file and checkpoint are of no further use: room on disk
        small.pop("BF16").unlink()
        shutil.rmtree(OUT_DIR / name / f"hf-{stem}", ignore_errors=True)
        for t in todo:
            gguf_expand.expand_experts(small[t], out[t], SHAPES[name][1][key])
            small[t].unlink()
    return out


def _expert_key(name: str) -> str:
    """The config argument holding shape ``name``'s expert count."""
    kwargs = SHAPES[name][1]
    return "num_local_experts" if "num_local_experts" in kwargs else "num_experts"


def _convert(name: str, stem: str, types: list[str], overrides: dict) -> dict[str, Path]:
    """:func:`convert` for shape ``name`` (its config updated by
    ``overrides``), files named ``{stem}-{type}.gguf``."""
    base = OUT_DIR / name
    base.mkdir(parents=True, exist_ok=True)
    bf16 = base / f"{stem}-BF16.gguf"
    out = {}
    if not bf16.is_file() or any(not (base / f"{stem}-{t}.gguf").is_file() for t in types):
        hf = hf_checkpoint(name, base / f"hf-{stem}", overrides)
        if not bf16.is_file():
            script = llamacpp.download_source() / "convert_hf_to_gguf.py"
            tmp = bf16.with_suffix(".tmp")
            subprocess.run([sys.executable, str(script), str(hf), "--outtype", "bf16",
                            "--outfile", str(tmp)], check=True)
            tmp.replace(bf16)
    out["BF16"] = bf16
    for t in types:
        dst = base / f"{stem}-{t}.gguf"
        if not dst.is_file():
            tmp = dst.with_suffix(".tmp")
            llamacpp.run_logged([llamacpp.binary("llama-quantize"), bf16, tmp, t], 3600)
            tmp.replace(dst)
        out[t] = dst
    return out


def main(argv: list[str] | None = None) -> int:
    """Make the files and print their paths and sizes."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("shape", choices=sorted(SHAPES))
    ap.add_argument("--types", default="Q4_K_M", help="llama-quantize types, comma-separated")
    ap.add_argument("--keep-hf", action="store_true", help="keep the HF checkpoint")
    args = ap.parse_args(argv)
    files = convert(args.shape, [t for t in args.types.split(",") if t])
    if not args.keep_hf:
        for hf in (OUT_DIR / args.shape).glob("hf-*"):
            shutil.rmtree(hf, ignore_errors=True)
    for t, p in files.items():
        print(f"{t}: {p} ({p.stat().st_size / 2**30:.2f} GiB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
