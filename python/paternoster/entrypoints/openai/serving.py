"""The OpenAI endpoints as a mapping onto the request pipeline.

/v1/completions and /v1/chat/completions turn their JSON body into prompts and
:class:`SamplingParams` fields, hand them to :meth:`Frontend.submit` (which
tokenizes, validates, admits and fans out) and format the generation's deltas
as one response or an SSE stream; /tokenize and /detokenize use the same
tokenizer and checks. Pipeline errors become HTTP errors here and nowhere else.

Stream and non-stream responses are built from the same per-choice state, so
they agree on text, logprobs, usage and finish_reason: concatenating a
stream's chunks gives the non-stream response.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

from fastapi import Request

from paternoster.entrypoints.openai.chat_messages import chat_input
from paternoster.entrypoints.openai.constraints import SOURCE_PARAM, structured_outputs
from paternoster.entrypoints.openai.errors import APIError, bad_request, renamed_in_message
from paternoster.entrypoints.openai.logprobs import (
    CompletionLogprobsBuilder,
    TokenTexts,
    merge_completion_logprobs,
)
from paternoster.entrypoints.openai.protocol import (
    SAMPLING_FIELDS,
    CompletionRequest,
    DetokenizeRequest,
    DetokenizeResponse,
    TokenizeChatRequest,
    TokenizeCompletionRequest,
    TokenizeResponse,
)
from paternoster.entrypoints.openai.protocol_outputs import (
    CompletionChoice,
    CompletionResponse,
    CompletionStreamResponse,
)
from paternoster.entrypoints.openai.request_setup import (
    Setup,
    chunk_encoder,
    request_tenant,
    usage,
)
from paternoster.entrypoints.openai.serving_chat import ChatServing
from paternoster.entrypoints.openai.sse import (
    EventStream,
    consume,
    error_event,
    event,
    run_until_disconnect,
    start_stream,
)
from paternoster.frontend.errors import (
    EngineDeadError,
    EngineOverloadedError,
    InvalidRequestError,
    RequestRejectedError,
)
from paternoster.frontend.generation import Generation
from paternoster.frontend.output_processor import SequenceState
from paternoster.frontend.pipeline import Frontend, RequestOptions, Submitted
from paternoster.frontend.processor import check_text
from paternoster.reasoning_parsers import ReasoningParser
from paternoster.tool_parsers import ToolParser

logger = logging.getLogger("paternoster.server")

COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # /v1/completions without max_tokens (OpenAI, vLLM)


class OpenAIServing(ChatServing):
    """The OpenAI endpoints over one :class:`Frontend`.

    Args:
        frontend: the request pipeline.
        tool_parser: the ``--tool-call-parser`` class reading tool calls out
            of chat output (``tool_choice: "auto"``), or ``None``.
        reasoning_parser: the ``--reasoning-parser`` class splitting chat
            output into reasoning and answer, or ``None``.
        trust_request_chat_template: accept a request's own ``chat_template``
            (``--trust-request-chat-template``).
    """

    def __init__(self, frontend: Frontend, tool_parser: type[ToolParser] | None = None,
                 reasoning_parser: type[ReasoningParser] | None = None,
                 trust_request_chat_template: bool = False):  # fmt: skip
        self.frontend = frontend
        self.trust_request_chat_template = trust_request_chat_template
        self.tool_parser = tool_parser
        self.reasoning_parser = (
            reasoning_parser(frontend.tokenizer) if reasoning_parser is not None else None
        )
        self.model_name = frontend.model_name
        self.tokenizer = frontend.tokenizer
        self.texts = TokenTexts(frontend.tokenizer)

    @property
    def max_model_len(self) -> int:
        """The longest sequence in tokens (context and KV cache)."""
        return self.frontend.max_model_len

    # ------------------------------------------------------------ endpoints

    async def create_completion(self, body: CompletionRequest, raw: Request):
        """Handle POST /v1/completions.

        Returns:
            A JSON response or an SSE ``StreamingResponse``.
        Raises:
            APIError: 400 bad input, 404 unknown model, 503 engine down.
            EngineOverloadedError: the waiting queue is full (the app answers
                503 with ``Retry-After``); nothing stays reserved.
        """
        self._check_model_name(body.model)
        prompt = body.prompt
        if isinstance(prompt, str) or (prompt and all(isinstance(t, int) for t in prompt)):
            prompt = [prompt]
        sampling = self._sampling(body)
        sampling["logprobs"] = body.logprobs
        sampling["prompt_logprobs"] = body.logprobs if body.echo else None
        setup = await self._submit(body, prompt, sampling, "cmpl", COMPLETIONS_DEFAULT_MAX_TOKENS,
                                   headers=raw.headers)  # fmt: skip
        gen = setup.gen
        want_logprobs = body.logprobs is not None
        try:  # every way out before the requests are sent gives their room back
            echo = None
            if body.echo:
                echo = [self._echo_text(ids, text)
                        for ids, text in zip(gen.prompts, setup.texts)]  # fmt: skip
            if body.stream:
                await start_stream(raw, gen)
                return EventStream(self._completion_stream(setup, echo, want_logprobs),
                                    gen.release)  # fmt: skip
            await run_until_disconnect(raw, consume(gen))
        except BaseException:
            gen.release()
            raise
        choices = [self._completion_choice(gen, s, echo, want_logprobs) for s in gen.states]
        return CompletionResponse(
            id=setup.request_id, created=setup.created, model=self.model_name, choices=choices,
            usage=usage(gen),
        )  # fmt: skip

    def _completion_choice(
        self, gen: Generation, s: SequenceState, echo: list[str] | None, want_logprobs: bool
    ) -> CompletionChoice:
        """A finished choice of a non-streamed completion (echoed prompt first)."""
        p = gen.prompt_index(s.index)
        lp = None
        if want_logprobs:
            b = CompletionLogprobsBuilder(self.texts)
            if echo is None:
                lp = b.generated(s.token_ids, s.logprobs)
            else:  # the prompt first: text offsets run on
                head = b.prompt(gen.prompts[p], s.prompt_logprobs)
                lp = merge_completion_logprobs(head, b.generated(s.token_ids, s.logprobs))
        text = s.text if echo is None else echo[p] + s.text
        return CompletionChoice(
            index=s.index, text=text, logprobs=lp, finish_reason=s.finish_reason
        )

    def tokenize(self, body: TokenizeCompletionRequest | TokenizeChatRequest) -> TokenizeResponse:
        """Handle POST /tokenize (vLLM's shape): a prompt, or chat messages
        through the chat template.

        Raises:
            APIError: 400 bad input or no chat template, 404 unknown model.
        """
        self._check_model_name(body.model)
        processor = self.frontend.processor
        try:
            if isinstance(body, TokenizeChatRequest):
                chat = chat_input(body, body.messages, self.trust_request_chat_template)
                _, ids = processor.chat(chat)
            else:
                check_text(body.prompt, "prompt")
                ids = list(self.tokenizer(
                    body.prompt, add_special_tokens=body.add_special_tokens
                ).input_ids)  # fmt: skip
        except InvalidRequestError as e:
            raise bad_request(e.message, e.param) from e
        strs = self.tokenizer.convert_ids_to_tokens(ids) if body.return_token_strs else None
        return TokenizeResponse(
            count=len(ids), max_model_len=self.max_model_len, tokens=ids, token_strs=strs
        )

    def detokenize(self, body: DetokenizeRequest) -> DetokenizeResponse:
        """Handle POST /detokenize: token ids back to text (special tokens kept).

        Raises:
            APIError: 400 for a token id outside the vocabulary, 404 unknown model.
        """
        self._check_model_name(body.model)
        vocab = self.frontend.vocab_size
        bad = [t for t in body.tokens if not 0 <= t < vocab]
        if bad:
            raise bad_request(f"token id {bad[0]} is out of range [0, {vocab})", "tokens")
        return DetokenizeResponse(prompt=self.tokenizer.decode(body.tokens))

    async def run_tokenizer(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run ``fn(*args)`` on the pipeline's tokenizer thread."""
        return await self.frontend.run_tokenizer(fn, *args)

    # --------------------------------------------------------------- inputs

    def _check_model_name(self, model: str | None) -> None:
        if model is not None and model != self.model_name:
            raise APIError(404, f"The model `{model}` does not exist.", "model")

    async def _submit(self, body: Any, prompts: Any, sampling: dict, prefix: str,
                      default_max_tokens: int | None = None, prompt_param: str = "prompt",
                      max_tokens_param: str = "max_tokens",
                      headers: Mapping[str, str] | None = None) -> Setup:  # fmt: skip
        """Hand the request to the pipeline; its errors become HTTP errors.
        The tenant is the ``X-Tenant-Id`` header of ``headers`` or the body's
        ``user`` (:func:`request_tenant`).

        Raises:
            APIError: 400 bad input, 503 engine down.
            EngineOverloadedError: the waiting queue is full (nothing reserved).
        """
        sampling = dict(sampling)
        constraint_param = sampling.pop(SOURCE_PARAM, "structured_outputs")
        gate = None
        if self.reasoning_parser is not None and prompt_param == "messages":
            gate = self.reasoning_parser.grammar_gate
        tenant, tenant_param = request_tenant(body.user, headers or {})
        options = RequestOptions(
            request_id_prefix=prefix, priority=body.priority, cache_salt=body.cache_salt,
            default_max_tokens=default_max_tokens, prompt_param=prompt_param,
            constraint_param=constraint_param, reasoning_gate=gate, tenant=tenant,
            tenant_param=tenant_param,
            slo_ttft_s=body.slo_ttft_s, slo_itl_s=body.slo_itl_s,
        )  # fmt: skip
        try:
            sub: Submitted = await self.frontend.submit(prompts, sampling, options)
        except InvalidRequestError as e:
            param = max_tokens_param if e.param == "max_tokens" else e.param
            message = renamed_in_message(e.message, e.param, param)
            if param == "tools":  # the constraint was built from the functions' parameters
                message = message.replace("structured_outputs.json", "a function's parameters")
            raise bad_request(message, param) from e
        except EngineDeadError as e:
            raise APIError(503, f"engine is not running: {e}") from e
        opts = body.stream_options
        include_usage = bool(opts and opts.include_usage)
        return Setup(
            sub.generation, sub.generation.request_id, sub.created, include_usage,
            include_usage and bool(opts.continuous_usage_stats), sub.prompt_texts,
        )  # fmt: skip

    def _sampling(self, body: Any) -> dict[str, Any]:
        """The body's :class:`SamplingParams` fields (those it set), in their
        engine form (``logit_bias`` keys as token ids)."""
        if body.best_of is not None and body.best_of != body.n:
            raise bad_request(
                f"best_of must equal n ({body.n}): sampling best_of candidates and returning "
                "the n most likely is not supported; use n",
                "best_of",
            )
        fields = {name: value for name in SAMPLING_FIELDS
                  if (value := getattr(body, name)) is not None}  # fmt: skip
        if "logit_bias" in fields:
            fields["logit_bias"] = _logit_bias(fields["logit_bias"])
        spec = structured_outputs(body)
        if spec is not None:
            fields[SOURCE_PARAM] = spec.pop(SOURCE_PARAM)
            fields["structured_outputs"] = spec
        return fields

    def _echo_text(self, ids: list[int], text: str | None) -> str:
        """The prompt as echoed: its text, or its tokens decoded (special tokens kept)."""
        return text if text is not None else self.tokenizer.decode(ids)

    # -------------------------------------------------------------- streams

    async def _completion_stream(
        self, setup: Setup, echo: list[str] | None, want_logprobs: bool
    ) -> AsyncIterator[str]:
        gen = setup.gen
        chunk = chunk_encoder(CompletionStreamResponse, setup, self.model_name)
        builders = {s.index: CompletionLogprobsBuilder(self.texts) for s in gen.states}
        started: set[int] = set()
        async with contextlib.aclosing(gen.deltas()) as deltas:
            try:
                async for d in deltas:
                    first = d.index not in started
                    started.add(d.index)
                    p = gen.prompt_index(d.index)
                    text = echo[p] + d.text if first and echo is not None else d.text
                    lp = None
                    if want_logprobs:
                        b = builders[d.index]
                        if first and echo is not None:
                            lp = merge_completion_logprobs(
                                b.prompt(gen.prompts[p], d.prompt_logprobs),
                                b.generated(d.token_ids, d.logprobs),
                            )
                        else:
                            lp = b.generated(d.token_ids, d.logprobs)
                    if text or d.finish_reason or (lp is not None and lp.tokens):
                        choice = CompletionChoice(
                            index=d.index, text=text, logprobs=lp, finish_reason=d.finish_reason
                        )
                        yield chunk([choice])
            except (EngineDeadError, EngineOverloadedError, RequestRejectedError) as e:
                yield error_event(e)
                yield event("[DONE]")
                return
        if setup.include_usage:
            yield chunk([], usage(gen))
        yield event("[DONE]")

# ------------------------------------------------------------------ helpers


def _logit_bias(bias: dict[str, float]) -> dict[int, float]:
    """JSON ``logit_bias`` (string keys) to ``{token id: bias}`` (ids are range
    checked by the pipeline).

    Raises:
        APIError: 400 for a key that is not an integer.
    """
    out = {}
    for key, value in bias.items():
        try:
            out[int(key)] = value
        except ValueError:
            raise bad_request(f"logit_bias keys must be token ids, got {key!r}",
                              "logit_bias") from None  # fmt: skip
    return out
