"""Offline data parallel: ``LLM(model, data_parallel_size=N)`` runs N engines,
one per worker process, and shards each batch of prompts between them (as
vLLM's ``examples/offline_inference/data_parallel.py`` does by hand: one
engine per rank, the prompts split).

**Start.** Each worker is ``python -m paternoster.entrypoints.llm_dp_worker``
(:mod:`~paternoster.engine.pipe_worker`: a fresh interpreter, as the
tensor-parallel ranks start, so a user script needs no ``if __name__ ==
"__main__"`` guard). Its engine's cores come from
:func:`~paternoster.frontend.placement.place_engines`, the plan ``paternoster
serve --data-parallel-size N`` uses (``num_threads`` per engine; auto splits
the usable cores, none left aside: this process only tokenizes and waits);
the worker pins itself and builds an ordinary in-process ``LLM`` from the
config (:meth:`~paternoster.entrypoints.llm.LLM.from_config`).

**Sharding** (:func:`shard`). The whole batch is known up front, so it is cut
to balance, not routed one request at a time as the server's
:class:`~paternoster.frontend.router.Router` must: the prompts are sorted by
their token ids (prompts sharing a prefix become neighbours) and cut into N
runs of about equal weight, a prompt's weight being its tokens plus ``n x
max_tokens``. A shared prefix is thus prefilled on one engine (two where a
cut falls inside its run), and the engines finish together within one
prompt's weight. The split depends only on the prompts, not on timing:
every run of a script shards alike. Each engine gets its prompts in the
caller's order, each with its own sampling params and priority (prepared by
the parent); the outputs come back in the caller's order.

**Links.** The parent writes frames down each worker's stdin: ``config``
once, then ``call`` ``(seq, method, args)`` (``run_prepared`` or
``timeline``), ``cancel`` ``seq`` and ``stop``. The worker answers on its
stdout (its own prints go to stderr): ``ready`` (its engine's ``info``, the
thread line, its CPU affinity) or ``failed``, then ``progress``, ``result``
or ``error`` tagged with the call's ``seq``; answers of an abandoned call
are dropped.

**Failures.** A worker that exits (killed, crashed) closes its stdout: the
call waiting on it raises ``RuntimeError`` naming the engine, its pid and how
it ended at once, the other workers are stopped, and every later call raises
the same. An engine's ``ValueError`` (a grammar that does not compile)
cancels the other engines' share of the call and is raised. Ctrl-C cancels
every engine's share (workers ignore SIGINT: the parent decides). Workers
exit when this process does (end of file on stdin, a ``getppid`` watchdog),
and on :meth:`DataParallelEngines.stop` (``LLM.shutdown``).
"""

from __future__ import annotations

import itertools
import logging
import os
import select
import subprocess
import sys
import time
import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from paternoster.config import EngineConfig
from paternoster.engine.pipe_worker import (
    FrameBuffer,
    describe_exit,
    encode_frame,
    kill_all,
    stop_all,
    worker_env,
    write_all,
)
from paternoster.frontend.placement import place_engines
from paternoster.outputs import RequestOutput

if TYPE_CHECKING:
    from paternoster.entrypoints.llm import Prepared

logger = logging.getLogger("paternoster.llm")

#: Seconds the workers may take to start (import torch, load the model).
START_TIMEOUT_S = 1800.0
#: Seconds a worker may take to read a frame (its reader thread is always ready).
WRITE_TIMEOUT_S = 60.0
#: Seconds a stopped worker may take to exit before it is killed.
STOP_TIMEOUT_S = 10.0
_POLL_S = 0.2


def prompt_weight(prompt: Prepared) -> int:
    """A prompt's share of the work, in tokens: its prompt tokens plus
    ``n x max_tokens`` (fitted, so never ``None``)."""
    ids, params = prompt[0], prompt[2]
    return len(ids) + params.n * (params.max_tokens or 0)


