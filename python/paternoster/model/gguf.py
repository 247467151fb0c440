"""Serve a GGUF file directly: its config and weights, quantized weights kept
quantized where they lie in the file.

The config (and, in the frontend, the tokenizer and chat template) come from
the file's metadata through transformers' GGUF support; the tensors are read
with the ``gguf`` package, renamed to HF's names and handed to the model's
``load_weights``:

- F32, F16, BF16 tensors: dense, cast to the model dtype (copied: norms,
  and the matrices of an unquantized file);
- the types of :data:`QUANTIZED_TYPES` (Q4_K, Q5_K, Q6_K, Q8_0, Q5_0, Q5_1,
  Q4_0, Q4_1, IQ4_NL, IQ4_XS, MXFP4): kept as their GGUF blocks
  (:class:`~paternoster.kernels.QuantizedWeight`) *in the file's memory
  mapping* (copy-on-write, never written): no converted copy on disk, no
  second copy in RAM; computed with directly by the CPU kernels (dequantized
  at load on CUDA, which has no such kernels);
- the other quantized types (Q2_K, Q3_K, the IQ1-IQ3 family, TQ1_0, TQ2_0,
  NVFP4): dequantized at load to bfloat16 by gguf-py's reference, named in one
  log line;
- a type this ``gguf`` package does not know: refused when the file is
  opened, naming the file.

The mapping lives as long as the model: the file must not be truncated or
rewritten while it is served (as with llama.cpp's mmap).

llama.cpp's converter permutes the rows of the q and k projections of Llama
models (its RoPE pairs adjacent dimensions, HF's pairs halves); the rows are
permuted back here (the quantization blocks run along a row, so whole rows
move).
"""

from __future__ import annotations

import contextlib
import copy
import functools
import logging
import re
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from paternoster.kernels.quant import QuantizedWeight

logger = logging.getLogger(__name__)

#: GGUF ``general.architecture`` values served, and the HF class they load as.
GGUF_ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
                      "qwen3": "Qwen3ForCausalLM", "qwen3moe": "Qwen3MoeForCausalLM",
                      "gemma3": "Gemma3ForCausalLM", "phi3": "Phi3ForCausalLM",
                      "smollm3": "SmolLM3ForCausalLM"}
#: Architectures whose tensor names come from gguf-py's own name table
#: (TensorNameMap, which llama.cpp's converter writes with) read backwards over
#: the HF model's parameter names; the others use :data:`_LAYER_NAMES`.
_NAME_MAP_ARCHITECTURES = ("gemma3", "phi3", "smollm3")
#: Architectures transformers' GGUF support does not know: we build the
#: config from the keys.
OWN_CONFIG_ARCHITECTURES = ("smollm3",)
#: Architectures whose q/k rows llama.cpp's converter permutes (its LlamaModel
#: and subclasses with ``undo_permute``).
_PERMUTED_QK = ("llama", "smollm3")
#: GGUF tensor types kept quantized, by our format name.
QUANTIZED_TYPES = {t: t.lower() for t in ("Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "IQ4_NL",
                                          "MXFP4", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS")}
#: GGUF tensor types loaded dense.
DENSE_TYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}
#: GGUF tensor types dequantized at load (to bfloat16): no kernel keeps them.
DEQUANTIZED_TYPES = ("Q2_K", "Q3_K", "IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS",
                     "IQ3_S", "TQ1_0", "TQ2_0", "NVFP4")

_LAYER_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q_norm": "self_attn.q_norm",  # qwen3
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate_inp": "mlp.gate",  # qwen3moe: the router
}
#: Stacked expert matrices ([experts, rows, in_features]) -> HF's per-expert name.
_EXPERT_NAMES = {"ffn_gate_exps": "gate_proj", "ffn_up_exps": "up_proj",
                 "ffn_down_exps": "down_proj"}
_GLOBAL_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}


def is_gguf(path: str | Path) -> bool:
    """True for a path naming a ``.gguf`` file (a directory so named is not one)."""
    return str(path).lower().endswith(".gguf") and not Path(path).is_dir()


