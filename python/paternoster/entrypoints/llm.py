"""The offline API: ``LLM(...).generate(prompts, SamplingParams(...))``.

Runs the EngineCore in this process (no ZeroMQ). All prompts are added before
the first step, so they are batched continuously; outputs go through the same
detokenizer and stop-string handling as the HTTP server.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Sequence
from typing import Any

from paternoster.entrypoints.engine_args import build_engine_config, resolve_model_dir
from paternoster.frontend.output_processor import SequenceState, fan_out
from paternoster.frontend.processor import InputProcessor
from paternoster.outputs import RequestOutput
from paternoster.sampling_params import SamplingParams

logger = logging.getLogger("paternoster.llm")


class LLM:
    """An engine in this process plus the model's tokenizer.

    Args:
        model: HF model directory or ``.gguf`` file (quantized weights kept
            quantized on CPU); ``None`` = the embedded default model.
        **engine_kwargs: the CLI's engine options by their flag names
            (``dtype``, ``max_model_len``, ``block_size``, ``num_kv_blocks``,
            ``kv_cache_memory``, ``max_num_seqs``, ``max_num_batched_tokens``,
            ``scheduler``, ``num_threads``, ``seed``, ``served_model_name``,
            ``device``, ``gpu_memory_utilization``, ``cuda_graphs``,
            ``batch_invariant``, ``load_format``, ``timeline_size``, ``timeline_sample_rate``,
            ``timeline_max_requests``, ``tensor_parallel_size``: only 1 yet,
            others raise ValueError). ``num_threads`` defaults to every
            physical core available (see :mod:`paternoster.engine.cpu_threads`).
        data_parallel_size: only 1 (the default) for now: the offline API runs
            one engine in this process; ``paternoster serve
            --data-parallel-size N`` runs several.
    Attributes:
        engine: the :class:`~paternoster.engine.core.EngineCore` (``step_log``,
            ``stats()``; ``info["num_threads"]`` and ``threads``: the thread
            count used).
        tokenizer: the Hugging Face tokenizer.
    Raises:
        ValueError: an option out of range; errors of model loading.
    """

    def __init__(self, model: str | None = None, data_parallel_size: int = 1,
                 **engine_kwargs: Any) -> None:  # fmt: skip
        from paternoster.engine.core import EngineCore
        from paternoster.model.loader import load_tokenizer

        if not isinstance(data_parallel_size, int) or data_parallel_size < 1:
            raise ValueError(f"data_parallel_size must be an integer >= 1, got "
                             f"{data_parallel_size!r}")  # fmt: skip
        if data_parallel_size != 1:
            raise ValueError(
                f"data_parallel_size={data_parallel_size}: the offline LLM runs one engine "
                "in this process (only 1 is supported); use `paternoster serve "
                "--data-parallel-size N` for several engines"
            )

        model_dir = resolve_model_dir(model)
        config = build_engine_config(model_dir, **engine_kwargs)
        self.tokenizer = load_tokenizer(model_dir)
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
        Returns:
            One :class:`RequestOutput` per prompt, in input order, each with
            ``n`` choices ordered by index.
        Raises:
            ValueError: mismatched lengths, an empty prompt, a token id outside
                the vocabulary, or a prompt plus ``max_tokens`` longer than
                ``max_model_len`` (an ``InvalidRequestError`` naming the field),
                or a structured-output constraint that does not compile (the
                other prompts' requests are aborted).
        """
        token_prompts, texts = self._tokenize(prompts)
        return self._run(token_prompts, texts, sampling_params, use_tqdm, priority)

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
            ValueError: as in :meth:`generate`; ``ChatTemplateError`` (a
                ``ValueError``) when there is no template or it fails.
        """
        from paternoster.frontend.chat import render_chat

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

    def timeline(self) -> dict:
        """The engine's request timeline (needs ``LLM(..., timeline_size=N)``).

        Returns:
            The snapshot: plain dicts and lists, times in ``time.monotonic()``
            seconds (schema in :mod:`paternoster.metrics.timeline`).
        Raises:
            RuntimeError: timelines are off (``timeline_size`` is 0, the default).
        """
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
    ) -> dict:
        """Write the request timeline as a Chrome/Perfetto trace, a Gantt PNG and/or
        the raw snapshot (JSON; ``paternoster trace --input`` converts it later).

        Args:
            trace_path: Chrome trace JSON to write (open in https://ui.perfetto.dev).
            gantt_path: Gantt chart PNG to write.
            snapshot_path: raw snapshot JSON to write.
            gantt_x: ``"time"`` or ``"step"`` on the Gantt x axis.
        Returns:
            The snapshot written.
        Raises:
            RuntimeError: timelines are off.
            ValueError: bad ``gantt_x``.
            OSError: a file cannot be written.
        """
        import json
        from pathlib import Path

        from paternoster.metrics.chrome_trace import write_chrome_trace
        from paternoster.metrics.gantt import plot_timeline_gantt

        snapshot = self.timeline()
        if trace_path is not None:
            write_chrome_trace(snapshot, trace_path)
        if gantt_path is not None:
            plot_timeline_gantt(snapshot, gantt_path, x=gantt_x)
        if snapshot_path is not None:
            Path(snapshot_path).write_text(json.dumps(snapshot) + "\n")
        return snapshot

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
    ) -> list[RequestOutput]:
        if sampling_params is None:
            sampling_params = SamplingParams()
        if isinstance(sampling_params, SamplingParams):
            params_list = [sampling_params] * len(token_prompts)
        else:
            params_list = list(sampling_params)
            if len(params_list) != len(token_prompts):
                raise ValueError(
                    f"got {len(params_list)} sampling params for {len(token_prompts)} prompts"
                )
        if priority is None or isinstance(priority, int):
            priorities = [priority or 0] * len(token_prompts)
        else:
            priorities = [int(p) for p in priority]
            if len(priorities) != len(token_prompts):
                raise ValueError(
                    f"got {len(priorities)} priorities for {len(token_prompts)} prompts"
                )
        results: list[RequestOutput] = []
        states: dict[str, tuple[int, SequenceState]] = {}
        try:
            for p, (ids, text, params) in enumerate(zip(token_prompts, texts, params_list)):
                if not ids:
                    raise ValueError(f"prompt {p} is empty")
                ids = self.processor.check_token_ids(ids)
                params = self.processor.fit(params.prepare(self.tokenizer), len(ids))
                rid = str(next(self._ids))
                results.append(RequestOutput(rid, text, ids))
                reqs = fan_out(rid, ids, params, 0, priorities[p])
                for index, req in reqs:
                    self.engine.add_request(req)
                    states[req.request_id] = (p, SequenceState(index, self.tokenizer, ids, params))
            self._step_until_done(results, states, use_tqdm)
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
        use_tqdm: bool,
    ) -> None:
        pending = [0] * len(results)
        for p, _ in states.values():
            pending[p] += 1
        bar = None
        if use_tqdm:
            from tqdm import tqdm

            bar = tqdm(total=len(results), desc="Processed prompts", unit="prompt")
        remaining = len(states)
        try:
            while remaining and self.engine.has_unfinished_requests():
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
                        if bar is not None and pending[p] == 0:
                            bar.update(1)
        finally:
            if bar is not None:
                bar.close()