def shard(prompts: Sequence[Prepared], num_engines: int) -> list[list[int]]:
    """Which prompts each engine runs (the module's rule; pure).

    Args:
        prompts: ``(token ids, text, fitted params, priority, tenant, SLO targets)``
            per prompt.
        num_engines: engines (>= 1).
    Returns:
        ``num_engines`` lists of prompt indices, each ascending (the caller's
        order); together every index once. Sorted by token ids, the prompts
        form ``num_engines`` contiguous runs whose weights
        (:func:`prompt_weight`) differ by at most one prompt's weight: a
        prompt goes to the engine whose equal share of the total weight holds
        its weight's midpoint. With fewer prompts than engines some get none.
    Raises:
        ValueError: ``num_engines`` < 1.
    """
    if num_engines < 1:
        raise ValueError(f"num_engines must be >= 1, got {num_engines}")
    order = sorted(range(len(prompts)), key=lambda i: prompts[i][0])
    weights = [max(1, prompt_weight(prompts[i])) for i in order]
    total = sum(weights)
    shares: list[list[int]] = [[] for _ in range(num_engines)]
    done = 0
    for i, w in zip(order, weights):
        engine = min(num_engines - 1, (2 * done + w) * num_engines // (2 * total))
        shares[engine].append(i)
        done += w
    return [sorted(s) for s in shares]


class DataParallelEngines:
    """The worker processes of ``LLM(..., data_parallel_size=N)`` and the calls to them.

    Args:
        config: the engines' shared configuration (``tensor_parallel_size`` 1).
        size: engines (>= 2).
    Attributes:
        procs: the workers, engine i at ``i``.
        info: each engine's ``EngineCore.info`` plus ``"threads"`` (its thread
            line) and ``"cpus"`` (its CPU affinity, sorted).
    Raises:
        ValueError: ``size`` < 2, ``tensor_parallel_size`` > 1 (naming both),
            the engines do not fit on disjoint cores or GPUs, or an engine
            failed to build (its error, naming it).
        RuntimeError: a worker exited or did not start in time.
    """

    def __init__(self, config: EngineConfig, size: int) -> None:
        if size < 2:
            raise ValueError(f"DataParallelEngines needs data_parallel_size >= 2, got {size}")
        tp = config.tensor_parallel_size
        if tp > 1:
            raise ValueError(
                f"data_parallel_size={size} with tensor_parallel_size={tp}: tensor parallel "
                "runs with data_parallel_size=1; data parallel x tensor parallel is not "
                "supported yet")
        placements = place_engines(config, size, reserve_frontend=False)
        level = logging.getLevelName(logging.getLogger("paternoster").getEffectiveLevel())
        self.procs: list[subprocess.Popen] = []
        self._finalizer = weakref.finalize(self, kill_all, self.procs)
        self._buffers = [FrameBuffer() for _ in range(size)]
        self._seq = itertools.count(1)
        self.failure: str | None = None
        try:
            for i, placement in enumerate(placements):
                proc = subprocess.Popen(
                    [sys.executable, "-m", "paternoster.entrypoints.llm_dp_worker",
                     "--engine", str(i), "--parent-pid", str(os.getpid()),
                     "--log-level", str(level)],
                    stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                    env={**worker_env(), **placement.env})  # fmt: skip
                self.procs.append(proc)
                os.set_blocking(proc.stdin.fileno(), False)
                os.set_blocking(proc.stdout.fileno(), False)
                self._send(i, "config", placement.config.to_dict())
            self.info: list[dict[str, Any]] = [{} for _ in range(size)]
            self._wait_ready()
        except BaseException:
            self.failure = "the data-parallel engines did not start"
            kill_all(self.procs)
            raise
        logger.info("data parallel: %d engines, %s", size, "; ".join(
            f"engine {i} pid {p.pid}: {self.info[i]['threads']}"
            for i, p in enumerate(self.procs)))  # fmt: skip

    # ------------------------------------------------------------------ calls

    def run(self, prompts: Sequence[Prepared], use_tqdm: bool = False) -> list[RequestOutput]:
        """Shard ``prompts`` (:func:`shard`), run each share on its engine
        (``LLM.run_prepared``), gather the outputs.

        Args:
            prompts: prepared prompts (``LLM._prepare``).
            use_tqdm: a progress bar over finished prompts (every engine reports).
        Returns:
            One :class:`RequestOutput` per prompt, in the order of ``prompts``
            (request ids are the workers'; the caller renumbers them).
        Raises:
            RuntimeError: a worker is gone (naming it), now or earlier.
            ValueError: an engine rejected a request (e.g. a grammar that does
                not compile); the other engines' share is cancelled.
        """
        self.check_alive()
        if not prompts:
            return []
        shares = shard(prompts, len(self.procs))
        seq = next(self._seq)
        pending = {}
        for i, share in enumerate(shares):
            if share:
                self._send(i, "call", (seq, "run_prepared", ([prompts[j] for j in share],
                                                             use_tqdm)))  # fmt: skip
                pending[i] = share
        results: list[RequestOutput | None] = [None] * len(prompts)
        bar = None
        if use_tqdm:
            from tqdm import tqdm

            bar = tqdm(total=len(prompts), desc="Processed prompts", unit="prompt")
        try:
            for i, value in self._gather(seq, set(pending), bar):
                for j, out in zip(pending[i], value):
                    results[j] = out
        finally:
            if bar is not None:
                bar.close()
        return results  # type: ignore[return-value]

    def call(self, engine: int, method: str, args: tuple) -> Any:
        """Engine ``engine``'s ``LLM.<method>(*args)`` (``timeline``).

        Raises:
            ValueError: ``engine`` out of range; the method's ``ValueError``.
            RuntimeError: a worker is gone; the method's other errors.
        """
        if isinstance(engine, bool) or not isinstance(engine, int) or not (
                0 <= engine < len(self.procs)):  # fmt: skip
            raise ValueError(f"engine must be in [0, {len(self.procs)}), got {engine!r}")
        self.check_alive()
        seq = next(self._seq)
        self._send(engine, "call", (seq, method, args))
        return next(iter(self._gather(seq, {engine}, None)))[1]

    def _gather(self, seq: int, pending: set[int], bar: Any):
        """Yield ``(engine, result)`` of call ``seq`` as each of ``pending``
        answers; cancel the others' share when one fails or the wait is
        interrupted (Ctrl-C).

        Raises:
            RuntimeError: a worker is gone; an engine's error other than ``ValueError``.
            ValueError: an engine's ``ValueError`` (its message).
        """
        try:
            while pending:
                for i, kind, payload in self._receive(pending):
                    if not isinstance(payload, tuple) or payload[0] != seq:
                        continue  # an abandoned call's answer
                    if kind == "progress":
                        if bar is not None:
                            bar.update(payload[1])
                        continue
                    pending.discard(i)
                    if kind == "result":
                        yield i, payload[1]
                        continue
                    _, error_type, message = payload
                    if error_type == "ValueError":
                        raise ValueError(message)
                    raise RuntimeError(f"data-parallel engine {i} (pid {self.procs[i].pid}): "
                                       f"{error_type}: {message}")
        except BaseException:
            if self.failure is None:
                for i in pending:
                    self._send(i, "cancel", seq, fail_quietly=True)
            raise

    def _receive(self, engines: set[int]) -> list[tuple[int, str, Any]]:
        """The frames ``engines`` have sent (waits up to ``_POLL_S`` for one).

        Raises:
            RuntimeError: one of them is gone (see :meth:`check_alive`).
        """
        fds = {self.procs[i].stdout.fileno(): i for i in engines}
        readable, _, _ = select.select(list(fds), [], [], _POLL_S)
        frames = []
        for fd in readable:
            i = fds[fd]
            try:
                data = os.read(fd, 1 << 20)
            except BlockingIOError:
                continue
            if not data:  # its end of the pipe closed: it exited
                self._fail(i)
            frames += [(i, kind, payload) for kind, payload in self._buffers[i].feed(data)]
        if not frames:
            self.check_alive()
        return frames

    def _wait_ready(self) -> None:
        """Until every worker has sent ``ready``.

        Raises:
            ValueError: an engine failed to build (naming it).
            RuntimeError: a worker exited, or ``START_TIMEOUT_S`` passed.
        """
        deadline = time.monotonic() + START_TIMEOUT_S
        pending = set(range(len(self.procs)))
        while pending:
            if time.monotonic() > deadline:
                raise RuntimeError(f"data-parallel engines {sorted(pending)} did not start "
                                   f"within {START_TIMEOUT_S:.0f} s")
            for i, kind, payload in self._receive(pending):
                if kind == "failed":
                    raise ValueError(f"data-parallel engine {i}: {payload}")
                if kind == "ready":
                    self.info[i] = payload
                    pending.discard(i)

    # ---------------------------------------------------------------- health

    def check_alive(self) -> None:
        """Raise if a worker has exited (then stop the others: the engines
        run as one).

        Raises:
            RuntimeError: naming the engine, its pid and how it ended; the
                same message on every call after a failure or :meth:`stop`.
        """
        if self.failure is not None:
            raise RuntimeError(self.failure)
        for i, p in enumerate(self.procs):
            if p.poll() is not None:
                self._fail(i)

    def _fail(self, engine: int) -> None:
        """Engine ``engine``'s worker is gone: record it, stop the others, raise."""
        p = self.procs[engine]
        try:
            code = p.wait(1.0)  # its pipe closes as it exits
            how = describe_exit(code)
        except subprocess.TimeoutExpired:
            how = "closed its output"
        self.failure = (f"data-parallel engine {engine} (pid {p.pid}) {how}; the offline LLM "
                        "cannot run without it (create a new LLM)")
        kill_all(self.procs)
        raise RuntimeError(self.failure)

    def _send(self, engine: int, kind: str, payload: Any, fail_quietly: bool = False) -> None:
        """Write one frame to engine ``engine``.

        Raises:
            RuntimeError: it took no input (unless ``fail_quietly``).
        """
        p = self.procs[engine]
        try:
            write_all(p.stdin.fileno(), encode_frame(kind, payload), WRITE_TIMEOUT_S)
        except OSError as e:  # BrokenPipeError, TimeoutError
            if fail_quietly:
                return
            if p.poll() is not None or isinstance(e, BrokenPipeError):
                self._fail(engine)
            raise RuntimeError(f"data-parallel engine {engine} (pid {p.pid}) took no "
                               f"input: {e}") from None

    def stop(self) -> None:
        """Stop the workers (``stop``, then SIGKILL after ``STOP_TIMEOUT_S``).
        Idempotent; later calls raise ``RuntimeError``."""
        if self.failure is None:
            self.failure = "this LLM was shut down (LLM.shutdown())"
            stop_all(self.procs, STOP_TIMEOUT_S, "data-parallel worker")
        self._finalizer()
        for p in self.procs:
            for f in (p.stdin, p.stdout):
                if f is not None and not f.closed:
                    f.close()
