"""The scheduler's side of automatic prefix caching (after vLLM's): look up a
request's cached prefix on admission, give the hit blocks back when it is not
admitted after all, and register the blocks each step filled. The lookup and
the registry are the C++ ``KVCacheManager``'s; the scheduler calls these only
when its ``prefix_caching`` is on."""

from __future__ import annotations

import numpy as np

from paternoster.request import Request
from paternoster.scheduling.output import SchedulerOutput


def lookup_prefix(kv_cache_manager, batch_builder, request: Request) -> None:
    """Start a waiting request past its cached prefix.

    The hit blocks become the start of its block table, one reference each;
    ``request.num_computed_tokens`` is set to the hit tokens (whole blocks,
    never the last token). A request asking for prompt logprobs skips the
    lookup (its prompt must be scored).
    """
    if request.sampling_params.prompt_logprobs is not None:
        return
    rid = request.internal_id
    request.num_computed_tokens = kv_cache_manager.get_computed_blocks(
        rid, batch_builder.token_ids(rid), getattr(request, "cache_salt", None)
    )


def peek_prefix(kv_cache_manager, batch_builder, request: Request) -> int:
    """Tokens :func:`lookup_prefix` would find cached for ``request`` now,
    taking nothing (no reference, no table, no hit counters): a planner's
    estimate for a request not admitted yet, whose blocks may still be
    evicted before it is. 0 for a request asking for prompt logprobs."""
    if request.sampling_params.prompt_logprobs is not None:
        return 0
    return kv_cache_manager.num_cached_prefix_tokens(
        batch_builder.token_ids(request.internal_id), getattr(request, "cache_salt", None)
    )


def undo_lookup(kv_cache_manager, request: Request) -> None:
    """``request`` was not admitted after all: give back its hit blocks."""
    kv_cache_manager.free(request.internal_id)
    request.num_computed_tokens = 0


def cache_computed_blocks(kv_cache_manager, batch_builder, out: SchedulerOutput) -> None:
    """Register the blocks this step filled (their KV is now written);
    called before ``num_computed_tokens`` advances."""
    ids, computed, scheduled = out.batch_arrays()
    done = computed.astype(np.int64) + scheduled
    kv_cache_manager.cache_computed_blocks(batch_builder, ids, done)
