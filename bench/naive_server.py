"""Naive baseline server: one request at a time through HF ``generate``, OpenAI API.

Not the product: the yardstick ``paternoster bench capacity`` measures
Paternoster against. It serves ``GET /v1/models``, ``GET /health``,
``POST /v1/completions`` and ``POST /v1/chat/completions`` (streaming SSE with
``stream_options.include_usage``, or one JSON response) with the same request
and response shapes as ``paternoster serve`` (its pydantic models), but every
request runs alone, in arrival order, on one worker thread: HF transformers
``model.generate`` with its own KV cache, no batching. Supported fields:
``max_tokens`` / ``max_completion_tokens``, ``temperature`` (0 = greedy),
``top_p``, ``top_k``, ``min_p``, ``seed``, ``stop``, ``stop_token_ids``,
``ignore_eos`` (vLLM's extra field); one prompt and ``n=1`` only; any
``model`` value is accepted. Usage::

    .venv/bin/python -m paternoster.bench.naive_server [MODEL_DIR] --port 8001

(default model when ``MODEL_DIR`` is omitted; torch threads default to 1).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers.generation.streamers import BaseStreamer

from paternoster.entrypoints.openai.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    ModelCard,
    ModelList,
)
from paternoster.entrypoints.openai.protocol_outputs import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionResponse,
    CompletionChoice,
    CompletionResponse,
    CompletionStreamResponse,
    DeltaMessage,
    UsageInfo,
)
from paternoster.frontend.detokenizer import IncrementalDetokenizer, StopStringMatcher

COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # as OpenAI, vLLM and `paternoster serve`


class BadRequest(ValueError):
    """A request the server refuses with HTTP 400 (``param`` names the field)."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


@dataclass
class Job:
    """One request for the worker thread.

    Attributes:
        prompt: prompt token ids.
        max_tokens: tokens to generate at most.
        temperature: 0 = greedy.
        top_p, top_k, min_p: sampling filters (1.0 / 0 / 0.0 = off).
        seed: seeds torch's global generator for this request (``None``: not seeded).
        stop: stop strings (cut from the text).
        stop_token_ids: extra tokens that end generation (kept in the count).
        ignore_eos: keep generating past EOS.
        emit: called from the worker thread with each text delta ``(text,
            None)``, then once with ``("", finish_reason)``, or with an exception.
        cancelled: set when the client went away; the job stops at the next token.
        num_tokens: tokens generated so far.
    """

    prompt: list[int]
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    emit: Callable[[Any], None] = field(default=lambda item: None)
    cancelled: threading.Event = field(default_factory=threading.Event)
    num_tokens: int = 0


class _JobStreamer(BaseStreamer):
    """Receives each generated token from ``generate``; detokenizes, matches stops."""

    def __init__(self, job: Job, tokenizer: Any, end_ids: set[int]):
        self.job = job
        self.end_ids = end_ids
        self.detok = IncrementalDetokenizer(tokenizer, job.prompt)
        self.stops = StopStringMatcher(job.stop)
        self.finish_reason: str | None = None
        self._prompt_seen = False

    def put(self, value: torch.Tensor) -> None:
        if not self._prompt_seen:  # generate() first hands over the prompt
            self._prompt_seen = True
            return
        if self.finish_reason is not None:
            return
        token = int(value.reshape(-1)[0])
        self.job.num_tokens += 1
        text, matched = self.stops.feed(self.detok.add([token]))
        if matched is None and token in self.end_ids:
            text += self._flush()
        if text:
            self.job.emit((text, None))
        if matched is not None or token in self.end_ids:
            self.finish_reason = "stop"  # the stopping criterion ends generate() here

    def end(self) -> None:
        if self.finish_reason is None:
            text = self._flush()
            if text:
                self.job.emit((text, None))
            if self.stops.matched:
                self.finish_reason = "stop"
            elif self.job.num_tokens < self.job.max_tokens:
                self.finish_reason = "abort"  # the client left
            else:
                self.finish_reason = "length"

    def _flush(self) -> str:
        """The text held back by the detokenizer and the stop matcher, at the end."""
        text, matched = self.stops.feed(self.detok.flush())
        return text if matched else text + self.stops.flush()

    def halted(self) -> bool:
        """Whether generation should stop now (finished, or the client left)."""
        return self.finish_reason is not None or self.job.cancelled.is_set()


class _Halt:
    """A stopping criterion: true once ``halted()`` is."""

    def __init__(self, halted: Callable[[], bool]):
        self.halted = halted

    def __call__(self, input_ids: torch.Tensor, scores: Any, **kwargs: Any) -> torch.Tensor:
        return torch.full((input_ids.shape[0],), self.halted(), dtype=torch.bool)


