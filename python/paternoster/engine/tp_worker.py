"""A tensor-parallel worker rank: ``python -m paternoster.engine.tp_worker``.

Rank 0 is the engine (:mod:`paternoster.engine.tensor_parallel`): it owns the
scheduler, the KV cache manager and the sampler, and starts ranks 1..N-1 as
this module's processes. A worker builds the same
:class:`~paternoster.model.runner.ModelRunner` for its rank (its shard of the
weights, a KV cache of its ``Hkv/N`` heads), then runs every step rank 0 sends
it through the same ``compute_logits`` and drops the logits: "rank 0
decides, the others follow".

Links with rank 0:

- **stdin** (a pipe only rank 0 writes): frames
  (:mod:`paternoster.engine.pipe_worker`) of ``(kind, payload)``. First
  ``("config", EngineConfig.to_dict())``; then ``("step", batch)`` per engine
  step (the dict of numpy arrays ``compute_logits`` takes, one pickle per
  step sent down each worker's pipe) and ``("stop", None)``. End of file
  means rank 0 is gone: the worker exits 0.
- **the TCPStore** rank 0 hosts on 127.0.0.1: the worker sets
  ``tp/joined/R`` once connected, waits for rank 0's ``tp/go`` (every
  worker connected), joins the gloo group, and sets ``tp/ready/R`` (JSON:
  its ``num_kv_blocks`` and ``max_model_len``, or ``error``) once its runner
  is built or failed.
- **the gloo group** (timeout :data:`STEP_TIMEOUT_S`): the model's
  all-reduces and all-gathers inside each step. A rank that dies mid-step
  closes its connections and the others' collectives raise at once; one that
  hangs makes them raise after the timeout.

A worker ignores SIGINT (Ctrl-C reaches the whole process group; rank 0
decides when to stop) and asks Linux for SIGTERM when rank 0 dies.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
from datetime import timedelta
from typing import Any, BinaryIO

from paternoster.engine.pipe_worker import exit_without_finalizing, read_frame

logger = logging.getLogger("paternoster.tp_worker")

#: Seconds a rank waits in one collective of a step for the others (the gloo
#: group's timeout): the ranks run the same work, so this bounds their skew,
#: not a step's length. A hung rank fails the step after this long.
STEP_TIMEOUT_S = 60.0
#: Seconds rank 0 waits for every worker to start (import torch, connect).
JOIN_TIMEOUT_S = 120.0
HOST = "127.0.0.1"
#: The store key rank 0 sets once every worker has connected: then all join
#: the gloo group together (its rendezvous waits only the group's timeout).
GO_KEY = "tp/go"


def backend_for(device: str) -> str:
    """The torch.distributed backend of ranks on ``device`` (an
    :class:`~paternoster.config.ModelConfig` device): ``"nccl"`` for
    ``"cuda"``, ``"gloo"`` otherwise."""
    return "nccl" if device.startswith("cuda") else "gloo"


def join_group(store, rank: int, size: int, device: str) -> str:
    """Join the tensor-parallel process group through ``store``; on CUDA first
    make GPU ``rank`` this process's current device (NCCL and the runner use
    it). Returns the backend.

    Raises:
        RuntimeError: what ``init_process_group`` raises (no such GPU, a rank
            missing within :data:`STEP_TIMEOUT_S`).
    """
    import torch
    import torch.distributed as dist

    backend = backend_for(device)
    if backend == "nccl":
        torch.cuda.set_device(rank)
    dist.init_process_group(backend, store=store, rank=rank, world_size=size,
                            timeout=timedelta(seconds=STEP_TIMEOUT_S))
    return backend


def joined_key(rank: int) -> str:
    """The store key a worker sets once connected, before joining the group."""
    return f"tp/joined/{rank}"


def ready_key(rank: int) -> str:
    """The store key of a worker's start-up status (JSON)."""
    return f"tp/ready/{rank}"


def runner_kwargs(config) -> dict:
    """The :class:`ModelRunner` sizes every rank must share (from an
    :class:`~paternoster.config.EngineConfig`): same sizes, same KV blocks."""
    return {"max_num_seqs": config.scheduler.max_num_seqs,
            "max_num_batched_tokens": config.scheduler.max_num_batched_tokens}


