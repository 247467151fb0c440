"""What an engine checks of a tokenized request before it queues it."""

from __future__ import annotations

from paternoster.engine.messages import EngineCoreRequest
from paternoster.request import check_slo_target


def check_request(request: EngineCoreRequest, vocab_size: int, max_model_len: int) -> int:
    """Check a request against the model (``EngineCore.add_request``).

    Args:
        request: the request.
        vocab_size: the model's vocabulary (logits width).
        max_model_len: the engine's context length.
    Returns:
        The room for output tokens: ``max_model_len`` minus the prompt's length.
    Raises:
        ValueError: empty prompt, token id (prompt or any token-id sampling field)
            outside the vocabulary, ``n != 1``, prompt (+ ``max_tokens``) longer
            than ``max_model_len``, a ``slo_ttft_s`` or ``slo_itl_s`` that is
            not a number > 0.
    """
    ids = request.prompt_token_ids
    params = request.sampling_params
    if not ids:
        raise ValueError("prompt must contain at least one token")
    check_slo_target(request.slo_ttft_s, "slo_ttft_s")
    check_slo_target(request.slo_itl_s, "slo_itl_s")
    if min(ids) < 0 or max(ids) >= vocab_size:
        raise ValueError(f"prompt token ids must be in [0, {vocab_size})")
    params.check_token_ids(vocab_size)
    if params.n != 1:
        raise ValueError("the engine takes n=1 requests; the frontend fans out n > 1")
    if len(ids) >= max_model_len:
        raise ValueError(
            f"prompt is {len(ids)} tokens; max_model_len is {max_model_len} "
            "(prompt plus at least one output token must fit)"
        )
    room = max_model_len - len(ids)
    if params.max_tokens is not None and params.max_tokens > room:
        raise ValueError(
            f"prompt ({len(ids)} tokens) + max_tokens ({params.max_tokens}) exceeds "
            f"max_model_len ({max_model_len})"
        )
    return room
