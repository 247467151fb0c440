"""Write a GGUF file from an HF Llama model the way llama.cpp's converter does
(``convert_hf_to_gguf.py``: metadata keys, tensor names, the q/k row
permutation), quantizing matrices with the ``gguf`` package's own quantizer;
for the types it has no quantizer for (the K-quants, IQ4_NL, IQ4_XS) the
matrices are random valid blocks of about the model's scale instead
(:func:`random_blocks`). The test reference is HF's model with gguf-py's
dequantization of exactly the blocks written."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from gguf import GGMLQuantizationType, GGUFWriter, RopeScalingType, quants

QTYPES = {"q8_0": GGMLQuantizationType.Q8_0, "q4_0": GGMLQuantizationType.Q4_0,
          "q4_1": GGMLQuantizationType.Q4_1, "f32": GGMLQuantizationType.F32,
          "f16": GGMLQuantizationType.F16, "q5_0": GGMLQuantizationType.Q5_0,
          "q5_1": GGMLQuantizationType.Q5_1, "mxfp4": GGMLQuantizationType.MXFP4,
          "q4_k": GGMLQuantizationType.Q4_K, "q5_k": GGMLQuantizationType.Q5_K,
          "q6_k": GGMLQuantizationType.Q6_K, "iq4_nl": GGMLQuantizationType.IQ4_NL,
          "iq4_xs": GGMLQuantizationType.IQ4_XS, "q3_k": GGMLQuantizationType.Q3_K,
          "q2_k": GGMLQuantizationType.Q2_K}
#: Types gguf-py cannot quantize: written as random valid blocks.
RANDOM_TYPES = ("q4_k", "q5_k", "q6_k", "iq4_nl", "iq4_xs", "q3_k", "q2_k")

#: Per type, byte offsets of its float16 scale fields in a block and their
#: magnitude, so values come out about N(0, 0.02^2)'s size.
_FP16_FIELDS = {"q8_0": ((0,), 2e-4), "q4_0": ((0,), 4e-3), "q4_1": ((0, 2), 4e-3),
                "q5_0": ((0,), 2e-3), "q5_1": ((0, 2), 2e-3), "iq4_nl": ((0,), 4e-4),
                "q4_k": ((0, 2), 1e-4), "q5_k": ((0, 2), 5e-5), "q6_k": ((208,), 2e-5),
                "iq4_xs": ((0,), 2e-5), "q3_k": ((108,), 2e-4), "q2_k": ((80, 82), 2e-4)}


def random_blocks(rows: int, k: int, fmt: str, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """A ``[rows, k]`` matrix of random valid blocks of ``fmt`` (random bytes,
    float16 scales set finite and small): its bytes ``[rows, row bytes]``
    and gguf-py's dequantization of them (float32 ``[rows, k]``)."""
    from gguf.constants import GGML_QUANT_SIZES

    qtype = QTYPES[fmt]
    block, nbytes = GGML_QUANT_SIZES[qtype]
    rng = np.random.default_rng(seed)
    nb = k // block
    blocks = rng.integers(0, 256, size=(rows, nb, nbytes), dtype=np.uint8)
    offsets, size = _FP16_FIELDS.get(fmt, ((), 0.0))
    for off in offsets:
        scale = (rng.uniform(0.5, 1.5, size=(rows, nb)) * size).astype(np.float16)
        blocks[:, :, off:off + 2] = scale.view(np.uint8).reshape(rows, nb, 2)
    if fmt == "mxfp4":  # E8M0 scales 2^-8 .. 2^-4 (halved: 2^(e - 128))
        blocks[:, :, 0] = rng.integers(120, 125, size=(rows, nb), dtype=np.uint8)
    data = blocks.reshape(rows, -1)
    return data, quants.dequantize(data, qtype).astype(np.float32)

_LAYER = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
          "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
          "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
          "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
          "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
          "mlp.gate": "ffn_gate_inp"}


def write_model_keys(w: GGUFWriter, cfg, rope_theta: float, blocks: int | None = None) -> None:
    """The keys every converter writes: block count (``blocks``, else the
    config's layers), context, widths, head counts, RoPE base, norm epsilon."""
    w.add_block_count(cfg.num_hidden_layers if blocks is None else blocks)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    if getattr(cfg, "intermediate_size", None):
        w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_rope_freq_base(float(rope_theta))
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)


