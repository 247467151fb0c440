"""A model-free stand-in for EngineCore, for frontend tests.

It "generates" a deterministic token sequence and keeps EngineCore's API and
its finish rules (EOS, stop_token_ids, max_tokens). Behaviour knobs come from
``fake_engine.json`` in the model directory (all optional):

    tokens:        list of token ids generated in turn (default: 1000 + step)
    echo_prompt:   generate the prompt's own tokens in turn instead (so each
                   request's output tells which request it belongs to)
    max_model_len: context length (default 256)
    num_kv_blocks: default 64; block_size comes from the CacheConfig
    vocab_size:    default 49152
    eos_token_id:  default None
    step_delay:    seconds slept per step (default 0)
    fail_init:     raise this message from __init__
    crash_at_step: raise from step() on this step number
    hang_at_step:  sleep forever at this step number
"""

from __future__ import annotations

import json
import math
import os
import time

from paternoster.config import EngineConfig
from paternoster.engine.messages import EngineCoreOutput, EngineCoreRequest


class FakeEngineCore:
    """EngineCore's API over a scripted token generator (see module doc)."""

    def __init__(self, config: EngineConfig) -> None:
        path = os.path.join(config.model.model, "fake_engine.json")
        opts = {}
        if os.path.exists(path):
            with open(path) as f:
                opts = json.load(f)
        if opts.get("fail_init"):
            raise ValueError(opts["fail_init"])
        self.opts = opts
        self.block_size = config.cache.block_size
        self.num_kv_blocks = config.cache.num_kv_blocks or opts.get("num_kv_blocks", 64)
        self.max_model_len = config.model.max_model_len or opts.get("max_model_len", 256)
        self.info = {
            "model": config.model.served_model_name or os.path.basename(config.model.model),
            "model_dir": config.model.model,
            "max_model_len": self.max_model_len,
            "num_kv_blocks": self.num_kv_blocks,
            "block_size": self.block_size,
            "eos_token_id": opts.get("eos_token_id"),
            "vocab_size": opts.get("vocab_size", 49152),
        }
        self.live: dict[str, tuple[EngineCoreRequest, list[int]]] = {}
        self.num_steps = 0
        self.step_log: list[int] = []
        self.arrivals: dict[str, float] = {}  # monotonic s; dropped once scheduled
        self.iteration_tokens: list[int] = []

    def add_request(self, request: EngineCoreRequest) -> None:
        if request.request_id in self.live:
            raise ValueError(f"duplicate request id {request.request_id!r}")
        n = len(request.prompt_token_ids)
        if n == 0:
            raise ValueError("empty prompt")
        max_tokens = request.sampling_params.max_tokens or (self.max_model_len - n)
        if n + max_tokens > self.max_model_len:
            raise ValueError(f"prompt ({n}) + max_tokens ({max_tokens}) > {self.max_model_len}")
        self.live[request.request_id] = (request, [])
        self.arrivals[request.request_id] = time.monotonic()

    def abort_requests(self, request_ids) -> list[EngineCoreOutput]:
        outs = []
        for rid in request_ids:
            if self.live.pop(rid, None) is not None:
                outs.append(EngineCoreOutput(rid, [], finish_reason="abort"))
                self.arrivals.pop(rid, None)
        return outs

    def _next_token(self, generated: list[int], prompt: list[int] | None = None) -> int:
        if self.opts.get("echo_prompt") and prompt:
            return prompt[len(generated) % len(prompt)]
        tokens = self.opts.get("tokens")
        if tokens:
            return tokens[len(generated) % len(tokens)]
        return 1000 + len(generated)

    def step(self) -> list[EngineCoreOutput]:
        self.num_steps += 1
        if self.opts.get("crash_at_step") == self.num_steps:
            raise RuntimeError("fake crash")
        if self.opts.get("hang_at_step") == self.num_steps:
            while True:
                time.sleep(1)
        time.sleep(self.opts.get("step_delay", 0))
        outs = []
        self.step_log.append(len(self.live))
        now = time.monotonic()
        # Like EngineCore: a new request computes its prompt, a running one its last token.
        self.iteration_tokens.append(
            sum(len(r.prompt_token_ids) if not g else 1 for r, g in self.live.values())
        )
        for rid, (req, gen) in list(self.live.items()):
            arrival = self.arrivals.pop(rid, None)
            tok = self._next_token(gen, req.prompt_token_ids)
            gen.append(tok)
            sp = req.sampling_params
            eos = self.info["eos_token_id"]
            max_tokens = sp.max_tokens or (self.max_model_len - len(req.prompt_token_ids))
            finish = stop_reason = None
            if tok in sp.stop_token_ids:
                finish, stop_reason = "stop", tok
            elif eos is not None and tok == eos and not sp.ignore_eos:
                finish = "stop"
            elif len(gen) >= max_tokens:
                finish = "length"
            outs.append(
                EngineCoreOutput(
                    rid, [tok], finish, stop_reason, None, len(req.prompt_token_ids),
                    queue_time=None if arrival is None else now - arrival,
                )
            )
            if finish:
                del self.live[rid]
        return outs

    def pop_iteration_tokens(self) -> list[int]:
        tokens, self.iteration_tokens = self.iteration_tokens, []
        return tokens

    def has_unfinished_requests(self) -> bool:
        return bool(self.live)

    def stats(self) -> dict:
        used = sum(
            math.ceil((len(r.prompt_token_ids) + len(g)) / self.block_size)
            for r, g in self.live.values()
        )
        return {
            "num_running": len(self.live),
            "num_waiting": 0,
            "kv_cache_usage": used / self.num_kv_blocks,
            "num_free_blocks": self.num_kv_blocks - used,
            "num_kv_blocks": self.num_kv_blocks,
            "num_preemptions_total": 0,
        }

    def shutdown(self) -> None:
        self.live.clear()
