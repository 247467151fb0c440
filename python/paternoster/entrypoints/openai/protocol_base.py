"""The base of every request model of the OpenAI-compatible API (protocol.py,
protocol_tools.py, responses_protocol.py): unknown fields are ignored, as
OpenAI does, but types are strict (no coercion)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class _Request(BaseModel):
    """A request body or a part of one: extra fields ignored, strict types."""

    model_config = ConfigDict(extra="ignore", strict=True)
