"""Fixtures for frontend tests: the real tokenizer and a server in a subprocess."""

from __future__ import annotations

import pytest

from tests.entrypoints.utils import start_server


@pytest.fixture(scope="session")
def tokenizer(default_model_path):
    """The default model's Hugging Face tokenizer."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(default_model_path))


@pytest.fixture(scope="module")
def server(default_model_path):
    """`paternoster serve` on the default model with a small KV cache (one per module)."""
    with start_server(
        str(default_model_path), "--num-kv-blocks", "512", "--max-model-len", "2048"
    ) as srv:
        yield srv


@pytest.fixture(scope="session")
def tiny_tp_model(default_model_path, tmp_path_factory):
    """A tiny random Llama (odd vocabulary, biases, untied head; sharp
    logits) with the default model's tokenizer, and the HF model itself: the
    tensor-parallel serving tests' checkpoint and independent reference."""
    from tests.model.tiny_checkpoints import tiny_checkpoint

    path = tmp_path_factory.mktemp("tiny-tp")
    return path, tiny_checkpoint("llama", path, sharp=True, tokenizer_from=default_model_path)
