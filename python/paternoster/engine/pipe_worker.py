"""Worker processes linked to their parent by pipes of frames: the plumbing the
tensor-parallel ranks (:mod:`paternoster.engine.tp_worker`) and the offline
data-parallel engines (:mod:`paternoster.entrypoints.llm_dp_worker`) share.

A worker is started as ``python -m MODULE`` (a fresh interpreter: nothing of
the caller's ``__main__`` is imported again, so a user script needs no
``if __name__ == "__main__"`` guard) with :func:`worker_env`. A frame is an
8-byte little-endian length, then a pickle (protocol 5) of ``(kind,
payload)``; the parent writes them with :func:`write_all` (non-blocking, with
a timeout), a worker reads them with :func:`read_frame`, and a parent reading
several workers at once splits their bytes with :class:`FrameBuffer`.

Only the standard library is imported here: a worker starts fast.
"""

from __future__ import annotations

import logging
import os
import pickle
import select
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, BinaryIO, NoReturn

_HEADER = struct.Struct("<Q")
logger = logging.getLogger(__name__)


def encode_frame(kind: str, payload: Any) -> bytes:
    """One frame: the 8-byte length, then the pickle of ``(kind, payload)``."""
    data = pickle.dumps((kind, payload), protocol=5)
    return _HEADER.pack(len(data)) + data


def read_frame(stream: BinaryIO) -> tuple[str, Any] | None:
    """The next frame's ``(kind, payload)`` from ``stream`` (blocks); ``None``
    at end of file (the writer is gone)."""
    header = stream.read(_HEADER.size)
    if len(header) < _HEADER.size:
        return None
    (size,) = _HEADER.unpack(header)
    data = stream.read(size)
    return None if len(data) < size else pickle.loads(data)


class FrameBuffer:
    """Bytes read from one non-blocking pipe, split into frames as they complete."""

    def __init__(self) -> None:
        self._data = bytearray()

    def feed(self, data: bytes) -> list[tuple[str, Any]]:
        """Add ``data``; return the frames it completed (``(kind, payload)``, in order)."""
        self._data += data
        frames = []
        while len(self._data) >= _HEADER.size:
            (size,) = _HEADER.unpack_from(self._data)
            end = _HEADER.size + size
            if len(self._data) < end:
                break
            frames.append(pickle.loads(bytes(self._data[_HEADER.size:end])))
            del self._data[:end]
        return frames


def write_all(fd: int, data: bytes, timeout_s: float) -> None:
    """Write all of ``data`` to the non-blocking pipe ``fd`` within ``timeout_s``.

    Raises:
        TimeoutError: the reader did not take it in time (a hung worker).
        OSError: the reader is gone (``BrokenPipeError``).
    """
    deadline = time.monotonic() + timeout_s
    view = memoryview(data)
    while view:
        if not select.select([], [fd], [], max(0.0, deadline - time.monotonic()))[1]:
            raise TimeoutError(f"the worker took no input for {timeout_s:.0f} s")
        view = view[os.write(fd, view):]


def describe_exit(code: int) -> str:
    """How a process ended, from its return code: ``"was killed by SIGKILL"``,
    ``"exited with code 1"``."""
    if code < 0:
        return f"was killed by {signal.Signals(-code).name}"
    return f"exited with code {code}"


def exit_without_finalizing(code: int) -> NoReturn:
    """End this worker process with ``code`` after flushing its logs and
    stderr, without interpreter shutdown (``os._exit``).

    Finalization is not safe in our workers: a gloo thread of
    ``torch.distributed`` may still be dropping the last collective's tensors,
    which takes the GIL, and a thread that takes the GIL during finalization
    aborts the process ("terminate called without an active exception",
    pytorch/pytorch#190489, even after ``destroy_process_group``); a reader
    thread holding stdin's lock makes finalization abort too."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def worker_env() -> dict[str, str]:
    """Our environment, this package importable, without the engine's handshake token."""
    env = {k: v for k, v in os.environ.items() if k != "PATERNOSTER_ENGINE_TOKEN"}
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(
        dict.fromkeys([root, *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]))
    return env


def kill_all(procs: list[subprocess.Popen]) -> None:
    """SIGKILL every process of ``procs`` still running and reap it."""
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()


def stop_all(procs: list[subprocess.Popen], timeout_s: float, what: str) -> None:
    """Send each worker a ``stop`` frame (one whose pipe is gone or full is
    skipped), then wait up to ``timeout_s`` in all for them to exit; log a
    warning naming each that did not (``what``: e.g. ``"tensor-parallel
    worker"``). The caller kills what is left (:func:`kill_all`)."""
    for p in procs:
        try:
            write_all(p.stdin.fileno(), encode_frame("stop", None), timeout_s)
        except OSError:  # BrokenPipeError, TimeoutError
            pass
    deadline = time.monotonic() + timeout_s
    for p in procs:
        try:
            p.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            logger.warning("%s pid %d did not stop; killing it", what, p.pid)