class NaiveGenerator:
    """An HF model and tokenizer that run :class:`Job` s one at a time, in order.

    Args:
        model_dir: HF model directory.
        dtype: ``"auto"`` (the checkpoint's), ``"bfloat16"`` or ``"float32"``.
        threads: torch threads (process-wide).
    Raises:
        OSError, ValueError: the model or tokenizer cannot be loaded.
    """

    def __init__(self, model_dir: str | Path, dtype: str = "auto", threads: int = 1):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        torch.set_num_threads(threads)
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        torch_dtype = dtype if dtype == "auto" else getattr(torch, dtype)
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch_dtype).eval()
        cfg = self.model.config
        self.max_model_len = int(getattr(cfg, "max_position_embeddings", 2048))
        self.vocab_size = int(cfg.vocab_size)
        eos = self.model.generation_config.eos_token_id
        eos = cfg.eos_token_id if eos is None else eos
        self.eos_token_ids = {eos} if isinstance(eos, int) else set(eos or [])
        pad = self.model.generation_config.pad_token_id
        self.pad_token_id = pad if pad is not None else min(self.eos_token_ids, default=0)
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="naive-generate")

    def submit(self, job: Job) -> None:
        """Queue ``job`` behind every earlier one (FIFO, one worker thread)."""
        self._worker.submit(self._run, job)

    def _run(self, job: Job) -> None:
        try:
            if job.cancelled.is_set():  # the client left while the job waited
                job.emit(("", "abort"))
                return
            end_ids = set(job.stop_token_ids) | (set() if job.ignore_eos else self.eos_token_ids)
            streamer = _JobStreamer(job, self.tokenizer, end_ids)
            kwargs: dict[str, Any] = {"do_sample": job.temperature > 0}
            if job.temperature > 0:
                kwargs.update(temperature=job.temperature, top_p=job.top_p, top_k=job.top_k)
                if job.min_p > 0:
                    kwargs["min_p"] = job.min_p
                if job.seed is not None:
                    torch.manual_seed(job.seed)
            ids = torch.tensor([job.prompt])
            with torch.inference_mode():
                self.model.generate(
                    ids,
                    attention_mask=torch.ones_like(ids),
                    max_new_tokens=job.max_tokens,
                    eos_token_id=sorted(end_ids) or None,
                    pad_token_id=self.pad_token_id,
                    streamer=streamer,
                    stopping_criteria=[_Halt(streamer.halted)],
                    **kwargs,
                )
            job.emit(("", streamer.finish_reason or "abort"))
        except Exception as e:  # reported to the client
            job.emit(e)

    # ---------------------------------------------------------------- requests

    def prompt_ids(self, body: CompletionRequest | ChatCompletionRequest) -> list[int]:
        """The request's one prompt as token ids (chat: through the chat template).

        Raises:
            BadRequest: several prompts, an empty prompt, or an id out of the vocabulary.
        """
        if isinstance(body, ChatCompletionRequest):
            messages = [
                {"role": m.role, "content": m.content if isinstance(m.content, str)
                 else "".join(p.text or "" for p in m.content or [])}
                for m in body.messages
            ]  # fmt: skip
            if not messages:
                raise BadRequest("messages must not be empty", "messages")
            text = self.tokenizer.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=True
            )
            return self.tokenizer(text, add_special_tokens=False).input_ids
        prompt = body.prompt
        if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int):
            if len(prompt) != 1:
                raise BadRequest("the naive server takes one prompt per request", "prompt")
            prompt = prompt[0]
        ids = self.tokenizer(prompt).input_ids if isinstance(prompt, str) else list(prompt)
        if not ids:
            raise BadRequest("prompt must not be empty", "prompt")
        if any(not 0 <= t < self.vocab_size for t in ids):
            raise BadRequest(f"prompt token ids must be in [0, {self.vocab_size})", "prompt")
        return ids

    def make_job(self, body: CompletionRequest | ChatCompletionRequest) -> Job:
        """Check the request and turn it into a :class:`Job` (``emit`` still unset).

        Raises:
            BadRequest: ``n != 1``, a negative temperature, ``max_tokens < 1``, or
                prompt + ``max_tokens`` longer than the model's context.
        """
        if body.n != 1:
            raise BadRequest("the naive server takes n=1 only", "n")
        prompt = self.prompt_ids(body)
        max_tokens = body.max_tokens
        if isinstance(body, ChatCompletionRequest):
            if body.max_completion_tokens is not None:
                max_tokens = body.max_completion_tokens
            if max_tokens is None:
                max_tokens = self.max_model_len - len(prompt)
        elif max_tokens is None:
            max_tokens = COMPLETIONS_DEFAULT_MAX_TOKENS
        if max_tokens < 1:
            raise BadRequest("max_tokens must be >= 1", "max_tokens")
        if len(prompt) + max_tokens > self.max_model_len:
            raise BadRequest(
                f"prompt ({len(prompt)} tokens) + max_tokens ({max_tokens}) exceeds the "
                f"model's context ({self.max_model_len})",
                "max_tokens",
            )
        temperature = 1.0 if body.temperature is None else body.temperature
        if temperature < 0:
            raise BadRequest("temperature must be >= 0", "temperature")
        stop = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
        return Job(
            prompt=prompt,
            max_tokens=max_tokens,
            temperature=temperature,
            top_p=1.0 if body.top_p is None else body.top_p,
            top_k=body.top_k if body.top_k and body.top_k > 0 else 0,
            min_p=body.min_p or 0.0,
            seed=body.seed,
            stop=[s for s in stop if s],
            stop_token_ids=list(body.stop_token_ids or []),
            ignore_eos=body.ignore_eos,
        )

    async def run(self, job: Job) -> AsyncIterator[tuple[str, str | None]]:
        """Queue ``job`` and yield its ``(text_delta, finish_reason)`` pairs as they come.

        The last pair has a finish reason (``stop``, ``length``; ``abort`` if
        cancelled). Closing the iterator early cancels the job.

        Raises:
            Exception: whatever ``generate`` raised.
        """
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()
        job.emit = lambda item: loop.call_soon_threadsafe(queue.put_nowait, item)
        self.submit(job)
        try:
            while True:
                item = await queue.get()
                if isinstance(item, Exception):
                    raise item
                yield item
                if item[1] is not None:
                    return
        finally:
            job.cancelled.set()


