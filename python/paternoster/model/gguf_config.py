"""The transformers config of a GGUF file, from its metadata: through
transformers' GGUF support (which reuses this process's parse of the file),
or built from the keys where transformers has no mapping (smollm3), with the
keys llama.cpp writes that transformers' mapping drops (head size, Llama 3's
rope frequency factors, Qwen3-MoE's routing).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from paternoster.model.gguf_config_keys import (
    Keys,
    exaone4_config,
    granitehybrid_config,
    lfm2_config,
    mistral3_config,
    nemotron_h_config,
    olmo2_config,
)
from paternoster.model.gguf_file import (
    file_architecture,
    float_field,
    gguf_reader,
    gguf_shards,
    int_field,
)

#: GGUF ``general.architecture`` values served, and the HF class they load as.
GGUF_ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
                      "qwen3": "Qwen3ForCausalLM", "qwen3moe": "Qwen3MoeForCausalLM",
                      "gemma3": "Gemma3ForCausalLM", "phi3": "Phi3ForCausalLM",
                      "smollm3": "SmolLM3ForCausalLM", "gpt-oss": "GptOssForCausalLM",
                      "qwen3next": "Qwen3NextForCausalLM", "qwen35": "Qwen3_5ForCausalLM",
                      "qwen35moe": "Qwen3_5MoeForCausalLM", "olmo2": "Olmo2ForCausalLM",
                      "exaone4": "Exaone4ForCausalLM", "mistral3": "Ministral3ForCausalLM",
                      "lfm2": "Lfm2ForCausalLM", "lfm2moe": "Lfm2MoeForCausalLM",
                      "granitehybrid": "GraniteMoeHybridForCausalLM",
                      "nemotron_h": "NemotronHForCausalLM",
                      "nemotron_h_moe": "NemotronHForCausalLM"}
#: The Gated DeltaNet hybrids (Qwen3-Next, Qwen3.5).
HYBRID_ARCHITECTURES = ("qwen3next", "qwen35", "qwen35moe")
#: Architectures whose config we build from the keys: transformers' GGUF
#: support does not know smollm3, and fails on gpt-oss's rope scaling keys
#: (transformers 5.24 reads a field's first part, its key's length, as the value).
OWN_CONFIG_ARCHITECTURES = ("smollm3", "gpt-oss", *HYBRID_ARCHITECTURES, "olmo2", "exaone4",
                            "mistral3", "lfm2", "lfm2moe", "granitehybrid", "nemotron_h",
                            "nemotron_h_moe")
#: Configs built by :mod:`paternoster.model.gguf_config_keys`.
_KEYED_CONFIGS = {"olmo2": olmo2_config, "exaone4": exaone4_config,
                  "mistral3": mistral3_config, "lfm2": lfm2_config, "lfm2moe": lfm2_config,
                  "granitehybrid": granitehybrid_config, "nemotron_h": nemotron_h_config,
                  "nemotron_h_moe": nemotron_h_config}

def load_gguf_config(path: str | Path):
    """The transformers config of a GGUF file (from its metadata).

    Raises:
        ValueError: an architecture other than :data:`GGUF_ARCHITECTURES`
            (the message lists them).
    """
    reader = gguf_reader(gguf_shards(path)[0])
    arch = file_architecture(reader, path)
    if arch not in GGUF_ARCHITECTURES:
        raise ValueError(f"{path}: GGUF architecture {arch!r} is not supported; "
                         f"supported: {', '.join(GGUF_ARCHITECTURES)}")
    from transformers import AutoConfig

    p = Path(path)
    try:
        if arch == "smollm3":
            config = _smollm3_config(reader, path)
        elif arch == "gpt-oss":
            config = _gpt_oss_config(reader, path)
        elif arch in HYBRID_ARCHITECTURES:
            config = _hybrid_config(reader, path, arch)
        elif arch in _KEYED_CONFIGS:
            keys = Keys(reader, path, arch)
            config = _KEYED_CONFIGS[arch](keys, keys.common(
                _vocab_size(reader, path, arch), _untied(reader), _special_tokens(reader)))
        else:
            with _transformers_reuses_our_parse():
                config = AutoConfig.from_pretrained(str(p.parent), gguf_file=p.name)
    except ValueError:
        raise
    except Exception as e:  # noqa: BLE001 - transformers' own GGUF reading, same file
        raise ValueError(f"{path}: transformers cannot read its config from the GGUF "
                         f"metadata, corrupt? ({type(e).__name__}: {e})") from e
    config.architectures = [GGUF_ARCHITECTURES[arch]]
    if arch == "olmo2" and getattr(config, "sliding_window", None):
        config.architectures = ["Olmo3ForCausalLM"]
    if arch == "gemma3":
        # llama.cpp scales queries by 1 / sqrt(head size), except for the 27B
        # model (62 layers), whose query_pre_attn_scalar is hidden / heads; the
        # file has no key for it (transformers' default, 256, fits 1B-12B only).
        heads = config.num_attention_heads
        config.query_pre_attn_scalar = (config.hidden_size // heads
                                        if config.num_hidden_layers == 62 else config.head_dim)
    # transformers maps no head size for qwen3 (its config then defaults to
    # 128): llama.cpp writes it as the key length.
    key_length = int_field(reader, f"{arch}.attention.key_length")
    if key_length is not None:
        config.head_dim = key_length
    if arch == "qwen3moe":
        # llama.cpp's qwen3moe: every layer routed, top-k weights renormalized
        # (build_moe_ffn with norm_w); the expert width is its own key.
        config.moe_intermediate_size = int_field(reader, f"{arch}.expert_feed_forward_length")
        config.norm_topk_prob = True
        config.decoder_sparse_step = 1
        config.mlp_only_layers = []
    rope_freqs = next((t for t in reader.tensors if t.name == "rope_freqs.weight"), None)
    if rope_freqs is not None:
        # llama.cpp's converter writes Llama 3's rope scaling as this tensor of
        # per-frequency divisors (transformers' config mapping drops it).
        config.rope_freq_factors = [float(v) for v in np.asarray(rope_freqs.data).reshape(-1)]
    # Activations and KV cache in bfloat16 under --dtype auto (the weights keep their types).
    config.dtype = "bfloat16"
    # transformers' GGUF config mapping leaves the file's type; weights carry theirs.
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    return config


@contextlib.contextmanager
def _transformers_reuses_our_parse() -> Iterator[None]:
    """While active, ``gguf.GGUFReader(path)`` (which transformers' GGUF config
    loader calls, importing the name at call time) returns this process's
    parse of the file (:func:`~paternoster.model.gguf_file.gguf_reader`)
    instead of parsing it again: the same fields, once (Llama 3's 128k-token
    vocabulary: 11.8 s -> 0 s of a 1B file's load, under cProfile). Restored
    on exit; load is single-threaded."""
    import gguf

    original = gguf.GGUFReader
    gguf.GGUFReader = lambda path, mode="r": gguf_reader(path)  # noqa: ARG005 - read-only use
    try:
        yield
    finally:
        gguf.GGUFReader = original


def _required_int(reader, path: str | Path, key: str) -> int:
    """Metadata ``key`` as an int.

    Raises:
        ValueError: the key is missing (naming the file and key).
    """
    value = int_field(reader, key)
    if value is None:
        raise ValueError(f"{path}: no {key} in the GGUF metadata")
    return value


def _vocab_size(reader, path: str | Path, arch: str) -> int:
    """``{arch}.vocab_size``, else the length of the token list (llama.cpp's
    converter writes the key for some architectures only)."""
    vocab = int_field(reader, f"{arch}.vocab_size")
    if vocab is None:
        field = reader.fields.get("tokenizer.ggml.tokens")
        vocab = len(field.data) if field is not None else _required_int(
            reader, path, f"{arch}.vocab_size")
    return vocab


def _special_tokens(reader) -> dict[str, int | None]:
    """bos/eos/pad token ids from the ``tokenizer.ggml.*`` keys."""
    return {f"{k}_token_id": int_field(reader, f"tokenizer.ggml.{key}")
            for k, key in (("bos", "bos_token_id"), ("eos", "eos_token_id"),
                           ("pad", "padding_token_id"))}


def _untied(reader) -> bool:
    """True when the file has its own ``output.weight`` (else tied to the embedding)."""
    return any(t.name == "output.weight" for t in reader.tensors)


def _smollm3_config(reader, path: str | Path):
    """SmolLM3's config from llama.cpp's ``smollm3`` keys (NoPE on every 4th
    layer, as llama.cpp hard-codes it and HF's config defaults)."""
    from transformers import SmolLM3Config

    def need(key: str) -> int:
        return _required_int(reader, path, f"smollm3.{key}")

    return SmolLM3Config(
        hidden_size=need("embedding_length"), intermediate_size=need("feed_forward_length"),
        num_hidden_layers=need("block_count"), num_attention_heads=need("attention.head_count"),
        num_key_value_heads=need("attention.head_count_kv"),
        vocab_size=_vocab_size(reader, path, "smollm3"),
        max_position_embeddings=need("context_length"),
        rope_theta=float_field(reader, "smollm3.rope.freq_base") or 10000.0,
        rms_norm_eps=float_field(reader, "smollm3.attention.layer_norm_rms_epsilon") or 1e-6,
        tie_word_embeddings=not _untied(reader), no_rope_layer_interval=4,
        **_special_tokens(reader))


def _gpt_oss_config(reader, path: str | Path):
    """gpt-oss's config from llama.cpp's ``gpt-oss`` keys (its GptOssModel
    converter): sliding-window layers first and alternating (llama.cpp's
    ``set_swa_pattern(2)``, HF's default ``layer_types``), and the YaRN
    scaling with llama.cpp's whole-dimension correction range (its
    ``ggml_rope_yarn_corr_dims`` floors and ceils: HF's ``truncate``; the
    released HF configs say ``truncate: false``, a difference of a fraction
    of one dimension pair's blend)."""
    from transformers import GptOssConfig

    def need(key: str) -> int:
        return _required_int(reader, path, f"gpt-oss.{key}")

    rope: dict = {"rope_type": "default",
                  "rope_theta": float_field(reader, "gpt-oss.rope.freq_base") or 150000.0}
    kind = reader.fields.get("gpt-oss.rope.scaling.type")
    if kind is not None and bytes(kind.parts[kind.data[0]]).decode() == "yarn":
        rope.update(
            rope_type="yarn", factor=float_field(reader, "gpt-oss.rope.scaling.factor") or 1.0,
            original_max_position_embeddings=need("rope.scaling.original_context_length"),
            beta_fast=float_field(reader, "gpt-oss.rope.scaling.yarn_beta_fast") or 32.0,
            beta_slow=float_field(reader, "gpt-oss.rope.scaling.yarn_beta_slow") or 1.0,
            truncate=True)
    return GptOssConfig(
        hidden_size=need("embedding_length"),
        intermediate_size=need("expert_feed_forward_length"),
        num_hidden_layers=need("block_count"), num_attention_heads=need("attention.head_count"),
        num_key_value_heads=need("attention.head_count_kv"),
        head_dim=need("attention.key_length"), num_local_experts=need("expert_count"),
        num_experts_per_tok=need("expert_used_count"),
        sliding_window=need("attention.sliding_window"),
        vocab_size=_vocab_size(reader, path, "gpt-oss"),
        max_position_embeddings=need("context_length"), rope_parameters=rope,
        rms_norm_eps=float_field(reader, "gpt-oss.attention.layer_norm_rms_epsilon") or 1e-5,
        tie_word_embeddings=not _untied(reader), **_special_tokens(reader))


def _hybrid_config(reader, path: str | Path, arch: str):
    """Qwen3-Next / Qwen3.5 (dense or MoE) config from llama.cpp's keys.

    - The layers' kinds from ``attention.recurrent_layers`` (else every
      ``full_attention_interval``-th layer full attention); the block count
      less ``nextn_predict_layers`` (the multi-token-prediction layers the
      converter appends, which we do not serve).
    - The Gated DeltaNet sizes from the ``ssm.*`` keys (``state_size`` the
      key head size, ``group_count`` the key heads, ``time_step_rank`` the
      value heads, ``inner_size`` all value channels).
    - The partial RoPE from ``rope.dimension_count`` over the head size
      (Qwen3.5's M-RoPE sections are plain RoPE on text positions).
    - Every layer routed where the file has experts, top-k renormalized
      (llama.cpp's ``build_moe_ffn`` with ``norm_w``).
    - Qwen3.5's value heads as its converter orders them: tiled over the key
      heads (value head j reads key head j mod Hk) where HF groups them
      (j // (Hv / Hk)); ``linear_value_heads_tiled`` tells the layers.
    """
    from transformers import Qwen3_5MoeTextConfig, Qwen3_5TextConfig, Qwen3NextConfig

    def need(key: str) -> int:
        return _required_int(reader, path, f"{arch}.{key}")

    head_dim = need("attention.key_length")
    layers = need("block_count") - (int_field(reader, f"{arch}.nextn_predict_layers") or 0)
    recurrent = reader.fields.get(f"{arch}.attention.recurrent_layers")
    if recurrent is not None:
        flags = [bool(recurrent.parts[i][0]) for i in recurrent.data][:layers]
    else:
        every = int_field(reader, f"{arch}.full_attention_interval") or 4
        flags = [(i + 1) % every != 0 for i in range(layers)]
    rope = {"rope_type": "default",
            "rope_theta": float_field(reader, f"{arch}.rope.freq_base") or 10000.0,
            "partial_rotary_factor": need("rope.dimension_count") / head_dim}
    value_heads = need("ssm.time_step_rank")
    args = dict(
        hidden_size=need("embedding_length"), num_hidden_layers=layers,
        num_attention_heads=need("attention.head_count"),
        num_key_value_heads=need("attention.head_count_kv"), head_dim=head_dim,
        vocab_size=_vocab_size(reader, path, arch),
        max_position_embeddings=need("context_length"),
        rms_norm_eps=float_field(reader, f"{arch}.attention.layer_norm_rms_epsilon") or 1e-6,
        rope_parameters=rope,
        layer_types=["linear_attention" if f else "full_attention" for f in flags],
        linear_conv_kernel_dim=need("ssm.conv_kernel"),
        linear_key_head_dim=need("ssm.state_size"),
        linear_num_key_heads=need("ssm.group_count"), linear_num_value_heads=value_heads,
        linear_value_head_dim=need("ssm.inner_size") // value_heads,
        tie_word_embeddings=not _untied(reader), **_special_tokens(reader))
    if arch == "qwen35":
        config = Qwen3_5TextConfig(intermediate_size=need("feed_forward_length"), **args)
    else:
        moe = dict(num_experts=need("expert_count"), num_experts_per_tok=need("expert_used_count"),
                   moe_intermediate_size=need("expert_feed_forward_length"),
                   shared_expert_intermediate_size=need("expert_shared_feed_forward_length"))
        if arch == "qwen35moe":
            config = Qwen3_5MoeTextConfig(**moe, **args)
        else:
            config = Qwen3NextConfig(intermediate_size=need("feed_forward_length"), **moe,
                                     **args, norm_topk_prob=True, decoder_sparse_step=1,
                                     mlp_only_layers=[])
    config.linear_value_heads_tiled = arch != "qwen3next"
    return config
