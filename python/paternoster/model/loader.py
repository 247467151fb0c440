"""Build one of our model classes from an HF model directory: pick the class by
architecture, resolve the dtype, stream the safetensors weights in.

transformers is used only for the config (``AutoConfig``); modelling is ours.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import torch

from paternoster.kernels import WeightParts
from paternoster.model.attention import AttentionOps
from paternoster.model.exaone4 import Exaone4ForCausalLM
from paternoster.model.gemma3 import Gemma3ForCausalLM
from paternoster.model.gguf import gguf_weights
from paternoster.model.gguf_config import load_gguf_config
from paternoster.model.gguf_file import gguf_architecture, gguf_reader, gguf_shards, is_gguf
from paternoster.model.gpt_oss import GptOssForCausalLM
from paternoster.model.granite_hybrid import GraniteMoeHybridForCausalLM
from paternoster.model.lfm2 import Lfm2ForCausalLM, Lfm2MoeForCausalLM
from paternoster.model.llama import LlamaForCausalLM, Qwen2ForCausalLM
from paternoster.model.ministral3 import Ministral3ForCausalLM
from paternoster.model.mixtral import MixtralForCausalLM
from paternoster.model.nemotron_h import NemotronHForCausalLM
from paternoster.model.olmo2 import Olmo2ForCausalLM, Olmo3ForCausalLM
from paternoster.model.phi3 import Phi3ForCausalLM
from paternoster.model.qwen3 import Qwen3ForCausalLM
from paternoster.model.qwen3_moe import Qwen3MoeForCausalLM
from paternoster.model.qwen3_next import (
    Qwen3_5ForCausalLM,
    Qwen3_5MoeForCausalLM,
    Qwen3NextForCausalLM,
)
from paternoster.model.smollm3 import SmolLM3ForCausalLM

logger = logging.getLogger(__name__)

MODEL_CLASSES: dict[str, type[LlamaForCausalLM]] = {
    "Exaone4ForCausalLM": Exaone4ForCausalLM,
    "Gemma3ForCausalLM": Gemma3ForCausalLM,
    "GptOssForCausalLM": GptOssForCausalLM,
    "GraniteMoeHybridForCausalLM": GraniteMoeHybridForCausalLM,
    "Lfm2ForCausalLM": Lfm2ForCausalLM,
    "Lfm2MoeForCausalLM": Lfm2MoeForCausalLM,
    "LlamaForCausalLM": LlamaForCausalLM,
    "Ministral3ForCausalLM": Ministral3ForCausalLM,
    "MistralForCausalLM": LlamaForCausalLM,
    "MixtralForCausalLM": MixtralForCausalLM,
    "NemotronHForCausalLM": NemotronHForCausalLM,
    "Olmo2ForCausalLM": Olmo2ForCausalLM,
    "Olmo3ForCausalLM": Olmo3ForCausalLM,
    "Phi3ForCausalLM": Phi3ForCausalLM,
    "Qwen2ForCausalLM": Qwen2ForCausalLM,
    "Qwen3ForCausalLM": Qwen3ForCausalLM,
    "Qwen3MoeForCausalLM": Qwen3MoeForCausalLM,
    "Qwen3NextForCausalLM": Qwen3NextForCausalLM,
    "Qwen3_5ForCausalLM": Qwen3_5ForCausalLM,
    "Qwen3_5MoeForCausalLM": Qwen3_5MoeForCausalLM,
    "SmolLM3ForCausalLM": SmolLM3ForCausalLM,
}
_MODEL_TYPES = {"exaone4": "Exaone4ForCausalLM", "ministral3": "Ministral3ForCausalLM",
                "lfm2": "Lfm2ForCausalLM", "lfm2_moe": "Lfm2MoeForCausalLM",
                "nemotron_h": "NemotronHForCausalLM",
                "granitemoehybrid": "GraniteMoeHybridForCausalLM",
                "olmo2": "Olmo2ForCausalLM", "olmo3": "Olmo3ForCausalLM",
                "gemma3_text": "Gemma3ForCausalLM", "gpt_oss": "GptOssForCausalLM",
                "llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM",
                "phi3": "Phi3ForCausalLM", "mixtral": "MixtralForCausalLM",
                "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM",
                "qwen3_moe": "Qwen3MoeForCausalLM", "qwen3_next": "Qwen3NextForCausalLM",
                "qwen3_5_text": "Qwen3_5ForCausalLM", "qwen3_5_moe_text": "Qwen3_5MoeForCausalLM",
                "smollm3": "SmolLM3ForCausalLM"}
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


#: Files of which a model directory needs at least one for its tokenizer.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "spiece.model")


def _local_model(model: str | Path) -> Path:
    """``model`` as a path that exists (never a hub id: nothing is downloaded).

    Raises:
        ValueError: no such file or directory.
    """
    p = Path(model)
    if not p.exists():
        raise ValueError(f"{p}: no such file or directory")
    return p


def load_hf_config(model_dir: str | Path):
    """``transformers.AutoConfig`` of a local model directory (no remote code),
    or of a ``.gguf`` file (:func:`paternoster.model.gguf_config.load_gguf_config`).

    Raises:
        ValueError: no such path, or a directory without ``config.json``.
    """
    p = _local_model(model_dir)
    if is_gguf(p):
        return load_gguf_config(p)
    if not (p / "config.json").is_file():
        raise ValueError(f"{p}: no config.json (a model directory holds config.json, "
                         f"*.safetensors weights and tokenizer files)")
    from transformers import AutoConfig

    _check_text_tower(p / "config.json")
    return text_tower_config(AutoConfig.from_pretrained(str(p), trust_remote_code=False))


def _check_text_tower(config_json: Path) -> None:
    """Refuse, before transformers parses it, a vision-language config whose
    text tower we cannot serve: no ``text_config`` (transformers would fill
    in a default one of another size), or one of a ``model_type`` not in
    :data:`_TEXT_TOWERS` (transformers lists every model type it knows).

    Raises:
        ValueError: one line naming the file and field.
    """
    try:
        raw = json.loads(config_json.read_text())
    except (OSError, ValueError):
        return  # transformers reports an unreadable config.json itself
    archs = raw.get("architectures") or []
    tower = _TEXT_TOWERS.get(archs[0]) if archs else None
    if tower is None:
        return
    text = raw.get("text_config")
    if not isinstance(text, dict):
        raise ValueError(f"{config_json}: {archs[0]} needs a text_config (its text tower's "
                         f"config); the file has none")
    if isinstance(tower, dict) and text.get("model_type") not in tower:
        raise ValueError(f"{config_json}: {archs[0]}: text_config.model_type "
                         f"{text.get('model_type')!r} is not supported; supported: "
                         f"{', '.join(tower)}")


#: Vision-language architectures whose text tower we serve, and its class
#: (one name, or one per ``text_config.model_type``).
_TEXT_TOWERS: dict[str, str | dict[str, str]] = {
    "Qwen3_5ForConditionalGeneration": "Qwen3_5ForCausalLM",
    "Qwen3_5MoeForConditionalGeneration": "Qwen3_5MoeForCausalLM",
    # Ministral 3 (every release) and Mistral Small 3.1/3.2.
    "Mistral3ForConditionalGeneration": {"ministral3": "Ministral3ForCausalLM",
                                         "mistral": "MistralForCausalLM"},
}


def text_tower_config(config):
    """The config to build: a vision-language checkpoint's ``text_config``
    (architecture set to its causal LM, ``tie_word_embeddings`` from the
    outer config) for the architectures in ``_TEXT_TOWERS`` (Qwen3.5 and
    Ministral 3: every release is one), else ``config`` itself. Images are
    not supported.

    Raises:
        ValueError: a text tower of a ``model_type`` we do not serve.
    """
    archs = list(getattr(config, "architectures", None) or [])
    text = getattr(config, "text_config", None)
    if not archs or archs[0] not in _TEXT_TOWERS or text is None:
        return config
    tower = _TEXT_TOWERS[archs[0]]
    if isinstance(tower, dict):
        kind = getattr(text, "model_type", None)
        if kind not in tower:
            raise ValueError(f"{archs[0]}: text_config.model_type {kind!r} is not supported; "
                             f"supported: {', '.join(tower)}")
        tower = tower[kind]
    text.architectures = [tower]
    if "tie_word_embeddings" in config.to_diff_dict():
        text.tie_word_embeddings = config.tie_word_embeddings
    if getattr(config, "quantization_config", None) is not None:  # refused by the model
        text.quantization_config = config.quantization_config
    logger.info("%s: serving the text tower (%s); image inputs are not supported",
                archs[0], text.architectures[0])
    return text


def load_tokenizer(model: str | Path):
    """The HF tokenizer (with its chat template) of a model directory or a
    ``.gguf`` file (built from the file's metadata by transformers).

    Raises:
        ValueError: no such path, a directory without tokenizer files
            (:data:`TOKENIZER_FILES`; transformers would otherwise build an
            empty tokenizer from config.json alone), or a GGUF file that is
            truncated or corrupt or has no tokenizer in its metadata.
    """
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    p = _local_model(model)
    if is_gguf(p):
        gguf_architecture(p)  # a cut or corrupt file: our clear ValueError first
        if "tokenizer.ggml.model" not in gguf_reader(gguf_shards(p)[0]).fields:
            raise ValueError(f"{p}: no tokenizer in the GGUF metadata (no tokenizer.ggml.model "
                             f"key); serve a file written with its tokenizer")
        # transformers builds the tokenizer from the file's vocabulary alone;
        # AutoTokenizer would first parse the whole file once more for the
        # config (which it maps for some architectures only) and pick a class
        # that wraps the same backend: same ids, decoding, special tokens and
        # chat template on SmolLM2's, Llama 3's and Gemma 3's vocabularies,
        # 0.4-1.0 s instead of 4-8 s.
        return PreTrainedTokenizerFast.from_pretrained(str(p.parent), gguf_file=p.name)
    if p.is_dir() and not any((p / f).is_file() for f in TOKENIZER_FILES):
        raise ValueError(f"{p}: no tokenizer files (one of {', '.join(TOKENIZER_FILES)})")
    return AutoTokenizer.from_pretrained(str(p))


def model_class(hf_config) -> type[LlamaForCausalLM]:
    """Our class for ``hf_config.architectures[0]`` (or, if absent, its ``model_type``).

    Raises:
        ValueError: the architecture is not supported; the message lists the
            supported ones.
    """
    archs = list(getattr(hf_config, "architectures", None) or [])
    if not archs and getattr(hf_config, "model_type", None) in _MODEL_TYPES:
        archs = [_MODEL_TYPES[hf_config.model_type]]
    for arch in archs:
        if arch in MODEL_CLASSES:
            return MODEL_CLASSES[arch]
    raise ValueError(
        f"unsupported model architecture {archs or getattr(hf_config, 'model_type', None)!r}; "
        f"supported: {', '.join(MODEL_CLASSES)}"
    )


def checkpoint_dtype(hf_config) -> torch.dtype | None:
    """The checkpoint's dtype from ``config.dtype`` (transformers 5) or ``torch_dtype``."""
    # vars(): transformers 5 warns on attribute access to the deprecated torch_dtype.
    value = getattr(hf_config, "dtype", None) or vars(hf_config).get("torch_dtype")
    if isinstance(value, torch.dtype):
        return value
    if isinstance(value, str):
        return _DTYPES.get(value.removeprefix("torch."))
    return None


def resolve_dtype(hf_config, dtype: str, device: str = "cpu") -> torch.dtype:
    """The model dtype for a ``--dtype`` value.

    ``auto`` is the checkpoint's dtype (float32 if unknown); on CPU a float16
    checkpoint runs in bfloat16 (the CPU kernels take float32/bfloat16 only),
    on CUDA a float32 one runs in bfloat16 (the CUDA kernels take
    float16/bfloat16 only).

    Raises:
        ValueError: unknown ``dtype``, ``float16`` requested on CPU or
            ``float32`` on CUDA.
    """
    if dtype == "auto":
        resolved = checkpoint_dtype(hf_config) or torch.float32
        if resolved == torch.float16 and device == "cpu":
            logger.info("float16 checkpoint: running in bfloat16 on CPU")
            resolved = torch.bfloat16
        if resolved == torch.float32 and device == "cuda":
            logger.info("float32 checkpoint: running in bfloat16 on CUDA")
            resolved = torch.bfloat16
        return resolved
    if dtype not in _DTYPES:
        raise ValueError(f"dtype must be one of auto, {', '.join(_DTYPES)}; got {dtype!r}")
    if dtype == "float16" and device == "cpu":
        raise ValueError("dtype float16 is not supported on CPU; use bfloat16 or float32")
    if dtype == "float32" and device == "cuda":
        raise ValueError("dtype float32 is not supported on CUDA; use bfloat16 or float16")
    return _DTYPES[dtype]


def iter_safetensors(model_dir: str | Path) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) for every tensor of the checkpoint, one file at a time.

    Uses ``model.safetensors.index.json`` when present (sharded checkpoints),
    else every ``*.safetensors`` file in the directory.

    Raises:
        ValueError: no safetensors file in ``model_dir``, or one that cannot
            be read (truncated, not safetensors), naming it.
    """
    from safetensors import safe_open

    model_dir = Path(model_dir)
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        files = sorted(set(weight_map.values()))
    else:
        files = sorted(p.name for p in model_dir.glob("*.safetensors"))
    if not files:
        raise ValueError(f"no *.safetensors weights in {model_dir}")
    for file in files:
        try:
            handle = safe_open(str(model_dir / file), framework="pt")
        except Exception as e:  # noqa: BLE001 - safetensors raises its own error types
            raise ValueError(f"{model_dir / file}: not a readable safetensors file "
                             f"({type(e).__name__}: {e})") from e
        with handle as f:
            for name in f.keys():  # noqa: SIM118 - safe_open is not a Mapping
                yield name, f.get_tensor(name)


def load_model(model_dir: str | Path, hf_config, dtype: torch.dtype, ops: AttentionOps,
               max_positions: int | None = None,
               device: torch.device | None = None,
               batch_invariant: bool = False) -> LlamaForCausalLM:
    """Instantiate the model for ``hf_config`` and load its weights
    (safetensors, or a GGUF file's tensors with quantized ones kept so).

    Args:
        model_dir: HF model directory or ``.gguf`` file.
        hf_config: its config (see :func:`load_hf_config`).
        dtype: model dtype (see :func:`resolve_dtype`).
        ops: paged-attention kernels.
        max_positions: RoPE table length (defaults to ``max_position_embeddings``).
        device: where the parameters are allocated (default: CPU); weights are
            copied there tensor by tensor, never staged whole in host memory.
            Off the CPU, quantized weights are dequantized to ``dtype`` (the
            quantized kernels are CPU-only), said in a log line.
        batch_invariant: see :class:`~paternoster.model.llama.LlamaForCausalLM`.
    Returns:
        The model in eval mode.
    Raises:
        ValueError: unsupported architecture/rope/activation, no weights,
            an unreadable weight file, missing or mis-shaped weights.
    """
    cls = model_class(hf_config)
    kwargs = {"max_positions": max_positions, "batch_invariant": batch_invariant}
    if device is None:
        model = cls(hf_config, dtype, ops, **kwargs)
    else:
        with torch.device(device):
            model = cls(hf_config, dtype, ops, **kwargs)
    weights = (gguf_weights(model_dir, hf_config) if is_gguf(model_dir)
               else iter_safetensors(model_dir))
    try:
        unused = model.load_weights(weights)
    except ValueError as e:  # name the file: a mis-shaped tensor says only its name
        if str(e).startswith(str(model_dir)):
            raise
        raise ValueError(f"{model_dir}: {e}") from e
    quantized = model.quantized_weights()
    if quantized and device is not None and torch.device(device).type != "cpu":
        model.dequantize_weights()
        logger.info("dequantized %d quantized weights to %s at load: the quantized kernels "
                    "run on CPU only", len(quantized), dtype)
    elif quantized:
        parts = Counter(p.format for w in quantized
                        for p in (w.parts if isinstance(w, WeightParts) else (w,)))
        logger.info("%d weights kept quantized (%s)", len(quantized),
                    ", ".join(f"{f}: {n} matrices" for f, n in sorted(parts.items())))
    unused = [n for n in unused if not n.endswith("rotary_emb.inv_freq")]
    if unused:
        logger.warning("ignored %d checkpoint tensors, e.g. %s", len(unused), unused[:4])
    return model.eval()


def dummy_model(hf_config, dtype: torch.dtype, ops: AttentionOps, max_positions: int | None,
                device: torch.device, seed: int = 0,
                batch_invariant: bool = False) -> LlamaForCausalLM:
    """The model for ``hf_config`` with random weights, allocated on ``device``
    (``--load-format dummy``: benchmarks of a model's shapes without its
    checkpoint, as vLLM's dummy loader).

    Matrices and biases are drawn from N(0, 0.02^2) (the usual initializer
    range of Llama configs), norm weights are 1, so activations stay finite
    through any number of layers.

    Raises:
        ValueError: unsupported architecture/rope/activation.
    """
    cls = model_class(hf_config)
    with torch.device(device):
        model = cls(hf_config, dtype, ops, max_positions=max_positions,
                    batch_invariant=batch_invariant)
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    std = float(getattr(hf_config, "initializer_range", 0.02))
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.fill_(1.0)
            else:
                param.normal_(0.0, std, generator=gen)
    return model.eval()