def gguf_architecture(path: str | Path) -> str:
    """The file's ``general.architecture``.

    Raises:
        ValueError: not a readable GGUF file, or the key is missing.
    """
    return _architecture(_reader(gguf_shards(path)[0]), path)


def _architecture(reader, path: str | Path) -> str:
    field = reader.fields.get("general.architecture")
    if field is None:
        raise ValueError(f"{path}: no general.architecture in the GGUF metadata")
    return bytes(field.parts[field.data[0]]).decode()


def load_gguf_config(path: str | Path):
    """The transformers config of a GGUF file (from its metadata).

    Raises:
        ValueError: an architecture other than :data:`GGUF_ARCHITECTURES`
            (the message lists them).
    """
    reader = _reader(gguf_shards(path)[0])
    arch = _architecture(reader, path)
    if arch not in GGUF_ARCHITECTURES:
        raise ValueError(f"{path}: GGUF architecture {arch!r} is not supported; "
                         f"supported: {', '.join(GGUF_ARCHITECTURES)}")
    from transformers import AutoConfig

    p = Path(path)
    try:
        if arch in OWN_CONFIG_ARCHITECTURES:  # transformers has no GGUF mapping for it
            config = _smollm3_config(reader, path)
        else:
            with _transformers_reuses_our_parse():
                config = AutoConfig.from_pretrained(str(p.parent), gguf_file=p.name)
    except ValueError:
        raise
    except Exception as e:  # noqa: BLE001 - transformers' own GGUF reading, same file
        raise ValueError(f"{path}: transformers cannot read its config from the GGUF "
                         f"metadata, corrupt? ({type(e).__name__}: {e})") from e
    config.architectures = [GGUF_ARCHITECTURES[arch]]
    if arch == "gemma3":
        # llama.cpp scales queries by 1 / sqrt(head size), except for the 27B
        # model (62 layers), whose query_pre_attn_scalar is hidden / heads; the
        # file has no key for it (transformers' default, 256, fits 1B-12B only).
        heads = config.num_attention_heads
        config.query_pre_attn_scalar = (config.hidden_size // heads
                                        if config.num_hidden_layers == 62 else config.head_dim)
    # transformers maps no head size for qwen3 (its config then defaults to
    # 128): llama.cpp writes it as the key length.
    key_length = _int_field(reader, f"{arch}.attention.key_length")
    if key_length is not None:
        config.head_dim = key_length
    if arch == "qwen3moe":
        # llama.cpp's qwen3moe: every layer routed, top-k weights renormalized
        # (build_moe_ffn with norm_w); the expert width is its own key.
        config.moe_intermediate_size = _int_field(reader, f"{arch}.expert_feed_forward_length")
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