def set_rank_threads(rank: int, num_threads: int, cpus: tuple[int, ...]) -> None:
    """Pin this process to ``cpus`` (none: unpinned; a refusal is logged and
    ignored), give torch's intra-op pool and the C++ core's pool
    ``num_threads`` threads, torch's inter-op pool 1; log the line."""
    from paternoster import _core
    from paternoster.engine.cpu_threads import ThreadChoice, apply_threads

    threads = apply_threads(ThreadChoice(num_threads, "tensor_parallel", cpus or None),
                            f"tensor-parallel rank {rank}")
    _core.set_num_threads(num_threads)
    logger.info("%s", threads.describe())


def run_worker(rank: int, size: int, port: int, num_threads: int, cpus: tuple[int, ...],
               stdin: BinaryIO) -> int:
    """Join the group, build this rank's runner, follow rank 0's steps.

    Args:
        rank: this rank (1..size-1). size: the tensor-parallel size.
        port: the TCPStore's port on 127.0.0.1.
        num_threads: this rank's threads. cpus: its CPUs (empty: unpinned).
        stdin: rank 0's frames.
    Returns:
        Exit code: 0 after ``stop`` or when rank 0 is gone, 1 when the runner
        failed to build or a step failed (a collective raised: a rank died,
        or the group timed out).
    """
    import torch.distributed as dist

    from paternoster.config import EngineConfig
    from paternoster.model.parallel.group import TPGroup
    from paternoster.model.runner import ModelRunner

    first = read_frame(stdin)
    if first is None or first[0] != "config":
        logger.error("no config frame from rank 0")
        return 1
    config = EngineConfig.from_dict(first[1])
    set_rank_threads(rank, num_threads, cpus)
    store = dist.TCPStore(HOST, port, size, False,
                          timeout=timedelta(seconds=2 * JOIN_TIMEOUT_S))
    store.set(joined_key(rank), "1")
    store.wait([GO_KEY])  # the slowest worker has connected too
    join_group(store, rank, size, config.model.device)
    try:
        try:
            runner = ModelRunner(config.model, config.cache, tp=TPGroup(rank, size),
                                 **runner_kwargs(config))
        except Exception as e:  # reported to rank 0, which raises it
            logger.debug("rank %d failed to build its runner", rank, exc_info=True)
            store.set(ready_key(rank), json.dumps({"error": f"{type(e).__name__}: {e}"}))
            return 1
        store.set(ready_key(rank), json.dumps({"num_kv_blocks": runner.num_kv_blocks,
                                               "max_model_len": runner.max_model_len}))
        return _follow(runner, stdin, rank)
    finally:
        dist.destroy_process_group()


def _follow(runner: Any, stdin: BinaryIO, rank: int) -> int:
    """Run each ``step`` frame through ``runner.compute_logits`` until
    ``stop`` or end of file."""
    while True:
        frame = read_frame(stdin)
        if frame is None:
            logger.warning("rank 0 is gone (its pipe closed); rank %d exiting", rank)
            return 0
        kind, payload = frame
        if kind == "stop":
            return 0
        if kind != "step":
            logger.error("unexpected frame %r from rank 0", kind)
            return 1
        try:
            runner.compute_logits(payload)  # the logits are rank 0's to sample
        except Exception:  # a collective failed: a rank died or the group timed out
            logger.exception("rank %d: step failed", rank)
            return 1


def main(argv: list[str] | None = None) -> int:
    """Command-line entry (rank 0 starts it): parse, set up signals and logs,
    :func:`run_worker`. Returns the exit code."""
    from paternoster.engine.process import die_with_parent

    p = argparse.ArgumentParser(description="Paternoster tensor-parallel worker rank "
                                            "(started by the engine, rank 0)")
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--size", type=int, required=True)
    p.add_argument("--port", type=int, required=True, help="rank 0's TCPStore on 127.0.0.1")
    p.add_argument("--num-threads", type=int, required=True)
    p.add_argument("--cpus", default="", help="CPUs to pin to, comma-separated (empty: none)")
    p.add_argument("--log-level", default="INFO")
    args = p.parse_args(argv)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    die_with_parent()
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format=f"%(asctime)s %(levelname)s [tp rank {args.rank}] %(message)s")
    cpus = tuple(int(c) for c in args.cpus.split(",") if c)
    return run_worker(args.rank, args.size, args.port, args.num_threads, cpus, sys.stdin.buffer)


if __name__ == "__main__":
    exit_without_finalizing(main())
