"""Tool calling on /v1/chat/completions with the ``openai`` SDK, on the default model.

The tiny model cannot be trusted to call tools by itself, so the calls are
forced: ``tool_choice: "required"`` and a named function through their own
grammars, and ``auto`` through a regex that makes the model write the Hermes
format, which the server's ``--tool-call-parser hermes`` then reads. Every
call's arguments are checked against the function's JSON schema with
``jsonschema_rs`` (an independent validator); streamed calls must concatenate
to the non-streamed ones; the prompt the chat template receives is checked
against the text the template is documented to write.
"""

from __future__ import annotations

import json
import subprocess
import sys

import httpx
import jsonschema_rs
import pytest
from openai import BadRequestError, OpenAI

from tests.entrypoints.utils import REPO_ROOT, child_env, start_server

WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 20}, "unit": {"enum": ["c", "f"]}},
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                      "parameters": WEATHER}},
    {"type": "function", "function": {"name": "get_time", "parameters": {
        "type": "object", "properties": {"zone": {"enum": ["utc", "cet"]}}, "required": ["zone"],
        "additionalProperties": False}}},
]  # fmt: skip
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
MESSAGES = [{"role": "user", "content": "What is the weather in Paris, and the time?"}]
HERMES_CALL = ('Let me check.\n<tool_call>\n{"name": "get_time", "arguments": {"zone": "utc"}}\n'
               '</tool_call>')  # fmt: skip

