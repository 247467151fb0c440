"""Configuration dataclasses. Each validates its fields and raises ``ValueError``
naming the field; none is mutated after construction."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

SUPPORTED_DTYPES = ("auto", "float32", "bfloat16", "float16")
SUPPORTED_DEVICES = ("cpu", "cuda")
LOAD_FORMATS = ("safetensors", "dummy")


@dataclass(frozen=True)
class ModelConfig:
    """Which model to load and how.

    Attributes:
        model: path to a local HF model directory (config.json, *.safetensors,
            tokenizer files), or a ``.gguf`` file (config, tokenizer and chat
            template from its metadata; Q8_0/Q4_0/Q4_1 weights kept quantized
            on CPU, dequantized at load on CUDA).
        dtype: ``auto`` (the checkpoint's ``torch_dtype``), ``float32``,
            ``bfloat16`` or ``float16``.
        max_model_len: context length in tokens (prompt + output); ``None``
            means the model's ``max_position_embeddings`` (further capped by
            the KV cache size).
        served_model_name: name reported by /v1/models; defaults to the
            directory name.
        device: torch device string: ``cpu``, ``cuda`` or ``cuda:N`` (the CUDA
            kernels run float16/bfloat16; ``auto`` picks bfloat16 for a float32
            checkpoint there).
        load_format: ``safetensors`` (the checkpoint's weights) or ``dummy``
            (random weights of the config's shapes, for benchmarks; only
            ``config.json`` is read).
        cuda_graphs: on CUDA, capture the decode forward in CUDA graphs for a
            few padded batch sizes and replay them (saves the per-kernel
            launch overhead, which dominates small decode batches).
        batch_invariant: a request's tokens and logprobs bit-identical
            whatever else is in its step, however its prompt is chunked,
            whether it hits the prefix cache or is preempted (CPU only: fixed
            reduction-order linear kernels, float32 logits).
    """

    model: str
    dtype: str = "auto"
    max_model_len: int | None = None
    served_model_name: str | None = None
    device: str = "cpu"
    load_format: str = "safetensors"
    cuda_graphs: bool = False
    batch_invariant: bool = False

    def __post_init__(self) -> None:
        if self.dtype not in SUPPORTED_DTYPES:
            raise ValueError(f"dtype must be one of {SUPPORTED_DTYPES}, got {self.dtype!r}")
        kind, _, index = self.device.partition(":")
        if kind not in SUPPORTED_DEVICES or (index and (kind != "cuda" or not index.isdigit())):
            raise ValueError(f"device must be cpu, cuda or cuda:N, got {self.device!r}")
        if self.load_format not in LOAD_FORMATS:
            raise ValueError(f"load_format must be one of {LOAD_FORMATS}, got {self.load_format!r}")
        if self.batch_invariant and kind != "cpu":
            raise ValueError("batch_invariant needs device 'cpu' (the CUDA kernels have no "
                             "batch-invariant mode yet)")
        if self.max_model_len is not None and self.max_model_len < 1:
            raise ValueError(f"max_model_len must be >= 1, got {self.max_model_len}")


@dataclass(frozen=True)
class CacheConfig:
    """Paged KV cache size and shape.

    Attributes:
        block_size: tokens per KV block (8, 16 or 32 are tested).
        num_kv_blocks: number of blocks per layer; if ``None``, derived from
            ``kv_cache_memory`` (CPU) or ``gpu_memory_utilization`` (CUDA).
        kv_cache_memory: CPU: bytes for the whole KV cache (all layers, K and V).
        gpu_memory_utilization: CUDA: fraction of the GPU's total memory this
            engine may use for weights, activations and KV cache together; the
            KV cache gets what the weights and a profiling forward of the
            largest step leave (measured with ``torch.cuda.mem_get_info``).
        enable_prefix_caching: automatic prefix caching (after vLLM's): full
            blocks are kept, found by a hash of their whole prefix, and reused
            by later requests with the same prefix (``--no-prefix-caching``
            turns it off).
    """

    block_size: int = 16
    num_kv_blocks: int | None = None
    kv_cache_memory: int = 1 << 30
    gpu_memory_utilization: float = 0.9
    enable_prefix_caching: bool = True

    def __post_init__(self) -> None:
        if self.block_size < 1 or self.block_size > 256:
            raise ValueError(f"block_size must be in [1, 256], got {self.block_size}")
        if self.num_kv_blocks is not None and self.num_kv_blocks < 1:
            raise ValueError(f"num_kv_blocks must be >= 1, got {self.num_kv_blocks}")
        if self.kv_cache_memory < 1:
            raise ValueError(f"kv_cache_memory must be >= 1 byte, got {self.kv_cache_memory}")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(
                f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}"
            )


@dataclass(frozen=True)
class SchedulerConfig:
    """Which scheduling policy and its per-step limits.

    Attributes:
        scheduler: name of a policy registered under the entry-point group
            ``paternoster.schedulers`` (e.g. ``fcfs``).
        max_num_seqs: most requests in one step.
        max_num_batched_tokens: token budget of one step (sum of
            ``num_scheduled_tokens``).
        policy_config: policy-specific options (JSON object).
    """

    scheduler: str = "fcfs"
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    policy_config: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {self.max_num_seqs}")
        if self.max_num_batched_tokens < 1:
            raise ValueError(
                f"max_num_batched_tokens must be >= 1, got {self.max_num_batched_tokens}"
            )


@dataclass(frozen=True)
class TimelineConfig:
    """Request timelines (docs/metrics.md): bounded records of steps and requests.

    Attributes:
        size: engine steps kept in the ring buffer; 0 turns timelines off.
        sample_rate: fraction of requests recorded, in [0, 1] (a hash of the
            request id decides, so the choice is reproducible).
        max_requests: requests kept at once (the oldest finished one is
            evicted first); ``None`` means ``size``.
    """

    size: int = 0
    sample_rate: float = 1.0
    max_requests: int | None = None

    def __post_init__(self) -> None:
        if self.size < 0:
            raise ValueError(f"timeline size must be >= 0 steps (0 = off), got {self.size}")
        if not 0.0 <= self.sample_rate <= 1.0:
            raise ValueError(f"timeline sample_rate must be in [0, 1], got {self.sample_rate}")
        if self.max_requests is not None and self.max_requests < 1:
            raise ValueError(f"timeline max_requests must be >= 1, got {self.max_requests}")


@dataclass(frozen=True)
class EngineConfig:
    """Everything the engine process needs (sent to it as a msgpack map).

    ``num_threads``: threads for torch and the C++ kernels in the engine; 0 =
    auto, resolved by the engine where it runs (the physical cores available,
    one left to the frontend on machines with >= 8: see
    :mod:`paternoster.engine.cpu_threads`).

    ``cpus``: CPUs the engine process pins itself to (``None``: the engine
    decides). Set by the frontend for data-parallel engines, each on cores of
    its own, together with their ``num_threads``.

    ``tensor_parallel_size``: ranks the model is split over (1: no split).
    Above 1 the engine is rank 0 and starts the other ranks as worker
    processes (docs/tensor_parallel.md): over gloo on ``device="cpu"``, over
    NCCL on ``device="cuda"`` with rank r on GPU r; ``num_threads`` is
    then each rank's count (0 = auto: the usable cores split between the
    ranks).

    ``rank_threads``: each tensor-parallel rank's ``(num_threads, cpus)``,
    rank 0 first, ``cpus`` empty for a rank left unpinned; ``None`` until the
    engine resolves them (:func:`paternoster.engine.tensor_parallel.plan_ranks`).
    """

    model: ModelConfig
    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    timeline: TimelineConfig = field(default_factory=TimelineConfig)
    num_threads: int = 0
    seed: int = 0
    cpus: tuple[int, ...] | None = None
    tensor_parallel_size: int = 1
    rank_threads: tuple[tuple[int, tuple[int, ...]], ...] | None = None

    def __post_init__(self) -> None:
        if self.cpus is not None and (not self.cpus or min(self.cpus) < 0):
            raise ValueError(f"cpus must be a non-empty list of CPU numbers, got {self.cpus}")
        tp = self.tensor_parallel_size
        if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
            raise ValueError(f"tensor_parallel_size must be an integer >= 1, got {tp!r}")
        if tp > 1:
            m = self.model
            why = (f"device must be 'cpu' (gloo) or 'cuda' (NCCL, rank r on GPU r), got "
                   f"{m.device!r}" if m.device not in ("cpu", "cuda")
                   else "load_format 'dummy' is not supported (ranks load shards of "
                   "safetensors)" if m.load_format == "dummy"
                   else "batch_invariant is not supported" if m.batch_invariant
                   else "cpus (a data-parallel engine's) are not supported: tensor parallel "
                   "runs with --data-parallel-size 1" if self.cpus is not None else None)
            if why is not None:
                raise ValueError(f"tensor_parallel_size={tp}: {why}")
        if self.rank_threads is not None and len(self.rank_threads) != tp:
            raise ValueError(f"rank_threads must have tensor_parallel_size={tp} entries, got "
                             f"{len(self.rank_threads)}")

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> EngineConfig:
        return cls(
            model=ModelConfig(**d["model"]),
            cache=CacheConfig(**d.get("cache", {})),
            scheduler=SchedulerConfig(**d.get("scheduler", {})),
            timeline=TimelineConfig(**d.get("timeline", {})),
            num_threads=int(d.get("num_threads", 0)),
            seed=int(d.get("seed", 0)),
            cpus=None if d.get("cpus") is None else tuple(int(c) for c in d["cpus"]),
            tensor_parallel_size=int(d.get("tensor_parallel_size", 1)),
            rank_threads=None if d.get("rank_threads") is None else tuple(
                (int(n), tuple(int(c) for c in cpus)) for n, cpus in d["rank_threads"]),
        )
