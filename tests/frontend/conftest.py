"""Fixtures for the request pipeline's tests: the default model's tokenizer."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def tokenizer(default_model_path):
    """The default model's Hugging Face tokenizer."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(default_model_path))
