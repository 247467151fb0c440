"""The typed messages between the frontend and the engine process.

Every message is one msgspec Struct: its definition is the schema, the
validation and the codec (after vLLM v1's ``EngineCoreRequest`` /
``EngineCoreOutputs``). On the ZeroMQ link each travels as one msgpack map
whose ``"type"`` names the struct (msgspec's tagged unions), decoded straight
into the struct of that type by :class:`paternoster.engine.codec.MessageDecoder`
(wrong types, missing fields and unknown types are refused, never half
decoded) and encoded once. Nothing is pickled. docs/protocol.md ("Engine
link") lists them.

Direction: :data:`ToEngine` messages go frontend -> engine, :data:`FromEngine`
messages engine -> frontend.
"""

from __future__ import annotations

import time
from typing import Any, Union

import msgspec

from paternoster.logprobs import Logprobs
from paternoster.sampling_params import SamplingParams

LINK_VERSION = 2
"""Version of the engine link's messages (both ends come from one install;
a mismatch means a stale engine process and is refused)."""


class EngineCoreRequest(msgspec.Struct):
    """A tokenized request for the engine.

    Attributes:
        request_id: unique id among live requests.
        prompt_token_ids: prompt tokens (non-empty).
        sampling_params: sampling and stop settings (``n`` must be 1 here; the
            frontend fans out ``n > 1``; ``max_tokens`` set).
        arrival_time: ``time.time()`` seconds when the request reached the
            frontend (wall clock: it stays meaningful across processes and
            hosts); the engine orders and times the request from it.
        priority: lower runs first (``priority`` scheduler).
        cache_salt: isolates the request's prefix-cache blocks: blocks are
            shared only between requests with the same salt (vLLM's
            ``cache_salt``); ``None``: no salt.
        tenant: who the request is served for (the ``fair`` scheduler's
            unit of sharing); ``None``: the one anonymous tenant. Optional on
            the wire (absent: ``None``).
        slo_ttft_s: time-to-first-token target in seconds (``slo``
            scheduler), or ``None`` for the policy's default.
        slo_itl_s: inter-token latency target in seconds (``slo``
            scheduler), or ``None`` for the policy's default.
    """

    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    arrival_time: float = msgspec.field(default_factory=time.time)
    priority: int = 0
    cache_salt: str | None = None
    tenant: str | None = None
    slo_ttft_s: float | None = None
    slo_itl_s: float | None = None


class EngineCoreOutput(msgspec.Struct, omit_defaults=True):
    """New tokens for one request from one engine step.

    Attributes:
        request_id: the request's id.
        new_token_ids: tokens generated this step (usually 0 or 1).
        finish_reason: ``None`` while running; ``"stop"``, ``"length"``,
            ``"abort"`` or ``"error"`` in the request's last output.
        stop_reason: the stop token id that ended it, if any.
        error: message when ``finish_reason == "error"``.
        num_prompt_tokens: prompt length in tokens (for usage).
        queue_time: seconds from the request's arrival to the step that first
            scheduled it; on the request's first output after that step only.
        logprobs: log-probabilities of ``new_token_ids`` (one position per
            token) when the request asked for ``logprobs``; else ``None``.
        prompt_logprobs: log-probabilities of prompt tokens ``1..P-1`` when the
            request asked for ``prompt_logprobs``; on its first output with a
            token only, else ``None``.
        overloaded: with ``finish_reason == "error"``: the scheduler refused
            the request under load (load shedding, ``Scheduler.reject``); the
            frontend answers 503 instead of 400.
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
    overloaded: bool = False

    @property
    def finished(self) -> bool:
        """True on the request's last output."""
        return self.finish_reason is not None


class _Message(msgspec.Struct, tag_field="type", kw_only=True, omit_defaults=True):
    """Base of the link messages: ``"type"`` is the tag, ``v`` the link version."""

    v: int = LINK_VERSION


# ---------------------------------------------------------------- to the engine


class Config(_Message, tag="config"):
    """The first message: the engine's configuration (``EngineConfig.to_dict()``)
    and the handshake token the engine must echo."""

    config: dict[str, Any]
    token: str


class Add(_Message, tag="add"):
    """Queue one request."""

    request: EngineCoreRequest


class Abort(_Message, tag="abort"):
    """Abort requests (unknown ids are ignored); each live one gets a final
    output with ``finish_reason="abort"``."""

    request_ids: list[str]


class Shutdown(_Message, tag="shutdown"):
    """Exit the engine loop."""


class ResetPrefixCache(_Message, tag="reset_prefix_cache"):
    """Forget every cached KV block (running requests keep theirs); answered by
    :class:`ResetPrefixCacheReply` with the same ``id``."""

    id: int


class TimelineQuery(_Message, tag="timeline"):
    """Ask for the request timeline; answered by :class:`TimelineReply`."""

    id: int


ToEngine = Union[Config, Add, Abort, Shutdown, ResetPrefixCache, TimelineQuery]  # noqa: UP007


# --------------------------------------------------------------- from the engine


class Ready(_Message, tag="ready"):
    """The engine is built: its ``EngineCore.info`` and the handshake token."""

    info: dict[str, Any]
    token: str


class StartupError(_Message, tag="startup_error"):
    """Building the engine failed; the process exits 1."""

    error: str
    token: str | None = None


class Outputs(_Message, tag="outputs"):
    """One step's outputs (plus the final outputs of aborted or rejected
    requests).

    Attributes:
        outputs: per request, what the step added.
        iteration_tokens: tokens each step since the previous message computed.
        stats: ``EngineCore.stats()`` just before sending.
        stats_time: ``time.monotonic()`` of ``stats`` (seconds).
    """

    outputs: list[EngineCoreOutput]
    iteration_tokens: list[int] = msgspec.field(default_factory=list)
    stats: dict[str, Any] = msgspec.field(default_factory=dict)
    stats_time: float = 0.0


class Heartbeat(_Message, tag="heartbeat"):
    """Sent every heartbeat interval from a thread of its own, busy or idle.

    Attributes:
        stats: the latest stats snapshot.
        stats_time: its ``time.monotonic()`` (the frontend keeps the newest).
        time: ``time.time()`` when sent.
        step_started: ``time.time()`` at which the running step began
            (``None`` between steps).
    """

    stats: dict[str, Any] = msgspec.field(default_factory=dict)
    stats_time: float = 0.0
    time: float = 0.0
    step_started: float | None = None


class ResetPrefixCacheReply(_Message, tag="reset_prefix_cache"):
    """Blocks uncached, or ``error`` (then ``num_blocks`` is ``None``)."""

    id: int
    num_blocks: int | None = None
    error: str | None = None


class TimelineReply(_Message, tag="timeline"):
    """The timeline snapshot, or ``error`` when the engine keeps none."""

    id: int
    timeline: dict[str, Any] | None = None
    error: str | None = None


class Fatal(_Message, tag="fatal"):
    """``step()`` raised; the process exits 1."""

    error: str


FromEngine = Union[  # noqa: UP007
    Ready, StartupError, Outputs, Heartbeat, ResetPrefixCacheReply, TimelineReply, Fatal
]
