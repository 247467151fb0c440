"""Reasoning on /v1/chat/completions with ``--reasoning-parser``, on the default model.

The tiny model never thinks by itself, so a regex makes it write a Qwen3
thinking answer (``<think>...</think>`` then the answer, in the format of
Qwen3's documented output); the parser's split is checked against the text the
regex fixes, streamed and not, and a tool call written inside the reasoning
must not be taken for a call (tool parsing applies to the answer only).
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from openai import OpenAI

from tests.entrypoints.utils import REPO_ROOT, child_env, start_server

REASONING = '\nI could call <tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>\n'
ANSWER = "It is 4."
CALL = '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'
TEXT = f"<think>{REASONING}</think>\n\n{ANSWER}\n{CALL}"
TOOLS = [{"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {}}}}]  # fmt: skip
MESSAGES = [{"role": "user", "content": "What is 2+2?"}]


def _regex(text: str) -> str:
    return "".join("\\" + ch if ch in "{}.[]()+*?|\\^$" else ch for ch in text)


@pytest.fixture(scope="module")
def client(default_model_path):
    with start_server(str(default_model_path), "--num-kv-blocks", "512", "--max-model-len",
                      "2048", "--reasoning-parser", "qwen3",
                      "--tool-call-parser", "hermes",
                      "--trust-request-chat-template") as srv:  # fmt: skip
        c = OpenAI(base_url=srv.url + "/v1", api_key="none")
        yield c, c.models.list().data[0].id


def _forced(client, text: str, **kw):
    c, model = client
    return dict(model=model, messages=MESSAGES, max_tokens=400, temperature=0,
                extra_body={"structured_outputs": {"regex": _regex(text)}, **kw.pop("extra", {})},
                **kw)  # fmt: skip


def test_reasoning_is_split_off_and_calls_come_from_the_answer_only(client):
    c, _ = client
    kw = _forced(client, TEXT, tools=TOOLS)
    r = c.chat.completions.create(**kw)
    m = r.choices[0].message
    extra = m.model_extra
    assert extra["reasoning_content"] == REASONING == extra["reasoning"]
    assert m.content == "\n\n" + ANSWER  # as the model wrote it, as vLLM keeps it
    [call] = m.tool_calls  # the one in the answer; the one in the reasoning is text
    assert (call.function.name, call.function.arguments) == ("get_time", "{}")
    assert r.choices[0].finish_reason == "tool_calls"
    thought = content = ""
    calls, finish = [], None
    for chunk in c.chat.completions.create(stream=True, **kw):
        d = chunk.choices[0].delta
        thought += (d.model_extra or {}).get("reasoning_content") or ""
        assert (d.model_extra or {}).get("reasoning_content") == (d.model_extra or {}).get(
            "reasoning")
        content += d.content or ""
        calls += d.tool_calls or []
        finish = chunk.choices[0].finish_reason or finish
    assert (thought, content, finish) == (REASONING, "\n\n" + ANSWER, "tool_calls")
    assert [x.function.name for x in calls if x.function.name] == ["get_time"]


def test_include_reasoning_false_drops_it(client):
    c, _ = client
    r = c.chat.completions.create(**_forced(client, TEXT, extra={"include_reasoning": False}))
    m = r.choices[0].message
    assert m.model_extra["reasoning_content"] is None and m.model_extra["reasoning"] is None
    assert m.content == f"\n\n{ANSWER}\n{CALL}"  # no tools: the call text is content


def test_an_answer_without_thinking_is_all_content(client):
    c, model = client
    r = c.chat.completions.create(model=model, messages=MESSAGES, max_tokens=8, temperature=0)
    m = r.choices[0].message
    assert m.content and m.model_extra["reasoning_content"] is None


def test_an_unknown_reasoning_parser_exits_with_one_clear_line(default_model_path):
    proc = subprocess.run(
        [sys.executable, "-m", "paternoster.entrypoints.cli", "serve", str(default_model_path),
         "--reasoning-parser", "nope"],
        env=child_env(), cwd=REPO_ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 1
    assert "'nope'" in proc.stderr and "Traceback" not in proc.stderr


# The prompt ends inside an open reasoning block, as DeepSeek-R1's and
# Qwen3-Thinking-2507's templates leave it.
OPEN_THINK_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
                       "<|im_end|>\n{% endfor %}<|im_start|>assistant\n<think>\n")  # fmt: skip


def test_a_schema_constrains_the_answer_not_the_reasoning(client):
    """With the prompt in reasoning, the JSON schema waits for ``</think>``: the
    (cut) output is free reasoning text, not JSON, and nothing is claimed as
    the answer. Without the gate the first token would already be ``{``."""
    c, model = client
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    kw = dict(model=model, messages=MESSAGES, max_tokens=12, temperature=0,
              response_format=fmt)  # fmt: skip
    r = c.chat.completions.create(**kw, extra_body={"chat_template": OPEN_THINK_TEMPLATE})
    m = r.choices[0].message
    assert r.choices[0].finish_reason == "length"
    assert m.content is None and m.model_extra["reasoning_content"]
    assert not m.model_extra["reasoning_content"].lstrip().startswith("{")
    # the same request whose prompt does not open reasoning is constrained at once
    r = c.chat.completions.create(**kw, max_completion_tokens=40)
    assert r.choices[0].message.content.startswith("{")
