"""When stream chunks leave the server, as benchmark tools time them: a server over
the scripted fake engine with slow steps (the real tokenizer, no model)."""

from __future__ import annotations

import json
import shutil
import time

import httpx
import pytest

from tests.entrypoints.utils import FAKE_ENGINE, start_server

STEP = 0.4  # seconds per fake engine step: the first token exists after one step


@pytest.fixture(scope="module")
def slow_server(default_model_path, tmp_path_factory):
    d = tmp_path_factory.mktemp("slow_fake_model")
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (default_model_path / name).exists():
            shutil.copy(default_model_path / name, d / name)
    (d / "fake_engine.json").write_text(json.dumps({"step_delay": STEP}))
    with start_server(str(d), "--engine-cls", FAKE_ENGINE, "--max-model-len", "256") as srv:
        yield srv


def _timed_chunks(url: str, path: str, body: dict) -> list[tuple[float, dict]]:
    """(seconds since the request was sent, chunk) for each SSE data chunk."""
    out = []
    start = time.monotonic()
    with httpx.stream("POST", url + path, json=body, timeout=30) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                out.append((time.monotonic() - start, json.loads(line[6:])))
    return out


def test_chat_role_chunk_waits_for_the_first_token(slow_server):
    # vLLM's benchmark_serving (openai-chat) takes the first chunk with choices as the
    # first token: a role chunk sent on arrival made its TTFT ~15 ms whatever the model.
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "n": 2,
            "stream": True}  # fmt: skip
    chunks = _timed_chunks(slow_server.url, "/v1/chat/completions", body)
    role = {"role": "assistant", "content": ""}
    assert [c["choices"][0]["delta"] for _, c in chunks[:2]] == [role, role]
    assert chunks[0][0] >= 0.8 * STEP, chunks[0][0]
    first_content = next(t for t, c in chunks if c["choices"][0]["delta"].get("content"))
    assert first_content - chunks[0][0] < STEP / 2


def test_completion_first_chunk_carries_the_first_token(slow_server):
    body = {"prompt": "hi", "max_tokens": 2, "stream": True}
    chunks = _timed_chunks(slow_server.url, "/v1/completions", body)
    assert chunks[0][0] >= 0.8 * STEP and chunks[0][1]["choices"][0]["text"]
