"""The offline API: ``LLM(...).generate(prompts, SamplingParams(...))``.

Runs the EngineCore in this process (no ZeroMQ). All prompts are added before
the first step, so they are batched continuously; outputs go through the same
detokenizer and stop-string handling as the HTTP server. With
``data_parallel_size=N`` > 1 the engines run in N worker processes instead
(:mod:`paternoster.entrypoints.llm_dp`), each an ``LLM`` of its own.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from paternoster.entrypoints.engine_args import build_engine_config, resolve_model_dir
from paternoster.frontend import processor as checks
from paternoster.frontend.output_processor import SequenceState, fan_out
from paternoster.frontend.processor import InputProcessor
from paternoster.outputs import RequestOutput
from paternoster.sampling_params import SamplingParams

if TYPE_CHECKING:
    from paternoster.config import EngineConfig

logger = logging.getLogger("paternoster.llm")

#: One prompt ready for an engine: its token ids, its text (``None`` for ids),
#: its fitted :class:`SamplingParams`, its priority, its tenant and its
#: ``(slo_ttft_s, slo_itl_s)`` targets.
Prepared = tuple[list[int], str | None, SamplingParams, int, str | None,
                 tuple[float | None, float | None]]


class LLM:
    """An engine in this process (or N engines in worker processes) plus the
    model's tokenizer.

    Args:
        model: HF model directory or ``.gguf`` file (quantized weights kept
            quantized on CPU); ``None`` = the embedded default model.
        **engine_kwargs: the CLI's engine options by their flag names
            (``dtype``, ``max_model_len``, ``block_size``, ``num_kv_blocks``,
            ``kv_cache_memory``, ``max_num_seqs``, ``max_num_batched_tokens``,
            ``scheduler``, ``num_threads``, ``seed``, ``served_model_name``,
            ``device``, ``gpu_memory_utilization``, ``cuda_graphs``,
            ``batch_invariant``, ``load_format``, ``timeline_size``, ``timeline_sample_rate``,
            ``timeline_max_requests``, ``tensor_parallel_size``).
            ``num_threads`` defaults to every physical core available (see
            :mod:`paternoster.engine.cpu_threads`). ``tensor_parallel_size=N``
            > 1 splits the model over N ranks on CPU: this process is rank 0
            (scheduler, KV cache manager, sampling) and starts N-1 worker
            processes (:mod:`paternoster.engine.tensor_parallel`);
            ``num_threads`` is then per rank (auto: the cores split between
            the ranks; the workers are pinned, this process is not). Call
            :meth:`shutdown` to stop them (they also exit with this process).
        data_parallel_size: engines (an int >= 1). 1: one engine in this
            process. N > 1: N worker processes (``python -m``: a script needs
            no ``__main__`` guard), each an ordinary in-process engine with
            its own KV cache, pinned to cores of its own as ``paternoster
            serve --data-parallel-size N`` pins them (``num_threads`` is then
            per engine; auto splits the usable cores between them, none left
            aside). :meth:`generate` and :meth:`chat` send each engine its
            share of the prompts (sorted by token ids, so shared prefixes sit
            together, cut into N runs of equal prompt + ``max_tokens`` tokens;
            :func:`~paternoster.entrypoints.llm_dp.shard`) with their own
            sampling params and priorities, and return the outputs in the
            caller's order: greedy outputs equal N=1's. Not with
            ``tensor_parallel_size`` > 1. Call :meth:`shutdown` to stop the
            workers (they also exit with this process).
    Attributes:
        engine: the :class:`~paternoster.engine.core.EngineCore` (``step_log``,
            ``stats()``; ``info["num_threads"]`` and ``threads``: the thread
            count used); ``None`` with ``data_parallel_size`` > 1.
        workers: the :class:`~paternoster.entrypoints.llm_dp.DataParallelEngines`
            (``procs``, each engine's ``info``) with ``data_parallel_size``
            > 1; else ``None``.
        tokenizer: the Hugging Face tokenizer.
    Raises:
        ValueError: an option out of range (``data_parallel_size`` not an int
            >= 1, or > 1 with ``tensor_parallel_size`` > 1); errors of model
            loading; a model that tensor parallel does not split.
        RuntimeError: a tensor-parallel or data-parallel worker exited or did
            not start in time.
    """

    def __init__(self, model: str | None = None, data_parallel_size: int = 1,
                 **engine_kwargs: Any) -> None:  # fmt: skip
        if (isinstance(data_parallel_size, bool) or not isinstance(data_parallel_size, int)
                or data_parallel_size < 1):  # fmt: skip
            raise ValueError(f"data_parallel_size must be an integer >= 1, got "
                             f"{data_parallel_size!r}")  # fmt: skip
        config = build_engine_config(resolve_model_dir(model), **engine_kwargs)
        self._start(config, data_parallel_size)

    @classmethod
    def from_config(cls, config: EngineConfig) -> LLM:
        """One in-process engine from a built config (a data-parallel worker's
        engine: its ``num_threads`` and ``cpus`` already placed).

        Raises:
            ValueError, RuntimeError: as the constructor.
        """
        llm = cls.__new__(cls)
        llm._start(config, 1)
        return llm

    def _start(self, config: EngineConfig, data_parallel_size: int) -> None:
        from paternoster.model.loader import load_tokenizer

        self.tokenizer = load_tokenizer(config.model.model)
        self.engine = self.workers = None
        if data_parallel_size > 1:
            from paternoster.entrypoints.llm_dp import DataParallelEngines

            self.workers = DataParallelEngines(config, data_parallel_size)
            info = self.workers.info[0]
        else:
            from paternoster.engine.core import EngineCore

            self.engine = EngineCore(config)
            logger.info("%s", self.engine.threads.describe())
            info = self.engine.info
        # The engine's cap already counts what one request can hold in the KV
        # cache (with sliding-window groups, more than num_kv_blocks * block_size).
        self.max_model_len = int(info["max_model_len"])
        vocab = int(info.get("vocab_size") or len(self.tokenizer))
        self.processor = InputProcessor(self.tokenizer, vocab, self.max_model_len)
        self._ids = itertools.count()

    # ----------------------------------------------------------------- public

    def generate(
        self,
        prompts: str | Sequence[str] | Sequence[list[int]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = False,
        priority: int | Sequence[int] | None = None,
        tenant: str | Sequence[str | None] | None = None,
        slo_ttft_s: float | Sequence[float | None] | None = None,
        slo_itl_s: float | Sequence[float | None] | None = None,
    ) -> list[RequestOutput]:
        """Generate completions for every prompt, batched continuously.

        Args:
            prompts: a string, a list of strings, or a list of token-id lists
                (a flat list of ints is one tokenized prompt).
            sampling_params: one for all prompts, one per prompt, or ``None``
                (defaults: temperature 1, max_tokens 16).
            use_tqdm: show a progress bar over finished prompts.
            priority: scheduling priority, one for all prompts or one per
                prompt (lower runs first; used by the ``priority`` scheduler).
            tenant: who the prompts are served for, one name for all prompts
                or one per prompt (``None``: the anonymous tenant); the ``fair``
                scheduler shares the engine between tenants.
            slo_ttft_s: time-to-first-token target in seconds, one for all
                prompts or one per prompt (``None``: the policy's default; used
                by the ``slo`` scheduler).
            slo_itl_s: inter-token latency target in seconds, likewise.
        Returns:
            One :class:`RequestOutput` per prompt, in input order, each with
            ``n`` choices ordered by index.
        Raises:
            ValueError: mismatched lengths, an empty or too long tenant name
                (naming ``tenant``), an empty prompt, a token id outside
                the vocabulary, or a prompt plus ``max_tokens`` longer than
                ``max_model_len`` (an ``InvalidRequestError`` naming the field),
                an SLO target that is not a number > 0 (naming it),
                or a structured-output constraint that does not compile (the
                other prompts' requests are aborted).
        """
        token_prompts, texts = self._tokenize(prompts)
        slo = checks.slo_targets(slo_ttft_s, slo_itl_s, len(token_prompts))
        return self._run(token_prompts, texts, sampling_params, use_tqdm, priority, tenant, slo)

    def chat(
        self,
        messages: list[dict] | Sequence[list[dict]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = False,
        chat_template: str | None = None,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
    ) -> list[RequestOutput]:
        """Generate replies to one conversation or several, via the model's chat template.

        Args:
            messages: one conversation (a list of ``{"role", "content"}``
                maps) or a list of conversations.
            sampling_params: as in :meth:`generate`.
            use_tqdm: show a progress bar.
            chat_template: a Jinja template replacing the model's own.
            add_generation_prompt: end with the assistant turn's header.
            continue_final_message: continue the last (assistant) message
                instead (needs ``add_generation_prompt=False``).
        Returns:
            One :class:`RequestOutput` per conversation (``prompt`` is the
            templated text).
        Raises:
            ValueError: as in :meth:`generate`; ChatTemplateError: no template, or it failed.
        """
        from paternoster.frontend.chat import ChatTemplateError, has_chat_template, render_chat

        if not has_chat_template(self.tokenizer, chat_template):
            raise ChatTemplateError("this model has no chat template: pass chat_template= (a Jinja"
                                    " template) to LLM.chat, or use LLM.generate", "chat_template")
        convs = [messages] if messages and isinstance(messages[0], dict) else list(messages)
        texts, token_prompts = [], []
        for conv in convs:
            # The template holds any BOS already: no special tokens added twice.
            text, ids = render_chat(
                self.tokenizer, list(conv), chat_template=chat_template,
                add_generation_prompt=add_generation_prompt,
                continue_final_message=continue_final_message,
            )  # fmt: skip
            texts.append(text)
            token_prompts.append(ids)
        return self._run(token_prompts, texts, sampling_params, use_tqdm)

    def timeline(self, engine: int = 0) -> dict:
        """An engine's request timeline (needs ``LLM(..., timeline_size=N)``).

        Args:
            engine: which engine, ``0 .. data_parallel_size - 1`` (each has
                its own clock: ``time.monotonic()`` of its process).
        Returns:
            The snapshot: plain dicts and lists, times in ``time.monotonic()``
            seconds (schema in :mod:`paternoster.metrics.timeline`).
        Raises:
            RuntimeError: timelines are off (``timeline_size`` is 0, the
                default); a data-parallel worker is gone.
            ValueError: ``engine`` out of range.
        """
        if self.workers is not None:
            return self.workers.call(engine, "timeline", ())
        if engine != 0:
            raise ValueError(f"engine must be 0 with one engine, got {engine!r}")
        snapshot = self.engine.timeline_snapshot()
        if snapshot is None:
            raise RuntimeError("request timelines are off: create LLM(..., timeline_size=N)")
        return snapshot

    def save_timeline(
        self,
        trace_path: str | None = None,
        gantt_path: str | None = None,
        snapshot_path: str | None = None,
        gantt_x: str = "time",
        engine: int = 0,
    ) -> dict:
        """Write the request timeline as a Chrome/Perfetto trace, a Gantt PNG and/or
        the raw snapshot (JSON; ``paternoster trace --input`` converts it later).

        Args:
            trace_path: Chrome trace JSON to write (open in https://ui.perfetto.dev).
            gantt_path: Gantt chart PNG to write.
            snapshot_path: raw snapshot JSON to write.
            gantt_x: ``"time"`` or ``"step"`` on the Gantt x axis.
            engine: which engine's timeline (see :meth:`timeline`).
        Returns:
            The snapshot written.
        Raises:
            RuntimeError: timelines are off.
            ValueError: bad ``gantt_x`` or ``engine``.
            OSError: a file cannot be written.
        """
        import json
        from pathlib import Path

        from paternoster.metrics.chrome_trace import write_chrome_trace
        from paternoster.metrics.gantt import plot_timeline_gantt

        snapshot = self.timeline(engine)
        if trace_path is not None:
            write_chrome_trace(snapshot, trace_path)
        if gantt_path is not None:
            plot_timeline_gantt(snapshot, gantt_path, x=gantt_x)
        if snapshot_path is not None:
            Path(snapshot_path).write_text(json.dumps(snapshot) + "\n")
        return snapshot

    def shutdown(self) -> None:
        """Abort what is live and stop the engine's tensor-parallel workers
        (if any), leaving the gloo group: another ``LLM(...,
        tensor_parallel_size=N)`` can start in this process after it; or stop
        the data-parallel workers. Idempotent."""
        if self.workers is not None:
            self.workers.stop()
        else:
            self.engine.shutdown()

    # -------------------------------------------------------------- internals

    def _tokenize(self, prompts: Any) -> tuple[list[list[int]], list[str | None]]:
        if isinstance(prompts, str):
            prompts = [prompts]
        prompts = list(prompts)
        if prompts and all(isinstance(t, int) for t in prompts):
            prompts = [prompts]
        token_prompts, texts = [], []
        for p in prompts:
            if isinstance(p, str):
                token_prompts.append(self.tokenizer(p).input_ids)
                texts.append(p)
            else:
                token_prompts.append([int(t) for t in p])
                texts.append(None)
        return token_prompts, texts

    def _run(
        self,
        token_prompts: list[list[int]],
        texts: list[str | None],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None,
        use_tqdm: bool,
        priority: int | Sequence[int] | None = None,
        tenant: str | Sequence[str | None] | None = None,
        slo: Sequence[tuple[float | None, float | None]] | None = None,
    ) -> list[RequestOutput]:
        prepared = self._prepare(token_prompts, texts, sampling_params, priority, tenant, slo)
        if self.workers is not None:
            results = self.workers.run(prepared, use_tqdm)
            for out in results:  # the ids N=1 gives, in the caller's order
                out.request_id = str(next(self._ids))
            return results
        bar = None
        if use_tqdm:
            from tqdm import tqdm

            bar = tqdm(total=len(prepared), desc="Processed prompts", unit="prompt")
        try:
            return self.run_prepared(prepared, None if bar is None else bar.update)
        finally:
            if bar is not None:
                bar.close()

    def _prepare(
        self,
        token_prompts: list[list[int]],
        texts: list[str | None],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None,
        priority: int | Sequence[int] | None,
        tenant: str | Sequence[str | None] | None = None,
        slo: Sequence[tuple[float | None, float | None]] | None = None,
    ) -> list[Prepared]:
        """Each prompt with its own sampling params (derived fields filled in,
        ``max_tokens`` fitted), priority, tenant and SLO targets, checked.

        Raises:
            ValueError: as :meth:`generate`.
        """
        n = len(token_prompts)
        if sampling_params is None:
            sampling_params = SamplingParams()
        if isinstance(sampling_params, SamplingParams):
            params_list = [sampling_params] * n
        else:
            params_list = list(sampling_params)
            if len(params_list) != n:
                raise ValueError(f"got {len(params_list)} sampling params for {n} prompts")
        priorities = [checks.check_priority(p)
                      for p in checks.per_prompt(priority, n, "priority", int)]  # fmt: skip
        tenants = checks.per_prompt(tenant, n, "tenant", str)
        for t in set(tenants):
            checks.check_tenant(t, "tenant")
        prepared: list[Prepared] = []
        for p, (ids, text, params) in enumerate(zip(token_prompts, texts, params_list)):
            if not ids:
                raise ValueError(f"prompt {p} is empty")
            ids = self.processor.check_token_ids(ids)
            params = self.processor.fit(params.prepare(self.tokenizer), len(ids))
            targets = slo[p] if slo else (None, None)
            prepared.append((ids, text, params, priorities[p], tenants[p], targets))
        return prepared

    def run_prepared(
        self,
        prepared: Sequence[Prepared],
        on_done: Callable[[int], object] | None = None,
        before_step: Callable[[], None] | None = None,
    ) -> list[RequestOutput]:
        """Run prompts already prepared on this process's engine (what
        :meth:`generate` does after checking; a data-parallel worker's entry).

        Args:
            prepared: ``(token ids, text, fitted params, priority, tenant,
                (slo_ttft_s, slo_itl_s))`` per prompt.
            on_done: called with 1 each time a prompt's choices have all finished.
            before_step: called before each engine step; what it raises ends
                the call (the live requests are aborted).
        Returns:
            One :class:`RequestOutput` per prompt, in order.
        Raises:
            ValueError: a structured-output constraint that does not compile
                (the other prompts' requests are aborted).
        """
        results: list[RequestOutput] = []
        states: dict[str, tuple[int, SequenceState]] = {}
        try:
            for p, (ids, text, params, priority, tenant, slo) in enumerate(prepared):
                rid = str(next(self._ids))
                results.append(RequestOutput(rid, text, ids))
                for index, req in fan_out(rid, ids, params, 0, priority, tenant=tenant, slo=slo):
                    self.engine.add_request(req)
                    states[req.request_id] = (p, SequenceState(index, self.tokenizer, ids, params))
            self._step_until_done(results, states, on_done, before_step)
        finally:
            live = [rid for rid, (_, s) in states.items() if not s.finished]
            if live:
                self.engine.abort_requests(live)
        for p, out in enumerate(results):
            mine = [s for q, s in states.values() if q == p]
            out.outputs = sorted((s.to_output() for s in mine), key=lambda c: c.index)
            out.prompt_logprobs = next(
                (s.prompt_logprobs for s in mine if s.prompt_logprobs is not None), None
            )
            out.finished = True
        return results

    def _step_until_done(
        self,
        results: list[RequestOutput],
        states: dict[str, tuple[int, SequenceState]],
        on_done: Callable[[int], object] | None,
        before_step: Callable[[], None] | None,
    ) -> None:
        pending = [0] * len(results)
        for p, _ in states.values():
            pending[p] += 1
        remaining = len(states)
        while remaining and self.engine.has_unfinished_requests():
            if before_step is not None:
                before_step()
            for out in self.engine.step():
                entry = states.get(out.request_id)
                if entry is None or entry[1].finished:
                    continue
                if out.finish_reason == "error":  # e.g. a grammar that failed to compile
                    raise ValueError(out.error or "the engine rejected the request")
                p, state = entry
                state.process(out)
                if state.needs_abort:
                    self.engine.abort_requests([out.request_id])
                if state.finished:
                    remaining -= 1
                    pending[p] -= 1
                    if on_done is not None and pending[p] == 0:
                        on_done(1)