def finish(w: GGUFWriter) -> None:
    """Write the header, metadata and tensors, and close the file."""
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_tensor(w: GGUFWriter, name: str, array: np.ndarray, kind: str) -> np.ndarray:
    """Write ``array`` as tensor ``name`` in type ``kind`` (a key of QTYPES;
    quantized along its last axis, any leading shape; F16 where the last axis
    holds no whole blocks, as llama-quantize falls back) and return the values
    the file holds, float32, in ``array``'s shape (gguf-py's dequantizer)."""
    array = np.ascontiguousarray(array, dtype=np.float32)
    qtype = QTYPES[kind]
    if qtype == GGMLQuantizationType.F32:
        w.add_tensor(name, array)
        return array
    if array.shape[-1] % 32:
        half = array.astype(np.float16)
        w.add_tensor(name, half)
        return half.astype(np.float32)
    shape = array.shape
    data = quants.quantize(array.reshape(-1, shape[-1]), qtype)
    w.add_tensor(name, data.reshape(*shape[:-1], -1), raw_dtype=qtype)
    return quants.dequantize(data, qtype).reshape(shape)


def permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's q/k row permutation (HF halves -> interleaved pairs)."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(
        w.shape)


def write_llama_gguf(hf_model, path: Path, matrix_type: str, embed_type: str = "q8_0",
                     layer_types: dict[str, str] | None = None,
                     arch: str = "llama",
                     split_max_tensors: int = 0,
                     tokenizer: bool = True) -> dict[str, torch.Tensor]:
    """Write ``hf_model`` (an HF ``LlamaForCausalLM``, or ``Qwen3ForCausalLM``
    with ``arch="qwen3"``: no q/k row permutation, the head size as the key
    and value lengths, the per-head q/k norms; or ``Qwen3MoeForCausalLM`` with
    ``arch="qwen3moe"``: also the expert counts and width, the router as
    ``ffn_gate_inp`` in F32 and each layer's experts stacked into
    ``ffn_{gate,up,down}_exps`` [E, rows, K], as llama.cpp's Qwen2MoeModel
    converter writes them; ``Gemma3ForCausalLM`` with ``arch="gemma3"``: the
    local RoPE base and window as keys, norm weights stored as ``1 + w``;
    ``SmolLM3ForCausalLM`` with ``arch="smollm3"``: q/k rows permuted as
    Llama's) to ``path``. The keys and transformations are those the real
    converter writes (checked on its output for tiny random checkpoints:
    logits within 2e-6 of HF's).

    Args:
        matrix_type: GGUF type of the layer matrices (``q8_0``, ``q4_0``,
            ``q4_1``, ``f32``, ``f16``).
        embed_type: type of ``token_embd`` (and of ``output`` when untied).
        layer_types: per HF-suffix overrides (e.g. ``{"self_attn.v_proj": "q8_0"}``).
        split_max_tensors: > 0: split into files of at most this many tensors
            (``path``'s stem + ``-00001-of-0000N.gguf``, gguf-split's naming).
        tokenizer: False: no ``tokenizer.*`` keys (a file without its tokenizer).
    Returns:
        The HF state dict with every tensor replaced by what the file holds,
        dequantized by gguf-py and un-permuted (the reference weights).
    """
    cfg = hf_model.config
    w = GGUFWriter(str(path), arch, split_max_tensors=split_max_tensors)
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    rope = cfg.rope_parameters
    write_model_keys(w, cfg, rope.get("full_attention", rope)["rope_theta"])
    w.add_vocab_size(cfg.vocab_size)
    w.add_rope_dimension_count(head_dim)
    if arch in ("qwen3", "qwen3moe", "gemma3") or (
            arch in ("exaone4", "mistral3") and getattr(cfg, "head_dim", None)):
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
    if arch in ("olmo2", "exaone4"):
        _write_window_keys(w, cfg)
    if arch == "mistral3":
        _write_yarn_keys(w, rope)
    if arch == "gemma3":  # as llama.cpp's Gemma3Model writes them
        w.add_sliding_window(cfg.sliding_window)
        local = cfg.rope_parameters["sliding_attention"]["rope_theta"]
        w.add_rope_freq_base_swa(float(local))
    if arch == "qwen3moe":
        w.add_expert_count(cfg.num_experts)
        w.add_expert_used_count(cfg.num_experts_per_tok)
        w.add_expert_feed_forward_length(cfg.moe_intermediate_size)
    rope_scaling = cfg.rope_parameters if isinstance(cfg.rope_parameters, dict) else {}
    if rope_scaling.get("rope_type") == "llama3":  # as LlamaModel.generate_extra_tensors
        w.add_tensor("rope_freqs.weight", _llama3_rope_factors(rope_scaling, head_dim))
    w.add_file_type(1)
    if tokenizer:
        _write_tokenizer(w, cfg.vocab_size)
    reference: dict[str, torch.Tensor] = {}
    for name, tensor in hf_model.state_dict().items():
        if name == "lm_head.weight" and cfg.tie_word_embeddings:
            continue  # llama.cpp writes no output.weight for tied embeddings
        if ".mlp.experts." in name:  # transformers 5's fused [E, 2I, H] / [E, H, I]
            reference[name] = _write_experts(w, name, tensor, layer_types.get(
                "mlp.experts", matrix_type) if layer_types else matrix_type)
            continue
        gguf_name, kind = _gguf_name(name, matrix_type, embed_type, layer_types or {})
        if arch in _TABLE_NAMED:  # gguf-py's name table, as llama.cpp's converter
            gguf_name = _table_name(arch, cfg.num_hidden_layers, name)
            kind = kind or (layer_types or {}).get(name.split(".")[-2], matrix_type)
        if gguf_name is None:
            continue
        array = tensor.float().numpy()
        if arch == "gemma3" and name.endswith("norm.weight"):
            array = array + 1.0  # llama.cpp stores Gemma's 1 + w
        heads = None
        if arch not in ("llama", "smollm3", "mistral3"):
            pass  # llama.cpp permutes the q/k rows of its LlamaModel family only
        elif name.endswith("q_proj.weight"):
            heads = cfg.num_attention_heads
        elif name.endswith("k_proj.weight"):
            heads = cfg.num_key_value_heads
        if heads is not None:
            array = permute(array, heads)
        qtype = QTYPES[kind if array.ndim == 2 else "f32"]
        if qtype == GGMLQuantizationType.F16:
            data = array.astype(np.float16)
            w.add_tensor(gguf_name, data)
        elif qtype == GGMLQuantizationType.F32:
            data = array
            w.add_tensor(gguf_name, data)
        elif kind in RANDOM_TYPES:
            data, _ = random_blocks(array.shape[0], array.shape[1], kind,
                                    seed=len(reference) + 1000 * array.shape[0])
            w.add_tensor(gguf_name, data, raw_dtype=qtype)
        else:
            data = quants.quantize(array, qtype)
            w.add_tensor(gguf_name, data, raw_dtype=qtype)
        values = quants.dequantize(data, qtype) if qtype not in (
            GGMLQuantizationType.F16, GGMLQuantizationType.F32) else data.astype(np.float32)
        values = values.reshape(array.shape)
        if heads is not None:  # back to HF's row order
            values = values.reshape(heads, values.shape[0] // heads // 2, 2, -1).swapaxes(
                1, 2).reshape(array.shape)
        if arch == "gemma3" and name.endswith("norm.weight"):
            values = values - 1.0
        reference[name] = torch.from_numpy(np.ascontiguousarray(values, dtype=np.float32))
    finish(w)
    if cfg.tie_word_embeddings:
        reference["lm_head.weight"] = reference["model.embed_tokens.weight"]
    return reference


