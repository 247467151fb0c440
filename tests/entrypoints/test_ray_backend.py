"""`paternoster serve --distributed-executor-backend ray`: the engines are Ray
actors on an existing cluster, linked to the frontend over ZeroMQ tcp.

The cluster is Ray's own two-node local cluster (``ray.cluster_utils.Cluster``,
one CPU per node, both nodes on this machine): the placement group puts one
engine on each node. With the real default model, greedy outputs equal a
single local engine's and both actors serve; with the fake engine, ``ray.kill``
of one actor fails its in-flight request fast, the other engine keeps serving,
and ``--restart-engine`` brings a new actor back; losing a whole node (its
raylet and workers killed) fails only the requests of the engine it held.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time

import httpx
import pytest
import ray
from ray.cluster_utils import Cluster

from paternoster.frontend.ray_executor import NAMESPACE, RayLauncher
from tests.entrypoints.utils import FAKE_ENGINE, child_env, free_port, start_server

MODEL_ARGS = ("--num-kv-blocks", "256", "--max-model-len", "1024")
RAY_ARGS = ("--data-parallel-size", "2", "--distributed-executor-backend", "ray")
PROMPTS = ["The capital of France is", "def fibonacci(n):", "The three primary colors are"]


@pytest.fixture(scope="module")
def cluster():
    """Two Ray nodes of one CPU each; workers import this repo's packages."""
    saved = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = child_env()["PYTHONPATH"]  # inherited by the raylets
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    try:
        c.add_node(num_cpus=1)
        c.wait_for_nodes()
        ray.init(address=c.address, namespace=NAMESPACE, logging_level="WARNING")
        yield c
    finally:
        ray.shutdown()
        c.shutdown()
        if saved is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = saved


def _complete(url: str, prompt: str, max_tokens: int = 12) -> str:
    r = httpx.post(url + "/v1/completions", timeout=120,
                   json={"prompt": prompt, "max_tokens": max_tokens, "temperature": 0})  # fmt: skip
    r.raise_for_status()
    return r.json()["choices"][0]["text"]


def test_greedy_outputs_of_two_actors_equal_a_single_local_engine(cluster, default_model_path):
    with start_server(str(default_model_path), *MODEL_ARGS, *RAY_ARGS,
                      "--ray-address", cluster.address) as srv:  # fmt: skip
        got = [_complete(srv.url, p) for p in PROMPTS]
        engines = srv.get("/stats").json()["engines"]
    with start_server(str(default_model_path), *MODEL_ARGS) as single:
        want = [_complete(single.url, p) for p in PROMPTS]
    assert got == want
    # One actor on each node, and both served (requests one at a time take turns).
    assert len({e["node_id"] for e in engines}) == 2
    assert all(e["ray_actor"] and e["engine"]["prefix_cache_queries"] > 0 for e in engines)


@pytest.fixture(scope="module")
def fake_model_dir(default_model_path, tmp_path_factory):
    """The fake engine's model dir: the default model's tokenizer, 20 ms steps."""
    d = tmp_path_factory.mktemp("fake_model_ray")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        if (default_model_path / name).exists():
            shutil.copy(default_model_path / name, d / name)
    (d / "fake_engine.json").write_text(json.dumps({"step_delay": 0.02}))
    return d


@pytest.fixture
def fake_ray_server(cluster, fake_model_dir):
    """Two fake engines as Ray actors with --restart-engine (for one test: the
    cluster has room for one server's two engines at a time)."""
    with start_server(str(fake_model_dir), "--engine-cls", FAKE_ENGINE, *RAY_ARGS,
                      "--ray-address", cluster.address, "--restart-engine") as srv:  # fmt: skip
        yield srv


