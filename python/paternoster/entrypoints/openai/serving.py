"""Request handling behind /v1/completions, /v1/chat/completions, /tokenize
and /detokenize.

Turns an OpenAI request into token ids and :class:`SamplingParams`, fans it
out into engine requests (``n`` per prompt), runs them through the
:class:`EngineClient`, and formats either one response or an SSE stream.
Everything that can be checked before the engine sees a request is checked
here and reported as HTTP 400 with the parameter at fault.

Stream and non-stream responses are built from the same per-choice state, so
they agree on text, logprobs, usage and finish_reason: concatenating a
stream's chunks gives the non-stream response.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import time
import uuid
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from fastapi import Request
from fastapi.responses import StreamingResponse

from paternoster.entrypoints.chat_utils import ChatTemplateError, render_chat
from paternoster.entrypoints.engine_client import (
    EngineClient,
    EngineDeadError,
    EngineOverloadedError,
    RequestRejectedError,
    Reservation,
)
from paternoster.entrypoints.openai.errors import APIError, bad_request, error_body
from paternoster.entrypoints.openai.logprobs import (
    CompletionLogprobsBuilder,
    TokenTexts,
    chat_logprobs,
    merge_completion_logprobs,
)
from paternoster.entrypoints.openai.protocol import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatMessage,
    CompletionChoice,
    CompletionRequest,
    CompletionResponse,
    CompletionStreamResponse,
    DeltaMessage,
    DetokenizeRequest,
    DetokenizeResponse,
    TokenizeChatRequest,
    TokenizeCompletionRequest,
    TokenizeResponse,
    UsageInfo,
)
from paternoster.metrics.requests import RequestMetrics
from paternoster.outputs import ChoiceDelta, SequenceState, fan_out
from paternoster.sampling_params import MAX_LOGPROBS, SamplingParams

logger = logging.getLogger("paternoster.server")

_DONE = object()
_PARAM_RE = re.compile(r"^(\w+)(?: keys| values)? must")


COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # /v1/completions without max_tokens (OpenAI, vLLM)


def _check_text(text: str, param: str) -> None:
    """400 unless ``text`` is valid Unicode (e.g. no lone UTF-16 surrogates).

    Raises:
        APIError: 400 naming ``param``.
    """
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise bad_request(f"{param} is not valid Unicode text: {e.reason}", param) from None


class ClientDisconnected(Exception):
    """The HTTP client went away before the response was ready."""


class Generation:
    """The choices of one HTTP request being generated.

    Args:
        client: the engine client.
        tokenizer: for detokenization.
        request_id: id of the HTTP request.
        prompts: tokenized prompts.
        params: sampling params (``n`` choices per prompt).
        max_model_len: resolves ``params.max_tokens=None`` per prompt.
        priority: scheduling priority (lower runs first; used by the
            ``priority`` scheduler, ignored by others).
        metrics: where each choice's latencies, tokens and finish reason are
            recorded (``None``: not recorded). A choice cut short by a client
            disconnect (or a sibling's error) counts as ``abort``.
        reservation: the waiting-queue room :meth:`EngineClient.check_capacity`
            reserved for these choices. Each choice takes its share when it
            is sent; :meth:`deltas` gives back the rest when it ends, and
            :meth:`release` does when it never runs.
    """

    def __init__(
        self,
        client: EngineClient,
        tokenizer: Any,
        request_id: str,
        prompts: list[list[int]],
        params: SamplingParams,
        max_model_len: int | None = None,
        priority: int = 0,
        metrics: RequestMetrics | None = None,
        reservation: Reservation | None = None,
    ):
        self.client = client
        self.metrics = metrics
        self.reservation = reservation
        self.prompts = prompts
        self.n = params.n
        self.jobs = []
        for p, ids in enumerate(prompts):
            first = p * params.n
            for index, req in fan_out(request_id, ids, params, first, max_model_len, priority):
                self.jobs.append((req, SequenceState(index, tokenizer, ids, req.sampling_params)))

    def release(self) -> None:
        """Give back the reserved waiting-queue room of the choices not sent to
        the engine (all of them when :meth:`deltas` never ran). Idempotent."""
        if self.reservation is not None:
            self.reservation.release()

    @property
    def states(self) -> list[SequenceState]:
        """Per-choice states, ordered by choice index."""
        return [s for _, s in self.jobs]

    def prompt_index(self, choice_index: int) -> int:
        """The prompt a choice belongs to (choices ``p * n .. p * n + n - 1``)."""
        return choice_index // self.n

    def usage(self) -> UsageInfo:
        """Exact token counts: each prompt once, every generated token delivered."""
        prompt = sum(len(p) for p in self.prompts)
        completion = sum(len(s.token_ids) for s in self.states)
        return UsageInfo(
            prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion
        )

    async def deltas(self) -> AsyncIterator[ChoiceDelta]:
        """Run every choice concurrently and yield their deltas as they come.

        Closing this iterator aborts the engine requests still running and
        releases the reserved room of choices that were never sent.

        Raises:
            EngineDeadError, RequestRejectedError: from the engine client.
        """
        queue: asyncio.Queue = asyncio.Queue()

        async def run(req, state: SequenceState) -> None:
            tracker = self.metrics.track(len(req.prompt_token_ids)) if self.metrics else None
            reason = "abort"  # unless it ends below: cancelled (client gone)
            try:
                outputs = self.client.generate(req, self.reservation)
                async with contextlib.aclosing(outputs):
                    async for out in outputs:
                        if tracker is not None:
                            tracker.on_output(out)
                        queue.put_nowait(state.process(out))
                        if state.finished:
                            break  # closing the iterator aborts a stop-string match
                reason = state.finish_reason or "abort"
            except Exception as e:
                reason = "error"
                queue.put_nowait(e)
            finally:
                if tracker is not None:
                    tracker.finish(reason, len(state.token_ids))
                queue.put_nowait(_DONE)

        tasks = [asyncio.create_task(run(req, state)) for req, state in self.jobs]
        try:
            remaining = len(tasks)
            while remaining:
                item = await queue.get()
                if item is _DONE:
                    remaining -= 1
                elif isinstance(item, Exception):
                    raise item
                else:
                    yield item
        finally:
            for t in tasks:
                t.cancel()  # a task not started yet never sends its request
            self.release()


@dataclass
class _Setup:
    """One HTTP request's generation and its response settings."""

    gen: Generation
    request_id: str
    created: int
    include_usage: bool
    continuous_usage: bool


class OpenAIServing:
    """The OpenAI endpoints' logic over one engine.

    Args:
        client: a started :class:`EngineClient`.
        tokenizer: the model's Hugging Face tokenizer.
        served_model_name: the only accepted ``model`` value.
        metrics: request metrics to record into (``None``: none).
        chat_template: a Jinja chat template replacing the tokenizer's own
            (``--chat-template``); a request's ``chat_template`` wins over both.
    """

    def __init__(
        self,
        client: EngineClient,
        tokenizer: Any,
        served_model_name: str,
        metrics: RequestMetrics | None = None,
        chat_template: str | None = None,
    ):
        self.client = client
        self.metrics = metrics
        self.tokenizer = tokenizer
        self.model_name = served_model_name
        self.chat_template = chat_template
        self.texts = TokenTexts(tokenizer)
        # Tokenizing a long prompt must not stall other streams: one worker
        # thread (HF fast tokenizers are not safe to call from several at once).
        self._tokenize_pool = ThreadPoolExecutor(1, thread_name_prefix="tokenize")
        info = client.info
        self.vocab_size = int(info.get("vocab_size") or len(tokenizer))
        # A sequence must fit in the model's context and in the whole KV cache.
        self.max_model_len = int(info["max_model_len"])
        blocks, block_size = info.get("num_kv_blocks"), info.get("block_size")
        if blocks and block_size:
            self.max_model_len = min(self.max_model_len, int(blocks) * int(block_size))

    # ------------------------------------------------------------ endpoints

    async def create_completion(self, body: CompletionRequest, raw: Request):
        """Handle POST /v1/completions.

        Returns:
            A JSON response or an SSE ``StreamingResponse``.
        Raises:
            APIError: 400 bad input, 404 unknown model, 503 engine dead.
            EngineOverloadedError: the waiting queue is full (the app answers
                503 with ``Retry-After``); nothing stays reserved.
        """
        self._check_model(body.model)
        prompts, texts = await self.run_tokenizer(self._completion_prompts, body.prompt)
        max_tokens = body.max_tokens
        room = self.max_model_len - max(map(len, prompts))
        if max_tokens is None and room >= 1:  # else the prompt alone is too long: say so
            max_tokens = min(COMPLETIONS_DEFAULT_MAX_TOKENS, room)
        logprobs = body.logprobs
        prompt_logprobs = logprobs if body.echo else None
        setup = self._start(body, prompts, max_tokens, "cmpl", logprobs, prompt_logprobs)
        gen = setup.gen
        try:  # every way out before the requests are sent gives their room back
            echo = None
            if body.echo:
                echo = [self._echo_text(ids, text) for ids, text in zip(prompts, texts)]
            if body.stream:
                stream = self._completion_stream(setup, echo, logprobs is not None)
                return _EventStream(stream, gen.release)
            await _run_until_disconnect(raw, _consume(gen))
        except BaseException:
            gen.release()
            raise
        choices = [self._completion_choice(gen, s, echo, logprobs is not None) for s in gen.states]
        return CompletionResponse(
            id=setup.request_id, created=setup.created, model=self.model_name, choices=choices,
            usage=gen.usage(),
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

    async def create_chat_completion(self, body: ChatCompletionRequest, raw: Request):
        """Handle POST /v1/chat/completions (the chat template, by default with
        the generation prompt).

        Returns:
            A JSON response or an SSE ``StreamingResponse``.
        Raises:
            APIError: 400 bad input, 404 unknown model, 503 engine dead.
            EngineOverloadedError: the waiting queue is full (the app answers
                503 with ``Retry-After``); nothing stays reserved.
        """
        self._check_model(body.model)
        _, ids = await self.run_tokenizer(self._render_chat, body, body.messages)
        max_tokens = body.max_tokens
        if body.max_completion_tokens is not None:
            max_tokens = body.max_completion_tokens
        top = body.top_logprobs
        if top is not None and not 0 <= top <= MAX_LOGPROBS:
            raise bad_request(f"top_logprobs must be in [0, {MAX_LOGPROBS}], got {top}",
                              "top_logprobs")
        if top and not body.logprobs:
            raise bad_request("top_logprobs needs logprobs to be true", "top_logprobs")
        logprobs = (top or 0) if body.logprobs else None
        setup = self._start(body, [ids], max_tokens, "chatcmpl", logprobs)
        gen = setup.gen
        try:  # every way out before the requests are sent gives their room back
            if body.stream:
                return _EventStream(self._chat_stream(setup, body.logprobs), gen.release)
            await _run_until_disconnect(raw, _consume(gen))
        except BaseException:
            gen.release()
            raise
        choices = [
            ChatChoice(
                index=s.index,
                message=AssistantMessage(content=s.text),
                logprobs=chat_logprobs(self.texts, s.token_ids, s.logprobs)
                if body.logprobs else None,
                finish_reason=s.finish_reason,
            )
            for s in gen.states
        ]
        return ChatCompletionResponse(
            id=setup.request_id, created=setup.created, model=self.model_name, choices=choices,
            usage=gen.usage(),
        )  # fmt: skip

    def tokenize(self, body: TokenizeCompletionRequest | TokenizeChatRequest) -> TokenizeResponse:
        """Handle POST /tokenize (vLLM's shape): a prompt, or chat messages
        through the chat template.

        Raises:
            APIError: 400 bad input or no chat template, 404 unknown model.
        """
        self._check_model_name(body.model)
        if isinstance(body, TokenizeChatRequest):
            _, ids = self._render_chat(body, body.messages)
        else:
            _check_text(body.prompt, "prompt")
            ids = list(self.tokenizer(
                body.prompt, add_special_tokens=body.add_special_tokens
            ).input_ids)  # fmt: skip
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
        bad = [t for t in body.tokens if not 0 <= t < self.vocab_size]
        if bad:
            raise bad_request(
                f"token id {bad[0]} is out of range [0, {self.vocab_size})", "tokens"
            )
        return DetokenizeResponse(prompt=self.tokenizer.decode(body.tokens))

    async def run_tokenizer(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run ``fn(*args)`` (tokenization, chat templates) on the tokenizer
        thread, off the event loop; its exceptions propagate."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._tokenize_pool, fn, *args)

    # --------------------------------------------------------------- inputs

    def _check_model_name(self, model: str | None) -> None:
        if model is not None and model != self.model_name:
            raise APIError(404, f"The model `{model}` does not exist.", "model")

    def _check_model(self, model: str | None) -> None:
        self._check_model_name(model)
        if not self.client.is_alive:
            raise APIError(503, f"engine is not running: {self.client.unavailable_reason}")

    def _start(
        self, body: Any, prompts: list[list[int]], max_tokens: int | None, prefix: str,
        logprobs: int | None = None, prompt_logprobs: int | None = None,
    ) -> _Setup:
        """Validate sampling, then set up the generation of one HTTP request.

        The requests' room in the waiting queue is reserved here; the
        generation holds the reservation (see :meth:`Generation.release`).

        Raises:
            APIError: 400 for bad sampling parameters.
            EngineOverloadedError: the waiting queue is full (nothing reserved).
        """
        params = self._sampling_params(body, max_tokens, prompts, logprobs, prompt_logprobs)
        # EngineOverloadedError (503 with Retry-After) when the queue is full;
        # else the room is reserved now, before any other request is checked.
        reservation = self.client.check_capacity(
            len(prompts) * params.n, sum(map(len, prompts)) * params.n
        )
        request_id = f"{prefix}-{uuid.uuid4().hex}"
        try:
            gen = Generation(
                self.client, self.tokenizer, request_id, prompts, params, self.max_model_len,
                body.priority, self.metrics, reservation,
            )  # fmt: skip
        except BaseException:
            reservation.release()
            raise
        opts = body.stream_options
        include_usage = bool(opts and opts.include_usage)
        return _Setup(
            gen, request_id, int(time.time()), include_usage,
            include_usage and bool(opts.continuous_usage_stats),
        )  # fmt: skip

    def _completion_prompts(self, prompt: Any) -> tuple[list[list[int]], list[str | None]]:
        """Token ids of each prompt, and its text when it was given as text."""
        if isinstance(prompt, str):
            prompt = [prompt]
        if not prompt:
            raise bad_request("prompt must not be empty", "prompt")
        if all(isinstance(t, int) for t in prompt):
            prompt = [prompt]
        out, texts = [], []
        for p in prompt:
            if isinstance(p, str):
                _check_text(p, "prompt")
            ids = self.tokenizer(p).input_ids if isinstance(p, str) else list(p)
            if not ids:
                raise bad_request("prompt must not be empty", "prompt")
            check_prompt_ids(ids, self.vocab_size)
            out.append(ids)
            texts.append(p if isinstance(p, str) else None)
        return out, texts

    def _echo_text(self, ids: list[int], text: str | None) -> str:
        """The prompt as echoed: its text, or its tokens decoded (special tokens kept)."""
        return text if text is not None else self.tokenizer.decode(ids)

    def _render_chat(self, body: Any, messages: list[ChatMessage]) -> tuple[str, list[int]]:
        """Messages through the chat template (the request's, the server's or
        the model's). Raises APIError 400 naming the field at fault."""
        if not messages:
            raise bad_request("messages must not be empty", "messages")
        converted = []
        for m in messages:
            content = m.content
            if isinstance(content, list):
                if any(p.type != "text" for p in content):
                    raise bad_request("only text content parts are supported", "messages")
                content = "".join(p.text or "" for p in content)
            _check_text(m.role, "messages")
            _check_text(content or "", "messages")
            converted.append({"role": m.role, "content": content or ""})
        if body.chat_template is not None:
            _check_text(body.chat_template, "chat_template")
        try:
            return render_chat(
                self.tokenizer, converted,
                chat_template=body.chat_template or self.chat_template,
                add_generation_prompt=body.add_generation_prompt,
                continue_final_message=body.continue_final_message,
                add_special_tokens=body.add_special_tokens,
            )  # fmt: skip
        except ChatTemplateError as e:
            raise bad_request(str(e), e.param) from e

    def _logit_bias(self, bias: dict[str, float] | None) -> dict[int, float] | None:
        """JSON ``logit_bias`` (string keys) to ``{token id: bias}``, ids checked."""
        if not bias:
            return None
        out = {}
        for key, value in bias.items():
            try:
                token = int(key)
            except ValueError:
                raise bad_request(
                    f"logit_bias keys must be token ids, got {key!r}", "logit_bias"
                ) from None
            if not 0 <= token < self.vocab_size:
                raise bad_request(
                    f"logit_bias token id {token} is out of range [0, {self.vocab_size})",
                    "logit_bias",
                )
            out[token] = value
        return out

    def _sampling_params(
        self, body: Any, max_tokens: int | None, prompts: list[list[int]],
        logprobs: int | None = None, prompt_logprobs: int | None = None,
    ) -> SamplingParams:
        longest = max(len(p) for p in prompts)
        if body.best_of is not None and body.best_of != body.n:
            raise bad_request(
                f"best_of must equal n ({body.n}): sampling best_of candidates and returning "
                "the n most likely is not supported; use n",
                "best_of",
            )
        stop = body.stop
        try:
            params = SamplingParams(
                n=body.n,
                temperature=1.0 if body.temperature is None else body.temperature,
                top_p=1.0 if body.top_p is None else body.top_p,
                top_k=-1 if body.top_k is None else body.top_k,
                min_p=0.0 if body.min_p is None else body.min_p,
                seed=body.seed,
                max_tokens=max_tokens,
                stop=[stop] if isinstance(stop, str) else list(stop or []),
                stop_token_ids=list(body.stop_token_ids or []),
                ignore_eos=body.ignore_eos,
                presence_penalty=body.presence_penalty or 0.0,
                frequency_penalty=body.frequency_penalty or 0.0,
                repetition_penalty=(
                    1.0 if body.repetition_penalty is None else body.repetition_penalty
                ),
                min_tokens=body.min_tokens,
                logit_bias=self._logit_bias(body.logit_bias),
                logprobs=logprobs,
                prompt_logprobs=prompt_logprobs,
                include_stop_str_in_output=body.include_stop_str_in_output,
                skip_special_tokens=body.skip_special_tokens,
            )
        except ValueError as e:
            raise bad_request(str(e), param_of(e)) from e
        check_model_limits(params, longest, self.max_model_len, self.vocab_size)
        return params

    # -------------------------------------------------------------- streams

    def _chunk_encoder(self, model_cls: type, setup: _Setup) -> Callable[..., str]:
        """A function ``(choices, usage=None) -> SSE event`` for one stream of
        ``model_cls`` chunks. ``usage`` is left out unless ``include_usage``;
        with ``continuous_usage_stats`` every chunk carries the usage so far."""

        def chunk(choices: list, usage: UsageInfo | None = None) -> str:
            if usage is None and setup.continuous_usage:
                usage = setup.gen.usage()
            c = model_cls(
                id=setup.request_id, created=setup.created, model=self.model_name,
                choices=choices, usage=usage,
            )  # fmt: skip
            data = c.model_dump()
            if not setup.include_usage:
                data.pop("usage")
            return _event(json.dumps(data, ensure_ascii=False))

        return chunk

    async def _completion_stream(
        self, setup: _Setup, echo: list[str] | None, want_logprobs: bool
    ) -> AsyncIterator[str]:
        gen = setup.gen
        chunk = self._chunk_encoder(CompletionStreamResponse, setup)
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
                yield _error_event(e)
                yield _event("[DONE]")
                return
        if setup.include_usage:
            yield chunk([], gen.usage())
        yield _event("[DONE]")

    async def _chat_stream(self, setup: _Setup, want_logprobs: bool) -> AsyncIterator[str]:
        gen = setup.gen
        chunk = self._chunk_encoder(ChatCompletionChunk, setup)
        role_sent = False
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
                    if d.text or d.finish_reason or lp is not None:
                        delta = DeltaMessage(content=d.text) if d.text else DeltaMessage()
                        choice = ChatChunkChoice(
                            index=d.index, delta=delta, logprobs=lp, finish_reason=d.finish_reason
                        )
                        yield chunk([choice])
            except (EngineDeadError, EngineOverloadedError, RequestRejectedError) as e:
                yield _error_event(e)
                yield _event("[DONE]")
                return
        if setup.include_usage:
            yield chunk([], gen.usage())
        yield _event("[DONE]")


# ------------------------------------------------------------------ helpers


def check_prompt_ids(ids: list[int], vocab_size: int, param: str = "prompt") -> None:
    """400 unless every prompt token id is in ``[0, vocab_size)``.

    Raises:
        APIError: 400 naming ``param``.
    """
    bad = [t for t in ids if not 0 <= t < vocab_size]
    if bad:
        raise bad_request(f"prompt token id {bad[0]} is out of range [0, {vocab_size})", param)


def check_model_limits(
    params: SamplingParams, prompt_len: int, max_model_len: int, vocab_size: int
) -> None:
    """400 when validated ``params`` do not fit the model: token ids outside the
    vocabulary, or a prompt of ``prompt_len`` tokens plus ``max_tokens`` (or
    ``min_tokens`` when ``max_tokens`` is ``None``) over ``max_model_len`` tokens.
    The message gives both lengths, as OpenAI's does.

    Raises:
        APIError: 400 naming ``stop_token_ids``, ``prompt``, ``min_tokens`` or
            ``max_tokens``.
    """
    if any(not 0 <= t < vocab_size for t in params.stop_token_ids):
        raise bad_request(f"stop_token_ids must be in [0, {vocab_size})", "stop_token_ids")
    bad = [t for t in (params.logit_bias or {}) if not 0 <= t < vocab_size]
    if bad:
        raise bad_request(
            f"logit_bias token id {bad[0]} is out of range [0, {vocab_size})", "logit_bias"
        )
    limit = max_model_len
    if params.max_tokens is None:
        if prompt_len >= limit:
            raise bad_request(
                f"This model's maximum context length is {limit} tokens, but the prompt "
                f"has {prompt_len} tokens, leaving no room for the completion. "
                "Please reduce the length of the prompt.",
                "prompt",
            )
        if params.min_tokens > limit - prompt_len:
            raise bad_request(
                f"min_tokens ({params.min_tokens}) does not fit in the context after the "
                f"prompt ({prompt_len} of {limit} tokens)",
                "min_tokens",
            )
    elif prompt_len + params.max_tokens > limit:
        raise bad_request(
            f"This model's maximum context length is {limit} tokens. However, you "
            f"requested {prompt_len + params.max_tokens} tokens ({prompt_len} in the prompt, "
            f"{params.max_tokens} for the completion). Please reduce the length of the "
            "prompt or max_tokens.",
            "max_tokens",
        )


def param_of(error: ValueError) -> str | None:
    """The parameter a :class:`SamplingParams` ``ValueError`` names (its first word)."""
    m = _PARAM_RE.match(str(error))
    return m.group(1) if m else None


def _event(data: str) -> str:
    return f"data: {data}\n\n"


def _error_event(e: Exception) -> str:
    status = 400 if isinstance(e, RequestRejectedError) else 503
    message = f"engine is not running: {e}" if isinstance(e, EngineDeadError) else str(e)
    return _event(json.dumps(error_body(status, message)))


class _EventStream(StreamingResponse):
    """An SSE response that calls ``on_close()`` once it is sent, or failed to
    be (the client went away), even when its body was never iterated: an
    async generator that never started runs none of its ``finally`` blocks."""

    def __init__(self, events: AsyncIterator[str], on_close: Callable[[], None]):
        super().__init__(
            events,
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
        self._on_close = on_close

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._on_close()



async def _consume(gen: Generation) -> None:
    """Run a generation to the end; engine errors become :class:`APIError`."""
    try:
        async with contextlib.aclosing(gen.deltas()) as deltas:
            async for _ in deltas:
                pass
    except RequestRejectedError as e:
        raise bad_request(str(e)) from e
    except EngineDeadError as e:
        raise APIError(503, f"engine is not running: {e}") from e


async def _wait_for_disconnect(raw: Request) -> None:
    while True:
        msg = await raw.receive()
        if msg["type"] == "http.disconnect":
            return


async def _run_until_disconnect(raw: Request, coro) -> Any:
    """Await ``coro`` unless the client disconnects first; then cancel it
    (which aborts its engine requests) and raise :class:`ClientDisconnected`."""
    work = asyncio.create_task(coro)
    watch = asyncio.create_task(_wait_for_disconnect(raw))
    try:
        done, _ = await asyncio.wait({work, watch}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        work.cancel()
        watch.cancel()
        raise
    if work in done:
        watch.cancel()
        return work.result()
    work.cancel()
    with contextlib.suppress(BaseException):
        await work
    raise ClientDisconnected()