def gguf_weights(path: str | Path,
                 hf_config) -> Iterator[tuple[str, torch.Tensor | QuantizedWeight]]:
    """The tensors of a GGUF file under HF names, quantized ones kept so.

    Args:
        path: the ``.gguf`` file.
        hf_config: its config (:func:`load_gguf_config`), for the head counts
            of the q/k row permutation.
    Yields:
        (HF name, dense tensor or :class:`QuantizedWeight`), rows in HF order.
    Raises:
        ValueError: a tensor type outside :data:`QUANTIZED_TYPES`,
            :data:`DENSE_TYPES` and :data:`DEQUANTIZED_TYPES` (naming the
            tensor and listing them).
    """
    shards = gguf_shards(path)
    reader = _reader(shards[0])
    heads = hf_config.num_attention_heads
    kv_heads = getattr(hf_config, "num_key_value_heads", None) or heads
    arch = _architecture(reader, path)
    llama = arch in _PERMUTED_QK
    names = _names_from_table(hf_config, arch) if arch in _NAME_MAP_ARCHITECTURES else None
    dequantized: dict[str, int] = {}
    tensors = [(t, shard) for shard in shards for t in _reader(shard).tensors]
    for t, shard in tensors:
        expert = _expert_tensor(t.name)
        name = names.get(t.name) if names is not None else hf_name(t.name)
        if name is None and expert is None:
            continue
        weight = _tensor(t, shard)
        if t.tensor_type.name in DEQUANTIZED_TYPES:
            dequantized[t.tensor_type.name] = dequantized.get(t.tensor_type.name, 0) + 1
        if expert is not None:
            # GGML order (K, rows, E): expert e's matrix is rows [e * rows, (e + 1) * rows).
            layer, proj = expert
            rows = int(t.shape[1])
            for e in range(int(t.shape[2])):
                part = (weight[e * rows:(e + 1) * rows] if isinstance(weight, QuantizedWeight)
                        else weight[e])
                yield f"model.layers.{layer}.mlp.experts.{e}.{proj}.weight", part
            continue
        if llama and name.endswith(("q_proj.weight", "k_proj.weight")):
            weight = unpermute_rows(weight, heads if "q_proj" in name else kv_heads)
        if arch == "gemma3" and name.endswith("norm.weight"):
            # llama.cpp's converter stores Gemma's RMSNorm weights as 1 + w
            # (its norm multiplies by the weight); ours, as HF's, adds the 1.
            weight = weight.float() - 1.0
        yield name, weight
    if dequantized:
        logger.info("%s: dequantized %s to bfloat16 at load (no kernel keeps these types "
                    "quantized; kept quantized: %s)", Path(path).name,
                    ", ".join(f"{n} {k} tensors" for k, n in sorted(dequantized.items())),
                    ", ".join(QUANTIZED_TYPES))


def _tensor(t, path: str | Path) -> torch.Tensor | QuantizedWeight:
    """One GGUF tensor: quantized rows viewing the file's mapping (stacked
    experts' rows back to back), or a dense tensor in HF's dimension order
    (a view of the mapping, for the model to copy; dequantized types: a new
    bfloat16 tensor).

    Raises:
        ValueError: a type outside :data:`QUANTIZED_TYPES`, :data:`DENSE_TYPES`
            and :data:`DEQUANTIZED_TYPES`, or a quantized tensor whose rows do
            not hold whole blocks (naming the file, tensor and type).
    """
    kind = t.tensor_type.name
    shape = [int(d) for d in reversed(t.shape)]  # HF order: [..., rows, in_features]
    if kind in QUANTIZED_TYPES:
        data = torch.from_numpy(t.data)
        try:
            return QuantizedWeight(data.reshape(-1, data.shape[-1]), QUANTIZED_TYPES[kind],
                                   shape[-1], mapped=True)
        except ValueError as e:
            raise ValueError(f"{path}: tensor {t.name} ({kind}, shape {shape}): {e}") from e
    if kind in DENSE_TYPES:
        array = t.data
        if kind == "BF16":
            weight = torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
        else:
            weight = torch.from_numpy(array)
        return weight.reshape(shape)
    if kind in DEQUANTIZED_TYPES:
        from gguf import quants

        values = quants.dequantize(t.data, t.tensor_type)
        return torch.from_numpy(values).to(torch.bfloat16).reshape(shape)
    raise ValueError(
        f"{path}: tensor {t.name} has GGUF type {kind}, which is not supported; "
        f"supported: {', '.join([*QUANTIZED_TYPES, *DENSE_TYPES, *DEQUANTIZED_TYPES])}")


_SHARD_NAME = re.compile(r"^(?P<stem>.*)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$", re.IGNORECASE)


def gguf_shards(path: str | Path) -> list[Path]:
    """The files of a model: ``[path]``, or for the first file of a split
    model (``name-00001-of-00003.gguf``, llama.cpp's ``gguf-split`` naming)
    all of its files in order; the first holds the metadata.

    Raises:
        ValueError: a split model's other file was given (naming the first),
            or one of its files is missing (naming it).
    """
    p = Path(path)
    m = _SHARD_NAME.match(p.name)
    if m is None:
        return [p]
    no, count = int(m["no"]), int(m["count"])
    shards = [p.with_name(f"{m['stem']}-{i:05d}-of-{count:05d}.gguf") for i in range(1, count + 1)]
    if no != 1:
        raise ValueError(f"{path}: file {no} of a split model; serve its first file, "
                         f"{shards[0].name}")
    for shard in shards:
        if not shard.is_file():
            raise ValueError(f"{path}: {shard.name}, file of this split model, is missing")
    return shards


