"""torch's intra-op threads around CPU steps that run in the core."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


@contextlib.contextmanager
def torch_threads_off(active: bool) -> Iterator[None]:
    """While ``active``, torch's own ops run on the calling thread alone
    (``torch.set_num_threads(1)``), restored on exit. For CPU steps whose
    matrix multiplies all run in the core: the elementwise torch ops between
    the core's kernels (the Python layers' norms and adds) otherwise wake
    torch's OpenMP threads, which then compete for the cores with the core's
    polling kernel threads (OLMo-2-1B Q4_K_M at batch 32: 350-380 ms a step
    with 2 torch threads, 232 ms with 1; docs/benchmarks.md). Switching costs
    about 0.1 us."""
    threads = torch.get_num_threads() if active else 1
    if threads > 1:
        torch.set_num_threads(1)
    try:
        yield
    finally:
        if threads > 1:
            torch.set_num_threads(threads)
