"""The scheduler simulator: the real EngineCore with a cost-model runner.

:func:`simulate` runs the real :class:`~paternoster.engine.core.EngineCore`
(any registered scheduler policy, the real C++ ``KVCacheManager`` and
``BatchBuilder``) with a :class:`CostModelRunner` in place of the model: each
step's duration comes from a linear :class:`CostModel` (calibrated by timing
the real ModelRunner) on a :class:`SimClock` instead of a forward pass.
Inputs are JSONL traces or a seeded synthetic mix; outputs are per-request
TTFT, ITL, E2E and queue times, percentiles, throughput and a Gantt chart.
See docs/simulator.md. Iteration-level scheduling after Orca
(Yu et al., OSDI'22); chunked prefill after Sarathi-Serve (Agrawal et al.,
OSDI'24).
"""

from paternoster.scheduling.cost_model import DEFAULT_COST_MODEL, CostModel, StepWork
from paternoster.simulate.executor import simulate
from paternoster.simulate.results import (
    RequestMetrics,
    SimStep,
    SimulationResult,
    format_priority_table,
    format_table,
)
from paternoster.simulate.runner import CostModelRunner, SimClock
from paternoster.simulate.trace import TraceRequest, load_trace, save_trace, synthetic_mix

__all__ = [
    "DEFAULT_COST_MODEL",
    "CostModel",
    "CostModelRunner",
    "RequestMetrics",
    "SimClock",
    "SimStep",
    "SimulationResult",
    "StepWork",
    "TraceRequest",
    "format_priority_table",
    "format_table",
    "load_trace",
    "save_trace",
    "simulate",
    "synthetic_mix",
]
