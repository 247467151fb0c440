"""Per-request SLO targets (``slo_ttft_s``, ``slo_itl_s``) and the priority
class on the ZeroMQ API and on /v1/responses: they cross the frontend and
the engine link (the fake engine logs each request as it decoded it), they
reach the ``slo`` scheduler (the real EngineCore over the cost-model runner
sheds a request whose target it cannot make), and bad values are refused
naming the field (HTTP 400 in the OpenAI shape; the ZeroMQ ``bad_request``
error)."""

from __future__ import annotations

import json
import math
import time

import httpx
import pytest

from paternoster.client import BadRequestError, Client, OverloadedError
from paternoster.client._common import generate_message
from tests.entrypoints.utils import free_port, start_server
from tests.hardening.conftest import fake_server

RESPONSES = {"input": "hi", "max_output_tokens": 2}


# ------------------------------------------------ plumbing (fake engine)


@pytest.fixture(scope="module")
def srv(fake_model_dir, tmp_path_factory):
    log = tmp_path_factory.mktemp("slo_fields") / "requests.jsonl"
    address = f"tcp://127.0.0.1:{free_port()}"
    with fake_server(fake_model_dir, {"request_log": str(log)}, "--zmq-address",
                     address) as s:  # fmt: skip
        yield s, log, address


def _logged(log, rid_prefix: str, timeout: float = 5.0) -> dict:
    """The one engine request whose id starts with ``rid_prefix``, as logged."""
    deadline = time.monotonic() + timeout
    while True:
        lines = log.read_text().splitlines() if log.exists() else []
        found = [e for e in map(json.loads, lines) if e["add"].startswith(rid_prefix)]
        if found or time.monotonic() > deadline:
            assert len(found) == 1, found
            return found[0]
        time.sleep(0.05)


def _ids(log) -> set[str]:
    lines = log.read_text().splitlines() if log.exists() else []
    return {json.loads(line)["add"] for line in lines}


def test_zmq_slo_fields_and_priority_reach_the_engine_request(srv):
    _, log, address = srv
    before = _ids(log)
    with Client(address) as client:
        done = client.generate("hi", priority=3, slo_ttft_s=0.5, slo_itl_s=0.125,
                               tenant="zed", max_tokens=2)  # fmt: skip
        assert done.finish_reason == "length"
    (rid,) = _ids(log) - before
    entry = _logged(log, rid)
    assert entry["add"].startswith("zmq-")
    assert (entry["slo_ttft_s"], entry["slo_itl_s"]) == (0.5, 0.125)
    assert entry["priority"] == 3 and entry["tenant"] == "zed"


def test_zmq_without_slo_fields_leaves_them_unset(srv):
    _, log, address = srv
    before = _ids(log)
    with Client(address) as client:
        client.generate("hi", max_tokens=2)
    (rid,) = _ids(log) - before
    entry = _logged(log, rid)
    assert entry["slo_ttft_s"] is None and entry["slo_itl_s"] is None


@pytest.mark.parametrize(("field", "value"), [
    ("slo_ttft_s", 0), ("slo_ttft_s", -1.5), ("slo_ttft_s", math.inf),
    ("slo_ttft_s", math.nan), ("slo_ttft_s", "fast"), ("slo_itl_s", 0.0),
    ("slo_itl_s", [0.1]), ("slo_itl_s", True),
])  # fmt: skip
def test_zmq_bad_slo_fields_are_a_bad_request_naming_them(srv, field, value):
    _, log, address = srv
    before = _ids(log)
    with Client(address) as client:
        with pytest.raises(BadRequestError) as e:
            client.generate("hi", max_tokens=2, **{field: value})
        assert e.value.code == "bad_request" and e.value.param == field, vars(e.value)
        assert field in str(e.value)
        assert client.generate("hi", max_tokens=2).finish_reason == "length"  # still usable
    assert len(_ids(log) - before) == 1  # only the good request reached the engine


def test_zmq_top_level_fields_are_not_named_as_sampling_ones(srv):
    _, _, address = srv
    with Client(address) as client:
        with pytest.raises(BadRequestError) as e:
            client.generate("hi", tenant="t" * 257, max_tokens=2)
    assert e.value.param == "tenant"


def test_python_client_sends_slo_fields_as_request_fields():
    _, msg = generate_message("hi", None, "r", False, 1, True,
                              {"slo_ttft_s": 0.5, "slo_itl_s": None, "max_tokens": 2})  # fmt: skip
    assert msg["slo_ttft_s"] == 0.5 and "slo_itl_s" not in msg
    assert msg["sampling"] == {"max_tokens": 2} and msg["priority"] == 1


