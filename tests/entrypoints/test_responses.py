"""POST /v1/responses: the mapping onto chat completions checked against the
``openai`` SDK's own Responses types (every response and streamed event must
validate as the SDK's model), then a few end-to-end calls through the SDK
against `paternoster serve` on the default model."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter, ValidationError

from paternoster.entrypoints.openai.errors import APIError
from paternoster.entrypoints.openai.protocol import ChatCompletionRequest
from paternoster.entrypoints.openai.responses import (
    _chat_body,
    create_response,
    to_chat_messages,
    to_chat_request,
    to_response,
)
from paternoster.entrypoints.openai.responses_protocol import ResponsesRequest
from paternoster.entrypoints.openai.responses_stream import ResponsesStreamTranslator
from paternoster.entrypoints.openai.sse import EventStream

EVENT = TypeAdapter(ResponseStreamEvent)
WEATHER = {"type": "function", "name": "get_weather", "description": "Weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
           "strict": True}  # fmt: skip


def request(**fields) -> ResponsesRequest:
    """A Responses request as the server would parse it from JSON."""
    return ResponsesRequest.model_validate_json(json.dumps(fields))


def chat_completion(message: dict, finish_reason: str = "stop") -> dict:
    """A chat completion dict with one choice."""
    return {
        "id": "chatcmpl-1", "object": "chat.completion", "created": 1700000000, "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", **message},
                     "finish_reason": finish_reason}],
        "usage": {"prompt_tokens": 7, "completion_tokens": 5, "total_tokens": 12},
    }  # fmt: skip


def events_of(body: ResponsesRequest, chunks: list[dict]) -> list[dict]:
    """Run chat chunks through the translator; every event is checked against
    the SDK's ``ResponseStreamEvent`` and its ``event:`` line."""
    t = ResponsesStreamTranslator(body, "m")
    raw = t.start()
    for c in chunks:
        raw += t.feed(c)
        if t.failed:
            break
    if not t.failed:
        raw += t.finish()
    out = []
    for e in raw:
        head, data, tail = e.split("\n", 2)
        assert tail == "\n" and head.startswith("event: ") and data.startswith("data: ")
        payload = json.loads(data.removeprefix("data: "))
        assert head.removeprefix("event: ") == payload["type"]
        EVENT.validate_python(payload)
        out.append(payload)
    assert [e["sequence_number"] for e in out] == list(range(len(out)))
    return out


def delta_chunk(delta: dict, finish_reason: str | None = None, index: int = 0) -> dict:
    choice = {"index": index, "delta": delta, "finish_reason": finish_reason}
    return {"id": "c", "created": 1, "model": "m", "choices": [choice]}


USAGE_CHUNK = {
    "id": "c", "created": 1, "model": "m", "choices": [],
    "usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7},
}  # fmt: skip


# ----------------------------------------------------------------- requests


def test_string_input_and_instructions_become_system_then_user():
    body = request(input="Hi", instructions="Be brief.")
    assert to_chat_messages(body) == [{"role": "system", "content": "Be brief."},
                                      {"role": "user", "content": "Hi"}]  # fmt: skip


def test_settings_map_to_chat_fields():
    body = request(
        input=[{"role": "user", "content": [{"type": "input_text", "text": "a"},
                                            {"type": "input_text", "text": "b"}]}],
        max_output_tokens=9, temperature=0.5, top_p=0.9, seed=3, stream=True, user="u",
        tools=[WEATHER], tool_choice={"type": "function", "name": "get_weather"},
        parallel_tool_calls=False, reasoning={"effort": "low"},
        text={"format": {"type": "json_schema", "name": "x", "schema": {"type": "object"},
                         "strict": True}},
    )  # fmt: skip
    chat = to_chat_request(body)
    assert chat["messages"] == [{"role": "user", "content": "ab"}]
    assert chat["max_completion_tokens"] == 9 and chat["temperature"] == 0.5
    assert chat["top_p"] == 0.9 and chat["seed"] == 3 and chat["user"] == "u"
    assert chat["stream"] is True and chat["stream_options"] == {"include_usage": True}
    assert chat["tools"] == [{"type": "function", "function": {
        "name": "get_weather", "description": "Weather in a city",
        "parameters": WEATHER["parameters"], "strict": True}}]  # fmt: skip
    assert chat["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    assert chat["parallel_tool_calls"] is False
    assert chat["response_format"] == {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "object"}, "strict": True}}  # fmt: skip
    assert chat["chat_template_kwargs"] == {"reasoning_effort": "low"}
    ChatCompletionRequest.model_validate(chat)  # today's chat model takes it


