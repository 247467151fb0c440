"""Serving with tensor parallel (``--tensor-parallel-size N``): the engine is
rank 0 and starts ranks 1..N-1 as worker processes
(:mod:`paternoster.engine.tp_worker`). On ``--device cpu`` the ranks' group
is gloo over 127.0.0.1; on ``--device cuda`` it is NCCL, rank r on GPU r
(N GPUs needed), without CUDA graphs, each rank's KV blocks the least any
rank's free memory holds. What follows says "gloo"; NCCL takes its place on
GPUs.

Rank 0 decides, the others follow: the scheduler, the KV cache manager and the
sampler stay single, on rank 0. Each step, :class:`TensorParallelRunner` (the
rank-0 :class:`~paternoster.model.runner.ModelRunner`) pickles the step's batch
arrays once and writes them down each worker's stdin pipe, then every rank runs
the same ``compute_logits`` over its shard; the model's collectives go over a
gloo group on 127.0.0.1, and only rank 0 samples.

Start-up: rank 0 hosts a ``TCPStore`` on a free port, starts the workers,
waits until each has connected (:data:`~paternoster.engine.tp_worker.JOIN_TIMEOUT_S`),
joins the gloo group (timeout :data:`~paternoster.engine.tp_worker.STEP_TIMEOUT_S`),
builds its own runner while they build theirs, and waits for their status
(:data:`LOAD_TIMEOUT_S`). A worker that exits while starting, or fails to
build its runner, makes the start fail with its rank, pid and error.

Failure: before each step rank 0 checks that every worker is alive; a dead one
makes the step raise ``RuntimeError`` naming the rank (the engine process
then sends ``Fatal`` and exits, and the frontend reports it or restarts the
engine). A worker dying mid-step closes its gloo connections and rank 0's
collective raises at once; a hung one makes it raise after
``STEP_TIMEOUT_S``. Workers exit on their own when rank 0 dies (end of file
on their pipe, and SIGTERM from Linux).

Threads (:func:`plan_ranks`): ``--num-threads T`` is each rank's count; auto
splits the usable cores between the ranks (``split_cores``, as for
data-parallel engines), each rank pinned to its own. Rank 0 is pinned only
in the engine process (``paternoster serve``): the offline ``LLM`` leaves the
caller's affinity alone and pins the workers only.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import subprocess
import sys
import time
import weakref
from collections.abc import Callable, Mapping
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist

from paternoster.config import EngineConfig
from paternoster.engine.cpu_threads import CpuTopology, ThreadChoice, data_parallel_threads
from paternoster.engine.pipe_worker import (
    describe_exit,
    encode_frame,
    kill_all,
    stop_all,
    worker_env,
    write_all,
)
from paternoster.engine.tp_worker import (
    GO_KEY,
    HOST,
    JOIN_TIMEOUT_S,
    STEP_TIMEOUT_S,
    join_group,
    joined_key,
    ready_key,
    runner_kwargs,
)
from paternoster.model.loader import is_gguf, load_hf_config, model_class
from paternoster.model.parallel.group import TPGroup
from paternoster.model.parallel.tp_model import SUPPORTED, local_config
from paternoster.model.runner import ModelRunner

logger = logging.getLogger(__name__)

#: Seconds rank 0 waits for the workers to build their runners (load weights).
LOAD_TIMEOUT_S = 1800.0
#: Seconds a stopped worker may take to exit before it is killed.
STOP_TIMEOUT_S = 10.0
_POLL_S = 0.02


def plan_ranks(config: EngineConfig, *, reserve_frontend: bool, pin_rank0: bool,
               environ: Mapping[str, str] | None = None,
               topology: CpuTopology | None = None) -> EngineConfig:
    """Each rank's threads and CPUs: ``config`` with ``rank_threads`` set and
    ``num_threads`` = rank 0's.

    Args:
        config: ``num_threads`` 0 (auto: the usable cores, less one for the
            frontend from 8 cores when ``reserve_frontend``, split between the
            ranks) or T (T per rank, N*T cores needed).
        reserve_frontend: a frontend process runs beside the engine.
        pin_rank0: pin rank 0 (the engine process) too, not only the workers.
        environ, topology: as :func:`~paternoster.engine.cpu_threads.data_parallel_threads`.
    Raises:
        ValueError: the ranks do not fit on disjoint cores (naming
            ``--tensor-parallel-size`` and ``--num-threads``).
    """
    choices = data_parallel_threads(config.num_threads, config.tensor_parallel_size,
                                    environ=environ, topology=topology,
                                    reserve_frontend=reserve_frontend,
                                    flag="tensor_parallel_size")
    ranks = [(c.num_threads, tuple(c.cpus or ())) for c in choices]
    if not pin_rank0:
        ranks[0] = (ranks[0][0], ())
    return dataclasses.replace(config, num_threads=ranks[0][0], rank_threads=tuple(ranks))


def rank0_threads(config: EngineConfig) -> ThreadChoice:
    """Rank 0's :class:`ThreadChoice` from a planned config (:func:`plan_ranks`)."""
    num_threads, cpus = config.rank_threads[0]
    return ThreadChoice(num_threads=num_threads, source="tensor_parallel", cpus=cpus or None)