def _write_tokenizer(w: GGUFWriter, vocab_size: int) -> None:
    """A byte-level BPE vocabulary of ``vocab_size``, so transformers can read the file."""
    tokens = ["<s>", "</s>", "<unk>", "a", "b", "ab"]
    tokens += [f"x{i}" for i in range(vocab_size - len(tokens))]
    w.add_tokenizer_model("gpt2")
    w.add_token_list(tokens)
    w.add_token_types([3, 3, 3] + [1] * (vocab_size - 3))
    w.add_token_scores([0.0] * vocab_size)
    w.add_token_merges(["a b"])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)


def _llama3_rope_factors(params: dict, head_dim: int) -> np.ndarray:
    """Llama 3's rope scaling as llama.cpp's converter writes it: a divisor per
    frequency (1 for short wavelengths, ``factor`` for long ones, blended)."""
    import math

    base, factor = float(params["rope_theta"]), float(params["factor"])
    low, high = float(params["low_freq_factor"]), float(params["high_freq_factor"])
    old = float(params["original_max_position_embeddings"])
    out = []
    for freq in 1.0 / base ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim):
        wavelen = 2 * math.pi / freq
        if wavelen < old / high:
            out.append(1.0)
        elif wavelen > old / low:
            out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.asarray(out, dtype=np.float32)


