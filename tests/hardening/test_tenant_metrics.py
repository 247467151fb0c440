"""Per-tenant request and token counters on /metrics: every protocol counts
a request under its tenant (``user``, ``X-Tenant-Id``, the ZeroMQ
``tenant``; ``tenant=""`` without one) with the tokens its usage reports, and
tenants beyond ``--metrics-max-tenants`` count under ``tenant="other"``."""

from __future__ import annotations

import time

import httpx
import pytest
from prometheus_client import CollectorRegistry

from paternoster.client import Client
from paternoster.engine.messages import EngineCoreOutput
from paternoster.metrics.requests import RequestMetrics
from tests.entrypoints.utils import free_port
from tests.hardening.conftest import fake_server
from tests.metrics.utils import scrape, value

P = "paternoster:"
REQUESTS, PROMPT, GENERATION = (P + "tenant_requests_total", P + "tenant_prompt_tokens_total",
                                P + "tenant_generation_tokens_total")  # fmt: skip


# ------------------------------------------------------------ unit level


def _sample(registry: CollectorRegistry, name: str, tenant: str) -> float:
    return registry.get_sample_value(name, {"tenant": tenant}) or 0.0


def test_tracker_counts_under_the_tenant_label_and_caps_distinct_tenants():
    registry = CollectorRegistry()
    m = RequestMetrics(registry, max_tenants=2)
    for tenant, prompt, generated in (("a", 5, 3), (None, 7, 1), ("b", 2, 2), ("c", 4, 4),
                                      ("a", 1, 1), ("d", 3, 0)):  # fmt: skip
        t = m.track(prompt, tenant)
        t.on_output(EngineCoreOutput(request_id="r-0", new_token_ids=[1]))
        t.finish(["stop"], generated)
    assert _sample(registry, REQUESTS, "a") == 2
    assert _sample(registry, PROMPT, "a") == 6 and _sample(registry, GENERATION, "a") == 4
    assert _sample(registry, REQUESTS, "") == 1 and _sample(registry, PROMPT, "") == 7
    assert _sample(registry, REQUESTS, "b") == 1
    # c and d came after the cap: one "other" row, no row of their own
    assert _sample(registry, REQUESTS, "other") == 2
    assert _sample(registry, PROMPT, "other") == 7 and _sample(registry, GENERATION, "other") == 4
    assert registry.get_sample_value(REQUESTS, {"tenant": "c"}) is None
    # the anonymous tenant does not take a place under the cap
    assert m.tenant_label(None) == "" and m.tenant_label("b") == "b"


def test_prompt_tokens_count_only_once_the_prefill_completed():
    registry = CollectorRegistry()
    m = RequestMetrics(registry)
    t = m.track(9, "x")
    t.finish(["error"], 0)  # refused before its first token
    assert _sample(registry, REQUESTS, "x") == 1 and _sample(registry, PROMPT, "x") == 0


def test_a_cap_of_zero_counts_every_named_tenant_as_other():
    registry = CollectorRegistry()
    m = RequestMetrics(registry, max_tenants=0)
    assert m.tenant_label("a") == "other" and m.tenant_label(None) == ""
    with pytest.raises(ValueError, match="max_tenants"):
        RequestMetrics(CollectorRegistry(), max_tenants=-1)


# ------------------------------------------------------- over the server


@pytest.fixture(scope="module")
def srv(fake_model_dir):
    address = f"tcp://127.0.0.1:{free_port()}"
    with fake_server(fake_model_dir, {}, "--zmq-address", address,
                     "--metrics-max-tenants", "2") as s:  # fmt: skip
        yield s, address


def _wait_for(url: str, expected: dict[tuple[str, str], float], timeout: float = 10.0) -> dict:
    """Scrape until every ``(name, tenant)`` sample has the expected value."""
    deadline = time.monotonic() + timeout
    while True:
        samples = scrape(url)
        got = {k: value(samples, k[0], tenant=k[1]) for k in expected}
        if got == expected or time.monotonic() > deadline:
            assert got == expected
            return samples
        time.sleep(0.05)


def test_per_tenant_counters_match_the_usage_of_every_protocol(srv):
    s, address = srv
    usages: dict[str, list[dict]] = {}

    def post(path: str, body: dict, tenant: str, headers: dict | None = None) -> None:
        r = httpx.post(s.url + path, json=body, headers=headers or {}, timeout=30)
        assert r.status_code == 200, r.text
        u = r.json()["usage"]
        if "input_tokens" in u:  # /v1/responses
            u = {"prompt_tokens": u["input_tokens"], "completion_tokens": u["output_tokens"]}
        usages.setdefault(tenant, []).append(u)

    post("/v1/completions", {"prompt": "hello there", "max_tokens": 3, "user": "alice"}, "alice")
    post("/v1/responses", {"input": "hi", "max_output_tokens": 2}, "bob", {"X-Tenant-Id": "bob"})
    post("/v1/chat/completions", {"messages": [{"role": "user", "content": "hey"}],
                                  "max_tokens": 4}, "")  # fmt: skip
    # the cap (2) is reached: later tenants share "other", known ones keep their row
    post("/v1/completions", {"prompt": "a b c", "max_tokens": 2, "n": 2, "user": "dave"}, "other")
    post("/v1/completions", {"prompt": "again", "max_tokens": 1, "user": "alice"}, "alice")
    with Client(address) as client:
        done = client.generate("zmq prompt", tenant="carol", max_tokens=3)
        usages.setdefault("other", []).append(vars(done.usage))
        done = client.generate("anonymous", max_tokens=2)
        usages[""].append(vars(done.usage))

    expected = {}
    for tenant, us in usages.items():
        expected[(REQUESTS, tenant)] = float(len(us))
        expected[(PROMPT, tenant)] = float(sum(u["prompt_tokens"] for u in us))
        expected[(GENERATION, tenant)] = float(sum(u["completion_tokens"] for u in us))
    samples = _wait_for(s.url, expected)
    assert expected[(GENERATION, "other")] == 2 * 2 + 3  # n = 2 choices of 2, and 3
    tenants = {dict(labels)["tenant"] for name, labels in samples if name == REQUESTS}
    assert tenants == {"alice", "bob", "", "other"}
    # the per-tenant rows add up to the totals
    for name, total in ((PROMPT, P + "prompt_tokens_total"),
                        (GENERATION, P + "generation_tokens_total")):  # fmt: skip
        assert sum(v for (n, _), v in samples.items() if n == name) == value(samples, total)