def _names_from_table(hf_config, arch: str) -> dict[str, str]:
    """GGUF tensor name -> HF parameter name for the HF model of ``hf_config``:
    gguf-py's TensorNameMap (the table llama.cpp's converter names tensors
    with) applied to every parameter of that model, built on the meta device."""
    import gguf
    import transformers

    arch_enum = {v: k for k, v in gguf.MODEL_ARCH_NAMES.items()}[arch]
    table = gguf.get_tensor_name_map(arch_enum, hf_config.num_hidden_layers)
    config = copy.deepcopy(hf_config)
    config.pad_token_id = None  # a class default past a small vocabulary trips nn.Embedding
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    out = {}
    for key in model.state_dict():
        name = table.get_name(key, try_suffixes=(".weight", ".bias"))
        if name is not None:
            out[name] = key
    return out


def _expert_tensor(gguf_name: str) -> tuple[str, str] | None:
    """(layer, HF projection) of a stacked expert tensor
    (``blk.3.ffn_up_exps.weight`` -> ``("3", "up_proj")``), None for any other."""
    parts = gguf_name.split(".")
    if len(parts) != 4 or parts[0] != "blk" or parts[2] not in _EXPERT_NAMES:
        return None
    return (parts[1], _EXPERT_NAMES[parts[2]]) if parts[3] == "weight" else None


def hf_name(gguf_name: str) -> str | None:
    """HF's name for a GGUF tensor name (``blk.3.attn_q.weight`` ->
    ``model.layers.3.self_attn.q_proj.weight``), None for tensors we do not load
    (e.g. ``rope_freqs``)."""
    base, _, suffix = gguf_name.rpartition(".")
    if base in _GLOBAL_NAMES:
        return f"{_GLOBAL_NAMES[base]}.{suffix}"
    parts = base.split(".")
    if len(parts) == 3 and parts[0] == "blk" and parts[2] in _LAYER_NAMES:
        return f"model.layers.{parts[1]}.{_LAYER_NAMES[parts[2]]}.{suffix}"
    return None


def unpermute_rows(weight: torch.Tensor | QuantizedWeight,
                   num_heads: int) -> torch.Tensor | QuantizedWeight:
    """Undo llama.cpp's q/k row permutation (rows of each head go from
    interleaved pairs ``(0, d/2), (1, d/2 + 1), ...`` back to halves).

    Args:
        weight: ``[num_heads * head_dim, in_features]`` (dense or quantized rows).
        num_heads: heads of this projection.
    Returns:
        The weight with rows in HF order.
    """
    data = weight.data if isinstance(weight, QuantizedWeight) else weight
    rows = data.shape[0]
    half = rows // num_heads // 2
    # HF row (h, p, j) (p: which half, j: index in it) is GGUF row (h, j, p).
    source = torch.arange(rows).reshape(num_heads, half, 2).transpose(1, 2).reshape(rows)
    moved = data[source].contiguous()
    if isinstance(weight, QuantizedWeight):
        return QuantizedWeight(moved, weight.format, weight.in_features)
    return moved


@contextlib.contextmanager
def _transformers_reuses_our_parse() -> Iterator[None]:
    """While active, ``gguf.GGUFReader(path)`` (which transformers' GGUF config
    loader calls, importing the name at call time) returns this process's
    parse of the file (:func:`_reader`) instead of parsing it again: the same
    fields, once (Llama 3's 128k-token vocabulary: 11.8 s -> 0 s of a 1B
    file's load, under cProfile). Restored on exit; load is single-threaded."""
    import gguf

    original = gguf.GGUFReader
    gguf.GGUFReader = lambda path, mode="r": _reader(path)  # noqa: ARG005 - read-only use
    try:
        yield
    finally:
        gguf.GGUFReader = original


