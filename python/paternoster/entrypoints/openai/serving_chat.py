"""POST /v1/chat/completions: messages through the chat template, and the
generated text shaped into the assistant message (content and tool calls).

:class:`ChatServing` is the chat half of
:class:`~paternoster.entrypoints.openai.serving.OpenAIServing`, which supplies
the shared request handling it calls (``_submit``, ``_sampling``,
``_check_model_name``, ``texts``, ``model_name``, ``tool_parser``). Stream and
non-stream responses agree: the streamed deltas of a choice concatenate to its
message.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request

from paternoster.entrypoints.openai.chat_messages import chat_input
from paternoster.entrypoints.openai.chat_output import ChoiceOutput, ReasoningPlan
from paternoster.entrypoints.openai.constraints import SOURCE_PARAM
from paternoster.entrypoints.openai.errors import bad_request
from paternoster.entrypoints.openai.logprobs import chat_logprobs
from paternoster.entrypoints.openai.protocol import ChatCompletionRequest
from paternoster.entrypoints.openai.protocol_outputs import (
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionResponse,
    DeltaMessage,
)
from paternoster.entrypoints.openai.request_setup import Setup, chunk_encoder, usage
from paternoster.entrypoints.openai.sse import (
    EventStream,
    consume,
    error_event,
    event,
    run_until_disconnect,
    start_stream,
)
from paternoster.entrypoints.openai.tool_calls import ToolPlan, plan_tools
from paternoster.frontend.errors import (
    EngineDeadError,
    EngineOverloadedError,
    RequestRejectedError,
)
from paternoster.frontend.output_processor import SequenceState
from paternoster.sampling_params import MAX_LOGPROBS


class ChatServing:
    """The chat completions endpoint (a base of ``OpenAIServing``)."""

    model_name: str
    texts: Any
    tool_parser: Any
    reasoning_parser: Any
    trust_request_chat_template: bool

    async def create_chat_completion(self, body: ChatCompletionRequest, raw: Request):
        """Handle POST /v1/chat/completions (the chat template, by default with
        the generation prompt).

        Returns:
            A JSON response or an SSE ``StreamingResponse``.
        Raises:
            APIError: 400 bad input, 404 unknown model, 503 engine down.
            EngineOverloadedError: the waiting queue is full (the app answers
                503 with ``Retry-After``); nothing stays reserved.
        """
        self._check_model_name(body.model)
        sampling = self._sampling(body)
        if body.max_completion_tokens is not None:
            sampling["max_tokens"] = body.max_completion_tokens
        top = body.top_logprobs
        if top is not None and not 0 <= top <= MAX_LOGPROBS:
            raise bad_request(
                f"top_logprobs must be in [0, {MAX_LOGPROBS}], got {top}", "top_logprobs"
            )
        if top and not body.logprobs:
            raise bad_request("top_logprobs needs logprobs to be true", "top_logprobs")
        sampling["logprobs"] = (top or 0) if body.logprobs else None
        plan = plan_tools(body, self.tool_parser, "structured_outputs" in sampling)
        if plan is not None and plan.constraint is not None:
            spec = dict(plan.constraint)
            sampling[SOURCE_PARAM] = spec.pop(SOURCE_PARAM)
            sampling["structured_outputs"] = spec
        parser = self.reasoning_parser
        if (plan is not None and not plan.skip_special_tokens) or (
                parser is not None and not parser.skip_special_tokens):  # fmt: skip
            sampling["skip_special_tokens"] = False  # the format's tags are special tokens
        chat = chat_input(body, body.messages, self.trust_request_chat_template)
        setup = await self._submit(
            body, chat, sampling, "chatcmpl", prompt_param="messages",
            max_tokens_param="max_completion_tokens"
            if body.max_completion_tokens is not None else "max_tokens", headers=raw.headers,
        )  # fmt: skip
        gen = setup.gen
        try:  # every way out before the requests are sent gives their room back
            if body.stream:
                await start_stream(raw, gen)
                reasoning = self._reasoning_plan(body, setup.texts[0])
                return EventStream(self._chat_stream(setup, body.logprobs, plan, reasoning),
                                   gen.release)  # fmt: skip
            await run_until_disconnect(raw, consume(gen))
        except BaseException:
            gen.release()
            raise
        reasoning = self._reasoning_plan(body, setup.texts[0])
        choices = [self._chat_choice(s, body.logprobs, ChoiceOutput(plan, reasoning))
                   for s in gen.states]  # fmt: skip
        return ChatCompletionResponse(
            id=setup.request_id, created=setup.created, model=self.model_name, choices=choices,
            usage=usage(gen),
        )  # fmt: skip

    def _reasoning_plan(self, body: ChatCompletionRequest,
                        prompt_text: str | None) -> ReasoningPlan | None:  # fmt: skip
        """The request's reasoning handling (``None`` without ``--reasoning-parser``)."""
        parser = self.reasoning_parser
        if parser is None:
            return None
        return ReasoningPlan(parser, parser.starts_in_reasoning(prompt_text or ""),
                             body.include_reasoning)  # fmt: skip

    def _chat_choice(self, s: SequenceState, want_logprobs: bool,
                     output: ChoiceOutput) -> ChatChoice:  # fmt: skip
        """A finished choice of a non-streamed chat completion."""
        message, reason = output.message(s.text, s.finish_reason)
        return ChatChoice(
            index=s.index, message=message,
            logprobs=chat_logprobs(self.texts, s.token_ids, s.logprobs) if want_logprobs
            else None,
            finish_reason=reason,
        )  # fmt: skip

    async def _chat_stream(self, setup: Setup, want_logprobs: bool, plan: ToolPlan | None,
                           reasoning: ReasoningPlan | None) -> AsyncIterator[str]:  # fmt: skip
        gen = setup.gen
        chunk = chunk_encoder(ChatCompletionChunk, setup, self.model_name)
        role_sent = False
        outputs = {s.index: ChoiceOutput(plan, reasoning) for s in gen.states}
        async with contextlib.aclosing(gen.deltas()) as deltas:
            try:
                async for d in deltas:
                    if not role_sent:  # once the first token exists, as vLLM does:
                        role_sent = True  # benchmark tools time TTFT by this chunk
                        for s in gen.states:
                            role = DeltaMessage(role="assistant", content="")
                            yield chunk([ChatChunkChoice(index=s.index, delta=role)])
                    lp = None
                    if want_logprobs and d.token_ids:
                        lp = chat_logprobs(self.texts, d.token_ids, d.logprobs)
                    delta, reason = outputs[d.index].feed(d.text, d.finish_reason)
                    if (delta.content or delta.tool_calls or delta.reasoning or reason
                            or lp is not None):  # fmt: skip
                        choice = ChatChunkChoice(
                            index=d.index, delta=delta, logprobs=lp, finish_reason=reason
                        )
                        yield chunk([choice])
            except (EngineDeadError, EngineOverloadedError, RequestRejectedError) as e:
                yield error_event(e)
                yield event("[DONE]")
                return
        if setup.include_usage:
            yield chunk([], usage(gen))
        yield event("[DONE]")
