"""A model directory that is not one gets a ValueError naming what is wrong
(the engine logs it as one line; LLM(...) raises it): no such path, no
config.json, no tokenizer files (transformers would build an empty tokenizer
from config.json alone), no weights, an unreadable weight file."""

from __future__ import annotations

import shutil

import pytest
import torch

from paternoster.config import CacheConfig, ModelConfig
from paternoster.model.loader import load_hf_config, load_tokenizer
from paternoster.model.runner import ModelRunner

from .test_tiny_models import SMALL


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, default_model_path):
    """A tiny Llama with the default model's tokenizer files."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    d = tmp_path_factory.mktemp("tiny")
    LlamaForCausalLM(LlamaConfig(**SMALL)).save_pretrained(d)
    for f in default_model_path.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens", "vocab", "merges")):
            shutil.copy(f, d / f.name)
    return d


def _copy_without(src, dst, *suffixes):
    dst.mkdir()
    for f in src.iterdir():
        if not f.name.startswith(suffixes) and not f.name.endswith(suffixes):
            shutil.copy(f, dst / f.name)
    return dst


def test_a_complete_directory_loads(model_dir):
    assert len(load_tokenizer(model_dir)) > 100
    assert load_hf_config(model_dir).hidden_size == SMALL["hidden_size"]


def test_no_such_path(tmp_path):
    for load in (load_hf_config, load_tokenizer):
        with pytest.raises(ValueError, match="no such file or directory"):
            load(tmp_path / "nope")


def test_no_config_json(model_dir, tmp_path):
    d = _copy_without(model_dir, tmp_path / "d", "config.json")
    with pytest.raises(ValueError, match="no config.json"):
        load_hf_config(d)


def test_no_tokenizer_files(model_dir, tmp_path):
    d = _copy_without(model_dir, tmp_path / "d", "tokenizer", "vocab", "merges",
                      "special_tokens")
    with pytest.raises(ValueError, match="no tokenizer files"):
        load_tokenizer(d)


def test_no_weights_and_unreadable_weights(model_dir, tmp_path):
    d = _copy_without(model_dir, tmp_path / "d", ".safetensors")
    with pytest.raises(ValueError, match=r"no \*\.safetensors weights"):
        ModelRunner(ModelConfig(model=str(d)), CacheConfig(num_kv_blocks=4))
    (d / "model.safetensors").write_bytes((model_dir / "model.safetensors").read_bytes()[:100])
    with pytest.raises(ValueError, match="model.safetensors: not a readable safetensors"):
        ModelRunner(ModelConfig(model=str(d)), CacheConfig(num_kv_blocks=4))