def _smollm3_config(reader, path: str | Path):
    """SmolLM3's config from llama.cpp's ``smollm3`` keys (NoPE on every 4th
    layer, as llama.cpp hard-codes it and HF's config defaults)."""
    from transformers import SmolLM3Config

    def need(key: str) -> int:
        value = _int_field(reader, f"smollm3.{key}")
        if value is None:
            raise ValueError(f"{path}: no smollm3.{key} in the GGUF metadata")
        return value

    vocab = _int_field(reader, "smollm3.vocab_size")
    if vocab is None:
        field = reader.fields.get("tokenizer.ggml.tokens")
        vocab = len(field.data) if field is not None else need("vocab_size")
    return SmolLM3Config(
        hidden_size=need("embedding_length"), intermediate_size=need("feed_forward_length"),
        num_hidden_layers=need("block_count"), num_attention_heads=need("attention.head_count"),
        num_key_value_heads=need("attention.head_count_kv"), vocab_size=vocab,
        max_position_embeddings=need("context_length"),
        rope_theta=_float_field(reader, "smollm3.rope.freq_base") or 10000.0,
        rms_norm_eps=_float_field(reader, "smollm3.attention.layer_norm_rms_epsilon") or 1e-6,
        tie_word_embeddings=not any(t.name == "output.weight" for t in reader.tensors),
        no_rope_layer_interval=4,
        bos_token_id=_int_field(reader, "tokenizer.ggml.bos_token_id"),
        eos_token_id=_int_field(reader, "tokenizer.ggml.eos_token_id"),
        pad_token_id=_int_field(reader, "tokenizer.ggml.padding_token_id"))


def _float_field(reader, key: str) -> float | None:
    field = reader.fields.get(key)
    return None if field is None else float(field.parts[field.data[0]][0])


def _int_field(reader, key: str) -> int | None:
    field = reader.fields.get(key)
    return None if field is None else int(field.parts[field.data[0]][0])


def _reader(path: str | Path):
    """The file's parsed header and tensor list (one parse per file per
    process while the file is unchanged: a vocabulary of 150k strings takes
    seconds to parse), whatever spelling of the path names it.

    Raises:
        ValueError: no such file, or not a readable GGUF file (naming it and
            the reader's reason: a truncated file, a tensor type this gguf
            package does not know).
    """
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"{path}: no such GGUF file")
    stat = p.stat()
    try:
        return _cached_reader(str(p.resolve()), stat.st_size, stat.st_mtime_ns)
    except Exception as e:  # noqa: BLE001 - the reader fails in many ways on a cut file
        reason = f"{type(e).__name__}: {e}"
        if "GGMLQuantizationType" in str(e):
            raise ValueError(f"{path}: a tensor type this gguf package does not know "
                             f"({reason}); supported: "
                             f"{', '.join([*QUANTIZED_TYPES, *DENSE_TYPES, *DEQUANTIZED_TYPES])}"
                             ) from e
        raise ValueError(f"{path}: not a readable GGUF file, truncated or corrupt? "
                         f"({reason})") from e


@functools.lru_cache(maxsize=1)
def _fast_reader_class():
    """gguf-py's reader over a plain ndarray view of its memory map: the same
    parse, ~4x faster (slicing a ``numpy.memmap`` runs Python-level
    ``__array_finalize__`` for each of the millions of small reads a
    vocabulary takes: 2.7 s -> 0.7 s for SmolLM2's 49k-token file). Built on
    the class in its own module, which :func:`_transformers_reuses_our_parse`
    never replaces."""
    from gguf.gguf_reader import GGUFReader

    class _Reader(GGUFReader):
        @property
        def data(self):
            return self._plain

        @data.setter
        def data(self, value) -> None:
            self._plain = value.view(np.ndarray)  # keeps the map alive (its base)

    return _Reader


@functools.lru_cache(maxsize=2)
def _cached_reader(resolved: str, size: int, mtime_ns: int):
    # Copy-on-write: writable arrays for torch, pages shared with the page
    # cache until written (we never write them).
    return _fast_reader_class()(resolved, "c")
