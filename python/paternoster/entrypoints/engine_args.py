"""Engine options shared by the CLI flags and ``LLM(**kwargs)``: one name each."""

from __future__ import annotations

import argparse
import json
import os
import re
from pathlib import Path
from typing import Any

from paternoster.config import (
    LOAD_FORMATS,
    SUPPORTED_DTYPES,
    CacheConfig,
    EngineConfig,
    ModelConfig,
    SchedulerConfig,
    TimelineConfig,
)
from paternoster.scheduling.registry import load_scheduler_class

_UNITS = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3,
    "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4,
}  # fmt: skip


def parse_bytes(text: str | int) -> int:
    """Parse a byte count: ``1073741824``, ``512MiB``, ``2GiB``, ``1.5GB``.

    Returns:
        The number of bytes (int).
    Raises:
        ValueError: not a number with an optional unit (B, KB, MB, GB, KiB,
            MiB, GiB, TiB; case-insensitive).
    """
    if isinstance(text, int):
        return text
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(text))
    if not m or m.group(2).lower() not in _UNITS:
        raise ValueError(f"not a byte count: {text!r} (e.g. 1073741824, 512MiB, 2GiB)")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def resolve_model_dir(model: str | None) -> str:
    """The model directory: ``model`` itself, or the embedded default model
    (converted on first use, with a progress bar) when ``None``."""
    if model is not None:
        return model
    from paternoster.model.default_model import default_model_dir

    return str(default_model_dir())


def build_engine_config(
    model: str,
    *,
    served_model_name: str | None = None,
    dtype: str = "auto",
    max_model_len: int | None = None,
    block_size: int = 16,
    num_kv_blocks: int | None = None,
    kv_cache_memory: int | str | None = None,
    enable_prefix_caching: bool = True,
    max_num_seqs: int | None = None,
    max_num_batched_tokens: int | None = None,
    scheduler: str = "fcfs",
    scheduler_config: dict | str | None = None,
    num_threads: int | None = None,
    seed: int = 0,
    device: str = "cpu",
    gpu_memory_utilization: float = 0.9,
    cuda_graphs: bool = False,
    batch_invariant: bool = False,
    load_format: str = "safetensors",
    timeline_size: int = 0,
    timeline_sample_rate: float = 1.0,
    timeline_max_requests: int | None = None,
    tensor_parallel_size: int = 1,
) -> EngineConfig:
    """Build an :class:`EngineConfig` from the flat option names of the CLI.

    Args:
        model: model directory.
        served_model_name: id reported by /v1/models (default: engine's).
        dtype: ``auto``, ``float32``, ``bfloat16`` or ``float16``.
        max_model_len: context length in tokens (default: the model's).
        block_size: tokens per KV block.
        num_kv_blocks: KV blocks (overrides ``kv_cache_memory``).
        kv_cache_memory: bytes (int or e.g. ``"2GiB"``) for the KV cache.
        enable_prefix_caching: automatic prefix caching (reuse the KV blocks
            of shared prompt prefixes).
        max_num_seqs: most requests per step.
        max_num_batched_tokens: token budget per step.
        scheduler: scheduler plugin name (entry-point group ``paternoster.schedulers``).
        scheduler_config: the policy's options: a dict, a JSON object string,
            or the path of a JSON file.
        num_threads: threads for torch and the C++ kernels in the engine;
            ``None`` or 0 = auto (the physical cores available, one left to
            the frontend process when >= 8; see
            :mod:`paternoster.engine.cpu_threads`).
        seed: engine-wide RNG seed.
        device: ``cpu``, ``cuda`` or ``cuda:N``.
        gpu_memory_utilization: CUDA: fraction of GPU memory for weights,
            activations and KV cache (sizes the KV cache unless ``num_kv_blocks``).
        cuda_graphs: CUDA: replay captured graphs for decode batches.
        batch_invariant: outputs independent of batching (CPU; see
            :class:`~paternoster.config.ModelConfig`).
        load_format: ``safetensors`` or ``dummy`` (random weights, benchmarks).
        timeline_size: engine steps the request timeline keeps (0 = off).
        timeline_sample_rate: fraction of requests the timeline records.
        timeline_max_requests: requests the timeline keeps (default: ``timeline_size``).
        tensor_parallel_size: ranks the model is split over (gloo on
            ``cpu``, NCCL on ``cuda`` with rank r on GPU r; the engine is
            rank 0 and starts N-1 worker processes; see
            :mod:`paternoster.engine.tensor_parallel`). ``num_threads`` is
            then per rank (auto: the usable cores split between the ranks).
    Returns:
        The validated config.
    Raises:
        ValueError: a value out of range (the message names it), or
            ``tensor_parallel_size`` > 1 with a device other than ``cpu``
            and ``cuda``,
            ``load_format="dummy"`` or ``batch_invariant`` (the model's own
            limits are checked when the engine starts).
    """
    cache = {"block_size": block_size, "num_kv_blocks": num_kv_blocks,
             "gpu_memory_utilization": gpu_memory_utilization,
             "enable_prefix_caching": enable_prefix_caching}
    if kv_cache_memory is not None:
        cache["kv_cache_memory"] = parse_bytes(kv_cache_memory)
    policy = load_scheduler_class(scheduler)  # unknown name: ValueError listing them
    policy_config = parse_scheduler_config(scheduler_config)
    policy.check_options(policy_config)  # a typo or bad value fails now, not after the model loads
    sched: dict = {"scheduler": scheduler, "policy_config": policy_config}
    if max_num_seqs is not None:
        sched["max_num_seqs"] = max_num_seqs
    if max_num_batched_tokens is not None:
        sched["max_num_batched_tokens"] = max_num_batched_tokens
    num_threads = 0 if num_threads is None else num_threads
    if isinstance(num_threads, bool) or not isinstance(num_threads, int):
        raise ValueError(f"num_threads must be an int (>= 1, or 0 for auto), got "
                         f"{num_threads!r}")
    if num_threads < 0:
        raise ValueError(f"num_threads must be >= 1, or 0 for auto; got {num_threads}")
    return EngineConfig(
        model=ModelConfig(
            model=model,
            dtype=dtype,
            max_model_len=max_model_len,
            served_model_name=served_model_name,
            device=device,
            load_format=load_format,
            cuda_graphs=cuda_graphs,
            batch_invariant=batch_invariant,
        ),
        cache=CacheConfig(**cache),
        scheduler=SchedulerConfig(**sched),
        num_threads=num_threads,
        seed=seed,
        tensor_parallel_size=tensor_parallel_size,
        timeline=TimelineConfig(
            size=timeline_size,
            sample_rate=timeline_sample_rate,
            max_requests=timeline_max_requests,
        ),
    )


