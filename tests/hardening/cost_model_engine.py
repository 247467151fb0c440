"""The real EngineCore (real scheduler, KV cache manager and batch builder)
over the simulator's cost-model runner: no model, steps take no wall time.

For server tests of scheduling policies: ``paternoster serve DIR --engine-cls
tests.hardening.cost_model_engine:CostModelEngineCore`` with ``DIR`` holding
a tokenizer. Every sampled token is the simulator's fake token.
"""

from __future__ import annotations

from paternoster.config import EngineConfig
from paternoster.engine.core import EngineCore
from paternoster.scheduling.cost_model import DEFAULT_COST_MODEL
from paternoster.simulate.runner import CostModelRunner, SimClock


class CostModelEngineCore(EngineCore):
    """EngineCore with a :class:`CostModelRunner` (wall clock for arrivals and
    deadlines; the runner's own clock only counts simulated seconds)."""

    def __init__(self, config: EngineConfig) -> None:
        runner = CostModelRunner(
            DEFAULT_COST_MODEL, SimClock(),
            num_kv_blocks=config.cache.num_kv_blocks or 512,
            block_size=config.cache.block_size,
            max_model_len=config.model.max_model_len or 2048,
            vocab_size=49152,
        )  # fmt: skip
        super().__init__(config, runner)
