"""Messages between the frontend and the EngineCore (in-process or over ZMQ).

On the ZMQ link each message is a msgpack map; :func:`to_wire` / :func:`from_wire`
convert. Nothing is pickled.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, fields

from paternoster.logprobs import Logprobs
from paternoster.sampling_params import SamplingParams


@dataclass
class EngineCoreRequest:
    """A tokenized request for the engine.

    Attributes:
        request_id: unique id among live requests (str).
        prompt_token_ids: prompt tokens, list of int (non-empty).
        sampling_params: sampling and stop settings (``n`` must be 1 here; the
            frontend fans out ``n > 1``).
        arrival_time: ``time.time()`` seconds at the frontend.
        priority: lower runs first.
    """

    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    arrival_time: float = field(default_factory=time.time)
    priority: int = 0

    def to_wire(self) -> dict:
        return {
            "request_id": self.request_id,
            "prompt_token_ids": list(self.prompt_token_ids),
            "sampling_params": self.sampling_params.to_dict(),
            "arrival_time": self.arrival_time,
            "priority": self.priority,
        }

    @classmethod
    def from_wire(cls, d: dict) -> EngineCoreRequest:
        """Decode a wire map. Raises ValueError/TypeError/KeyError on a bad map."""
        ids = d["prompt_token_ids"]
        if not isinstance(ids, list) or not all(isinstance(t, int) for t in ids):
            raise ValueError("prompt_token_ids must be a list of int")
        if not isinstance(d["request_id"], str):
            raise ValueError("request_id must be a string")
        return cls(
            request_id=d["request_id"],
            prompt_token_ids=ids,
            sampling_params=SamplingParams.from_dict(d["sampling_params"]),
            arrival_time=float(d.get("arrival_time", time.time())),
            priority=int(d.get("priority", 0)),
        )


@dataclass(slots=True)
class EngineCoreOutput:
    """New tokens for one request from one engine step.

    Attributes:
        request_id: the request's id.
        new_token_ids: tokens generated this step (usually 0 or 1).
        finish_reason: ``None`` while running; ``"stop"``, ``"length"``,
            ``"abort"`` or ``"error"`` in the request's last output.
        stop_reason: the stop token id that ended it, if any.
        error: message when ``finish_reason == "error"``.
        num_prompt_tokens: prompt length in tokens (for usage).
        queue_time: seconds from the request's arrival at the engine to the
            step that first scheduled it; set on the request's first output
            after that step only, ``None`` elsewhere (and omitted on the wire).
        logprobs: log-probabilities of ``new_token_ids`` (one position per
            token) when the request asked for ``logprobs``; else ``None``
            (omitted on the wire).
        prompt_logprobs: log-probabilities of prompt tokens ``1..P-1`` when the
            request asked for ``prompt_logprobs``; on its first output with a
            token only, else ``None`` (omitted on the wire).
    """

    request_id: str
    new_token_ids: list[int]
    finish_reason: str | None = None
    stop_reason: int | None = None
    error: str | None = None
    num_prompt_tokens: int = 0
    queue_time: float | None = None
    logprobs: Logprobs | None = None
    prompt_logprobs: Logprobs | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def to_wire(self) -> dict:
        wire = {
            "request_id": self.request_id,
            "new_token_ids": self.new_token_ids,
            "finish_reason": self.finish_reason,
            "stop_reason": self.stop_reason,
            "error": self.error,
            "num_prompt_tokens": self.num_prompt_tokens,
        }
        if self.queue_time is not None:
            wire["queue_time"] = self.queue_time
        if self.logprobs is not None:
            wire["logprobs"] = self.logprobs.to_wire()
        if self.prompt_logprobs is not None:
            wire["prompt_logprobs"] = self.prompt_logprobs.to_wire()
        return wire

    @classmethod
    def from_wire(cls, d: dict) -> EngineCoreOutput:
        """Decode a wire map; unknown keys (from a newer engine) are ignored.

        Raises:
            TypeError: a required key is missing.
            ValueError: malformed ``logprobs`` or ``prompt_logprobs``.
        """
        out = cls(**{k: v for k, v in d.items() if k in _OUTPUT_FIELDS})
        if out.logprobs is not None:
            out.logprobs = Logprobs.from_wire(out.logprobs)
        if out.prompt_logprobs is not None:
            out.prompt_logprobs = Logprobs.from_wire(out.prompt_logprobs)
        return out


_OUTPUT_FIELDS = frozenset(f.name for f in fields(EngineCoreOutput))
