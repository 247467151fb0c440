"""Helpers for the engine tests."""

from __future__ import annotations

from paternoster.engine.messages import EngineCoreRequest
from paternoster.sampling_params import SamplingParams


def make_request(request_id: str, prompt_token_ids: list[int], sampling_params: SamplingParams,
                 **fields) -> EngineCoreRequest:
    """An :class:`EngineCoreRequest` built with keyword arguments (the message's
    field order is not part of its contract); ``fields`` are its other fields."""
    return EngineCoreRequest(request_id=request_id, prompt_token_ids=prompt_token_ids,
                             sampling_params=sampling_params, **fields)
