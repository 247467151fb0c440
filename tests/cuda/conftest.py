"""Helpers for the CUDA tests: the correctness cases and checks of
bench/gpu_check.py (one source for the prepared GPU check and pytest), judged
against the suite's own paged-attention reference (tests/paged_attention_ref.py,
not the bench's), and the GPU skip condition."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

from ..paged_attention_ref import paged_attention_reference

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


def case_reference(c: dict) -> torch.Tensor:
    """The shared float64 reference of a gpu_check case dict: ``[T, Hq, D]``."""
    return paged_attention_reference(c["query"], c["key_cache"], c["value_cache"],
                                     c["block_tables"], c["seq_lens"], c["query_start_loc"],
                                     c["scale"], sliding_window=c.get("sliding_window", 0),
                                     sinks=c.get("sinks"))


def check_attention_case(*args, **kwargs) -> dict:
    """bench/gpu_check.py's ``check_attention_case`` against :func:`case_reference`."""
    return load_gpu_check().check_attention_case(*args, reference=case_reference, **kwargs)


def cuda_ready() -> bool:
    """A GPU torch can use and the CUDA kernels built."""
    from paternoster import kernels

    return kernels.cuda_kernels_available()


requires_gpu = pytest.mark.skipif(not cuda_ready(), reason="needs a CUDA GPU and _cuda_ops")