def check_model(config: EngineConfig) -> None:
    """Refuse, before any worker starts, what the split model does not run.

    Raises:
        ValueError: starting ``tensor_parallel_size=N:``, for fewer than N
            GPUs on ``device="cuda"``, a GGUF file, a quantized checkpoint,
            an architecture other than Llama, Mistral, Qwen2 and Qwen3 dense
            (MoE included), or head counts / ``intermediate_size`` that are
            not multiples of N.
    """
    n, path = config.tensor_parallel_size, config.model.model
    prefix = f"tensor_parallel_size={n}:"
    if config.model.device == "cuda" and torch.cuda.device_count() < n:
        raise ValueError(f"{prefix} device cuda runs rank r on GPU r and needs {n} GPUs; "
                         f"torch sees {torch.cuda.device_count()}")
    if is_gguf(path):
        raise ValueError(f"{prefix} GGUF files are not supported (each rank loads its shard "
                         "of a safetensors checkpoint)")
    hf = load_hf_config(path)
    if getattr(hf, "quantization_config", None):
        raise ValueError(f"{prefix} quantized checkpoints are not supported")
    cls = model_class(hf)
    if cls not in SUPPORTED:
        archs = getattr(hf, "architectures", None) or [getattr(hf, "model_type", "?")]
        raise ValueError(f"{prefix} {archs[0]} is not supported; tensor parallel splits "
                         "Llama, Mistral, Qwen2 and Qwen3 dense models")
    try:
        local_config(hf, n)
    except ValueError as e:
        raise ValueError(f"{prefix} {e}") from None