def test_responses_slo_fields_priority_and_tenant_reach_the_engine_request(srv):
    s, log, _ = srv
    before = _ids(log)
    body = {**RESPONSES, "priority": 2, "slo_ttft_s": 1.5, "slo_itl_s": 0.25, "user": "u1"}
    r = httpx.post(s.url + "/v1/responses", json=body, timeout=30)
    assert r.status_code == 200, r.text
    (rid,) = _ids(log) - before
    entry = _logged(log, rid)
    assert (entry["slo_ttft_s"], entry["slo_itl_s"]) == (1.5, 0.25)
    assert entry["priority"] == 2 and entry["tenant"] == "u1"
    before = _ids(log)
    r = httpx.post(s.url + "/v1/responses", json={**body, "stream": True},
                   headers={"X-Tenant-Id": "gw"}, timeout=30)  # fmt: skip
    assert r.status_code == 200 and "event: response.incomplete" in r.text, r.text
    (rid,) = _ids(log) - before
    entry = _logged(log, rid)
    assert entry["slo_ttft_s"] == 1.5 and entry["tenant"] == "gw"


@pytest.mark.parametrize(("field", "value"), [
    ("slo_ttft_s", 0), ("slo_ttft_s", -1.5), ("slo_ttft_s", "fast"),
    ("slo_itl_s", 0), ("slo_itl_s", [0.1]), ("priority", 2**31), ("priority", "high"),
])  # fmt: skip
def test_responses_bad_slo_fields_are_a_400_naming_them(srv, field, value):
    s, _, _ = srv
    r = httpx.post(s.url + "/v1/responses", json={**RESPONSES, field: value}, timeout=30)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == field and error["code"] == 400, error
    assert error["type"] == "BadRequestError", error


def test_responses_non_finite_slo_field_is_a_400(srv):
    s, _, _ = srv
    r = httpx.post(s.url + "/v1/responses", content='{"input": "hi", "slo_itl_s": Infinity}',
                   headers={"Content-Type": "application/json"}, timeout=30)  # fmt: skip
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "slo_itl_s"


# ------------------------------------------------- the slo scheduler itself

ENGINE = "tests.hardening.cost_model_engine:CostModelEngineCore"
# As in test_slo_shedding: priority 1's TTFT target (1 ms) is below any step
# the cost model predicts, so with load shedding such requests are refused.
CONFIG = {"ttft_s": 30.0, "itl_s": 5.0, "load_shedding": True,
          "classes": {"1": {"ttft_s": 0.001}}}  # fmt: skip


@pytest.fixture(scope="module")
def slo_srv(fake_model_dir):
    address = f"tcp://127.0.0.1:{free_port()}"
    with start_server(
        str(fake_model_dir), "--engine-cls", ENGINE, "--scheduler", "slo",
        "--scheduler-config", json.dumps(CONFIG), "--max-model-len", "2048",
        "--num-kv-blocks", "512", "--zmq-address", address,
    ) as s:  # fmt: skip
        yield s, address


def test_zmq_targets_reach_the_slo_scheduler(slo_srv):
    _, address = slo_srv
    with Client(address) as client:
        done = client.generate("Hello there", max_tokens=4, ignore_eos=True)
        assert done.usage.completion_tokens == 4
        with pytest.raises(OverloadedError, match="TTFT target"):
            client.generate("Hello there", max_tokens=4, slo_ttft_s=0.001)
        with pytest.raises(OverloadedError, match="TTFT target"):
            client.generate("Hello there", max_tokens=4, priority=1)  # the class's target
        done = client.generate("Hello there", max_tokens=4, ignore_eos=True, priority=1,
                               slo_ttft_s=30)  # the request's own target wins  # fmt: skip
        assert done.usage.completion_tokens == 4


def test_responses_targets_reach_the_slo_scheduler(slo_srv):
    s, _ = slo_srv

    def post(**fields) -> httpx.Response:
        return httpx.post(s.url + "/v1/responses", json={"input": "Hello there",
                          "max_output_tokens": 4, **fields}, timeout=60)  # fmt: skip

    assert post().status_code == 200
    for fields in ({"slo_ttft_s": 0.001}, {"priority": 1}):
        r = post(**fields)
        assert r.status_code == 503, r.text
        error = r.json()["error"]
        assert error["type"] == "ServiceUnavailableError" and "TTFT target" in error["message"]
    r = post(priority=1, slo_ttft_s=30)
    assert r.status_code == 200, r.text
    assert r.json()["status"] in ("completed", "incomplete")
