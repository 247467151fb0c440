"""A scheduler shipped by a separate package is found through its entry point
and used by `paternoster serve --scheduler NAME`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from paternoster.scheduling.registry import available_schedulers, load_scheduler_class
from tests.entrypoints.utils import child_env, start_server
from tests.scheduling.conftest import create_requests, create_scheduler, run_step

PLUGIN_DIR = Path(__file__).parent / "toy_scheduler"
NAME = "shortest_prompt_first"


@pytest.fixture(scope="module")
def plugin_path(tmp_path_factory) -> str:
    """The toy plugin pip-installed (with its own build backend) into a private folder."""
    target = tmp_path_factory.mktemp("plugin")
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target),
         str(PLUGIN_DIR)],
        check=True,
        timeout=600,
    )  # fmt: skip
    return str(target)


@pytest.fixture
def with_plugin(plugin_path, monkeypatch):
    monkeypatch.syspath_prepend(plugin_path)
    monkeypatch.setenv("PYTHONPATH", plugin_path)
    return plugin_path


def test_plugin_is_discovered_and_runs_its_policy(with_plugin):
    assert NAME in available_schedulers()
    assert load_scheduler_class(NAME).__module__ == "paternoster_toy_scheduler"
    s = create_scheduler(NAME, max_num_seqs=1)
    reqs = create_requests(3, prompt_len=5, max_tokens=1)
    for r, n in zip(reqs, [30, 4, 12]):
        r.prompt_token_ids = r.prompt_token_ids[:1] * n
        s.add_request(r)
    order = [run_step(s)[0].scheduled[0].request_id for _ in range(3)]
    assert order == ["r1", "r2", "r0"]


def test_plugin_written_for_v1_survives_preemption_under_v2(with_plugin):
    """The toy overrides only ``enqueue_waiting`` (a version 1 hook that inserts
    into the deque); preempted requests still go back through the base class
    and every request finishes with all its tokens and its blocks freed."""
    s = create_scheduler(NAME, num_blocks=12, max_num_batched_tokens=32, max_model_len=32)
    reqs = create_requests(4, prompt_len=8, max_tokens=12)
    for r in reqs:
        s.add_request(r)
    preempted = 0
    while s.has_unfinished_requests():
        plan, _ = run_step(s)
        preempted += len(plan.preempted)
    assert preempted > 0
    assert all(r.num_output_tokens == 12 for r in reqs)
    assert s.kv_cache_manager.num_free_blocks() == 12


def test_serve_uses_the_plugin(with_plugin, default_model_path):
    args = [str(default_model_path), "--scheduler", NAME, "--num-kv-blocks", "128"]
    with start_server(*args, "--max-model-len", "1024") as server:
        assert server.get("/stats").json()["scheduler"] == NAME
        r = httpx.post(
            server.url + "/v1/completions",
            json={"prompt": "The capital of France is", "max_tokens": 4, "temperature": 0},
            timeout=60,
        )
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4
        # The request body's scheduling priority is accepted, and type-checked.
        body = {"prompt": "Hi", "max_tokens": 2, "priority": 3}
        r = httpx.post(server.url + "/v1/completions", json=body, timeout=60)
        assert r.status_code == 200
        body["priority"] = "high"
        r = httpx.post(server.url + "/v1/completions", json=body, timeout=60)
        assert r.status_code == 400 and r.json()["error"]["param"] == "priority"


def test_unknown_scheduler_lists_installed_ones(with_plugin, default_model_path):
    proc = subprocess.run(
        [sys.executable, "-m", "paternoster.entrypoints.cli", "serve", str(default_model_path),
         "--scheduler", "no_such_policy"],
        env=child_env(), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode != 0
    assert "no_such_policy" in proc.stderr and NAME in proc.stderr and "fcfs" in proc.stderr
