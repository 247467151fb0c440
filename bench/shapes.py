"""Model directories without weights (config and the default model's
tokenizer) at the shapes of released hybrids, for ``--load-format dummy``
runs of bench/step_profile.py and bench/offline.py where no GGUF file of
the architecture is made here (Mamba2 hybrids: llama.cpp's converter for
them is not wired into bench/make_gguf.py yet).

    .venv/bin/python bench/shapes.py granite-4.0-h-1b
    .venv/bin/python bench/step_profile.py --model build/shapes/granite-4.0-h-1b \\
        --load-format dummy --batches 1 --rounds 5

Shapes are given as written below (hidden size, layers by kind, heads,
Mamba2 heads, head size, state and groups, widths, vocabulary); they follow
the published model cards' parameter counts, not copied configs.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
OUT_DIR = REPO / "build" / "shapes"



#: name -> (HF config class, its arguments).
SHAPES: dict[str, tuple[str, dict]] = {
    # A 1.5B dense Granite 4.0-H (the "H-1B" size): 40 layers, attention at
    # every 10th, 48 Mamba2 heads of 64 with state 128 in one group.
    "granite-4.0-h-1b": ("GraniteMoeHybridConfig", dict(
        hidden_size=1536, num_hidden_layers=40,
        layer_types=["full_attention" if i % 10 == 9 else "linear_attention"
                     for i in range(40)],
        num_attention_heads=12, num_key_value_heads=4, intermediate_size=4096,
        shared_intermediate_size=4096, num_local_experts=0, mamba_n_heads=48,
        mamba_d_head=64, mamba_d_state=128, mamba_n_groups=1, mamba_d_conv=4,
        mamba_expand=2, vocab_size=100352, tie_word_embeddings=True,
        max_position_embeddings=32768, position_embedding_type="nope")),
    # A 4B Nemotron-H: 52 layers, Mamba2 and MLP alternating, 4 of the MLPs
    # attention instead (26 Mamba2, 22 MLP, 4 attention);
    # 96 Mamba2 heads of 64, state 128, 8 groups; relu² MLPs of 12288.
    "nemotron-h-4b": ("NemotronHConfig", dict(
        hidden_size=3072,
        layers_block_type=[("full_attention" if i in (7, 19, 31, 43) else
                            "linear_attention") if i % 2 == 0 or i in (7, 19, 31, 43)
                           else "mlp" for i in range(52)],
        num_attention_heads=32, num_key_value_heads=8, head_dim=128,
        intermediate_size=12288, mamba_num_heads=96, mamba_head_dim=64, ssm_state_size=128,
        n_groups=8, conv_kernel=4, vocab_size=131072, tie_word_embeddings=False,
        max_position_embeddings=8192)),
}


def model_dir(name: str) -> Path:
    """``build/shapes/{name}``: its config.json and the default model's
    tokenizer files (made once)."""
    import transformers

    from paternoster.model.default_model import default_model_dir

    out = OUT_DIR / name
    if (out / "config.json").is_file():
        return out
    cls_name, kwargs = SHAPES[name]
    config = getattr(transformers, cls_name)(**kwargs)
    config.architectures = [cls_name.replace("Config", "ForCausalLM")]
    out.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(out)
    for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        src = default_model_dir() / f
        if src.is_file():
            shutil.copy(src, out / f)
    return out


def main(argv: list[str] | None = None) -> int:
    """Make the directory and print its path."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("shape", choices=sorted(SHAPES))
    print(model_dir(ap.parse_args(argv).shape))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