ENGINE_ARG_NAMES = (
    "served_model_name", "dtype", "max_model_len", "block_size", "num_kv_blocks",
    "kv_cache_memory", "max_num_seqs", "max_num_batched_tokens", "scheduler",
    "scheduler_config", "num_threads", "seed", "device", "gpu_memory_utilization",
    "cuda_graphs", "batch_invariant", "load_format", "timeline_size", "timeline_sample_rate",
    "timeline_max_requests", "enable_prefix_caching", "tensor_parallel_size",
)  # fmt: skip


def parse_scheduler_config(value: dict | str | os.PathLike | None) -> dict:
    """A policy's options from a dict, a JSON object string or a JSON file path
    (a string or an ``os.PathLike``).

    Raises:
        ValueError: not a JSON object, an empty or blank string, an unreadable
            file, malformed JSON or a key given twice.
    """
    if value is None:
        return {}
    if isinstance(value, dict):
        return dict(value)
    if isinstance(value, os.PathLike):
        parsed = _read_json_file(os.fspath(value))
        if not isinstance(parsed, dict):
            raise ValueError(f"scheduler_config must be a JSON object, got "
                             f"{type(parsed).__name__}")  # fmt: skip
        return parsed
    if not isinstance(value, str):
        raise ValueError(f"scheduler_config must be a dict, a JSON object string or a file "
                         f"path, got {type(value).__name__}")  # fmt: skip
    if not value.strip():
        raise ValueError("scheduler_config is empty: give a JSON object (e.g. '{}') or a file")
    try:
        parsed = _loads(value)
    except json.JSONDecodeError as e:
        if value.lstrip().startswith("{"):
            raise ValueError(f"scheduler_config is not valid JSON: {e}") from None
        parsed = _read_json_file(value)
    if not isinstance(parsed, dict):
        raise ValueError(f"scheduler_config must be a JSON object, got {type(parsed).__name__}")
    return parsed


class _Pairs(dict):
    """A parsed JSON object remembering the first key it was given twice."""

    duplicate: str | None = None


def _unique_keys(pairs: list[tuple[str, Any]]) -> _Pairs:
    """A JSON object's pairs as a dict that remembers a key given twice (plain
    ``json.loads`` keeps the last one silently); :func:`_plain` reports it
    with where it sits, which this hook, called innermost first, cannot know."""
    out = _Pairs()
    for key, val in pairs:
        if key in out and out.duplicate is None:
            out.duplicate = key
        out[key] = val
    return out


def _plain(value: Any, where: str = "") -> Any:
    """``value`` with every :class:`_Pairs` turned into a plain dict.

    Raises:
        ValueError: an object gave a key twice, naming the key and the option
            path it sits under (``classes.interactive``).
    """
    if isinstance(value, dict):
        dup = getattr(value, "duplicate", None)
        if dup is not None:
            at = f" in {where}" if where else ""
            raise ValueError(f"scheduler_config gives the key {dup!r} twice{at}")
        return {k: _plain(v, f"{where}.{k}" if where else k) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v, f"{where}[{i}]") for i, v in enumerate(value)]
    return value


def _loads(text: str) -> Any:
    """``json.loads`` refusing duplicate keys (ValueError naming where)."""
    return _plain(json.loads(text, object_pairs_hook=_unique_keys))


