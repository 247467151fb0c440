"""How :class:`~paternoster.engine.core.EngineCore` builds its parts from a
config: its threads, the runner (or the tensor-parallel ranks), the paged KV
cache for the runner's layout, the scheduler's limits for a policy that keeps
prompts whole, and the served model's name."""

from __future__ import annotations

import dataclasses
import logging
import re

from paternoster import _core
from paternoster.config import EngineConfig, ModelConfig, SchedulerConfig
from paternoster.engine.cpu_threads import ThreadChoice, resolve_threads
from paternoster.model.interface import Runner
from paternoster.model.runner import ModelRunner

# The engine's construction log lines, under the engine's logger name.
logger = logging.getLogger("paternoster.engine.core")


def resolve_engine_threads(config: EngineConfig, tp: bool) -> tuple[EngineConfig, ThreadChoice]:
    """The threads of an engine built in this process.

    Args:
        config: the engine's config.
        tp: this process is rank 0 of ``config.tensor_parallel_size`` ranks
            and starts the others.
    Returns:
        ``config`` with the resolved ``num_threads`` (and, with ``tp``, every
        rank's share planned), and the choice. On CPU it also logs the core's
        SIMD variants, with a warning when ``PATERNOSTER_CPU_ISA`` named one
        it could not apply.
    Raises:
        ValueError: ``PATERNOSTER_NUM_THREADS`` not an int >= 1.
    """
    # num_threads 0 = auto: every usable physical core, no pinning (in-process;
    # the engine process resolves it first, leaving a core to the frontend).
    # Tensor parallel: each rank's share (rank 0 here, unpinned in-process).
    if tp:
        from paternoster.engine import tensor_parallel

        if config.rank_threads is None:
            config = tensor_parallel.plan_ranks(config, reserve_frontend=False,
                                                pin_rank0=False)
        threads = tensor_parallel.rank0_threads(config)
    else:
        threads = resolve_threads(config.num_threads, reserve_frontend=False)
    if config.num_threads != threads.num_threads:
        config = dataclasses.replace(config, num_threads=threads.num_threads)
    if config.model.device == "cpu":  # which SIMD code the kernels run, said once
        from paternoster.kernels import cpu

        simd, warning = cpu.simd_variants()
        logger.info("CPU kernels: %s; %s", simd, cpu.describe_linear_split(
            config.model.batch_invariant))
        if warning:
            logger.warning("%s", warning)
    return config, threads


def make_runner(config: EngineConfig, tp: bool) -> Runner:
    """The real runner for ``config``: a :class:`~paternoster.model.runner.ModelRunner`,
    or with ``tp`` rank 0 of the tensor-parallel ranks it starts
    (:mod:`paternoster.engine.tensor_parallel`).

    Raises:
        ValueError: unsupported architecture, bad sizes, a model that tensor
            parallel does not split.
        RuntimeError: a tensor-parallel worker exited or did not start in time.
    """
    if tp:
        from paternoster.engine import tensor_parallel

        return tensor_parallel.start_tensor_parallel(config)
    return ModelRunner(
        config.model, config.cache, max_num_seqs=config.scheduler.max_num_seqs,
        max_num_batched_tokens=config.scheduler.max_num_batched_tokens,
    )


def make_kv_cache_manager(runner: Runner, enable_prefix_caching: bool) -> _core.KVCacheManager:
    """The C++ ``KVCacheManager`` for ``runner``'s blocks and KV cache groups
    (sliding windows, recurrent state slots).

    Prefix caching is turned off (with a log line) for a model with
    linear-attention layers: their recurrent state is not saved at block
    boundaries.
    """
    windows = list(getattr(runner, "kv_cache_group_windows", (0,)))
    recurrent = list(getattr(runner, "kv_cache_group_recurrent", ()) or ())
    caching = enable_prefix_caching
    if caching and any(recurrent):
        logger.info("prefix caching off: the model's recurrent layers (linear attention, "
                    "Mamba2 or short convolutions) keep a state that is not saved at block "
                    "boundaries")
        caching = False
    return _core.KVCacheManager(
        runner.num_kv_blocks,
        runner.block_size,
        enable_caching=caching,
        # Runners without KV cache groups have one full-attention group.
        sliding_windows=windows,
        recurrent=recurrent or None,
        num_state_slots=int(getattr(runner, "num_state_slots", 0) or 0),
    )


def fit_scheduler_config(scheduler_cls: type, sched_config: SchedulerConfig, runner: Runner,
                         max_model_len: int) -> tuple[SchedulerConfig, int]:
    """Fit the context length and the token budget to a policy that keeps
    prompts whole (``supports_chunked_prefill`` False); a chunked-prefill
    policy gets them unchanged. Each change is logged.

    Args:
        scheduler_cls: the policy class.
        sched_config: the configured scheduler settings.
        runner: the runner (its ``kv_layout``, when it has one, bounds the
            context a whole prompt's step can hold).
        max_model_len: the runner's context length.
    Returns:
        ``(sched_config, max_model_len)``: the token budget raised to the
        context length, the context length lowered to what a whole prompt's
        step fits in the KV cache.
    """
    layout = getattr(runner, "kv_layout", None)
    if layout is not None and not scheduler_cls.supports_chunked_prefill:
        # A whole prompt's step holds every block of its context in every
        # KV cache group (a window releases blocks only as later steps
        # advance): the runner's cap assumed chunks of the token budget.
        whole = layout.max_tokens(runner.num_kv_blocks, runner.block_size,
                                  max_model_len, max_model_len)
        if whole < max_model_len:
            logger.info(
                "scheduler %r keeps prompts whole: max_model_len %d -> %d (a prompt's "
                "step needs all its blocks in every KV cache group; a chunked-prefill "
                "scheduler keeps the sliding-window layers to a window plus a chunk)",
                sched_config.scheduler, max_model_len, whole,
            )
            max_model_len = whole
    if (
        not scheduler_cls.supports_chunked_prefill
        and sched_config.max_num_batched_tokens < max_model_len
    ):
        logger.info(
            "scheduler %r keeps prompts whole: raising max_num_batched_tokens from %d to "
            "max_model_len (%d)",
            sched_config.scheduler,
            sched_config.max_num_batched_tokens,
            max_model_len,
        )
        sched_config = dataclasses.replace(
            sched_config, max_num_batched_tokens=max_model_len
        )
    return sched_config, max_model_len


def served_model_name(model: ModelConfig) -> str:
    """The model's id: ``served_model_name``, else the directory's name, or a
    GGUF file's name without ".gguf" (as llama-server names it) and, for the
    first file of a split model, without its ``-00001-of-0000N`` part."""
    name = model.served_model_name or str(model.model).rstrip("/").split("/")[-1]
    if name.lower().endswith(".gguf") and not model.served_model_name:
        name = re.sub(r"-\d{5}-of-\d{5}$", "", name[: -len(".gguf")])
    return name