#: Architectures written with gguf-py's TensorNameMap (the converter's table).
_TABLE_NAMED = ("gemma3", "smollm3", "phi3", "olmo2", "exaone4", "mistral3")


def _write_window_keys(w: GGUFWriter, cfg) -> None:
    """OLMo 3's and EXAONE 4's window, layer pattern and RoPE (llama.cpp's
    Olmo2Model / Exaone4Model and TextModel.set_gguf_parameters)."""
    if getattr(cfg, "sliding_window", None):
        w.add_sliding_window(cfg.sliding_window)
        w.add_sliding_window_pattern([t == "sliding_attention" for t in cfg.layer_types])
    rope = cfg.rope_parameters
    local = rope.get("sliding_attention", {}).get("rope_theta")
    if local is not None:
        w.add_rope_freq_base_swa(float(local))
    _write_yarn_keys(w, rope.get("full_attention", rope))


def _write_yarn_keys(w: GGUFWriter, rope: dict) -> None:
    """YaRN scaling keys (TextModel.set_gguf_parameters) and Ministral 3's
    log multiplier and query temperature (Mistral3Model)."""
    if rope.get("rope_type") != "yarn":
        return
    w.add_rope_scaling_type(RopeScalingType.YARN)
    w.add_rope_scaling_factor(rope["factor"])
    w.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
    for key, add in (("beta_fast", w.add_rope_scaling_yarn_beta_fast),
                     ("beta_slow", w.add_rope_scaling_yarn_beta_slow)):
        if rope.get(key) is not None:
            add(rope[key])
    if rope.get("llama_4_scaling_beta") is not None:
        w.add_rope_scaling_yarn_log_mul(rope["mscale_all_dim"])
        w.add_attn_temperature_scale(rope["llama_4_scaling_beta"])


def _table_name(arch: str, layers: int, hf_name: str) -> str | None:
    from gguf import MODEL_ARCH_NAMES, get_tensor_name_map

    enum = {v: k for k, v in MODEL_ARCH_NAMES.items()}[arch]
    return get_tensor_name_map(enum, layers).get_name(hf_name, try_suffixes=(".weight", ".bias"))


def _gguf_name(name: str, matrix: str, embed: str,
               overrides: dict[str, str]) -> tuple[str | None, str]:
    if name == "model.embed_tokens.weight":
        return "token_embd.weight", embed
    if name == "model.norm.weight":
        return "output_norm.weight", "f32"
    if name == "lm_head.weight":
        return "output.weight", embed
    parts = name.split(".")
    if parts[:2] != ["model", "layers"]:
        return None, ""
    suffix = ".".join(parts[3:-1])
    if suffix not in _LAYER:
        return None, ""
    default = "f32" if suffix == "mlp.gate" else matrix  # llama.cpp keeps routers in F32
    return f"blk.{parts[2]}.{_LAYER[suffix]}.{parts[-1]}", overrides.get(suffix, default)