# --------------------------------------------------------------------- the app


def _event(data: Any) -> str:
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n"


def build_app(gen: NaiveGenerator, model_name: str):
    """The FastAPI app over ``gen``.

    Returns:
        A FastAPI app (serve it with uvicorn). Errors are OpenAI-shaped
        (400 for bad requests, 500 if ``generate`` fails).
    """
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse, StreamingResponse

    from paternoster.entrypoints.openai.errors import error_response

    app = FastAPI(title="naive baseline (HF generate, one request at a time)")

    @app.exception_handler(BadRequest)
    async def _bad(_: Request, exc: BadRequest) -> JSONResponse:
        return error_response(400, str(exc), exc.param)

    @app.get("/health")
    async def health() -> JSONResponse:
        return JSONResponse({"status": "ok"})

    @app.get("/v1/models")
    async def models() -> ModelList:
        card = ModelCard(id=model_name, owned_by="naive-baseline", max_model_len=gen.max_model_len)
        return ModelList(data=[card])

    async def respond(body: CompletionRequest | ChatCompletionRequest, chat: bool):
        job = gen.make_job(body)
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        created = int(time.time())

        def usage() -> UsageInfo:
            n, p = job.num_tokens, len(job.prompt)
            return UsageInfo(prompt_tokens=p, completion_tokens=n, total_tokens=p + n)

        if not body.stream:
            parts, reason = [], None
            async with contextlib.aclosing(gen.run(job)) as deltas:
                async for text, finish in deltas:
                    parts.append(text)
                    reason = finish
            text = "".join(parts)
            if chat:
                choice = ChatChoice(index=0, message=AssistantMessage(content=text),
                                    finish_reason=reason)  # fmt: skip
                return ChatCompletionResponse(id=rid, created=created, model=model_name,
                                              choices=[choice], usage=usage())  # fmt: skip
            choice = CompletionChoice(index=0, text=text, finish_reason=reason)
            return CompletionResponse(id=rid, created=created, model=model_name,
                                      choices=[choice], usage=usage())  # fmt: skip

        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        cls = ChatCompletionChunk if chat else CompletionStreamResponse

        def chunk(choices: list, final_usage: UsageInfo | None = None) -> str:
            data = cls(id=rid, created=created, model=model_name, choices=choices,
                       usage=final_usage).model_dump()  # fmt: skip
            if not include_usage:
                data.pop("usage")
            return _event(data)

        async def events() -> AsyncIterator[str]:
            if chat:
                role = DeltaMessage(role="assistant", content="")
                yield chunk([ChatChunkChoice(index=0, delta=role)])
            async with contextlib.aclosing(gen.run(job)) as deltas:
                async for text, reason in deltas:
                    if chat:
                        delta = DeltaMessage(content=text) if text else DeltaMessage()
                        yield chunk([ChatChunkChoice(index=0, delta=delta, finish_reason=reason)])
                    else:
                        yield chunk([CompletionChoice(index=0, text=text, finish_reason=reason)])
            if include_usage:
                yield chunk([], usage())
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"})  # fmt: skip

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest):
        return await respond(body, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest):
        return await respond(body, chat=True)

    return app


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", nargs="?", default=None, help="HF model dir (default: SmolLM2)")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8001)
    ap.add_argument("--dtype", default="auto", choices=["auto", "bfloat16", "float32"])
    ap.add_argument("--threads", type=int, default=1, help="torch threads")
    ap.add_argument("--served-model-name", default=None, help="id in /v1/models")
    ap.add_argument("--log-level", default="warning")
    args = ap.parse_args(argv)

    import uvicorn

    from paternoster.entrypoints.engine_args import resolve_model_dir

    model_dir = resolve_model_dir(args.model)
    gen = NaiveGenerator(model_dir, args.dtype, args.threads)
    name = args.served_model_name or str(model_dir).rstrip("/").split("/")[-1]
    uvicorn.run(build_app(gen, name), host=args.host, port=args.port, log_level=args.log_level)


if __name__ == "__main__":
    main()
