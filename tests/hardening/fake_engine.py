"""The scripted fake engine with a waiting queue: at most ``max_running``
requests (``fake_engine.json``, default unbounded) advance per step, the rest
wait in arrival order and count in ``num_waiting`` like EngineCore's."""

from __future__ import annotations

from tests.entrypoints.fake_engine import FakeEngineCore


class QueueingFakeEngine(FakeEngineCore):
    """FakeEngineCore whose steps run only the first ``max_running`` live requests."""

    def step(self):
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

    def stats(self) -> dict:
        out = super().stats()
        cap = self.opts.get("max_running")
        if cap:
            out["num_running"] = min(len(self.live), cap)
            out["num_waiting"] = max(0, len(self.live) - cap)
        return out