# A Hermes/Qwen2.5-style template (the layout of Qwen's documented tool prompt):
# tools as JSON lines in <tools>, calls in <tool_call>, results in <tool_response>.
TEMPLATE = """{%- if tools %}<|im_start|>system
# Tools
<tools>
{%- for tool in tools %}
{{ tool | tojson }}
{%- endfor %}
</tools><|im_end|>
{% endif %}
{%- for m in messages %}
{%- if m.role == 'assistant' and m.tool_calls %}<|im_start|>assistant
{%- for tc in m.tool_calls %}
<tool_call>
{"name": "{{ tc.function.name }}", "arguments": {{ tc.function.arguments | tojson }}}
</tool_call>
{%- endfor %}<|im_end|>
{% elif m.role == 'tool' %}<|im_start|>user
<tool_response>
{{ m.content }}
</tool_response><|im_end|>
{% else %}<|im_start|>{{ m.role }}
{{ m.content }}<|im_end|>
{% endif %}
{%- endfor %}
{%- if enable_thinking is defined and not enable_thinking %}NO_THINK{% endif %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""


@pytest.fixture(scope="module")
def server(default_model_path):
    with start_server(str(default_model_path), "--num-kv-blocks", "512", "--max-model-len",
                      "2048", "--tool-call-parser", "hermes",
                      "--trust-request-chat-template") as srv:  # fmt: skip
        yield srv


@pytest.fixture(scope="module")
def client(server):
    return OpenAI(base_url=server.url + "/v1", api_key="none")


@pytest.fixture(scope="module")
def model(client):
    return client.models.list().data[0].id


def _check_calls(calls) -> None:
    ids = [c.id for c in calls]
    assert len(set(ids)) == len(ids) and all(i.startswith("call_") for i in ids)
    for c in calls:
        assert c.type == "function"
        args = json.loads(c.function.arguments)
        jsonschema_rs.validator_for(SCHEMAS[c.function.name]).validate(args)
        # canonical compact JSON, as json.dumps writes it
        assert c.function.arguments == json.dumps(args, separators=(",", ":"),
                                                  ensure_ascii=False)  # fmt: skip


def _stream(client, **kw):
    """A streamed chat: (content, {index: [id, name, arguments]}, finish_reason)."""
    content, calls, finish = "", {}, None
    for chunk in client.chat.completions.create(stream=True, **kw):
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        content += delta.content or ""
        for item in delta.tool_calls or []:
            if item.index not in calls:  # the first item of a call carries id and name
                assert item.id and item.function.name and item.type == "function"
                calls[item.index] = [item.id, item.function.name, ""]
            else:
                assert item.id is None and item.function.name is None
            calls[item.index][2] += item.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    return content, calls, finish


@pytest.mark.parametrize("parallel", [True, False])
def test_required_calls_validate_and_stream_the_same(client, model, parallel):
    kw = dict(model=model, messages=MESSAGES, tools=TOOLS, tool_choice="required",
              parallel_tool_calls=parallel, max_tokens=200, temperature=0)  # fmt: skip
    r = client.chat.completions.create(**kw)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    calls = choice.message.tool_calls
    assert len(calls) >= 1 and (parallel or len(calls) == 1)
    _check_calls(calls)
    content, streamed, finish = _stream(client, **kw)
    assert finish == "tool_calls" and content == ""
    assert [(n, a) for _, n, a in streamed.values()] == [
        (c.function.name, c.function.arguments) for c in calls]


def test_required_calls_under_sampling_and_n(client, model):
    # One call per choice: sampled at 1.2, the tiny model often keeps appending
    # calls to the list until max_tokens (a "length" finish, legal but not what
    # this checks); the seed alone does not pin that down: a prefix-cache hit
    # or another batch moves the logits, as the server runs without
    # --batch-invariant. One call takes 31-45 tokens here.
    r = client.chat.completions.create(
        model=model, messages=MESSAGES, tools=TOOLS, tool_choice="required", n=3,
        temperature=1.2, seed=7, max_tokens=300, parallel_tool_calls=False,
    )  # fmt: skip
    assert len(r.choices) == 3
    for choice in r.choices:
        assert choice.finish_reason == "tool_calls", choice.message.content
        assert len(choice.message.tool_calls) == 1
        _check_calls(choice.message.tool_calls)


def test_named_function_is_called_with_valid_arguments(client, model):
    named = {"type": "function", "function": {"name": "get_weather"}}
    kw = dict(model=model, messages=MESSAGES, tools=TOOLS, tool_choice=named, max_tokens=100,
              temperature=0)  # fmt: skip
    r = client.chat.completions.create(**kw)
    choice = r.choices[0]
    assert choice.finish_reason == "stop"  # OpenAI's answer to a forced function
    [call] = choice.message.tool_calls
    assert call.function.name == "get_weather"
    _check_calls([call])
    content, streamed, finish = _stream(client, **kw)
    assert finish == "stop" and content == ""
    assert list(streamed.values())[0][1:] == ["get_weather", call.function.arguments]


def test_a_call_cut_by_max_tokens_is_length_and_stays_content(client, model):
    kw = dict(model=model, messages=MESSAGES, tools=TOOLS, tool_choice="required", max_tokens=6,
              temperature=0)  # fmt: skip
    r = client.chat.completions.create(**kw)
    choice = r.choices[0]
    assert choice.finish_reason == "length" and not choice.message.tool_calls
    assert choice.message.content and choice.message.content.lstrip().startswith("[")
    content, _, finish = _stream(client, **kw)
    assert finish == "length" and content == choice.message.content


def test_auto_reads_hermes_calls_out_of_the_text(client, model):
    regex = HERMES_CALL.replace("{", r"\{").replace("}", r"\}").replace(".", r"\.")
    kw = dict(model=model, messages=MESSAGES, tools=TOOLS, max_tokens=100, temperature=0,
              extra_body={"structured_outputs": {"regex": regex}})  # fmt: skip
    r = client.chat.completions.create(**kw)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Let me check."
    [call] = choice.message.tool_calls
    assert (call.function.name, call.function.arguments) == ("get_time", '{"zone":"utc"}')
    content, streamed, finish = _stream(client, **kw)
    assert (content, finish) == ("Let me check.", "tool_calls")
    assert list(streamed.values())[0][1:] == ["get_time", '{"zone":"utc"}']


def test_a_streamed_call_cut_short_does_not_finish_as_tool_calls(client, model):
    """A stop string cutting a forced call, or a malformed Hermes call: the
    stream may already have sent the call's name (arguments stream as they
    come), but it finishes as the non-streamed answer does: "stop", the text
    as content, no "tool_calls" finish reason."""
    bad = ('<tool_call>\n{"name": "get_time", "arguments": {"zone": "ut\n</tool_call>')
    cases = [
        dict(tool_choice="required", stop=["zone", "city"]),
        dict(extra_body={"structured_outputs": {"regex": re_escape(bad)}}),
    ]
    for extra in cases:
        kw = dict(model=model, messages=MESSAGES, tools=TOOLS, max_tokens=200, temperature=0,
                  **extra)  # fmt: skip
        r = client.chat.completions.create(**kw)
        choice = r.choices[0]
        assert choice.finish_reason == "stop" and not choice.message.tool_calls, extra
        content, _, finish = _stream(client, **kw)
        assert finish == "stop" and content == choice.message.content, extra


def test_parallel_tool_calls_false_keeps_the_first_call_in_auto(client, model):
    two = HERMES_CALL + '\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo", ' \
        '"unit": "c"}}\n</tool_call>'
    kw = dict(model=model, messages=MESSAGES, tools=TOOLS, max_tokens=200, temperature=0,
              extra_body={"structured_outputs": {"regex": re_escape(two)}})  # fmt: skip
    both = client.chat.completions.create(**kw).choices[0].message.tool_calls
    assert [c.function.name for c in both] == ["get_time", "get_weather"]
    one = client.chat.completions.create(parallel_tool_calls=False, **kw).choices[0]
    assert [c.function.name for c in one.message.tool_calls] == ["get_time"]
    _, streamed, finish = _stream(client, parallel_tool_calls=False, **kw)
    assert finish == "tool_calls" and [v[1] for v in streamed.values()] == ["get_time"]


def test_a_function_without_parameters_takes_an_empty_object(client, model):
    for params in ({}, None):
        fn = {"name": "ping"} if params is None else {"name": "ping", "parameters": params}
        r = client.chat.completions.create(
            model=model, messages=MESSAGES, tools=[{"type": "function", "function": fn}],
            tool_choice={"type": "function", "function": {"name": "ping"}}, max_tokens=30,
            temperature=0)  # fmt: skip
        [call] = r.choices[0].message.tool_calls
        assert call.function.arguments == "{}"


def re_escape(text: str) -> str:
    """``text`` as a regex matching exactly it (xgrammar's regex syntax)."""
    return "".join("\\" + ch if ch in "{}.[]()+*?|\\^$" else ch for ch in text)


def test_tool_choice_none_and_plain_answers_are_content(client, model):
    r = client.chat.completions.create(model=model, messages=MESSAGES, tools=TOOLS,
                                       tool_choice="none", max_tokens=8, temperature=0)
    choice = r.choices[0]
    assert choice.message.content and not choice.message.tool_calls
    assert choice.finish_reason in ("stop", "length")


def test_tools_history_and_template_kwargs_reach_the_template(server, model):
    history = MESSAGES + [
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city": "Paris", "unit": "c"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "21 C"},
    ]  # fmt: skip
    body = {"model": model, "messages": history, "tools": TOOLS, "chat_template": TEMPLATE,
            "chat_template_kwargs": {"enable_thinking": False}}
    tokens = httpx.post(server.url + "/tokenize", json=body).json()["tokens"]
    text = httpx.post(server.url + "/detokenize",
                      json={"model": model, "tokens": tokens}).json()["prompt"]
    for tool in TOOLS:  # HF's tojson: json.dumps with its default separators
        assert json.dumps(tool, ensure_ascii=False) in text
    # the arguments reach the template as an object, not as JSON text
    assert '"arguments": {"city": "Paris", "unit": "c"}' in text
    assert "<tool_response>\n21 C\n</tool_response>" in text
    assert text.endswith("NO_THINK<|im_start|>assistant\n")
    r = httpx.post(server.url + "/v1/chat/completions", timeout=60,
                   json={**body, "tool_choice": "none", "max_tokens": 4})  # fmt: skip
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("body, param, words", [
    ({"tool_choice": "auto"}, "tool_choice", "needs tools"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "tool_choice", "'nope'"),
    ({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}},
     "tool_choice", "cannot be combined"),
    ({"tools": TOOLS + TOOLS[:1]}, "tools", "two functions named 'get_weather'"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"a": {"not": {}}}}}}], "tool_choice": "required"},
     "tools", "'not'"),
    ({"tools": [{"type": "web_search"}]}, "tools", ""),
    ({"tools": [{"type": "function", "function": {"name": ""}}]}, "tools", "empty"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "string"}}}]}, "tools", "must describe an object"),
    ({"chat_template_kwargs": {"tokenize": True}}, "chat_template_kwargs", "'tokenize'"),
    ({"messages": MESSAGES + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "a", "type": "function", "function": {"name": "f", "arguments": "[1]"}}]}]},
     "messages", "JSON object"),
    ({"messages": MESSAGES + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "a", "type": "function", "function": {"name": "f", "arguments": "{"}}]}]},
     "messages", "not valid JSON"),
])  # fmt: skip
def test_bad_tool_requests_are_400_naming_the_field(server, model, body, param, words):
    r = httpx.post(server.url + "/v1/chat/completions", timeout=60,
                   json={"model": model, "messages": MESSAGES, "max_tokens": 4, **body})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and words in error["message"], error