def _read_json_file(path: str) -> Any:
    """The JSON in the file ``path`` (``--scheduler-config`` given as a path).

    Raises:
        ValueError: unreadable file or malformed JSON.
    """
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        raise ValueError(
            f"scheduler_config must be a JSON object (e.g. '{{\"ttft_s\": 2}}') or the path "
            f"of a JSON file; {path!r} is not JSON and no such file exists") from None
    except OSError as e:
        raise ValueError(f"scheduler_config file {path!r} cannot be read: {e}") from None
    try:
        return _loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"scheduler_config file {path} is not valid JSON: {e}") from None


def positive_int(text: str) -> int:
    """An argparse type: an integer >= 1.

    Raises:
        argparse.ArgumentTypeError: not an integer, or below 1.
    """
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def add_engine_args(parser: argparse.ArgumentParser) -> None:
    """Add the engine flags (``--dtype``, ``--block-size``, ...) to ``parser``;
    their dests are :data:`ENGINE_ARG_NAMES`."""
    g = parser.add_argument_group("engine")
    g.add_argument("--served-model-name", default=None, help="model id in the API")
    g.add_argument("--dtype", choices=SUPPORTED_DTYPES, default="auto")
    g.add_argument("--max-model-len", type=int, default=None, help="context length (tokens)")
    g.add_argument("--block-size", type=int, default=16, help="tokens per KV block")
    g.add_argument("--num-kv-blocks", type=int, default=None, help="KV cache blocks")
    g.add_argument(
        "--kv-cache-memory", type=parse_bytes, default=None,
        help="CPU KV cache size in bytes, e.g. 1073741824 or 2GiB (ignored with "
             "--num-kv-blocks; on CUDA see --gpu-memory-utilization)",
    )  # fmt: skip
    g.add_argument(
        "--no-prefix-caching", dest="enable_prefix_caching", action="store_false",
        help="turn off automatic prefix caching (on by default: KV blocks of shared "
             "prompt prefixes are reused)",
    )  # fmt: skip
    g.add_argument(
        "--enable-prefix-caching", dest="enable_prefix_caching", action="store_true",
        default=True, help=argparse.SUPPRESS,
    )  # fmt: skip
    g.add_argument("--max-num-seqs", type=int, default=None, help="most requests per step")
    g.add_argument("--max-num-batched-tokens", type=int, default=None, help="tokens per step")
    g.add_argument("--scheduler", default="fcfs", help="scheduler plugin name")
    g.add_argument(
        "--scheduler-config", default=None,
        help="the scheduler's options: a JSON object or the path of a JSON file",
    )  # fmt: skip
    g.add_argument(
        "--num-threads", type=int, default=0, metavar="N",
        help="threads for torch and the C++ kernels in the engine (default 0 = auto: the "
             "physical cores available to the process, SMT siblings counted once, capped by "
             "a cgroup CPU quota; with >= 8 cores one is left to the frontend and the engine "
             "is pinned to the others; env PATERNOSTER_NUM_THREADS replaces auto)",
    )  # fmt: skip
    g.add_argument("--seed", type=int, default=0)
    g.add_argument(
        "--tensor-parallel-size", "-tp", type=positive_int, default=1, metavar="N",
        help="split the model over N ranks (over gloo on --device cpu, over NCCL with "
             "rank r on GPU r on --device cuda: the engine process is rank 0 "
             "and starts N-1 worker processes; Llama/Mistral/Qwen2/Qwen3 dense safetensors "
             "checkpoints; --num-threads is then per rank, auto splits the cores between "
             "the ranks, each pinned to its own; docs/tensor_parallel.md)",
    )  # fmt: skip
    g.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    g.add_argument(
        "--gpu-memory-utilization", type=float, default=0.9,
        help="CUDA: fraction of GPU memory for weights, activations and KV cache "
             "(sizes the KV cache unless --num-kv-blocks is given)",
    )  # fmt: skip
    g.add_argument(
        "--cuda-graphs", action="store_true",
        help="CUDA: capture decode steps in CUDA graphs for padded batch sizes",
    )  # fmt: skip
    g.add_argument(
        "--batch-invariant", action="store_true",
        help="a request's tokens and logprobs bit-identical whatever else is batched with it, "
        "however its prompt is chunked, with or without prefix-cache hits and preemption "
        "(CPU; costs throughput at large batches, see docs/benchmarks.md)",
    )
    g.add_argument(
        "--load-format", choices=LOAD_FORMATS, default="safetensors",
        help="dummy = random weights of the config's shapes (benchmarks)",
    )  # fmt: skip
    t = parser.add_argument_group("request timelines (GET /debug/timeline, paternoster trace)")
    t.add_argument(
        "--timeline-size", type=int, default=0, metavar="STEPS",
        help="engine steps the request timeline keeps in its ring buffer (0 = off, the default)",
    )  # fmt: skip
    t.add_argument(
        "--timeline-sample-rate", type=float, default=1.0, metavar="F",
        help="fraction of requests the timeline records, chosen by a hash of the id (1.0)",
    )  # fmt: skip
    t.add_argument(
        "--timeline-max-requests", type=int, default=None, metavar="N",
        help="requests the timeline keeps at once; the oldest finished go first "
             "(default: --timeline-size)",
    )  # fmt: skip
