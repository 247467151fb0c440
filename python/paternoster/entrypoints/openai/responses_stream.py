"""A chat completions stream as a Responses API event stream.

:class:`ResponsesStreamTranslator` turns chat chunks (the JSON of the chat
stream's ``data:`` lines) into Responses SSE events, in the order OpenAI
sends them: ``response.created``, ``response.in_progress``, then per output
item ``response.output_item.added``, its content part and text (or arguments)
deltas, their ``.done`` events and ``response.output_item.done``, and last
``response.completed`` (``response.incomplete`` when the token limit cut the
output). Event shapes are the SDK's ``ResponseStreamEvent`` union
(``openai.types.responses``); every event carries a ``sequence_number``.

Only choice 0 is read. Chat deltas open output items as they come: reasoning
text (``reasoning_content`` or ``reasoning``), content, and each tool call
(by its ``index``) is one item; a delta of another kind closes the open item.
A tool call's deltas are expected to arrive together, as vLLM sends them.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from paternoster.entrypoints.openai.responses_protocol import (
    ResponsesRequest,
    final_status,
    function_call_item,
    message_item,
    new_id,
    output_text_part,
    reasoning_item,
    response_object,
    usage,
)


@dataclass
class _OpenItem:
    """The output item being streamed: its kind, position and text so far
    (arguments for a function call)."""

    kind: str  # "reasoning", "message" or "function_call"
    item_id: str
    output_index: int
    tool_index: int | None = None
    call_id: str = ""
    name: str = ""
    text: list[str] = field(default_factory=list)


class ResponsesStreamTranslator:
    """Chat chunks in, Responses SSE events (``event: TYPE\\ndata: JSON\\n\\n``) out.

    Call :meth:`start` once, :meth:`feed` per chat chunk, then :meth:`finish`
    unless :attr:`failed` (an error chunk ends the stream with an ``error``
    event and nothing after it).

    Args:
        body: the Responses request (its settings are echoed in ``response``).
        model: the served model's name (``response.model``).
        response_id: the response's id (default: a fresh ``resp_...``).
    """

    def __init__(self, body: ResponsesRequest, model: str, response_id: str | None = None):
        self.body = body
        self.model = model
        self.response_id = response_id or new_id("resp")
        self.created_at = int(time.time())
        self.failed = False
        self._seq = 0
        self._output: list[dict] = []
        self._open: _OpenItem | None = None
        self._finish_reason: str | None = None
        self._usage: dict | None = None

    # ---------------------------------------------------------- public

    def start(self) -> list[str]:
        """``response.created`` and ``response.in_progress`` (empty output)."""
        response = self._response("in_progress")
        return [self._event("response.created", response=response),
                self._event("response.in_progress", response=response)]  # fmt: skip

    def feed(self, chunk: dict) -> list[str]:
        """The events of one chat chunk: choice 0's deltas, its ``finish_reason``
        and ``usage`` are recorded for the final response. A chunk
        ``{"error": {...}}`` (the chat stream's error event) gives one
        ``error`` event and sets :attr:`failed`."""
        if "error" in chunk:
            return self._error(chunk["error"])
        if chunk.get("usage"):
            self._usage = chunk["usage"]
        events: list[str] = []
        for choice in chunk.get("choices") or []:
            if choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            reasoning = delta.get("reasoning_content") or delta.get("reasoning")
            if reasoning:
                events += self._append("reasoning", reasoning)
            if delta.get("content"):
                events += self._append("message", delta["content"])
            for call in delta.get("tool_calls") or []:
                events += self._tool_call(call)
            if choice.get("finish_reason"):
                self._finish_reason = choice["finish_reason"]
        return events

    def finish(self) -> list[str]:
        """Close the open item and send the full response: ``response.completed``,
        or ``response.incomplete`` when the chat choice stopped at its token
        limit. Output with neither text nor calls still gets an empty message
        item, as the JSON answer has."""
        status = final_status(self._finish_reason)
        events = []
        if not any(item["type"] in ("message", "function_call") for item in self._output) and (
            self._open is None or self._open.kind == "reasoning"
        ):
            events += self._append("message", "")
        events += self._close(status)
        kind = "response.incomplete" if status == "incomplete" else "response.completed"
        return events + [self._event(kind, response=self._response(status))]

    # --------------------------------------------------------- helpers

    def _event(self, kind: str, **fields) -> str:
        data = {"type": kind, "sequence_number": self._seq, **fields}
        self._seq += 1
        return f"event: {kind}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"

    def _response(self, status: str) -> dict:
        final = usage(self._usage) if status != "in_progress" else None
        return response_object(self.body, self.response_id, self.created_at, self.model,
                               status=status, output=list(self._output), usage=final)  # fmt: skip

    def _error(self, error: dict) -> list[str]:
        """An ``error`` event (``ResponseErrorEvent``) from an OpenAI error body."""
        self.failed = True
        code = error.get("type") or error.get("code")
        return [self._event("error", code=None if code is None else str(code),
                            message=str(error.get("message", "error")),
                            param=error.get("param"))]  # fmt: skip

    def _append(self, kind: str, text: str) -> list[str]:
        """Text for a reasoning or message item (opening it when another kind is open)."""
        events = []
        if self._open is None or self._open.kind != kind:
            events += self._close("completed")
            events += self._begin(_OpenItem(kind, new_id("rs" if kind == "reasoning" else "msg"),
                                            len(self._output)))  # fmt: skip
        item = self._open
        if text:
            item.text.append(text)
            where = {"item_id": item.item_id, "output_index": item.output_index,
                     "content_index": 0}  # fmt: skip
            if kind == "reasoning":
                events.append(self._event("response.reasoning_text.delta", delta=text, **where))
            else:
                events.append(self._event("response.output_text.delta", delta=text,
                                          logprobs=[], **where))  # fmt: skip
        return events

    def _tool_call(self, call: dict) -> list[str]:
        """A tool call delta: a new ``index`` opens a function_call item."""
        events = []
        index = call.get("index", 0)
        fn = call.get("function") or {}
        item = self._open
        if item is None or item.kind != "function_call" or item.tool_index != index:
            events += self._close("completed")
            item = _OpenItem("function_call", new_id("fc"), len(self._output), index,
                             call.get("id") or new_id("call"), fn.get("name") or "")  # fmt: skip
            events += self._begin(item)
        elif fn.get("name"):  # a name sent in pieces
            item.name += fn["name"]
        if fn.get("arguments"):
            item.text.append(fn["arguments"])
            events.append(self._event("response.function_call_arguments.delta",
                                      delta=fn["arguments"], item_id=item.item_id,
                                      output_index=item.output_index))  # fmt: skip
        return events

    def _item(self, item: _OpenItem, status: str) -> dict:
        """The output item dict of ``item`` as it stands."""
        text = "".join(item.text)
        if item.kind == "reasoning":
            return reasoning_item(item.item_id, text, status)
        if item.kind == "message":
            return message_item(item.item_id, text, status)
        return function_call_item(item.item_id, item.call_id, item.name, text, status)

    def _begin(self, item: _OpenItem) -> list[str]:
        """``output_item.added`` (empty) and, for text items, ``content_part.added``."""
        self._open = item
        added = self._item(item, "in_progress")
        if item.kind != "function_call":
            added["content"] = []  # parts are announced by content_part.added
        events = [self._event("response.output_item.added", output_index=item.output_index,
                              item=added)]  # fmt: skip
        if item.kind != "function_call":
            events.append(self._event("response.content_part.added", item_id=item.item_id,
                                      output_index=item.output_index, content_index=0,
                                      part=self._part(item.kind, "")))  # fmt: skip
        return events

    @staticmethod
    def _part(kind: str, text: str) -> dict:
        if kind == "reasoning":
            return {"type": "reasoning_text", "text": text}
        return output_text_part(text)

    def _close(self, status: str) -> list[str]:
        """The ``.done`` events of the open item (none when nothing is open)."""
        item, self._open = self._open, None
        if item is None:
            return []
        text = "".join(item.text)
        where = {"item_id": item.item_id, "output_index": item.output_index}
        if item.kind == "function_call":
            events = [self._event("response.function_call_arguments.done", arguments=text,
                                  **where)]  # fmt: skip
        else:
            done = "response.reasoning_text.done" if item.kind == "reasoning" else \
                "response.output_text.done"  # fmt: skip
            extra = {"logprobs": []} if item.kind == "message" else {}
            events = [
                self._event(done, text=text, content_index=0, **where, **extra),
                self._event("response.content_part.done", content_index=0,
                            part=self._part(item.kind, text), **where),
            ]  # fmt: skip
        final = self._item(item, status)
        self._output.append(final)
        events.append(self._event("response.output_item.done", output_index=item.output_index,
                                  item=final))  # fmt: skip
        return events


async def responses_events(body: ResponsesRequest, events: AsyncIterator[str], model: str
                           ) -> AsyncIterator[str]:  # fmt: skip
    """The Responses SSE events of a chat SSE stream (``data: JSON`` events
    ending with ``data: [DONE]``). Closing this generator closes the chat
    stream, which aborts its generation."""
    translator = ResponsesStreamTranslator(body, model)
    async with contextlib.aclosing(events) as chat_events:
        for e in translator.start():
            yield e
        async for raw in chat_events:
            data = raw.removeprefix("data: ").strip()
            if not raw.startswith("data: ") or data == "[DONE]":
                continue
            for e in translator.feed(json.loads(data)):
                yield e
            if translator.failed:
                return
    for e in translator.finish():
        yield e