class RankWorkers:
    """Rank 0's handle on ranks 1..N-1: starts them, joins the gloo group with
    them, sends each step, stops them.

    Args:
        config: a planned config (:func:`plan_ranks`; ``tensor_parallel_size`` > 1).
    Attributes:
        tp: rank 0's :class:`TPGroup`. procs: the workers (rank r at ``r - 1``).
    Raises:
        ValueError: torch.distributed is already initialised in this process.
        RuntimeError: a worker exited while starting, or did not connect
            within ``JOIN_TIMEOUT_S``.
    """

    def __init__(self, config: EngineConfig) -> None:
        n = config.tensor_parallel_size
        if dist.is_initialized():
            raise ValueError(f"tensor_parallel_size={n}: torch.distributed is already "
                             "initialised in this process (shut down the other tensor-parallel "
                             "LLM first: LLM.shutdown())")
        self.size = n
        self.broken = False  # a step failed or the workers were stopped: no more steps
        self.stopped = False  # stop() ran (said so in the error of a later step)
        self.store = dist.TCPStore(HOST, 0, n, True, timeout=timedelta(seconds=JOIN_TIMEOUT_S),
                                   wait_for_workers=False)
        frame = encode_frame("config", config.to_dict())
        level = logging.getLevelName(logging.getLogger("paternoster").getEffectiveLevel())
        self.procs: list[subprocess.Popen] = []
        self._finalizer = weakref.finalize(self, kill_all, self.procs)
        try:
            for rank in range(1, n):
                threads, cpus = config.rank_threads[rank]
                proc = subprocess.Popen(
                    [sys.executable, "-m", "paternoster.engine.tp_worker", "--rank", str(rank),
                     "--size", str(n), "--port", str(self.store.port),
                     "--num-threads", str(threads), "--cpus", ",".join(map(str, cpus)),
                     "--log-level", str(level)],
                    stdin=subprocess.PIPE, env=worker_env())  # fmt: skip
                self.procs.append(proc)
                os.set_blocking(proc.stdin.fileno(), False)
                write_all(proc.stdin.fileno(), frame, JOIN_TIMEOUT_S)
            self._wait(joined_key, JOIN_TIMEOUT_S, "starting")
            self.store.set(GO_KEY, "1")  # all there: every rank joins the group now
            backend = join_group(self.store, 0, n, config.model.device)
        except BaseException:
            kill_all(self.procs)
            raise
        self._in_group = True  # this handle's group: stop() destroys it once
        self.tp = TPGroup(rank=0, size=n)
        logger.info("tensor parallel: %d ranks over %s, workers %s", n, backend,
                    ", ".join(f"rank {r} pid {p.pid}" for r, p in enumerate(self.procs, 1)))

    def check_alive(self, during: str) -> None:
        """Raise if a worker has exited.

        Raises:
            RuntimeError: naming the rank, its pid and how it ended.
        """
        for rank, p in enumerate(self.procs, 1):
            code = p.poll()
            if code is not None:
                raise RuntimeError(f"tensor-parallel worker rank {rank} (pid {p.pid}) "
                                   f"{describe_exit(code)} {during}")

    def name_the_dead(self, error: Exception, grace_s: float = 1.0) -> None:
        """After a failed collective: if a worker exits within ``grace_s`` (its
        connection closing is what failed the collective), raise naming it.

        Raises:
            RuntimeError: naming the rank, from ``error``.
        """
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            try:
                self.check_alive("during a step")
            except RuntimeError as dead:
                raise dead from error
            time.sleep(_POLL_S)

    def _wait(self, key: Callable[[int], str], timeout_s: float, what: str) -> None:
        """Until every worker has set ``key(rank)`` in the store, polling that
        each is alive.

        Raises:
            RuntimeError: a worker exited, or ``timeout_s`` passed.
        """
        deadline = time.monotonic() + timeout_s
        pending = list(range(1, self.size))
        while pending:
            self.check_alive(f"while {what} (see its log)")
            pending = [r for r in pending if not self.store.check([key(r)])]
            if pending and time.monotonic() > deadline:
                raise RuntimeError(f"tensor-parallel ranks {pending} did not finish {what} "
                                   f"within {timeout_s:.0f} s")
            if pending:
                time.sleep(_POLL_S)

    def wait_ready(self, num_kv_blocks: int, max_model_len: int) -> None:
        """Wait for every worker's runner; check it has rank 0's sizes.

        Raises:
            ValueError: a worker failed to build its runner (its error).
            RuntimeError: a worker exited, timed out, or has other sizes.
        """
        self._wait(ready_key, LOAD_TIMEOUT_S, "loading the model")
        for rank in range(1, self.size):
            status = json.loads(self.store.get(ready_key(rank)))
            if "error" in status:
                raise ValueError(f"tensor-parallel rank {rank}: {status['error']}")
            if (status["num_kv_blocks"], status["max_model_len"]) != (num_kv_blocks,
                                                                       max_model_len):
                raise RuntimeError(f"tensor-parallel rank {rank} sized its KV cache "
                                   f"differently: {status} vs rank 0's {num_kv_blocks}, "
                                   f"{max_model_len}")

    def send_step(self, batch: dict[str, np.ndarray]) -> None:
        """Send one step's batch to every worker (one pickle, written down each pipe).

        Raises:
            RuntimeError: a worker is gone (naming it); the engine cannot go on.
        """
        if self.stopped:
            raise RuntimeError("tensor parallel: the workers were stopped (LLM.shutdown() or "
                               "the engine's shutdown)")
        if self.broken:
            raise RuntimeError("tensor parallel: an earlier step failed; the ranks are out "
                               "of step")
        self.check_alive("(the engine cannot run the model without it)")
        frame = encode_frame("step", batch)
        for rank, p in enumerate(self.procs, 1):
            try:
                write_all(p.stdin.fileno(), frame, STEP_TIMEOUT_S)
            except OSError as e:  # BrokenPipeError, TimeoutError
                self.broken = True
                raise RuntimeError(f"tensor-parallel worker rank {rank} (pid {p.pid}) took no "
                                   f"step: {e}") from None

    def stop(self) -> None:
        """Stop the workers (``stop`` frame, then SIGKILL after
        ``STOP_TIMEOUT_S``; at once after a failed step) and leave the group.
        Idempotent."""
        if not self.broken:
            stop_all(self.procs, STOP_TIMEOUT_S, "tensor-parallel worker")
        self.broken = self.stopped = True
        self._finalizer()
        for p in self.procs:
            p.stdin.close()
        if self._in_group:
            self._in_group = False
            dist.destroy_process_group()


