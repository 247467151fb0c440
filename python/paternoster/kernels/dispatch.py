"""The one place that picks the kernels of a device: ``cpu`` gets the C++
core (:class:`~paternoster.kernels.cpu.CpuBackend`), ``cuda`` the CUDA
extension (:class:`~paternoster.kernels.cuda.CudaBackend`), any other device
type the torch reference (:class:`~paternoster.kernels.backend.NativeBackend`,
no paged attention). The choice is made once per device type and never
changes; a different backend for the same tensors (the CUDA emulation on CPU
tensors, a test's fake) is an object passed to whoever runs the op, not a
replacement of this table.
"""

from __future__ import annotations

import functools

import torch

from paternoster.kernels.backend import Backend, NativeBackend
from paternoster.kernels.cpu import CpuBackend
from paternoster.kernels.cuda import CudaBackend, load_cuda_ops


@functools.cache
def _backend_for_type(device_type: str) -> Backend:
    if device_type == "cpu":
        return CpuBackend()
    if device_type == "cuda":
        module = load_cuda_ops()
        if module is None:
            raise ValueError("the CUDA kernels (paternoster._cuda_ops) are not built: install "
                             "with nvcc on PATH")
        return CudaBackend(module)
    return NativeBackend(device_type)


def backend_for(device: torch.device | str) -> Backend:
    """The backend that runs ops on ``device``'s tensors.

    Raises:
        ValueError: ``device`` is a CUDA device and the CUDA extension is not
            built (a missing kernel fails loudly, never falls back).
    """
    device_type = device.type if isinstance(device, torch.device) else torch.device(device).type
    return _backend_for_type(device_type)


def cuda_kernels_available() -> bool:
    """True when the CUDA extension is built and torch sees a GPU."""
    return load_cuda_ops() is not None and torch.cuda.is_available()
