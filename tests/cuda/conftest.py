"""Helpers for the CUDA tests: the correctness cases and checks of
bench/gpu_check.py (one source for the prepared GPU check and pytest), and the
GPU skip condition."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

_GPU_CHECK = Path(__file__).resolve().parents[2] / "bench" / "gpu_check.py"


def load_gpu_check():
    """bench/gpu_check.py as a module."""
    name = "paternoster_bench_gpu_check"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, _GPU_CHECK)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def cuda_ready() -> bool:
    """A GPU torch can use and the CUDA kernels built."""
    from paternoster import kernels

    return kernels.cuda_kernels_available()


requires_gpu = pytest.mark.skipif(not cuda_ready(), reason="needs a CUDA GPU and _cuda_ops")
