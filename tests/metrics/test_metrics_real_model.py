"""GET /metrics over the real default model: tokens and steps add up."""

from __future__ import annotations

import httpx

from tests.entrypoints.utils import start_server
from tests.metrics.utils import delta, scrape

P = "paternoster:"


def test_real_engine_counts_add_up(default_model_path):
    with start_server(
        str(default_model_path), "--num-kv-blocks", "64", "--max-model-len", "512"
    ) as srv:
        before = scrape(srv.url)
        usages = []
        for prompt in ("The capital of France is", "One, two, three,"):
            body = {"prompt": prompt, "max_tokens": 4, "ignore_eos": True}
            r = httpx.post(srv.url + "/v1/completions", json=body, timeout=60).json()
            usages.append(r["usage"])
        after = scrape(srv.url)
    prompt = sum(u["prompt_tokens"] for u in usages)
    completion = sum(u["completion_tokens"] for u in usages)
    assert delta(after, before, P + "prompt_tokens_total") == prompt
    assert delta(after, before, P + "generation_tokens_total") == completion
    assert delta(after, before, P + "request_success_total", finished_reason="length") == 2
    assert delta(after, before, P + "request_queue_time_seconds_count") == 2
    assert delta(after, before, P + "time_to_first_token_seconds_count") == 2
    # Each request's prompt is computed once, then every generated token but the last.
    steps = delta(after, before, P + "iteration_tokens_total_sum", engine="0")
    assert steps >= prompt + completion - 2
