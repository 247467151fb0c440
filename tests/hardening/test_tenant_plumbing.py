"""A request's tenant (the ``fair`` scheduler's unit of sharing) travels from
the HTTP body's ``user`` field, the ``X-Tenant-Id`` header (which wins) or the
ZeroMQ ``tenant`` field through the frontend and the engine link to the
engine process: the fake engine logs each request as it decoded it."""

from __future__ import annotations

import json
import time
import uuid

import httpx
import pytest

from paternoster.client import BadRequestError, Client
from paternoster.client._common import generate_message
from paternoster.entrypoints.openai.request_setup import TENANT_HEADER
from tests.entrypoints.utils import free_port
from tests.hardening.conftest import fake_server

TOO_LONG = "t" * 257


@pytest.fixture(scope="module")
def srv(fake_model_dir, tmp_path_factory):
    log = tmp_path_factory.mktemp("tenants") / "requests.jsonl"
    address = f"tcp://127.0.0.1:{free_port()}"
    with fake_server(fake_model_dir, {"request_log": str(log)}, "--zmq-address",
                     address) as s:  # fmt: skip
        yield s, log, address


def _tenants_of(log, prefix: str, timeout: float = 5.0) -> list:
    """The tenants the engine saw for requests whose id starts with ``prefix``."""
    deadline = time.monotonic() + timeout
    while True:
        lines = log.read_text().splitlines() if log.exists() else []
        found = [e["tenant"] for e in map(json.loads, lines) if e["add"].startswith(prefix)]
        if found or time.monotonic() > deadline:
            return found
        time.sleep(0.05)


def _post(url: str, path: str, body: dict, headers: dict | None = None) -> httpx.Response:
    return httpx.post(url + path, json=body, headers=headers or {}, timeout=30)


def _new_ids(log) -> set[str]:
    lines = log.read_text().splitlines() if log.exists() else []
    return {json.loads(line)["add"] for line in lines}


def _tenant_of_next(srv, path: str, body: dict, headers: dict | None = None):
    """POST one request and return the tenant the engine logged for it."""
    s, log, _ = srv
    before = _new_ids(log)
    r = _post(s.url, path, body, headers)
    assert r.status_code == 200, r.text
    deadline = time.monotonic() + 5
    while not (new := _new_ids(log) - before) and time.monotonic() < deadline:
        time.sleep(0.05)
    (rid,) = new
    [tenant] = _tenants_of(log, rid)
    return tenant


CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
PROMPT = {"prompt": "hi", "max_tokens": 2}


@pytest.mark.parametrize(("path", "body"), [
    ("/v1/completions", PROMPT),
    ("/v1/chat/completions", CHAT),
    ("/v1/responses", {"input": "hi", "max_output_tokens": 2}),
])  # fmt: skip
def test_user_field_reaches_the_engine_request(srv, path, body):
    assert _tenant_of_next(srv, path, {**body, "user": "alice"}) == "alice"


def test_header_reaches_the_engine_request_and_wins_over_user(srv):
    headers = {TENANT_HEADER: "team-gw"}
    assert _tenant_of_next(srv, "/v1/completions", PROMPT, headers) == "team-gw"
    both = {**PROMPT, "user": "bob"}
    assert _tenant_of_next(srv, "/v1/completions", both, headers) == "team-gw"
    assert _tenant_of_next(srv, "/v1/chat/completions", {**CHAT, "user": "bob"},
                           {"x-tenant-id": "lower"}) == "lower"  # fmt: skip


def test_no_user_or_an_empty_one_is_the_anonymous_tenant(srv):
    assert _tenant_of_next(srv, "/v1/completions", PROMPT) is None
    assert _tenant_of_next(srv, "/v1/completions", {**PROMPT, "user": ""}) is None
    empty_header = {TENANT_HEADER: ""}
    assert _tenant_of_next(srv, "/v1/completions", {**PROMPT, "user": "c"},
                           empty_header) == "c"  # fmt: skip


@pytest.mark.parametrize(("body", "headers", "param"), [
    ({"prompt": "hi", "user": TOO_LONG}, {}, "user"),
    ({"prompt": "hi", "user": "ok"}, {TENANT_HEADER: TOO_LONG}, TENANT_HEADER),
    ({"prompt": "hi", "user": "\ud800"}, {}, "user"),
])  # fmt: skip
def test_bad_tenant_is_a_400_naming_its_field(srv, body, headers, param):
    s, _, _ = srv
    r = httpx.post(s.url + "/v1/completions", content=json.dumps(body),  # "\ud800" escaped
                   headers={"Content-Type": "application/json", **headers}, timeout=30)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and error["type"] == "BadRequestError", error
    assert param in error["message"]


def test_zmq_tenant_field_reaches_the_engine_request(srv):
    _, log, address = srv
    rid = f"z-{uuid.uuid4().hex}"
    with Client(address) as client:
        done = client.generate("hi", request_id=rid, tenant="carol", max_tokens=2)
        assert done.finish_reason == "length"
        with pytest.raises(BadRequestError, match="tenant"):
            client.generate("hi", tenant=TOO_LONG, max_tokens=2)
    assert "carol" in _tenants_of(log, "zmq-")


def test_python_client_sends_tenant_as_a_request_field():
    _, msg = generate_message("hi", None, "r", False, 0, True,
                              {"tenant": "acme", "max_tokens": 2})  # fmt: skip
    assert msg["tenant"] == "acme" and msg["sampling"] == {"max_tokens": 2}
    _, msg = generate_message("hi", None, "r", False, 0, True, {"tenant": None})
    assert "tenant" not in msg
