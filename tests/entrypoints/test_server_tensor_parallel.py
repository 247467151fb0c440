"""`paternoster serve MODEL -tp 2`: the engine process is rank 0 and starts one
worker process. A greedy completion equals TP=1's (the offline LLM in this
process); killing the worker makes the engine fail within a second, with
/health naming the rank, instead of hanging.

The suite sets PATERNOSTER_NUM_THREADS=1: one thread per rank."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import httpx
import pytest

from paternoster import LLM, SamplingParams
from tests.entrypoints.utils import start_server

PROMPT = [5, 17, 33, 2, 90, 64, 7, 11, 3, 8, 1, 120, 44, 9, 70, 12, 33]
N = 16
SIZES = ("--num-kv-blocks", "64", "--block-size", "8", "--dtype", "float32")

pytestmark = pytest.mark.multiprocess


@pytest.fixture(scope="module")
def tp_server(tiny_tp_model):
    with start_server(str(tiny_tp_model[0]), "-tp", "2", *SIZES) as srv:
        yield srv


def _workers(engine_pid: int) -> list[int]:
    """Pids of the engine's tensor-parallel worker processes."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == engine_pid and b"paternoster.engine.tp_worker" in cmdline:
            pids.append(int(entry.name))
    return pids


def test_greedy_completion_equals_tp1(tp_server, tiny_tp_model):
    body = {"prompt": PROMPT, "max_tokens": N, "temperature": 0, "ignore_eos": True}
    r = httpx.post(tp_server.url + "/v1/completions", json=body, timeout=60)
    r.raise_for_status()
    single = LLM(str(tiny_tp_model[0]), num_kv_blocks=64, block_size=8, dtype="float32")
    [want] = single.generate([PROMPT], SamplingParams(temperature=0, max_tokens=N,
                                                      ignore_eos=True))
    assert r.json()["choices"][0]["text"] == want.outputs[0].text
    assert len(_workers(tp_server.engine_pid())) == 1


def test_killing_the_worker_fails_the_engine_fast_naming_it(tp_server):
    [worker] = _workers(tp_server.engine_pid())
    os.kill(worker, signal.SIGKILL)
    killed = time.monotonic()
    # The idle engine checks its workers between polls (every 0.5 s) and exits.
    health = None
    while time.monotonic() - killed < 5:
        health = tp_server.get("/health")
        if health.status_code == 503:
            break
        time.sleep(0.05)
    assert health.status_code == 503, health.text
    assert time.monotonic() - killed < 2.0
    assert f"tensor-parallel worker rank 1 (pid {worker}) was killed by SIGKILL" in (
        health.json()["reason"])
    late = httpx.post(tp_server.url + "/v1/completions", json={"prompt": PROMPT}, timeout=10)
    assert late.status_code == 503
