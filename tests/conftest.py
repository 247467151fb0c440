"""Shared pytest fixtures."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

try:
    import paternoster  # noqa: F401
except ImportError:  # running from a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))


@pytest.fixture(scope="session")
def default_model_path() -> Path:
    """The converted SmolLM2-135M-Instruct directory (converted once, ~20 s, then
    cached under ``$PATERNOSTER_HOME``, default ``~/.cache/paternoster``)."""
    from paternoster.model.default_model import default_model_dir

    return default_model_dir(home=os.environ.get("PATERNOSTER_HOME"), progress=False)
