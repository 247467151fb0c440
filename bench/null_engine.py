"""A model-free engine for frontend benchmarks: EngineCore's interface over a
token generator that costs nothing, so a benchmark measures the frontend, the
ZeroMQ links and the engine loop, not a model.

Every request generates ``max_tokens`` tokens (``max_model_len`` minus the
prompt when ``None``), one per step, all live requests in every step; the
tokens are the prompt's own, in turn. Run it with
``paternoster serve TOKENIZER_DIR --engine-cls paternoster.bench.null_engine:NullEngineCore``.
"""

from __future__ import annotations

import os

from paternoster.config import EngineConfig
from paternoster.engine.messages import EngineCoreOutput, EngineCoreRequest


class NullEngineCore:
    """EngineCore's API (add_request, abort_requests, step, stats, ...) without a model.

    Args:
        config: the engine configuration; ``model.model`` is only named in ``info``.
    """

    def __init__(self, config: EngineConfig) -> None:
        self.max_model_len = config.model.max_model_len or 4096
        self.num_kv_blocks = config.cache.num_kv_blocks or 1 << 20
        self.info = {
            "model": config.model.served_model_name or os.path.basename(config.model.model),
            "model_dir": config.model.model, "max_model_len": self.max_model_len,
            "num_kv_blocks": self.num_kv_blocks, "block_size": config.cache.block_size,
            "eos_token_id": None,
        }  # fmt: skip
        self.live: dict[str, tuple[EngineCoreRequest, int, int]] = {}  # id -> req, budget, done

    def add_request(self, request: EngineCoreRequest) -> None:
        """Queue ``request``. Raises ValueError for a duplicate id or an empty prompt."""
        if request.request_id in self.live or not request.prompt_token_ids:
            raise ValueError(f"bad or duplicate request {request.request_id!r}")
        n = len(request.prompt_token_ids)
        budget = request.sampling_params.max_tokens or max(1, self.max_model_len - n)
        self.live[request.request_id] = (request, budget, 0)

    def abort_requests(self, request_ids: list[str]) -> list[EngineCoreOutput]:
        """Drop live requests; one ``abort`` output each (unknown ids ignored)."""
        return [EngineCoreOutput(rid, [], finish_reason="abort")
                for rid in request_ids if self.live.pop(rid, None) is not None]  # fmt: skip

    def step(self) -> list[EngineCoreOutput]:
        """One token for every live request."""
        outs = []
        for rid, (req, budget, done) in list(self.live.items()):
            prompt = req.prompt_token_ids
            tok = prompt[done % len(prompt)]
            done += 1
            finish = "length" if done >= budget else None
            outs.append(EngineCoreOutput(rid, [tok], finish, None, None, len(prompt)))
            if finish:
                del self.live[rid]
            else:
                self.live[rid] = (req, budget, done)
        return outs

    def has_unfinished_requests(self) -> bool:
        """True while any request is live."""
        return bool(self.live)

    def stats(self) -> dict:
        """The gauges the frontend reads (no KV cache: usage 0)."""
        return {"num_running": len(self.live), "num_waiting": 0, "kv_cache_usage": 0.0,
                "num_free_blocks": self.num_kv_blocks, "num_kv_blocks": self.num_kv_blocks,
                "num_preemptions_total": 0}  # fmt: skip

    def shutdown(self) -> None:
        """Forget every request."""
        self.live.clear()
