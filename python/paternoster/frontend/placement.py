"""Where each data-parallel engine runs: its cores (CPU) or its GPU (CUDA).

``--data-parallel-size N`` starts N engine processes from one
:class:`~paternoster.config.EngineConfig`; :func:`place_engines` gives each
its own copy:

- **CPU**: disjoint cores, each engine pinned to its own
  (:func:`~paternoster.engine.cpu_threads.data_parallel_threads`): its
  ``num_threads`` and ``cpus`` are set.
- **CUDA** (``--device cuda``): engine *i* sees only GPU *i* through
  ``CUDA_VISIBLE_DEVICES`` (the *i*-th entry of the frontend's own
  ``CUDA_VISIBLE_DEVICES`` when that is set), so inside it the device is
  ``cuda`` as with one engine. Fewer visible GPUs than engines is an error;
  so is ``cuda:K`` (one fixed GPU for every engine).

With N = 1 nothing changes: the engine chooses its threads itself.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from paternoster.config import EngineConfig
from paternoster.engine.cpu_threads import CpuTopology, data_parallel_threads

CUDA_VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"


@dataclass(frozen=True)
class EnginePlacement:
    """One engine's configuration and the environment its process adds.

    Attributes:
        config: the engine's own configuration.
        env: environment variables set for its process only.
    """

    config: EngineConfig
    env: dict[str, str] = field(default_factory=dict)


def _cuda_device_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def place_engines(config: EngineConfig, num_engines: int, *,
                  environ: Mapping[str, str] | None = None,
                  topology: CpuTopology | None = None,
                  cuda_device_count: Callable[[], int] = _cuda_device_count,
                  reserve_frontend: bool = True,
                  ) -> list[EnginePlacement]:  # fmt: skip
    """Each engine's configuration and extra environment.

    Args:
        config: the configuration every engine shares.
        num_engines: engine processes (``--data-parallel-size``, >= 1).
        environ: the frontend's environment (default ``os.environ``).
        topology: the CPUs (default: this process's).
        cuda_device_count: returns the GPUs torch sees (only called for CUDA
            without ``CUDA_VISIBLE_DEVICES``).
        reserve_frontend: CPU auto threads leave one core to a frontend
            process from 8 cores (``paternoster serve``); the offline ``LLM``
            passes ``False`` (its process only tokenizes and waits).
    Returns:
        ``num_engines`` placements, engine 0 first.
    Raises:
        ValueError: ``num_engines`` < 1, the engines do not fit on disjoint
            cores, fewer GPUs than engines, or a fixed ``cuda:K`` device.
    """
    if num_engines < 1:
        raise ValueError(f"data_parallel_size must be >= 1, got {num_engines}")
    if num_engines == 1:
        return [EnginePlacement(config)]
    environ = os.environ if environ is None else environ
    kind, _, index = config.model.device.partition(":")
    if kind == "cuda":
        if index:
            raise ValueError(
                f"--device {config.model.device} with --data-parallel-size {num_engines}: "
                "give --device cuda (engine i gets GPU i; restrict them with "
                "CUDA_VISIBLE_DEVICES)"
            )
        visible = environ.get(CUDA_VISIBLE_DEVICES)
        gpus = ([g.strip() for g in visible.split(",") if g.strip()] if visible is not None
                else [str(i) for i in range(cuda_device_count())])  # fmt: skip
        if len(gpus) < num_engines:
            raise ValueError(
                f"data_parallel_size={num_engines} needs {num_engines} GPUs (one per "
                f"engine), but {len(gpus)} {'is' if len(gpus) == 1 else 'are'} visible"
            )
        return [EnginePlacement(config, {CUDA_VISIBLE_DEVICES: gpus[i]})
                for i in range(num_engines)]  # fmt: skip
    threads = data_parallel_threads(config.num_threads, num_engines, environ=environ,
                                    topology=topology,
                                    reserve_frontend=reserve_frontend)  # fmt: skip
    return [
        EnginePlacement(dataclasses.replace(config, num_threads=t.num_threads, cpus=t.cpus))
        for t in threads
    ]
