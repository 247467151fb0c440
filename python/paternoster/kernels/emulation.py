"""The CUDA kernels on a CPU: ``paternoster._cuda_emu`` is cuda/src compiled
against the CPU emulation of the CUDA execution model (``cuda/emu/cuda_emu.h``:
every CUDA thread a fiber, barriers and warp shuffles exact, launches
synchronous). :func:`emulated_cuda_backend` wraps it in the same
:class:`~paternoster.kernels.cuda.CudaBackend` a GPU uses, for CPU tensors:
pass it where a backend is taken (``ModelRunner(attn_ops=...)``,
``bench/gpu_check.py``'s checks) to run the GPU path's attention on a machine
without a GPU. Slow; for tests and ``bench/gpu_check.py --dry-run``.
"""

from __future__ import annotations

from typing import Any

from paternoster.kernels.cuda import CudaBackend


def load_cuda_emu() -> Any | None:
    """``paternoster._cuda_emu``, or None where it was not built (it is built
    where CMake finds the CUDA toolkit on an x86-64 host).

    Raises:
        ImportError: the module is there but does not load.
    """
    try:
        from paternoster import _cuda_emu
    except ModuleNotFoundError as e:
        if e.name != "paternoster._cuda_emu":
            raise
        return None
    return _cuda_emu


def cuda_emulation_available() -> bool:
    """True when ``paternoster._cuda_emu`` is built."""
    return load_cuda_emu() is not None


class SeededEmulation:
    """``paternoster._cuda_emu`` with one schedule seed set before each launch,
    so two backends with different seeds do not disturb each other. Other
    attributes (``emu_stats``, ``decode_num_splits``, ``DType`` ...) are the
    module's.

    Args:
        module: ``paternoster._cuda_emu``.
        schedule_seed: 0 runs emulated threads in index order between
            barriers; another value shuffles that order per round (a missing
            barrier then changes results between seeds).
    """

    def __init__(self, module: Any, schedule_seed: int) -> None:
        self.module = module
        self.schedule_seed = schedule_seed

    def __getattr__(self, name: str) -> Any:
        return getattr(self.module, name)

    def paged_attention(self, *args: Any) -> None:
        """The module's ``paged_attention`` under this seed."""
        self.module.set_schedule_seed(self.schedule_seed)
        self.module.paged_attention(*args)

    def reshape_and_cache(self, *args: Any) -> None:
        """The module's ``reshape_and_cache`` under this seed."""
        self.module.set_schedule_seed(self.schedule_seed)
        self.module.reshape_and_cache(*args)


def emulated_cuda_backend(num_sms: int = 132, schedule_seed: int = 0,
                          check_indices: bool = True) -> CudaBackend:
    """The CUDA kernels' own code and host API as a backend for CPU tensors.

    It takes the CUDA dtypes (float16, bfloat16; no float32) and the CUDA
    path's keyword arguments (``max_query_len``, ``max_seq_len``,
    ``workspace``). Index contents are checked as on the CPU path (block ids,
    lengths, ``query_start_loc``, slots, and ``max_query_len`` against the
    query lengths) unless ``check_indices`` is False; then they are trusted as
    on a GPU, and a bad one reads or writes outside its tensor. Not
    thread-safe (the emulator's statistics are per process).

    Args:
        num_sms: multiprocessors the split-K plan aims to fill (132: H100/H200).
        schedule_seed: see :class:`SeededEmulation`.
        check_indices: check index contents before each launch (see above).
    Returns:
        a :class:`CudaBackend` whose ``module`` is a :class:`SeededEmulation`
        (``backend.module.emu_stats()``).
    Raises:
        ValueError: the emulation is not built (see
            :func:`cuda_emulation_available`), or ``num_sms < 1``.
    """
    module = load_cuda_emu()
    if module is None:
        raise ValueError("the CUDA emulation (paternoster._cuda_emu) is not built; it is built "
                         "where CMake finds the CUDA toolkit, on x86-64")
    if num_sms < 1:
        raise ValueError(f"num_sms must be >= 1, got {num_sms}")
    return CudaBackend(SeededEmulation(module, schedule_seed), stream=lambda device: 0,
                       num_sms=lambda device: num_sms, check_indices=check_indices)
