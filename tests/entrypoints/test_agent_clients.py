"""The agent clients people use, unmodified, against ``paternoster serve``.

The ``openai`` SDK's pydantic helpers, ``langchain-openai`` (``bind_tools``,
``with_structured_output``, streaming, an agent round trip) and ``litellm``
(tools, streamed tools, ``response_format``), on the default model with
``--tool-call-parser hermes``. The tiny model cannot be trusted to call tools
by itself, so every call is forced by ``tool_choice`` (a named function or
``required``, each enforced by grammar) or by a JSON schema. Arguments are
checked against the pydantic model's JSON schema with ``jsonschema_rs`` (an
independent validator), not with the server's code. Raw tools, raw streamed
tool calls and the Responses API are in test_tool_calling.py; ``parse`` with a
flat pydantic model in test_structured_outputs.py.
"""

from __future__ import annotations

import json
import os
from typing import Literal

import httpx
import jsonschema_rs
import pytest
from openai import OpenAI, pydantic_function_tool
from pydantic import BaseModel, Field

from tests.entrypoints.utils import start_server

# litellm otherwise retries a download of its price list at import (~10 s offline).
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import litellm  # noqa: E402
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage  # noqa: E402
from langchain_core.tools import tool  # noqa: E402
from langchain_openai import ChatOpenAI  # noqa: E402

QUESTION = "What is the weather in Paris?"
# litellm's own pydantic types warn at first use; not ours to fix.
pytestmark = pytest.mark.filterwarnings("ignore:Items? .*ReadOnly:UserWarning")


class GetWeather(BaseModel):
    """Weather in a city."""

    city: str = Field(max_length=20)
    unit: Literal["c", "f"]


class Step(BaseModel):
    action: str = Field(max_length=30)
    minutes: int = Field(ge=0, le=600)


class Plan(BaseModel):
    """A short plan."""

    title: str = Field(max_length=30)
    steps: list[Step] = Field(min_length=1, max_length=2)
    done: bool


@tool
def get_time(zone: Literal["utc", "cet"]) -> str:
    """The time in a time zone."""
    return "12:00"


def _valid(model: type[BaseModel], args: dict) -> dict:
    """``args`` after checking it against ``model``'s JSON schema (jsonschema_rs)."""
    jsonschema_rs.validator_for(model.model_json_schema()).validate(args)
    return args


@pytest.fixture(scope="module")
def server(default_model_path):
    with start_server(str(default_model_path), "--num-kv-blocks", "512", "--max-model-len",
                      "2048", "--tool-call-parser", "hermes") as srv:  # fmt: skip
        yield srv


@pytest.fixture(scope="module")
def client(server):
    return OpenAI(base_url=server.url + "/v1", api_key="none")


@pytest.fixture(scope="module")
def model(client):
    return client.models.list().data[0].id


@pytest.fixture(scope="module")
def chat(server, model):
    return ChatOpenAI(base_url=server.url + "/v1", api_key="none", model=model, temperature=0,
                      max_tokens=160)  # fmt: skip


# -- openai SDK ---------------------------------------------------------------------


def test_openai_parse_gives_parsed_arguments_of_a_pydantic_tool(client, model):
    r = client.chat.completions.parse(
        model=model, messages=[{"role": "user", "content": QUESTION}], max_tokens=120,
        temperature=0, tools=[pydantic_function_tool(GetWeather)],
        tool_choice={"type": "function", "function": {"name": "GetWeather"}},
    )  # fmt: skip
    [call] = r.choices[0].message.tool_calls
    assert call.function.name == "GetWeather"
    assert isinstance(call.function.parsed_arguments, GetWeather)
    _valid(GetWeather, json.loads(call.function.arguments))


def test_openai_stream_helper_parses_nested_model_and_tool(client, model):
    """``chat.completions.stream``: the SDK's streaming parse of a nested model
    (arrays of objects, bounds) and of a pydantic tool's arguments."""
    messages = [{"role": "user", "content": "Plan a short walk."}]
    with client.chat.completions.stream(model=model, messages=messages, max_tokens=200,
                                        temperature=0, response_format=Plan) as s:  # fmt: skip
        deltas = "".join(ev.delta for ev in s if ev.type == "content.delta")
        final = s.get_final_completion()
    message = final.choices[0].message
    assert final.choices[0].finish_reason == "stop", message.content
    assert isinstance(message.parsed, Plan) and deltas == message.content
    _valid(Plan, json.loads(message.content))

    with client.chat.completions.stream(
        model=model, messages=[{"role": "user", "content": QUESTION}], max_tokens=120,
        temperature=0, tools=[pydantic_function_tool(GetWeather)], tool_choice="required",
    ) as s:  # fmt: skip
        done = [ev for ev in s if ev.type == "tool_calls.function.arguments.done"]
        final = s.get_final_completion()
    assert len(done) >= 1 and all(isinstance(ev.parsed_arguments, GetWeather) for ev in done)
    calls = final.choices[0].message.tool_calls
    assert [c.function.arguments for c in calls] == [ev.arguments for ev in done]