def test_killing_one_actor_fails_its_request_fast_and_the_other_serves(fake_ray_server):
    srv = fake_ray_server
    results: dict[int, tuple[httpx.Response, float]] = {}

    def run(i: int) -> None:
        body = {"prompt": [100 + i, 7, 7, 7], "max_tokens": 200, "ignore_eos": True}
        r = httpx.post(srv.url + "/v1/completions", json=body, timeout=60)
        results[i] = (r, time.monotonic())

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    # Both have had output (none waits): a request that had none would be
    # re-routed to the other engine instead of failing.
    stats = srv.wait_for(lambda s: [e["num_in_flight"] for e in s["engines"]] == [1, 1]
                         and s["num_waiting"] == 0, timeout=30,
                         what="one request streaming on each engine")  # fmt: skip
    victim = stats["engines"][1]
    killed_at = time.monotonic()
    ray.kill(ray.get_actor(victim["ray_actor"], namespace=NAMESPACE), no_restart=True)
    for t in threads:
        t.join(60)
    by_code = {r.status_code: (r, at) for r, at in results.values()}
    assert sorted(by_code) == [200, 503]  # the survivor's request finished, the victim's failed
    failed, failed_at = by_code[503]
    assert failed_at - killed_at < 3.0
    assert victim["ray_actor"] in failed.json()["error"]["message"]
    assert by_code[200][0].json()["usage"]["completion_tokens"] == 200
    for i in range(3):  # the other engine keeps serving
        r = httpx.post(srv.url + "/v1/completions", timeout=30,
                       json={"prompt": [200 + i, 1, 2], "max_tokens": 3})  # fmt: skip
        assert r.status_code == 200
    back = srv.wait_for(lambda s: s["engines"][1]["num_restarts"] == 1
                        and s["engines"][1]["alive"], timeout=90, what="engine 1 restarted")
    assert back["engines"][1]["ray_actor"] != victim["ray_actor"]  # a new actor
    results.clear()
    threads = [threading.Thread(target=run, args=(i,)) for i in range(10, 12)]
    for t in threads:
        t.start()
    srv.wait_for(lambda s: [e["num_in_flight"] for e in s["engines"]] == [1, 1],
                 timeout=30, what="one request on each engine again")  # fmt: skip
    for t in threads:
        t.join(60)
    assert [r.status_code for r, _ in results.values()] == [200, 200]


def test_losing_a_node_fails_its_engines_request_and_the_other_serves(cluster, fake_model_dir):
    # Its own server without restarts; the lost node is replaced at the end so
    # the cluster keeps two nodes for the module's other servers.
    with start_server(str(fake_model_dir), "--engine-cls", FAKE_ENGINE, *RAY_ARGS,
                      "--ray-address", cluster.address) as srv:  # fmt: skip
        worker = next(n for n in cluster.list_all_nodes() if not n.head)
        engines = srv.get("/stats").json()["engines"]
        victim = next(e["index"] for e in engines if e["node_id"] == worker.node_id)
        results: dict[int, tuple[int, float]] = {}

        def run(i: int) -> None:
            body = {"prompt": [100 + i, 7, 7, 7], "max_tokens": 200, "ignore_eos": True}
            r = httpx.post(srv.url + "/v1/completions", json=body, timeout=60)
            results[i] = (r.status_code, time.monotonic())

        threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        # Both have had output (none waits): a request that had none would be
        # re-routed to the other engine instead of failing.
        srv.wait_for(lambda s: [e["num_in_flight"] for e in s["engines"]] == [1, 1]
                     and s["num_waiting"] == 0, timeout=30,
                     what="one request streaming on each engine")  # fmt: skip
        lost_at = time.monotonic()
        cluster.remove_node(worker, allow_graceful=False)
        for t in threads:
            t.join(60)
        assert sorted(code for code, _ in results.values()) == [200, 503]
        assert next(at for code, at in results.values() if code == 503) - lost_at < 10.0
        stats = srv.get("/stats").json()["engines"]
        assert not stats[victim]["alive"] and stats[1 - victim]["alive"]
        r = httpx.post(srv.url + "/v1/completions", timeout=30,
                       json={"prompt": [300, 1, 2], "max_tokens": 3})  # fmt: skip
        assert r.status_code == 200
    cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()


def test_a_cluster_without_room_for_the_engines_is_a_clear_error(cluster):
    with pytest.raises(ValueError, match=r"no room for 2 engine\(s\) of \{'CPU': 4\}"):
        RayLauncher(2, num_cpus=4, address=cluster.address, placement_timeout=1.0)
    deadline = time.monotonic() + 10  # the placement group is released (asynchronously)
    while ray.available_resources().get("CPU") != 2.0 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert ray.available_resources().get("CPU") == 2.0


def test_no_cluster_at_the_address_is_a_clear_error(default_model_path):
    cmd = [sys.executable, "-m", "paternoster.entrypoints.cli", "serve", str(default_model_path),
           *RAY_ARGS, "--ray-address", "127.0.0.1:9", "--port", str(free_port())]
    done = subprocess.run(cmd, env=child_env(), capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert "no Ray cluster at '127.0.0.1:9'" in done.stderr
    assert "ray start --head" in done.stderr
