"""Stop conditions: whether a request's newest token ends it."""

from __future__ import annotations

from paternoster.request import Request, RequestStatus


def check_stop(request: Request, token: int, max_model_len: int) -> RequestStatus | None:
    """The finished status ``token`` (just appended to ``request``'s output)
    gives it: EOS (unless ``ignore_eos``) or a stop token id (recorded in
    ``request.stop_reason``) stop it; ``max_tokens`` or ``max_model_len``
    reached caps it. ``None``: it goes on."""
    params = request.sampling_params
    if not params.ignore_eos and token == request.eos_token_id:
        return RequestStatus.FINISHED_STOPPED
    if token in params.stop_token_ids:
        request.stop_reason = token
        return RequestStatus.FINISHED_STOPPED
    if request.num_output_tokens >= request.max_tokens:
        return RequestStatus.FINISHED_LENGTH_CAPPED
    if request.num_tokens >= max_model_len:
        return RequestStatus.FINISHED_LENGTH_CAPPED
    return None