# -- langchain-openai ---------------------------------------------------------------


@pytest.mark.parametrize("tool_choice", ["GetWeather", "any", "required"])
def test_langchain_bind_tools_invoke_and_stream_agree(chat, tool_choice):
    bound = chat.bind_tools([GetWeather, get_time], tool_choice=tool_choice)
    ai = bound.invoke(QUESTION)
    assert isinstance(ai, AIMessage) and ai.tool_calls and not ai.invalid_tool_calls
    if tool_choice == "GetWeather":
        assert [c["name"] for c in ai.tool_calls] == ["GetWeather"]
    for call in ai.tool_calls:
        assert call["id"] and call["name"] in ("GetWeather", "get_time")
        schema_of = GetWeather if call["name"] == "GetWeather" else get_time.args_schema
        _valid(schema_of, call["args"])
    merged = None
    for chunk in bound.stream(QUESTION):
        merged = chunk if merged is None else merged + chunk
    assert not merged.invalid_tool_calls
    shape = [(c["name"], c["args"]) for c in ai.tool_calls]
    assert [(c["name"], c["args"]) for c in merged.tool_calls] == shape


@pytest.mark.parametrize("method", ["json_schema", "function_calling"])
def test_langchain_with_structured_output_returns_the_model(chat, method):
    structured = chat.with_structured_output(Plan, method=method)
    plan = structured.invoke("Plan a short walk.")
    assert isinstance(plan, Plan)
    _valid(Plan, plan.model_dump())


@pytest.mark.parametrize("responses_api", [False, True])
def test_langchain_agent_round_trip_through_a_tool_message(server, chat, model, responses_api):
    """A tool call, its result as a ToolMessage, then an answer: the history with
    the assistant's call and the tool message reaches the server as the prompt a
    hand-written request gives (over chat completions, or /v1/responses with
    ``use_responses_api``)."""
    chat = chat.model_copy(update={"max_tokens": 16, "use_responses_api": responses_api})
    messages = [HumanMessage(QUESTION)]
    ai = chat.bind_tools([GetWeather], tool_choice="GetWeather").invoke(messages)
    [call] = ai.tool_calls
    _valid(GetWeather, call["args"])
    messages += [ai, ToolMessage("21 C and sunny", tool_call_id=call["id"])]
    answer = chat.bind_tools([GetWeather], tool_choice="none").invoke(messages)
    assert isinstance(answer, AIMessage) and not answer.tool_calls and answer.text.strip()
    by_hand = [
        {"role": "user", "content": QUESTION},
        {"role": "assistant", "content": None, "tool_calls": [{"id": call["id"], "type": "function",
         "function": {"name": "GetWeather", "arguments": json.dumps(call["args"])}}]},
        {"role": "tool", "tool_call_id": call["id"], "content": "21 C and sunny"},
    ]  # fmt: skip
    body = {"model": model, "messages": by_hand, "tools": [pydantic_function_tool(GetWeather)]}
    r = httpx.post(server.url + "/tokenize", json=body, timeout=30)
    assert answer.usage_metadata["input_tokens"] == r.json()["count"]


# -- litellm ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def litellm_kw(server, model):
    return dict(model=f"openai/{model}", api_base=server.url + "/v1", api_key="none",
                temperature=0)  # fmt: skip


def test_litellm_named_tool_call_and_its_stream(litellm_kw):
    kw = dict(litellm_kw, messages=[{"role": "user", "content": QUESTION}], max_tokens=120,
              tools=[pydantic_function_tool(GetWeather)],
              tool_choice={"type": "function", "function": {"name": "GetWeather"}})  # fmt: skip
    r = litellm.completion(**kw)
    [call] = r.choices[0].message.tool_calls
    assert call.function.name == "GetWeather" and call.id
    _valid(GetWeather, json.loads(call.function.arguments))
    chunks = list(litellm.completion(stream=True, **kw))
    rebuilt = litellm.stream_chunk_builder(chunks, messages=kw["messages"])
    [again] = rebuilt.choices[0].message.tool_calls
    assert again.function.name == "GetWeather"
    assert again.function.arguments == call.function.arguments


def test_litellm_response_format_json_schema(litellm_kw):
    schema = Plan.model_json_schema()
    r = litellm.completion(
        **litellm_kw, messages=[{"role": "user", "content": "Plan a short walk."}],
        max_tokens=200, response_format={"type": "json_schema", "json_schema": {
            "name": "Plan", "schema": schema}},
    )  # fmt: skip
    assert r.choices[0].finish_reason == "stop"
    Plan.model_validate(_valid(Plan, json.loads(r.choices[0].message.content)))
