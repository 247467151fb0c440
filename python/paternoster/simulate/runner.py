"""The cost-model runner: a :class:`~paternoster.model.interface.Runner` with no model.

The real :class:`~paternoster.engine.core.EngineCore` drives it like the real
ModelRunner: the scheduler plans against the real C++ ``KVCacheManager``, the
real C++ ``BatchBuilder`` flattens the plan (so a plan the engine would reject
fails here too), and :meth:`CostModelRunner.execute_model` then "takes"
``cost_model.step_time(work)`` on a :class:`SimClock` and samples
:data:`FAKE_TOKEN` for every request whose prefill completes.
"""

from __future__ import annotations

import operator
from collections.abc import Callable

import numpy as np

from paternoster.model.interface import ModelInput, ModelRunnerOutput
from paternoster.scheduling.cost_model import CostModel, StepWork

_NUM_PROMPT_TOKENS = operator.attrgetter("num_prompt_tokens")

#: The fake sampled token: any id works, the simulator's requests ignore EOS.
FAKE_TOKEN = 1


class SimClock:
    """A simulated clock: seconds (or steps) that move only when told.

    Call it for the current time, as the engine's ``clock``.
    """

    def __init__(self, start: float = 0.0) -> None:
        self.now = float(start)

    def __call__(self) -> float:
        """The current simulated time."""
        return self.now

    def advance(self, seconds: float) -> None:
        """Move the clock forward by ``seconds`` (>= 0).

        Raises:
            ValueError: ``seconds`` is negative.
        """
        if seconds < 0:
            raise ValueError(f"the clock cannot go back ({seconds} s)")
        self.now += seconds

    def advance_to(self, time: float) -> None:
        """Set the clock to ``time`` exactly (an idle jump to the next arrival).

        Raises:
            ValueError: ``time`` is before now.
        """
        if time < self.now:
            raise ValueError(f"the clock cannot go back (from {self.now} to {time})")
        self.now = float(time)


#: ``on_step(model_input, work, start, end)``, called once per executed step.
StepObserver = Callable[[ModelInput, StepWork, float, float], None]


class CostModelRunner:
    """Executes steps by advancing a clock by the cost model's step time.

    Args:
        cost_model: the step-time model.
        clock: advanced by each step's duration.
        num_kv_blocks: KV cache blocks to report to the engine.
        block_size: tokens per block.
        max_model_len: context cap in tokens.
        vocab_size: token ids the engine accepts are in ``[0, vocab_size)``.
        on_step: called after each step with its input, the cost model's
            inputs and the step's start and end times (the simulator records
            its per-step results there).
        seed: seeds the step-time noise (``cost_model.step_noise`` > 0).

    Attributes:
        eos_token_id: None (simulated requests stop at ``max_tokens``).
        num_steps: steps executed so far.

    Logprobs and prompt logprobs are not simulated: the output never has any.
    """

    def __init__(self, cost_model: CostModel, clock: SimClock, *, num_kv_blocks: int,
                 block_size: int, max_model_len: int, vocab_size: int = 32_000,
                 on_step: StepObserver | None = None, seed: int = 0) -> None:
        self.cost_model = cost_model
        self._rng = np.random.default_rng(seed) if cost_model.step_noise > 0 else None
        self.clock = clock
        self.num_kv_blocks = num_kv_blocks
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.vocab_size = vocab_size
        self.eos_token_id: int | None = None
        self.num_steps = 0
        self._on_step = on_step

    def execute_model(self, model_input: ModelInput) -> ModelRunnerOutput:
        """Advance the clock by the step's cost (times the noise factor, when
        the cost model has ``step_noise``); sample :data:`FAKE_TOKEN` per
        sampling row.

        Args:
            model_input: the step the engine built.
        Returns:
            ``{row: FAKE_TOKEN}`` for each ``model_input.sample_rows`` entry.
        Raises:
            ValueError: the cost model gives a step time that is not > 0.
        """
        prompt = np.fromiter(map(_NUM_PROMPT_TOKENS, model_input.requests), np.int64,
                             len(model_input.requests))
        work = StepWork.from_arrays(model_input.num_computed_tokens,
                                    model_input.num_scheduled_tokens, prompt)
        duration = self.cost_model.step_time(work)
        if self._rng is not None:  # median-preserving: the fit is to median times
            duration *= float(np.exp(self.cost_model.step_noise * self._rng.standard_normal()))
        if not duration > 0:
            raise ValueError(f"cost model gives a step time of {duration} for {work}")
        start = self.clock.now
        self.clock.advance(duration)
        self.num_steps += 1
        if self._on_step is not None:
            self._on_step(model_input, work, start, self.clock.now)
        return ModelRunnerOutput(dict.fromkeys(model_input.sample_rows.tolist(), FAKE_TOKEN))
