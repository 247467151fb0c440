"""The scripted fake engine with a waiting queue: at most ``max_running``
requests (``fake_engine.json``, default unbounded) advance per step, the rest
wait in arrival order and count in ``num_waiting`` like EngineCore's.

With ``"event_log": PATH`` it appends one JSON line per step,
``{"step": n, "start": s, "end": s, "ran": [request ids that got a token]}``,
and one per aborted request, ``{"abort": id, "time": s, "num_steps": n}``
(``start``, ``end`` and ``time`` in ``time.monotonic()`` seconds, a clock the
test process shares; ``num_steps``: steps begun before the abort), so tests
can count the steps a request ran after its client went away.

With ``"request_log": PATH`` it appends one JSON line per request it is
given, ``{"add": id, "tenant": ..., "priority": ..., "cache_salt": ...,
"slo_ttft_s": ..., "slo_itl_s": ...}``:
the fields as decoded in the engine process, so tests can check that a
request field crossed the HTTP or ZeroMQ frontend and the engine link.
"""

from __future__ import annotations

import json
import time

from tests.entrypoints.fake_engine import FakeEngineCore


class QueueingFakeEngine(FakeEngineCore):
    """FakeEngineCore whose steps run only the first ``max_running`` live
    requests, optionally logging steps and aborts (see the module doc)."""

    def step(self):
        start = time.monotonic()
        outs = self._step()
        ran = [o.request_id for o in outs if o.new_token_ids]
        self._log(step=self.num_steps, start=start, end=time.monotonic(), ran=ran)
        return outs

    def _step(self):
        cap = self.opts.get("max_running")
        if not cap or len(self.live) <= cap:
            return super().step()
        parked = dict(list(self.live.items())[cap:])
        for rid in parked:
            del self.live[rid]
        try:
            return super().step()
        finally:
            self.live.update(parked)  # dict order keeps them behind the running ones

    def add_request(self, request):
        super().add_request(request)
        path = self.opts.get("request_log")
        if path:
            with open(path, "a") as f:
                f.write(json.dumps({"add": request.request_id, "tenant": request.tenant,
                                    "priority": request.priority,
                                    "cache_salt": request.cache_salt,
                                    "slo_ttft_s": request.slo_ttft_s,
                                    "slo_itl_s": request.slo_itl_s}) + "\n")  # fmt: skip

    def abort_requests(self, request_ids):
        outs = super().abort_requests(request_ids)
        now = time.monotonic()
        for o in outs:
            self._log(abort=o.request_id, time=now, num_steps=self.num_steps)
        return outs

    def _log(self, **event) -> None:
        path = self.opts.get("event_log")
        if path:
            with open(path, "a") as f:
                f.write(json.dumps(event) + "\n")

    def stats(self) -> dict:
        out = super().stats()
        out["num_steps"] = self.num_steps
        cap = self.opts.get("max_running")
        if cap:
            out["num_running"] = min(len(self.live), cap)
            out["num_waiting"] = max(0, len(self.live) - cap)
        return out