class TensorParallelRunner(ModelRunner):
    """Rank 0's :class:`ModelRunner`: each ``compute_logits`` first sends the
    batch to the workers, which run the same forward pass; sampling stays here.

    Args:
        config: a planned config (:func:`plan_ranks`). workers: the started ranks.
    Raises:
        ValueError, RuntimeError: what :class:`ModelRunner` raises for rank 0.
    """

    def __init__(self, config: EngineConfig, workers: RankWorkers) -> None:
        super().__init__(config.model, config.cache, tp=workers.tp, **runner_kwargs(config))
        self.workers = workers

    def compute_logits(self, batch: dict[str, np.ndarray]) -> torch.Tensor:
        """Send ``batch`` to the workers, then the forward pass (see
        :meth:`ModelRunner.compute_logits`): float32 ``[N, V]`` logits.

        Raises:
            RuntimeError: a worker is gone, or a collective failed (a rank
                died mid-step, or the group timed out).
        """
        self.workers.send_step(batch)
        try:
            return super().compute_logits(batch)
        except BaseException as e:  # Ctrl-C included: the ranks are out of step
            self.workers.broken = True  # stop() kills them
            if isinstance(e, Exception):
                self.workers.name_the_dead(e)
            raise

    def check_health(self) -> None:
        """Raise if a worker has exited (the engine process calls this while
        idle, so that a dead rank fails the engine before the next request).

        Raises:
            RuntimeError: naming the rank.
        """
        self.workers.check_alive("(the engine cannot run the model without it)")

    def shutdown(self) -> None:
        """Stop the workers and leave the gloo group."""
        self.workers.stop()


def start_tensor_parallel(config: EngineConfig) -> TensorParallelRunner:
    """Check the model, start the workers, build rank 0's runner, wait for theirs.

    Args:
        config: ``tensor_parallel_size`` > 1; planned (:func:`plan_ranks`),
            or planned here as for the offline ``LLM``.
    Returns:
        Rank 0's runner; call its ``shutdown()`` to stop the workers.
    Raises:
        ValueError: what :func:`check_model` refuses, or a rank's runner
            failed to build (a bad setting or checkpoint).
        RuntimeError: a worker exited or did not start in time.
    """
    check_model(config)
    if config.rank_threads is None:
        config = plan_ranks(config, reserve_frontend=False, pin_rank0=False)
    workers = RankWorkers(config)
    try:
        runner = TensorParallelRunner(config, workers)
        workers.wait_ready(runner.num_kv_blocks, runner.max_model_len)
    except BaseException:
        workers.broken = True
        workers.stop()
        raise
    return runner
