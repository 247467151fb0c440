"""Prompt logprobs (``SamplingParams.prompt_logprobs``) on their way from the
steps that compute a prompt to the request's first output."""

from __future__ import annotations

import numpy as np

from paternoster.engine.messages import EngineCoreOutput
from paternoster.logprobs import Logprobs
from paternoster.model.interface import PromptChunk
from paternoster.request import Request
from paternoster.scheduling.output import SchedulerOutput


class PromptLogprobsTracker:
    """Which live requests want prompt logprobs, and those computed so far.

    A prompt is scored chunk by chunk as the steps compute it (a preempted
    request recomputes its prompt but is not scored twice); the whole goes out
    on the request's first output.

    Attributes:
        computed: prompt logprobs computed so far, per request, until its
            first token is sent.
        wanted: live requests that asked for prompt logprobs and have not had
            them sent.
    """

    def __init__(self) -> None:
        self.computed: dict[str, Logprobs] = {}
        self.wanted: dict[str, Request] = {}

    def want(self, request: Request) -> None:
        """``request`` asked for prompt logprobs."""
        self.wanted[request.request_id] = request

    def forget(self, request_id: str) -> None:
        """The request ends before its first token (aborted, rejected by load
        shedding after a preemption, or its grammar failed): nothing is sent,
        and what was computed for it is dropped. Unknown ids are ignored."""
        self.computed.pop(request_id, None)
        self.wanted.pop(request_id, None)

    def chunks(self, plan: SchedulerOutput, batch: dict[str, np.ndarray],
               computed: np.ndarray, scheduled: np.ndarray) -> list[PromptChunk]:
        """This step's prompt chunks whose logprobs are wanted; appends their
        token rows to ``batch["logits_indices"]``."""
        if not self.wanted:
            return []
        chunks: list[PromptChunk] = []
        starts: list[np.ndarray] = []
        qsl = batch["query_start_loc"]
        for i, r in enumerate(plan.scheduled):
            if r.request_id not in self.wanted:
                continue  # none asked, or sent already (a preempted request recomputes)
            done = len(self.computed.get(r.request_id) or ())
            first = max(int(computed[i]), done)
            # The logit at position p scores prompt token p + 1; the last prompt
            # position's logit is the first sample.
            end = min(int(computed[i]) + int(scheduled[i]), r.num_prompt_tokens - 1)
            if end > first:
                chunks.append(PromptChunk(r, first, end - first))
                starts.append(np.arange(end - first) + int(qsl[i]) + first - int(computed[i]))
        if chunks:
            batch["logits_indices"] = np.concatenate([batch["logits_indices"], *starts])
        return chunks

    def attach(self, outputs: list[EngineCoreOutput], step_logprobs: dict[str, Logprobs]) -> None:
        """Keep this step's prompt logprobs (``ModelRunnerOutput.prompt_logprobs``);
        put them on the outputs of the requests that got their first token."""
        for request_id, lp in step_logprobs.items():
            self.computed.setdefault(request_id, Logprobs()).extend(lp)
        if self.wanted:
            for o in outputs:  # the first token carries the prompt logprobs
                if o.new_token_ids and self.wanted.pop(o.request_id, None):
                    o.prompt_logprobs = self.computed.pop(o.request_id, None)
