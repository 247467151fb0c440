"""Servers for bench/peers.py: start one on a free port, wait until it answers,
run ``paternoster bench capacity`` against it, stop it (its whole process group).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: The CPU-sized mix of docs/benchmarks.md (prompts <= 1024 tokens).
CPU_MIX = "short=0.6:16-256:8-64,summary=0.3:256-1024:64-256,long_gen=0.1:16-128:256-512"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def paternoster_cli() -> str:
    """The ``paternoster`` command of this venv (next to its python), else on PATH."""
    here = Path(sys.executable).parent / "paternoster"
    return str(here) if here.is_file() else "paternoster"


def _log_tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def wait_ready(url: str, proc: subprocess.Popen, timeout: float, log: Path) -> None:
    """Poll ``GET {url}/v1/models`` until it answers 200.

    Raises:
        RuntimeError: the process exited, or no answer within ``timeout`` s
            (the message holds the end of its log).
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited {proc.returncode}; {log}:\n{_log_tail(log)}")
        try:
            with urllib.request.urlopen(f"{url}/v1/models", timeout=5) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(1.0)
    raise RuntimeError(f"server not ready after {timeout:.0f} s; {log}:\n{_log_tail(log)}")


def stop(proc: subprocess.Popen, grace: float = 30.0) -> None:
    """SIGTERM the process group ``proc`` leads (it was started in a new
    session), then SIGKILL it after ``grace`` seconds."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
    except ProcessLookupError:
        pass


@contextmanager
def running_server(cmd: list[str], port: int, log: Path, startup_timeout: float) -> Iterator[str]:
    """Start ``cmd`` (its output to ``log``), wait until it serves, yield its
    base URL, and stop it on the way out, whatever happened."""
    log.parent.mkdir(parents=True, exist_ok=True)
    print("+ " + " ".join(cmd) + f"   (log: {log})", flush=True)
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, proc, startup_timeout, log)
        yield url
    finally:
        stop(proc)


@dataclass
class CapacityPlan:
    """What ``paternoster bench capacity`` is asked for, the same for every server:
    request-rate probes (Poisson arrivals) of at least ``probe_duration`` s on the
    CPU mix, ``--ignore-eos``, p95 TTFT and p95 ITL objectives in seconds."""

    start: float = 0.25
    probe_duration: float = 60.0
    probe_requests: int = 8
    max_duration: float = 900.0
    bisect_rounds: int = 3
    warmup: int = 4
    request_timeout: float = 300.0
    slo_ttft_p95: float = 2.0
    slo_itl_p95: float = 0.2
    mix: str = CPU_MIX
    seed: int = 0
    factor: float = 2.0  # ramp multiplier

    def command(self, url: str, max_model_len: int, out_json: Path) -> list[str]:
        """The ``paternoster bench capacity`` command line against ``url``.

        No ``--tokenizer`` (prompt lengths ~1 token per word, as in the CPU-mix
        runs of docs/benchmarks.md): both servers get the same prompt texts."""
        return [
            paternoster_cli(), "bench", "capacity", "--base-url", url, "--mode", "rate",
            "--start", f"{self.start:g}", "--factor", f"{self.factor:g}",
            "--probe-duration", f"{self.probe_duration:g}",
            "--probe-requests", str(self.probe_requests), "--max-duration",
            f"{self.max_duration:g}", "--bisect-rounds", str(self.bisect_rounds),
            "--warmup", str(self.warmup), "--timeout", f"{self.request_timeout:g}",
            "--slo-ttft-p95", f"{self.slo_ttft_p95:g}", "--slo-itl-p95", f"{self.slo_itl_p95:g}",
            "--mix", self.mix, "--ignore-eos", "--seed", str(self.seed),
            "--max-model-len", str(max_model_len),
            "--no-progress", "--json", str(out_json),
        ]  # fmt: skip


def add_plan_args(group: argparse._ActionsContainer) -> None:
    """The search flags every capacity comparison shares (:class:`CapacityPlan`'s
    fields: ``--start`` ... ``--request-timeout``), with its defaults."""
    plan = CapacityPlan()
    group.add_argument("--start", type=float, default=plan.start, help="first rate (req/s)")
    group.add_argument("--probe-duration", type=float, default=plan.probe_duration, metavar="S")
    group.add_argument("--probe-requests", type=int, default=plan.probe_requests)
    group.add_argument("--max-duration", type=float, default=plan.max_duration,
                       help="seconds per search")  # fmt: skip
    group.add_argument("--bisect-rounds", type=int, default=plan.bisect_rounds)
    group.add_argument("--warmup", type=int, default=plan.warmup, help="warm-up requests")
    group.add_argument("--request-timeout", type=float, default=plan.request_timeout)


def plan_from_args(args: argparse.Namespace, **fields: Any) -> CapacityPlan:
    """A :class:`CapacityPlan` from :func:`add_plan_args`' flags, plus ``fields``."""
    return CapacityPlan(
        start=args.start, probe_duration=args.probe_duration,
        probe_requests=args.probe_requests, max_duration=args.max_duration,
        bisect_rounds=args.bisect_rounds, warmup=args.warmup,
        request_timeout=args.request_timeout, **fields,
    )  # fmt: skip


def run_capacity(plan: CapacityPlan, url: str, max_model_len: int, out_json: Path) -> dict:
    """Run the capacity search against ``url``, its output streamed to ours.

    A search that wrote its JSON and then exited non-zero (a crash at
    interpreter exit) is used, with a warning.

    Returns:
        The search JSON (``capacity`` in req/s or ``None``, ``probes``, ...).
    Raises:
        RuntimeError: the search failed or ran far past its budget.
    """
    out_json.unlink(missing_ok=True)
    cmd = plan.command(url, max_model_len, out_json)
    print("+ " + " ".join(cmd), flush=True)
    timeout = plan.max_duration + plan.request_timeout + 300
    try:
        proc = subprocess.run(cmd, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        raise RuntimeError(f"capacity search ran past {timeout:.0f} s") from e
    if proc.returncode != 0:
        if not out_json.is_file():
            raise RuntimeError(f"paternoster bench capacity exited {proc.returncode}")
        print(f"WARNING: paternoster bench capacity exited {proc.returncode} after writing "
              f"{out_json}; using it")  # fmt: skip
    return json.loads(out_json.read_text())


def describe_probes(search: dict) -> str:
    """``load: p95 TTFT s, p95 ITL ms verdict`` for every probe, ``; ``-joined."""
    parts = []
    for p in search.get("probes", []):
        s = p["summary"]
        ttft = (s.get("ttft") or {}).get("p95")
        itl = (s.get("itl") or {}).get("p95")
        mark = {True: "✓", False: "✗", None: "?"}[p["ok"]]
        ttft_s = "-" if ttft is None else f"{ttft:.2f} s"
        itl_s = "-" if itl is None else f"{1e3 * itl:.0f} ms"
        parts.append(f"{p['load']:g}: {ttft_s}, {itl_s} {mark}")
    return "; ".join(parts)
