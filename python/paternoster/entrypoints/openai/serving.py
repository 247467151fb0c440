"""Request handling behind /v1/completions and /v1/chat/completions.

Turns an OpenAI request into token ids and :class:`SamplingParams`, fans it
out into engine requests (``n`` per prompt), runs them through the
:class:`EngineClient`, and formats either one response or an SSE stream.
Everything that can be checked before the engine sees a request is checked
here and reported as HTTP 400 with the parameter at fault.
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
from typing import Any

from fastapi import Request
from fastapi.responses import StreamingResponse

from paternoster.entrypoints.engine_client import (
    EngineClient,
    EngineDeadError,
    RequestRejectedError,
)
from paternoster.entrypoints.openai.errors import APIError, bad_request, error_body
from paternoster.entrypoints.openai.protocol import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    CompletionChoice,
    CompletionRequest,
    CompletionResponse,
    CompletionStreamResponse,
    DeltaMessage,
    UsageInfo,
)
from paternoster.metrics import RequestMetrics
from paternoster.outputs import ChoiceDelta, SequenceState, fan_out
from paternoster.sampling_params import SamplingParams

logger = logging.getLogger("paternoster.server")

_DONE = object()
_PARAM_RE = re.compile(r"^(\w+) must")


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
    ):
        self.client = client
        self.metrics = metrics
        self.prompts = prompts
        self.jobs = []
        for p, ids in enumerate(prompts):
            first = p * params.n
            for index, req in fan_out(request_id, ids, params, first, max_model_len, priority):
                self.jobs.append((req, SequenceState(index, tokenizer, ids, req.sampling_params)))

    @property
    def states(self) -> list[SequenceState]:
        """Per-choice states, ordered by choice index."""
        return [s for _, s in self.jobs]

    def usage(self) -> UsageInfo:
        """Exact token counts: each prompt once, every generated token delivered."""
        prompt = sum(len(p) for p in self.prompts)
        completion = sum(len(s.token_ids) for s in self.states)
        return UsageInfo(
            prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion
        )

    async def deltas(self) -> AsyncIterator[ChoiceDelta]:
        """Run every choice concurrently and yield their deltas as they come.

        Closing this iterator aborts the engine requests still running.

        Raises:
            EngineDeadError, RequestRejectedError: from the engine client.
        """
        queue: asyncio.Queue = asyncio.Queue()

        async def run(req, state: SequenceState) -> None:
            tracker = self.metrics.track(len(req.prompt_token_ids)) if self.metrics else None
            reason = "abort"  # unless it ends below: cancelled (client gone)
            try:
                async with contextlib.aclosing(self.client.generate(req)) as outputs:
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
                t.cancel()


class OpenAIServing:
    """The OpenAI endpoints' logic over one engine.

    Args:
        client: a started :class:`EngineClient`.
        tokenizer: the model's Hugging Face tokenizer.
        served_model_name: the only accepted ``model`` value.
        metrics: request metrics to record into (``None``: none).
    """

    def __init__(
        self,
        client: EngineClient,
        tokenizer: Any,
        served_model_name: str,
        metrics: RequestMetrics | None = None,
    ):
        self.client = client
        self.metrics = metrics
        self.tokenizer = tokenizer
        self.model_name = served_model_name
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
        """
        self._check_model(body.model)
        prompts = self._completion_prompts(body.prompt)
        max_tokens = body.max_tokens
        room = self.max_model_len - max(map(len, prompts))
        if max_tokens is None and room >= 1:  # else the prompt alone is too long: say so
            max_tokens = min(COMPLETIONS_DEFAULT_MAX_TOKENS, room)
        gen, request_id, created, include_usage = self._start(body, prompts, max_tokens, "cmpl")
        if body.stream:
            return _sse(self._completion_stream(gen, request_id, created, include_usage))
        await _run_until_disconnect(raw, _consume(gen))
        choices = [
            CompletionChoice(index=s.index, text=s.text, finish_reason=s.finish_reason)
            for s in gen.states
        ]
        return CompletionResponse(
            id=request_id, created=created, model=self.model_name, choices=choices,
            usage=gen.usage(),
        )  # fmt: skip

    async def create_chat_completion(self, body: ChatCompletionRequest, raw: Request):
        """Handle POST /v1/chat/completions (the model's chat template, with
        the generation prompt).

        Returns:
            A JSON response or an SSE ``StreamingResponse``.
        Raises:
            APIError: 400 bad input, 404 unknown model, 503 engine dead.
        """
        self._check_model(body.model)
        prompts = [self._chat_prompt(body)]
        max_tokens = body.max_tokens
        if body.max_completion_tokens is not None:
            max_tokens = body.max_completion_tokens
        gen, request_id, created, include_usage = self._start(
            body, prompts, max_tokens, "chatcmpl"
        )
        if body.stream:
            return _sse(self._chat_stream(gen, request_id, created, include_usage))
        await _run_until_disconnect(raw, _consume(gen))
        choices = [
            ChatChoice(
                index=s.index,
                message=AssistantMessage(content=s.text),
                finish_reason=s.finish_reason,
            )
            for s in gen.states
        ]
        return ChatCompletionResponse(
            id=request_id, created=created, model=self.model_name, choices=choices,
            usage=gen.usage(),
        )  # fmt: skip

    # --------------------------------------------------------------- inputs

    def _check_model(self, model: str | None) -> None:
        if model is not None and model != self.model_name:
            raise APIError(404, f"The model `{model}` does not exist.", "model")
        if not self.client.is_alive:
            raise APIError(503, f"engine is not running: {self.client.dead_reason}")

    def _start(
        self, body: Any, prompts: list[list[int]], max_tokens: int | None, prefix: str
    ) -> tuple[Generation, str, int, bool]:
        """Validate sampling, then set up the generation of one HTTP request.

        Returns:
            ``(generation, request_id, created unix seconds, include_usage)``.
        Raises:
            APIError: 400 for bad sampling parameters.
        """
        params = self._sampling_params(body, max_tokens, prompts)
        request_id = f"{prefix}-{uuid.uuid4().hex}"
        gen = Generation(
            self.client, self.tokenizer, request_id, prompts, params, self.max_model_len,
            body.priority, self.metrics,
        )  # fmt: skip
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return gen, request_id, int(time.time()), include_usage

    def _completion_prompts(self, prompt: Any) -> list[list[int]]:
        if isinstance(prompt, str):
            prompt = [prompt]
        if not prompt:
            raise bad_request("prompt must not be empty", "prompt")
        if all(isinstance(t, int) for t in prompt):
            prompt = [prompt]
        out = []
        for p in prompt:
            if isinstance(p, str):
                _check_text(p, "prompt")
            ids = self.tokenizer(p).input_ids if isinstance(p, str) else list(p)
            if not ids:
                raise bad_request("prompt must not be empty", "prompt")
            bad = [t for t in ids if not 0 <= t < self.vocab_size]
            if bad:
                raise bad_request(
                    f"prompt token id {bad[0]} is out of range [0, {self.vocab_size})", "prompt"
                )
            out.append(ids)
        return out

    def _chat_prompt(self, body: ChatCompletionRequest) -> list[int]:
        if not body.messages:
            raise bad_request("messages must not be empty", "messages")
        messages = []
        for m in body.messages:
            content = m.content
            if isinstance(content, list):
                if any(p.type != "text" for p in content):
                    raise bad_request("only text content parts are supported", "messages")
                content = "".join(p.text or "" for p in content)
            _check_text(m.role, "messages")
            _check_text(content or "", "messages")
            messages.append({"role": m.role, "content": content or ""})
        try:
            text = self.tokenizer.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=True
            )
        except Exception as e:  # a template may raise on roles it does not know
            raise bad_request(f"cannot apply the chat template: {e}", "messages") from e
        # The template already holds any BOS; don't add special tokens twice.
        return self.tokenizer(text, add_special_tokens=False).input_ids

    def _sampling_params(
        self, body: Any, max_tokens: int | None, prompts: list[list[int]]
    ) -> SamplingParams:
        longest = max(len(p) for p in prompts)
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
            )
        except ValueError as e:
            m = _PARAM_RE.match(str(e))
            raise bad_request(str(e), m.group(1) if m else None) from e
        if any(not 0 <= t < self.vocab_size for t in params.stop_token_ids):
            raise bad_request(f"stop_token_ids must be in [0, {self.vocab_size})", "stop_token_ids")
        limit = self.max_model_len
        if params.max_tokens is None:
            if longest >= limit:
                raise bad_request(
                    f"This model's maximum context length is {limit} tokens, but the prompt "
                    f"has {longest} tokens, leaving no room for the completion. "
                    "Please reduce the length of the prompt.",
                    "prompt",
                )
            # fan_out gives each prompt the rest of the context.
        elif longest + params.max_tokens > limit:
            raise bad_request(
                f"This model's maximum context length is {limit} tokens. However, you "
                f"requested {longest + params.max_tokens} tokens ({longest} in the prompt, "
                f"{params.max_tokens} for the completion). Please reduce the length of the "
                "prompt or max_tokens.",
                "max_tokens",
            )
        return params

    # -------------------------------------------------------------- streams

    def _chunk_encoder(
        self, model_cls: type, request_id: str, created: int, include_usage: bool
    ) -> Callable[..., str]:
        """A function ``(choices, usage=None) -> SSE event`` for one stream of
        ``model_cls`` chunks (``usage`` is left out unless ``include_usage``)."""

        def chunk(choices: list, usage: UsageInfo | None = None) -> str:
            c = model_cls(
                id=request_id, created=created, model=self.model_name, choices=choices, usage=usage
            )
            data = c.model_dump()
            if not include_usage:
                data.pop("usage")
            return _event(json.dumps(data, ensure_ascii=False))

        return chunk

    async def _completion_stream(
        self, gen: Generation, request_id: str, created: int, include_usage: bool
    ) -> AsyncIterator[str]:
        chunk = self._chunk_encoder(CompletionStreamResponse, request_id, created, include_usage)
        async with contextlib.aclosing(gen.deltas()) as deltas:
            try:
                async for d in deltas:
                    if d.text or d.finish_reason:
                        choice = CompletionChoice(
                            index=d.index, text=d.text, finish_reason=d.finish_reason
                        )
                        yield chunk([choice])
            except (EngineDeadError, RequestRejectedError) as e:
                yield _error_event(e)
                yield _event("[DONE]")
                return
        if include_usage:
            yield chunk([], gen.usage())
        yield _event("[DONE]")

    async def _chat_stream(
        self, gen: Generation, request_id: str, created: int, include_usage: bool
    ) -> AsyncIterator[str]:
        chunk = self._chunk_encoder(ChatCompletionChunk, request_id, created, include_usage)
        for s in gen.states:
            role = DeltaMessage(role="assistant", content="")
            yield chunk([ChatChunkChoice(index=s.index, delta=role)])
        async with contextlib.aclosing(gen.deltas()) as deltas:
            try:
                async for d in deltas:
                    if d.text or d.finish_reason:
                        delta = DeltaMessage(content=d.text) if d.text else DeltaMessage()
                        choice = ChatChunkChoice(
                            index=d.index, delta=delta, finish_reason=d.finish_reason
                        )
                        yield chunk([choice])
            except (EngineDeadError, RequestRejectedError) as e:
                yield _error_event(e)
                yield _event("[DONE]")
                return
        if include_usage:
            yield chunk([], gen.usage())
        yield _event("[DONE]")


# ------------------------------------------------------------------ helpers


def _event(data: str) -> str:
    return f"data: {data}\n\n"


def _error_event(e: Exception) -> str:
    status = 400 if isinstance(e, RequestRejectedError) else 503
    message = str(e) if status == 400 else f"engine is not running: {e}"
    return _event(json.dumps(error_body(status, message)))


def _sse(events: AsyncIterator[str]) -> StreamingResponse:
    return StreamingResponse(
        events,
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


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