def _write_experts(w: GGUFWriter, name: str, tensor: torch.Tensor, kind: str) -> torch.Tensor:
    """Write one layer's stacked experts (``...mlp.experts.gate_up_proj`` [E, 2I, H]
    as ``ffn_gate_exps`` and ``ffn_up_exps`` [E, I, H]; ``down_proj`` [E, H, I]
    as ``ffn_down_exps``); returns the tensor as the file holds it, dequantized."""
    layer = name.split(".")[2]
    array = tensor.float().numpy()
    parts = ({"ffn_gate_exps": array[:, : array.shape[1] // 2],
              "ffn_up_exps": array[:, array.shape[1] // 2 :]}
             if name.endswith("gate_up_proj") else {"ffn_down_exps": array})
    values = [write_tensor(w, f"blk.{layer}.{gguf_name}.weight", part, kind)
              for gguf_name, part in parts.items()]
    return torch.from_numpy(np.ascontiguousarray(np.concatenate(values, axis=1),
                                                 dtype=np.float32))


def write_gpt_oss_gguf(hf_model, path: Path, matrix_type: str,
                       expert_type: str) -> dict[str, torch.Tensor]:
    """Write an HF ``GptOssForCausalLM`` as llama.cpp's GptOssModel converter
    does (checked on its output for a tiny random checkpoint, and that file
    against llama-server: bench/gguf_agreement.py): ``gpt-oss`` keys with the
    YaRN scaling, gguf-py's name table, sinks as ``attn_sinks.weight``, the
    router and biases in F32, each layer's fused ``gate_up_proj``
    ``[E, H, 2I]`` (gate and up columns interleaved) split into
    ``ffn_gate_exps`` / ``ffn_up_exps`` ``[E, I, H]`` and ``down_proj``
    ``[E, I, H]`` written as ``ffn_down_exps`` ``[E, H, I]``.

    Args:
        matrix_type: type of the attention matrices, embedding and output.
        expert_type: type of the expert matrices (``mxfp4``, as published).
    Returns:
        The HF state dict with every tensor as the file holds it
        (dequantized by gguf-py), in HF's layout.
    """
    from gguf import RopeScalingType

    cfg = hf_model.config
    rope = cfg.rope_parameters
    w = GGUFWriter(str(path), "gpt-oss")
    write_model_keys(w, cfg, rope["rope_theta"])
    w.add_expert_count(cfg.num_local_experts)
    w.add_expert_used_count(cfg.num_experts_per_tok)
    w.add_key_length(cfg.head_dim)
    w.add_value_length(cfg.head_dim)
    w.add_sliding_window(cfg.sliding_window)
    w.add_expert_feed_forward_length(cfg.intermediate_size)
    w.add_rope_scaling_type(RopeScalingType.YARN)
    w.add_rope_scaling_factor(float(rope["factor"]))
    w.add_rope_scaling_orig_ctx_len(int(rope["original_max_position_embeddings"]))
    w.add_rope_scaling_yarn_beta_fast(float(rope["beta_fast"]))
    w.add_rope_scaling_yarn_beta_slow(float(rope["beta_slow"]))
    w.add_file_type(1)
    _write_tokenizer(w, cfg.vocab_size)
    layers = cfg.num_hidden_layers

    def put(gguf_name: str, array: np.ndarray, kind: str) -> np.ndarray:
        return write_tensor(w, gguf_name, array, kind)

    reference: dict[str, torch.Tensor] = {}
    for name, tensor in hf_model.state_dict().items():
        array = tensor.float().numpy()
        if ".mlp.experts." in name:
            at = f"blk.{name.split('.')[2]}"
            if name.endswith("gate_up_proj"):  # [E, H, 2I] -> gate, up [E, I, H]
                gate = put(f"{at}.ffn_gate_exps.weight", array[:, :, 0::2].swapaxes(1, 2),
                           expert_type)
                up = put(f"{at}.ffn_up_exps.weight", array[:, :, 1::2].swapaxes(1, 2),
                         expert_type)
                out = np.empty_like(array)
                out[:, :, 0::2], out[:, :, 1::2] = gate.swapaxes(1, 2), up.swapaxes(1, 2)
            elif name.endswith("gate_up_proj_bias"):  # [E, 2I]
                out = np.empty_like(array)
                out[:, 0::2] = put(f"{at}.ffn_gate_exps.bias", array[:, 0::2], "f32")
                out[:, 1::2] = put(f"{at}.ffn_up_exps.bias", array[:, 1::2], "f32")
            elif name.endswith("down_proj"):  # [E, I, H] -> [E, H, I]
                out = put(f"{at}.ffn_down_exps.weight", array.swapaxes(1, 2),
                          expert_type).swapaxes(1, 2)
            else:  # down_proj_bias [E, H]
                out = put(f"{at}.ffn_down_exps.bias", array, "f32")
            reference[name] = torch.from_numpy(np.ascontiguousarray(out))
            continue
        gguf_name = _table_name("gpt-oss", layers, name)
        if name.endswith(".sinks"):
            gguf_name += ".weight"  # the converter's filter_tensors
        kind = matrix_type if array.ndim == 2 and ".router." not in name else "f32"
        reference[name] = torch.from_numpy(put(gguf_name, array, kind))
    finish(w)
    return reference