def test_json_object_format_and_own_template_kwargs_win():
    body = request(
        input="x",
        text={"format": {"type": "json_object"}},
        reasoning={"effort": "high"},
        chat_template_kwargs={"reasoning_effort": "low", "enable_thinking": False},
    )
    chat = to_chat_request(body)
    assert chat["response_format"] == {"type": "json_object"}
    assert chat["chat_template_kwargs"] == {"reasoning_effort": "low", "enable_thinking": False}
    assert "stream_options" not in chat and "tools" not in chat and "temperature" not in chat


def test_function_call_items_become_tool_calls_and_tool_messages():
    body = request(input=[
        {"role": "user", "content": "Weather in Paris and Rome?"},
        {"type": "reasoning", "id": "rs_1", "summary": [],
         "content": [{"type": "reasoning_text", "text": "Two calls."}]},
        {"type": "function_call", "call_id": "call_a", "name": "get_weather",
         "arguments": '{"city": "Paris"}', "id": "fc_1", "status": "completed"},
        {"type": "function_call", "call_id": "call_b", "name": "get_weather",
         "arguments": '{"city": "Rome"}'},
        {"type": "function_call_output", "call_id": "call_a", "output": "sunny"},
        {"type": "function_call_output", "call_id": "call_b",
         "output": [{"type": "input_text", "text": "rain"}]},
        {"type": "reasoning", "summary": [{"type": "summary_text", "text": "Answer now."}]},
        {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
         "content": [{"type": "output_text", "text": "Sunny, rain.", "annotations": []}]},
        {"role": "user", "content": "Thanks"},
    ])  # fmt: skip
    assert to_chat_messages(body) == [
        {"role": "user", "content": "Weather in Paris and Rome?"},
        {"role": "assistant", "content": None, "reasoning_content": "Two calls.", "tool_calls": [
            {"id": "call_a", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
            {"id": "call_b", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'}}]},
        {"role": "tool", "tool_call_id": "call_a", "content": "sunny"},
        {"role": "tool", "tool_call_id": "call_b", "content": "rain"},
        {"role": "assistant", "content": "Sunny, rain.", "reasoning_content": "Answer now."},
        {"role": "user", "content": "Thanks"},
    ]  # fmt: skip


def test_call_after_assistant_text_joins_it_and_stray_reasoning_is_dropped():
    body = request(input=[
        {"type": "reasoning", "summary": [{"type": "summary_text", "text": "lost"}]},
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "Let me check."},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
    ])  # fmt: skip
    assert to_chat_messages(body) == [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "Let me check.", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
    ]  # fmt: skip


@pytest.mark.parametrize("fields, needle", [
    ({"tools": [{"type": "web_search"}]}, "only function tools"),
    ({"previous_response_id": "resp_1"}, "stateless"),
    ({"conversation": "conv_1"}, "stateless"),
    ({"background": True}, "background"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
     "input_text"),
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "item_reference"),
    ({"text": {"format": {"type": "json_schema", "name": "x"}}}, "schema"),
])  # fmt: skip
def test_unsupported_fields_are_refused(fields, needle):
    with pytest.raises(ValidationError) as err:
        request(**{"input": "x", **fields})
    assert needle in str(err.value)
    assert err.value.errors()[0]["loc"][0] == next(iter(fields))


def test_chat_validation_errors_name_the_responses_field():
    body = request(input="x", max_output_tokens=5)
    body.max_output_tokens = "five"  # only reachable through a bug: still a 400
    with pytest.raises(APIError) as err:
        _chat_body(body)
    assert err.value.status == 400 and err.value.param == "max_output_tokens"


# ---------------------------------------------------------------- responses


def test_text_completion_is_a_sdk_response():
    body = request(input="Hi", temperature=0.0, metadata={"k": "v"})
    r = Response.model_validate(to_response(body, chat_completion({"content": "Hello!"})))
    assert r.output_text == "Hello!" and r.status == "completed" and r.id.startswith("resp_")
    assert r.usage.input_tokens == 7 and r.usage.output_tokens == 5 and r.usage.total_tokens == 12
    assert r.tool_choice == "auto" and r.tools == [] and r.parallel_tool_calls is True
    assert r.temperature == 0.0 and r.metadata == {"k": "v"} and r.created_at == 1700000000
    assert r.output[0].id.startswith("msg_") and r.text.format.type == "text"


def test_reasoning_and_tool_calls_become_output_items():
    body = request(input="Weather?", tools=[WEATHER], tool_choice="required")
    chat = chat_completion({"content": None, "reasoning_content": "Call it.", "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]},
        "tool_calls")  # fmt: skip
    r = Response.model_validate(to_response(body, chat))
    assert [o.type for o in r.output] == ["reasoning", "function_call"]
    assert r.output[0].content[0].text == "Call it." and r.output[0].summary == []
    call = r.output[1]
    assert (call.call_id, call.name, call.arguments) == ("call_1", "get_weather",
                                                         '{"city": "Oslo"}')  # fmt: skip
    assert call.id.startswith("fc_") and r.output_text == "" and r.tools[0].name == "get_weather"
    # vLLM's newer field name for the reasoning text
    chat["choices"][0]["message"] = {"role": "assistant", "content": "ok", "reasoning": "hm"}
    r = Response.model_validate(to_response(body, chat))
    assert [o.type for o in r.output] == ["reasoning", "message"]


def test_length_finish_is_incomplete():
    body = request(input="Hi", max_output_tokens=2)
    r = Response.model_validate(to_response(body, chat_completion({"content": "He"}, "length")))
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.output[0].status == "incomplete" and r.max_output_tokens == 2


# ------------------------------------------------------------------ streams


def test_stream_of_text_events_validates_and_adds_up():
    body = request(input="Hi", stream=True)
    chunks = [delta_chunk({"role": "assistant", "content": ""}), delta_chunk({"content": "Hel"}),
              delta_chunk({"content": "lo"}), delta_chunk({}, "stop"), USAGE_CHUNK]  # fmt: skip
    events = events_of(body, chunks)
    kinds = [e["type"] for e in events]
    assert kinds == [
        "response.created", "response.in_progress", "response.output_item.added",
        "response.content_part.added", "response.output_text.delta",
        "response.output_text.delta", "response.output_text.done",
        "response.content_part.done", "response.output_item.done", "response.completed",
    ]  # fmt: skip
    deltas = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    final = Response.model_validate(events[-1]["response"])
    assert deltas == final.output_text == "Hello"
    assert final.usage.output_tokens == 4 and final.id == events[0]["response"]["id"]
    assert events[0]["response"]["status"] == "in_progress"


def test_stream_with_reasoning_and_two_tool_calls():
    body = request(input="Weather?", stream=True, tools=[WEATHER])
    chunks = [
        delta_chunk({"role": "assistant", "content": ""}),
        delta_chunk({"reasoning_content": "Two "}), delta_chunk({"reasoning_content": "cities."}),
        delta_chunk({"tool_calls": [{"index": 0, "id": "call_a", "type": "function",
                                     "function": {"name": "get_weather", "arguments": ""}}]}),
        delta_chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"city": '}}]}),
        delta_chunk({"tool_calls": [{"index": 0, "function": {"arguments": '"Paris"}'}}]}),
        delta_chunk({"tool_calls": [{"index": 1, "id": "call_b", "type": "function",
                                     "function": {"name": "get_weather", "arguments": "{}"}}]}),
        delta_chunk({}, "tool_calls"), USAGE_CHUNK,
    ]  # fmt: skip
    events = events_of(body, chunks)
    final = Response.model_validate(events[-1]["response"])
    assert [o.type for o in final.output] == ["reasoning", "function_call", "function_call"]
    assert final.output[0].content[0].text == "Two cities."
    assert [(o.call_id, o.arguments) for o in final.output[1:]] == [
        ("call_a", '{"city": "Paris"}'), ("call_b", "{}")]  # fmt: skip
    reasoning = "".join(e["delta"] for e in events
                        if e["type"] == "response.reasoning_text.delta")  # fmt: skip
    assert reasoning == "Two cities."
    done = [e for e in events if e["type"] == "response.function_call_arguments.done"]
    assert [e["arguments"] for e in done] == ['{"city": "Paris"}', "{}"]
    items = [e["item"] for e in events if e["type"] == "response.output_item.done"]
    assert items == final.model_dump(exclude_none=True)["output"]
    assert [e["output_index"] for e in events if e["type"] == "response.output_item.added"] == \
        [0, 1, 2]  # fmt: skip


def test_stream_cut_at_the_limit_is_incomplete_and_empty_stream_has_a_message():
    body = request(input="Hi", stream=True, max_output_tokens=1)
    events = events_of(body, [delta_chunk({"content": "He"}, "length"), USAGE_CHUNK])
    assert events[-1]["type"] == "response.incomplete"
    assert events[-1]["response"]["output"][0]["status"] == "incomplete"
    events = events_of(body, [delta_chunk({}, "stop"), USAGE_CHUNK])
    assert Response.model_validate(events[-1]["response"]).output[0].type == "message"


def test_stream_error_chunk_ends_with_an_error_event():
    body = request(input="Hi", stream=True)
    err = {"error": {"message": "engine is not running: boom", "type": "ServiceUnavailableError",
                     "param": None, "code": 503}}  # fmt: skip
    events = events_of(body, [delta_chunk({"content": "a"}), err, delta_chunk({"content": "b"})])
    assert events[-1]["type"] == "error" and "boom" in events[-1]["message"]
    assert events[-1]["code"] == "ServiceUnavailableError"
    assert not any(e["type"] == "response.completed" for e in events)


def test_only_choice_zero_is_read():
    body = request(input="Hi", stream=True)
    events = events_of(body, [delta_chunk({"content": "x"}, index=1),
                              delta_chunk({"content": "y"}, "stop")])  # fmt: skip
    assert Response.model_validate(events[-1]["response"]).output_text == "y"


class _StreamingServing:
    """A serving whose chat stream records being closed and released."""

    model_name = "m"

    def __init__(self):
        self.closed = self.released = 0

    async def create_chat_completion(self, body, raw):
        assert body.stream and body.stream_options.include_usage

        async def chat_events():
            try:
                for text in ("a", "b", "c"):
                    yield f"data: {json.dumps(delta_chunk({'content': text}))}\n\n"
                yield f"data: {json.dumps(USAGE_CHUNK)}\n\n"
                yield "data: [DONE]\n\n"
            finally:
                self.closed += 1

        return EventStream(chat_events(), self._release)

    def _release(self):
        self.released += 1


def test_closing_the_responses_stream_closes_the_chat_stream_and_releases_once():
    serving = _StreamingServing()
    sent = []

    async def run():
        stream = await create_response(serving, request(input="x", stream=True), None)
        assert isinstance(stream, EventStream)
        events = aiter(stream.body_iterator)
        first = [await anext(events) for _ in range(5)]
        assert first[-1].startswith("event: response.output_text.delta")
        await events.aclose()  # what Starlette does when the client goes away
        assert serving.closed == 1 and serving.released == 0

        async def receive():
            await asyncio.sleep(60)

        async def send(message):
            sent.append(message)

        scope = {"type": "http", "asgi": {"spec_version": "2.4"}}
        await stream(scope, receive, send)  # the response is sent (or fails): release

    asyncio.run(run())
    assert serving.released == 1 and serving.closed == 1


# --------------------------------------------------------------- end to end

SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                           "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}  # fmt: skip


@pytest.fixture(scope="module")
def client(server):
    from openai import OpenAI

    return OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def model(client):
    return client.models.list().data[0].id


def test_e2e_text_matches_chat_and_stream(client, model):
    prompt = "The capital of France is"
    r = client.responses.create(model=model, input=prompt, max_output_tokens=8, temperature=0)
    assert r.output_text and r.status in ("completed", "incomplete")
    chat = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": prompt}], max_completion_tokens=8,
        temperature=0,
    )  # fmt: skip
    assert r.output_text == chat.choices[0].message.content
    assert (r.usage.input_tokens, r.usage.output_tokens, r.usage.total_tokens) == (
        chat.usage.prompt_tokens,
        chat.usage.completion_tokens,
        chat.usage.total_tokens,
    )
    events = list(client.responses.create(model=model, input=prompt, max_output_tokens=8,
                                          temperature=0, stream=True))  # fmt: skip
    assert [e.type for e in events[:2]] == ["response.created", "response.in_progress"]
    final = events[-1].response
    assert events[-1].type in ("response.completed", "response.incomplete")
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == final.output_text == r.output_text
    assert final.usage.output_tokens == r.usage.output_tokens


def test_e2e_json_schema_format(client, model):
    import jsonschema_rs

    r = client.responses.create(
        model=model, input="Give me a person as JSON.", max_output_tokens=64, temperature=0,
        text={"format": {"type": "json_schema", "name": "person", "schema": SCHEMA,
                         "strict": True}},
    )  # fmt: skip
    assert r.status == "completed", r.output_text
    jsonschema_rs.validator_for(SCHEMA).validate(json.loads(r.output_text))
    assert r.text.format.type == "json_schema"


def test_e2e_token_limit_is_incomplete(client, model):
    r = client.responses.create(model=model, input="Tell me a long story.", max_output_tokens=2)
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.usage.output_tokens == 2


def test_e2e_disconnect_mid_stream_frees_the_engine(server, model):
    body = {"model": model, "input": "Tell me a long story.", "max_output_tokens": 1000,
            "stream": True}  # fmt: skip
    with httpx.stream("POST", server.url + "/v1/responses", json=body, timeout=30) as r:
        assert r.status_code == 200
        lines = r.iter_lines()
        assert [next(lines) for _ in range(2)][0] == "event: response.created"

    def idle(stats: dict) -> bool:
        e = stats["engine"]
        return stats["num_in_flight"] == 0 and e.get("num_running") == 0 and (
            e.get("num_free_blocks") == e.get("num_kv_blocks"))  # fmt: skip

    server.wait_for(idle, timeout=10, what="the engine to drop the request")


@pytest.mark.parametrize("fields, param", [
    ({"tools": [{"type": "web_search"}]}, "tools"),
    ({"previous_response_id": "resp_123"}, "previous_response_id"),
    ({"max_output_tokens": 0}, "max_output_tokens"),
])  # fmt: skip
def test_e2e_bad_input_is_a_400_naming_the_field(server, model, fields, param):
    resp = httpx.post(server.url + "/v1/responses", timeout=30,
                      json={"model": model, "input": "Hi", **fields})  # fmt: skip
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["param"] == param and error["type"] == "BadRequestError" and error["message"]
