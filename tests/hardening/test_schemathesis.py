"""Property-based requests generated from /openapi.json (schemathesis): the
server never answers 5xx, whatever the body."""

from __future__ import annotations

import pytest

schemathesis = pytest.importorskip("schemathesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402

from tests.hardening.conftest import fake_server  # noqa: E402

EXAMPLES_PER_OPERATION = 25


def test_no_server_errors(fake_model_dir):
    with fake_server(fake_model_dir, {}) as srv:
        schema = schemathesis.openapi.from_url(srv.url + "/openapi.json")
        operations = [result.ok() for result in schema.get_all_operations()]
        assert any(op.path == "/v1/chat/completions" for op in operations)
        for op in operations:

            @given(case=op.as_strategy())
            @settings(
                max_examples=EXAMPLES_PER_OPERATION, deadline=None,
                suppress_health_check=list(HealthCheck), database=None,
            )  # fmt: skip
            def check(case):
                response = case.call(base_url=srv.url, timeout=30)
                assert response.status_code < 500, (
                    case.method, case.path, case.body, response.status_code, response.text
                )  # fmt: skip

            check()
