"""Shared pytest fixtures."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

# Engines started by the tests (in-process, and the servers they spawn, which
# inherit the environment) run 1 thread unless a test passes num_threads: the
# suite starts many engines, often at once, on small machines. The default
# (auto: the physical cores) is tested in tests/engine/test_cpu_threads.py.
os.environ.setdefault("PATERNOSTER_NUM_THREADS", "1")

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
