"""Fixtures of the hardening tests: servers over the fake engine (the real
tokenizer, no model), so they start in seconds."""

from __future__ import annotations

import contextlib
import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.entrypoints.utils import Server, start_server

QUEUEING_ENGINE = "tests.hardening.fake_engine:QueueingFakeEngine"
MAX_MODEL_LEN = 256


@pytest.fixture(scope="session")
def fake_model_dir(default_model_path, tmp_path_factory) -> Path:
    """A directory with the default model's tokenizer files only."""
    d = tmp_path_factory.mktemp("hardening_model")
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
                 "special_tokens_map.json"):  # fmt: skip
        if (default_model_path / name).exists():
            shutil.copy(default_model_path / name, d / name)
    return d


@pytest.fixture(scope="session")
def tokenizer(fake_model_dir):
    """The default model's Hugging Face tokenizer."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(fake_model_dir))


@contextlib.contextmanager
def fake_server(model_dir: Path, opts: dict, *args: str,
                new_session: bool = False) -> Iterator[Server]:
    """A server over :class:`QueueingFakeEngine` configured by ``opts``
    (``new_session``: see :func:`start_server`)."""
    d = model_dir.parent / f"{model_dir.name}-{abs(hash(json.dumps(opts, sort_keys=True)))}"
    if not d.exists():
        shutil.copytree(model_dir, d)
    (d / "fake_engine.json").write_text(json.dumps(opts))
    with start_server(
        str(d), "--engine-cls", QUEUEING_ENGINE, "--max-model-len", str(MAX_MODEL_LEN),
        "--num-kv-blocks", "64", *args, timeout=60, new_session=new_session,
    ) as srv:  # fmt: skip
        yield srv
