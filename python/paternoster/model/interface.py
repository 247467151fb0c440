"""The contract between :class:`~paternoster.engine.core.EngineCore` and a runner.

EngineCore plans a step (the scheduler), flattens it (the C++ ``BatchBuilder``)
and hands the runner one :class:`ModelInput`; the runner computes the step and
returns a :class:`ModelRunnerOutput`: one sampled token for each request whose
prefill completes, with logprobs and prompt logprobs where the requests asked.
Two runners implement :class:`Runner`: the real
:class:`~paternoster.model.runner.ModelRunner` (a forward pass, logits
processors, the sampler) and the simulator's
:class:`~paternoster.simulate.runner.CostModelRunner` (no model: a step "takes"
the cost model's time on a simulated clock).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from paternoster.logprobs import Logprobs
from paternoster.request import Request


@dataclass(frozen=True, slots=True)
class PromptChunk:
    """Prompt positions of one request whose logits score prompt tokens.

    The logit at prompt position ``p`` scores prompt token ``p + 1``, so a chunk
    scores tokens ``first + 1 .. first + count``.

    Attributes:
        request: the request (its ``prompt_token_ids`` and
            ``sampling_params.prompt_logprobs`` are read).
        first: first prompt position (0-based) of the chunk.
        count: positions in the chunk (>= 1).
    """

    request: Request
    first: int
    count: int


@dataclass(frozen=True, slots=True)
class ModelInput:
    """One step as a runner sees it.

    Attributes:
        requests: the scheduled requests, in batch order (B of them).
        preempted: requests the scheduler preempted while planning this step
            (a runner that keeps per-request state drops theirs).
        arrays: the flat batch (numpy): ``input_ids`` int64[T], ``positions``
            int64[T], ``slot_mapping`` int64[T], ``block_tables`` int32[B, M],
            ``seq_lens`` int32[B], ``query_start_loc`` int32[B + 1] and
            ``logits_indices`` int64[S + sum of chunk counts]: the last token
            row of each sampling request (``sample_rows`` order), then the
            token rows of each prompt chunk (``prompt_chunks`` order).
        num_computed_tokens: int32[B] tokens of each request already in the KV
            cache, as of planning.
        num_scheduled_tokens: int32[B] tokens each request computes this step.
        sample_rows: int64[S] indices into ``requests`` of the requests
            whose prefill completes this step (they sample one token), ascending.
        prompt_chunks: the chunks whose prompt logprobs are wanted this step.
    """

    requests: list[Request]
    preempted: list[Request]
    arrays: dict[str, np.ndarray]
    num_computed_tokens: np.ndarray
    num_scheduled_tokens: np.ndarray
    sample_rows: np.ndarray
    prompt_chunks: list[PromptChunk] = field(default_factory=list)


@dataclass(slots=True)
class ModelRunnerOutput:
    """What a runner returns for one step.

    Attributes:
        sampled_token_ids: ``{row index in requests: token id}``, one
            entry per ``sample_rows`` entry (what ``Scheduler.update_from_output``
            takes).
        logprobs: ``{request id: one-position Logprobs}`` of the sampled token,
            for the sampling requests that asked for ``logprobs``. Of the
            model's distribution before penalties, bias and temperature
            (vLLM's default ``raw_logprobs``).
        prompt_logprobs: ``{request id: Logprobs}`` of this step's prompt
            chunk (``count`` positions, in order) for each ``prompt_chunks``
            entry.
    """

    sampled_token_ids: dict[int, int]
    logprobs: dict[str, Logprobs] = field(default_factory=dict)
    prompt_logprobs: dict[str, Logprobs] = field(default_factory=dict)


class Runner(Protocol):
    """What EngineCore needs from a runner.

    Attributes:
        num_kv_blocks: KV cache blocks the runner holds (per layer).
        block_size: tokens per KV block.
        kv_cache_group_windows: optional; per KV cache group (layers sharing
            block tables, :mod:`paternoster.model.kv_layout`) its sliding window
            in tokens, 0 for full attention. A runner without it has one
            full-attention group.
        max_model_len: context cap in tokens (prompt + output).
        vocab_size: token ids are in ``[0, vocab_size)``.
        eos_token_id: the model's EOS id, or None.
    """

    num_kv_blocks: int
    block_size: int
    max_model_len: int
    vocab_size: int
    eos_token_id: int | None

    def execute_model(self, model_input: ModelInput) -> ModelRunnerOutput:
        """Compute one step: write the scheduled tokens' K/V, sample one token
        per ``model_input.sample_rows`` entry, score the prompt chunks.

        Args:
            model_input: the step; the requests' ``output_token_ids`` do not
                yet include this step's tokens.
        Returns:
            The sampled tokens, logprobs and prompt logprobs.
        """
        ...
