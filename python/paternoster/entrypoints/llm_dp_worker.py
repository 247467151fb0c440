"""One engine of ``LLM(..., data_parallel_size=N)``:
``python -m paternoster.entrypoints.llm_dp_worker`` (started by
:class:`~paternoster.entrypoints.llm_dp.DataParallelEngines`; the protocol is
in :mod:`paternoster.entrypoints.llm_dp`).

It reads the ``config`` frame, pins itself to the config's CPUs, builds an
ordinary in-process ``LLM`` (:meth:`~paternoster.entrypoints.llm.LLM.from_config`),
answers ``ready``, then runs each ``call`` on it. A thread reads stdin all the
while, so that a ``cancel`` reaches a running call: the call's next engine
step raises, its requests are aborted, and the worker waits for the next call.
"""

from __future__ import annotations

import argparse
import logging
import os
import queue
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, BinaryIO

from paternoster.engine.pipe_worker import encode_frame, exit_without_finalizing, read_frame

logger = logging.getLogger("paternoster.llm_dp_worker")

#: The ``LLM`` methods the parent may call.
METHODS = ("run_prepared", "timeline")
_PARENT_POLL_S = 0.5


class Cancelled(Exception):
    """The parent cancelled the running call."""


class Inbox:
    """Frames from the parent, read by a daemon thread: calls queue up,
    ``cancel`` marks a call (queued or running) as cancelled at once.

    Args:
        stdin: the parent's frames.
    """

    def __init__(self, stdin: BinaryIO) -> None:
        self.calls: queue.Queue[tuple[str, Any] | None] = queue.Queue()
        self.cancelled: set[int] = set()
        self.gone = False
        threading.Thread(target=self._read, args=(stdin,), daemon=True,
                         name="dp-inbox").start()  # fmt: skip

    def _read(self, stdin: BinaryIO) -> None:
        while True:
            frame = read_frame(stdin)
            if frame is None:  # the parent is gone
                self.gone = True
                self.calls.put(None)
                return
            if frame[0] == "cancel":
                self.cancelled.add(frame[1])
            else:
                self.calls.put(frame)

    def check(self, seq: int) -> None:
        """Raise :class:`Cancelled` if call ``seq`` was cancelled or the parent is gone."""
        if self.gone or seq in self.cancelled:
            raise Cancelled(f"call {seq} cancelled")


def _watch_parent(parent_pid: int) -> None:
    """Exit at once when the parent dies (a thread: Linux's parent-death
    signal would follow the parent's *thread* that started us, and a caller
    may create its ``LLM`` in a thread that ends)."""
    while os.getppid() == parent_pid:
        time.sleep(_PARENT_POLL_S)
    os._exit(0)


def serve(engine: int, stdin: BinaryIO, out: BinaryIO) -> int:
    """Build the engine from the ``config`` frame, answer ``ready``, run calls.

    Args:
        engine: this engine's index (for logs).
        stdin: the parent's frames. out: where this worker's frames go.
    Returns:
        Exit code: 0 after ``stop`` or when the parent is gone, 1 when the
        engine failed to build (``failed`` sent) or no config came.
    """
    from paternoster.engine.cpu_threads import ThreadChoice, apply_threads
    from paternoster.entrypoints.llm import LLM

    def send(kind: str, payload: Any) -> None:
        out.write(encode_frame(kind, payload))
        out.flush()

    first = read_frame(stdin)
    if first is None or first[0] != "config":
        logger.error("no config frame from the parent")
        return 1
    try:
        from paternoster.config import EngineConfig

        config = EngineConfig.from_dict(first[1])
        threads = None
        if config.cpus is not None:  # CPU: its own cores (CUDA: its own GPU instead)
            threads = apply_threads(ThreadChoice(config.num_threads, "data_parallel",
                                                 config.cpus), f"data-parallel engine {engine}")
        llm = LLM.from_config(config)
    except Exception as e:  # reported to the parent, which raises it
        logger.debug("engine %d failed to build", engine, exc_info=True)
        send("failed", f"{type(e).__name__}: {e}")
        return 1
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    threads = threads or llm.engine.threads
    send("ready", {**llm.engine.info, "threads": threads.describe(), "cpus": cpus})
    inbox = Inbox(stdin)
    while True:
        frame = inbox.calls.get()
        if frame is None or frame[0] == "stop":
            llm.shutdown()
            return 0
        seq, method, args = frame[1]
        try:
            value = _call(llm, inbox, send, seq, method, args)
        except Exception as e:
            kind = "ValueError" if isinstance(e, ValueError) else type(e).__name__
            send("error", (seq, kind, str(e)))
            continue
        send("result", (seq, value))


def _call(llm: Any, inbox: Inbox, send: Callable[[str, Any], None], seq: int, method: str,
          args: tuple) -> Any:
    """``llm.<method>(*args)`` for call ``seq``; ``run_prepared`` reports
    progress (when asked) and stops at a cancel.

    Raises:
        Cancelled: the call was cancelled. ValueError: an unknown method;
        what the method raises.
    """
    inbox.check(seq)
    if method == "run_prepared":
        prompts, progress = args
        on_done = (lambda k: send("progress", (seq, k))) if progress else None
        return llm.run_prepared(prompts, on_done, lambda: inbox.check(seq))
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}")
    return getattr(llm, method)(*args)


def main(argv: list[str] | None = None) -> None:
    """Command-line entry (the parent starts it): parse, set up signals and
    logs, keep stdout for frames (prints go to stderr), :func:`serve`, then
    exit the process with its code (``os._exit``)."""
    p = argparse.ArgumentParser(description="Paternoster offline data-parallel engine "
                                            "(started by LLM(..., data_parallel_size=N))")
    p.add_argument("--engine", type=int, required=True)
    p.add_argument("--parent-pid", type=int, required=True)
    p.add_argument("--log-level", default="INFO")
    args = p.parse_args(argv)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C: the parent cancels the call
    threading.Thread(target=_watch_parent, args=(args.parent_pid,), daemon=True,
                     name="dp-parent-watch").start()  # fmt: skip
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # whatever prints goes to stderr, not into the frames
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format=f"%(asctime)s %(levelname)s [dp engine {args.engine}] "
                               "%(message)s")  # fmt: skip
    try:
        code = serve(args.engine, sys.stdin.buffer, out)
    except BrokenPipeError:  # the parent is gone
        code = 0
    exit_without_finalizing(code)  # the inbox thread may hold stdin's lock


if __name__ == "__main__":
    main()
