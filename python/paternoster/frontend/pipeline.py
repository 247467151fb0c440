"""The request pipeline: from "a prompt and parameters" to a running
:class:`Generation`.

Every protocol maps its wire format onto :meth:`Frontend.submit` and maps the
generation's deltas back; none of them tokenizes, validates, admits or fans
out a request itself. The steps, in order: tokenize the prompts (or render the
chat) on the tokenizer thread, off the event loop; validate every field
against the model's limits (:class:`InputProcessor`); admit the request into
the waiting queue (reserving its room, or :class:`EngineOverloadedError`);
fan out its ``n`` choices. Detokenization and stop strings run as the deltas
come (:mod:`paternoster.frontend.output_processor`); request metrics are
recorded once per API request.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from paternoster.frontend.data_parallel import DataParallelClient
from paternoster.frontend.engine_client import EngineClient
from paternoster.frontend.errors import EngineDeadError, InvalidRequestError
from paternoster.frontend.generation import Generation
from paternoster.frontend.processor import (
    DEFAULT_MAX_STOP,
    ChatInput,
    InputProcessor,
    check_text,
    wire_tenant,
)
from paternoster.metrics.requests import RequestMetrics
from paternoster.request import check_slo_target
from paternoster.sampling_params import MAX_N
from paternoster.structured_outputs import GATE_KEY, check_spec

Prompt = str | Sequence[int]
"""A prompt: text, or token ids."""


@dataclass(frozen=True)
class RequestOptions:
    """How an API request is scheduled and identified.

    Attributes:
        request_id_prefix: the request id is ``f"{prefix}-{uuid}"``.
        priority: lower runs first (``priority`` scheduler; ignored by others).
        cache_salt: prefix-cache isolation (vLLM's ``cache_salt``): blocks are
            shared only between requests with the same salt.
        default_max_tokens: ``max_tokens`` when the request gives none,
            capped by the room the prompt leaves (``None``: all that room).
        add_special_tokens: tokenize text prompts with BOS etc.
        prompt_param: the field errors about the prompt name (``messages``
            for chat).
        constraint_param: the field errors about the structured-output
            constraint name (``response_format`` when it came from there).
        reasoning_gate: for a chat request with a structured-output
            constraint, a function of the rendered prompt giving the
            constraint's ``reasoning`` entry (the grammar then waits for the
            reasoning to end), or ``None``.
        tenant: who the request is served for (``fair`` scheduler; ``None``
            or ``""``: the anonymous tenant).
        tenant_param: the field errors about the tenant name (``user``, the
            ``X-Tenant-Id`` header, ``tenant``).
        slo_ttft_s: time-to-first-token target, seconds (``slo`` scheduler;
            ``None``: the policy's default).
        slo_itl_s: inter-token latency target, seconds (likewise).
    """

    request_id_prefix: str = "req"
    priority: int = 0
    cache_salt: str | None = None
    default_max_tokens: int | None = None
    add_special_tokens: bool = True
    prompt_param: str = "prompt"
    constraint_param: str = "structured_outputs"
    reasoning_gate: Callable[[str], dict[str, Any] | None] | None = None
    tenant: str | None = None
    tenant_param: str = "tenant"
    slo_ttft_s: float | None = None
    slo_itl_s: float | None = None


@dataclass
class Submitted:
    """A request the pipeline accepted.

    Attributes:
        generation: the running choices (iterate :meth:`Generation.deltas`,
            or :meth:`Generation.release` if it is never run).
        prompt_texts: each prompt's text when it was given as text, else ``None``.
        created: ``time.time()`` seconds of acceptance (whole seconds).
    """

    generation: Generation
    prompt_texts: list[str | None]
    created: int


class Frontend:
    """The one request pipeline over one engine client (of one engine, or of
    several data-parallel ones).

    Args:
        client: a started :class:`EngineClient` or :class:`DataParallelClient`
            (its ``info`` gives the vocabulary size and the context limit).
        tokenizer: the model's Hugging Face tokenizer.
        model_name: the served model's name.
        metrics: request metrics to record into (``None``: none).
        chat_template: a Jinja chat template replacing the model's own.
        max_n: the largest ``n``.
        max_stop: the most stop strings per request.
    """

    def __init__(self, client: EngineClient | DataParallelClient, tokenizer: Any, model_name: str,
                 metrics: RequestMetrics | None = None, chat_template: str | None = None,
                 max_n: int = MAX_N, max_stop: int = DEFAULT_MAX_STOP):  # fmt: skip
        self.client = client
        self.tokenizer = tokenizer
        self.model_name = model_name
        self.metrics = metrics
        info = client.info
        vocab_size = int(info.get("vocab_size") or len(tokenizer))
        # A sequence must fit in the model's context and in the whole KV cache.
        max_model_len = int(info["max_model_len"])
        blocks, block_size = info.get("num_kv_blocks"), info.get("block_size")
        if blocks and block_size:
            max_model_len = min(max_model_len, int(blocks) * int(block_size))
        self.processor = InputProcessor(tokenizer, vocab_size, max_model_len, chat_template,
                                        max_n, max_stop)  # fmt: skip
        # Tokenizing a long prompt must not stall other streams: one worker
        # thread (HF fast tokenizers are not safe to call from several at once).
        self._tokenize_pool = ThreadPoolExecutor(1, thread_name_prefix="tokenize")

    @property
    def max_model_len(self) -> int:
        """The longest sequence (prompt plus completion) in tokens."""
        return self.processor.max_model_len

    @property
    def vocab_size(self) -> int:
        """Token ids lie in ``[0, vocab_size)``."""
        return self.processor.vocab_size

    async def run_tokenizer(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run ``fn(*args)`` (tokenization, chat templates) on the tokenizer
        thread, off the event loop; its exceptions propagate."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._tokenize_pool, fn, *args)

    def check_ready(self) -> None:
        """Refuse work while the engine cannot take it.

        Raises:
            EngineDeadError: the engine is dead, stalled, restarting, or the
                server is shutting down (the message says which).
        """
        reason = self.client.unavailable_reason
        if reason is not None:
            raise EngineDeadError(reason)

    async def submit(self, prompts: Sequence[Prompt] | ChatInput, sampling: Mapping[str, Any],
                     options: RequestOptions) -> Submitted:  # fmt: skip
        """Tokenize, validate and admit one API request, and set up its choices.

        Args:
            prompts: one or more prompts, or chat messages.
            sampling: :class:`SamplingParams` fields by name (absent: default).
            options: scheduling and identity.
        Returns:
            The accepted request; its waiting-queue room is reserved until
            its choices are sent (the generation holds the reservation).
        Raises:
            InvalidRequestError: a bad prompt or field (naming it; an SLO
                target that is not a finite number > 0 names ``slo_ttft_s`` or
                ``slo_itl_s``).
            EngineDeadError: the engine cannot take work.
            EngineOverloadedError: the waiting queue is full (nothing reserved).
        """
        self.check_ready()
        salt = options.cache_salt
        if salt is not None:
            if not salt:
                raise InvalidRequestError("cache_salt must be a non-empty string", "cache_salt")
            check_text(salt, "cache_salt")
        tenant = wire_tenant(options.tenant, options.tenant_param)
        for name in ("slo_ttft_s", "slo_itl_s"):
            try:
                check_slo_target(getattr(options, name), name)
            except ValueError as e:
                raise InvalidRequestError(str(e), name) from None
        ids, texts = await self.run_tokenizer(self._tokenize, prompts, options)
        spec = sampling.get("structured_outputs")
        if options.reasoning_gate is not None and spec is not None and texts[0] is not None:
            gate = options.reasoning_gate(texts[0])
            if gate is not None:
                sampling = {**sampling, "structured_outputs": {**spec, GATE_KEY: gate}}
        params = self.processor.sampling_params(
            sampling, [len(p) for p in ids], options.default_max_tokens, options.prompt_param
        )
        if params.structured_outputs is not None:
            try:  # xgrammar's parse can take seconds for a deep schema: not on the loop
                await self.run_tokenizer(check_spec, params.structured_outputs)
            except ValueError as e:
                raise InvalidRequestError(str(e), options.constraint_param) from e
        reservation = self.client.check_capacity(len(ids) * params.n,
                                                 sum(map(len, ids)) * params.n)  # fmt: skip
        try:
            gen = Generation(
                self.client, self.tokenizer, f"{options.request_id_prefix}-{uuid.uuid4().hex}",
                ids, params, options.priority, options.cache_salt, time.time(), self.metrics,
                reservation, tenant, (options.slo_ttft_s, options.slo_itl_s),
            )  # fmt: skip
        except BaseException:
            reservation.release()
            raise
        return Submitted(gen, texts, int(time.time()))

    def _tokenize(self, prompts: Sequence[Prompt] | ChatInput,
                  options: RequestOptions) -> tuple[list[list[int]], list[str | None]]:  # fmt: skip
        """Token ids of each prompt, and its text when it was text (tokenizer thread)."""
        if isinstance(prompts, ChatInput):
            text, ids = self.processor.chat(prompts)
            return [ids], [text]
        param = options.prompt_param
        if not prompts:
            raise InvalidRequestError(f"{param} must not be empty", param)
        ids = [self.processor.prompt(p, options.add_special_tokens, param) for p in prompts]
        return ids, [p if isinstance(p, str) else None for p in prompts]
