"""The scheduler simulator: the real scheduler classes on a virtual clock.

A model-free executor runs any registered scheduler policy against the real
C++ ``KVCacheManager`` and ``BatchBuilder``; each step's duration comes from a
linear :class:`CostModel` (calibrated by timing the real ModelRunner) instead
of a forward pass. Inputs are JSONL traces or a seeded synthetic mix; outputs
are per-request TTFT, ITL, E2E and queue times, percentiles, throughput and a
Gantt chart. See docs/simulator.md. Iteration-level scheduling after Orca
(Yu et al., OSDI'22); chunked prefill after Sarathi-Serve (Agrawal et al.,
OSDI'24).
"""

from paternoster.simulate.cost_model import DEFAULT_COST_MODEL, CostModel, StepWork
from paternoster.simulate.executor import simulate
from paternoster.simulate.results import (
    RequestMetrics,
    SimStep,
    SimulationResult,
    format_priority_table,
    format_table,
)
from paternoster.simulate.trace import TraceRequest, load_trace, save_trace, synthetic_mix

__all__ = [
    "DEFAULT_COST_MODEL",
    "CostModel",
    "RequestMetrics",
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
