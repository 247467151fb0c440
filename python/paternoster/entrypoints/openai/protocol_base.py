"""The base of every request model of the OpenAI-compatible API (protocol.py,
protocol_tools.py, responses_protocol.py): unknown fields are ignored, as
OpenAI does, but types are strict (no coercion)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class _Request(BaseModel):
    """A request body or a part of one: extra fields ignored, strict types."""

    model_config = ConfigDict(extra="ignore", strict=True)


class _SchedulingFields(_Request):
    """What a request tells the scheduler (chat, completions and responses):
    its ``priority`` (lower runs first; the ``priority`` and ``slo``
    schedulers), its latency targets for the ``slo`` scheduler (seconds > 0,
    finite) and its tenant for the ``fair`` one (the ``X-Tenant-Id`` header
    wins)."""

    priority: int = Field(0, ge=-(2**31), le=2**31 - 1)
    slo_ttft_s: float | None = Field(
        None, gt=0, allow_inf_nan=False,
        description="time-to-first-token target in seconds (the `slo` scheduler)")
    slo_itl_s: float | None = Field(
        None, gt=0, allow_inf_nan=False,
        description="inter-token latency target in seconds (the `slo` scheduler)")
    user: str | None = Field(None, description="tenant of the `fair` scheduler (X-Tenant-Id wins)")