def test_auto_without_a_parser_is_400_and_none_still_answers(default_model_path):
    with start_server(str(default_model_path), "--num-kv-blocks", "128", "--max-model-len",
                      "1024") as srv:  # fmt: skip
        c = OpenAI(base_url=srv.url + "/v1", api_key="none")
        model = c.models.list().data[0].id
        with pytest.raises(BadRequestError) as err:
            c.chat.completions.create(model=model, messages=MESSAGES, tools=TOOLS, max_tokens=4)
        assert "--tool-call-parser" in str(err.value)
        r = c.chat.completions.create(model=model, messages=MESSAGES, tools=TOOLS,
                                      tool_choice="required", max_tokens=100, temperature=0)
        assert r.choices[0].finish_reason == "tool_calls"
        _check_calls(r.choices[0].message.tool_calls)


@pytest.mark.parametrize("args, words", [
    (["--tool-call-parser", "nope"], "'nope'"),
    (["--enable-auto-tool-choice"], "needs --tool-call-parser"),
    (["--reasoning-parser", "gpt_oss"], "not gpt-oss"),
])  # fmt: skip
def test_bad_tool_flags_exit_with_one_clear_line(default_model_path, args, words):
    proc = subprocess.run(
        [sys.executable, "-m", "paternoster.entrypoints.cli", "serve", str(default_model_path),
         *args], env=child_env(), cwd=REPO_ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 1
    assert words in proc.stderr and "Traceback" not in proc.stderr


def test_responses_api_calls_and_takes_back_function_outputs(client, model):
    """/v1/responses: a forced call comes out as a function_call item (also
    streamed), and a function_call_output goes back in as the tool result."""
    tools = [{"type": "function", "name": t["function"]["name"],
              "parameters": t["function"]["parameters"]} for t in TOOLS]  # fmt: skip
    r = client.responses.create(model=model, input=MESSAGES[0]["content"], tools=tools,
                                tool_choice="required", max_output_tokens=200)  # fmt: skip
    assert r.status == "completed"
    calls = [o for o in r.output if o.type == "function_call"]
    assert calls and all(o.call_id.startswith("call_") for o in calls)
    for o in calls:
        jsonschema_rs.validator_for(SCHEMAS[o.name]).validate(json.loads(o.arguments))
    with client.responses.stream(model=model, input=MESSAGES[0]["content"], tools=tools,
                                 tool_choice="required", max_output_tokens=200) as s:
        arguments = "".join(ev.delta for ev in s
                            if ev.type == "response.function_call_arguments.delta")
        final = s.get_final_response()
    streamed = [o for o in final.output if o.type == "function_call"]
    assert arguments == "".join(o.arguments for o in streamed)
    follow = client.responses.create(
        model=model, tools=tools, tool_choice="none", max_output_tokens=8,
        input=[MESSAGES[0], {"type": "function_call", "call_id": calls[0].call_id,
                             "name": calls[0].name, "arguments": calls[0].arguments},
               {"type": "function_call_output", "call_id": calls[0].call_id,
                "output": "21 C"}],
    )  # fmt: skip
    assert follow.output_text and not [o for o in follow.output if o.type == "function_call"]
