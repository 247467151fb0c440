"""ModelRunner: owns the model and its paged KV cache; runs one forward pass and
samples one step."""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path

import numpy as np
import torch

from paternoster import kernels
from paternoster.config import CacheConfig, ModelConfig
from paternoster.model import huge_pages, recurrent_state
from paternoster.model.attention import AttentionMetadata, AttentionOps, default_attention_ops
from paternoster.model.interface import ModelInput, ModelRunnerOutput
from paternoster.model.kv_layout import kv_cache_layout
from paternoster.model.loader import (
    dummy_model,
    load_hf_config,
    load_model,
    model_class,
    resolve_dtype,
)
from paternoster.model.parallel.group import TPGroup
from paternoster.model.parallel.shard import check_heads
from paternoster.model.parallel.tp_model import load_tp_model
from paternoster.model.sampler import Sampler
from paternoster.model.torch_threads import torch_threads_off

logger = logging.getLogger(__name__)

#: How long the core's kernel threads poll between calls (microseconds) in a
#: step whose matrix multiplies all run in the core (small decode batches,
#: quantized weights, batch-invariant mode: kernels back to back, a futex
#: wake-up per call would cost more than the split gains), and in other steps
#: (torch's GEMM threads need the cores between the core's kernels). Measured
#: with bench/offline.py --decode-batches (docs/benchmarks.md, "CPU decode").
CORE_STEP_SPIN_US = 100
TORCH_STEP_SPIN_US = 30

_BATCH_DTYPES = {
    "input_ids": np.int64,
    "positions": np.int64,
    "slot_mapping": np.int64,
    "block_tables": np.int32,
    "seq_lens": np.int32,
    "query_start_loc": np.int32,
    "logits_indices": np.int64,
}


class ModelRunner:
    """Loads a model and allocates its KV cache; turns a step into sampled tokens.

    Implements :class:`~paternoster.model.interface.Runner`:
    :meth:`execute_model` runs the forward pass (:meth:`compute_logits`) and
    the sampling stage (:meth:`Sampler.sample_step
    <paternoster.model.sampler.Sampler.sample_step>`: logits processors,
    sampler, logprobs, prompt logprobs).

    On CUDA (``model_config.device``): the weights are loaded straight onto
    the GPU (or drawn at random, ``load_format="dummy"``), then, unless
    ``num_kv_blocks`` is given, a profiling forward of the largest step
    (``max(max_num_batched_tokens, max_model_len)`` tokens) measures the peak
    activation memory and the KV cache gets
    ``gpu_memory_utilization * total - peak - memory used outside torch``
    (``torch.cuda.mem_get_info``). The CUDA kernels get host-side bounds
    (``max_query_len``, ``max_seq_len``) and a preallocated split-K workspace;
    with ``model_config.cuda_graphs`` decode steps replay captured graphs
    (:class:`~paternoster.model.cuda_graphs.DecodeGraphs`).

    Args:
        model_config: model directory, dtype, ``max_model_len``, device.
        cache_config: block size and number of blocks (or memory budget).
        attn_ops: paged-attention kernels; default :mod:`paternoster.ops`.
        max_num_seqs: CUDA: most sequences of a step (workspace, graph sizes).
        max_num_batched_tokens: CUDA: token budget of a step (profiling).
        tp: the tensor-parallel group this runner is one rank of (None: the
            whole model here). With ``tp.size > 1`` (safetensors weights,
            Llama/Qwen2/Qwen3 dense; on CUDA rank r runs on GPU r over NCCL,
            its KV blocks the least any rank's free memory holds, without
            CUDA graphs) the runner holds its shard
            (:class:`~paternoster.model.parallel.tp_model.TensorParallelCausalLM`)
            and a KV cache of ``Hkv / tp.size`` heads; every rank must run
            :meth:`compute_logits` on the same batch, and each gets the full logits.

    Attributes:
        hf_config: the transformers config. model_dir: pathlib.Path.
        dtype: torch dtype of weights, activations and KV cache.
        block_size: tokens per KV block. num_kv_blocks: blocks in the pool
            (each holds one block of K and V in every cache slot).
        kv_layout: the layers' KV cache groups and shared cache slots
            (:class:`~paternoster.model.kv_layout.KVCacheLayout`).
        kv_cache_group_windows: each KV cache group's sliding window (0: full
            attention), for the engine's ``KVCacheManager``.
        max_model_len: context cap in tokens = min(requested or
            ``max_position_embeddings``, the longest context one request can
            hold in ``num_kv_blocks``: every block in full-attention groups,
            about a window plus a step's tokens in sliding-window groups).
        vocab_size: logits width V.
        eos_token_id: from ``generation_config.json`` if present, else the
            config (first one if a list), or None.
        kv_caches: per layer (key_cache, value_cache), each
            [num_kv_blocks, block_size, Hkv, D], zero-initialised; layers of
            different KV cache groups share these tensors (``kv_layout``).

    Raises:
        ValueError: unsupported architecture or dtype; a tensor-parallel
            group with dummy weights, batch-invariant, or with sizes that do not
            split over it; a KV cache budget too
            small for one block; ``max_model_len`` above the model's
            ``max_position_embeddings``; CUDA requested without a GPU or
            without the CUDA kernels built.
        ImportError: ``attn_ops`` not given and :mod:`paternoster.ops` is not built.
    """

    def __init__(self, model_config: ModelConfig, cache_config: CacheConfig, *,
                 attn_ops: AttentionOps | None = None, max_num_seqs: int = 256,
                 max_num_batched_tokens: int = 8192, tp: TPGroup | None = None) -> None:
        self.model_dir = Path(model_config.model).expanduser()
        self.hf_config = load_hf_config(self.model_dir)
        cfg = self.hf_config
        self.device = torch.device(model_config.device)
        self.dtype = resolve_dtype(cfg, model_config.dtype, self.device.type)
        self.block_size = cache_config.block_size
        self.num_layers = cfg.num_hidden_layers
        self.num_kv_heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.tp = tp if tp is not None and tp.size > 1 else None
        if self.tp is not None:
            check_heads(cfg.num_attention_heads, self.num_kv_heads, self.tp.size)
            self.num_kv_heads //= self.tp.size  # this rank's share of the KV heads
        self.vocab_size = cfg.vocab_size
        self.eos_token_id = self._eos_token_id()
        self.workspace: torch.Tensor | None = None  # CUDA split-K scratch
        self.graphs = None  # CUDA decode graphs
        self._kernel_hints = False  # pass max_query_len/max_seq_len/workspace to the ops
        self.sampler = Sampler()
        self._spin = -1  # kernel threads' polling time last set (_set_spin)
        check_types = getattr(model_class(cfg), "layer_types_of", None)
        if check_types is not None:  # a clear error before the layout reads them
            check_types(cfg)
        self.kv_layout = kv_cache_layout(cfg)
        self.kv_cache_group_windows = self.kv_layout.group_windows
        self.kv_cache_group_recurrent = self.kv_layout.group_recurrent
        # Recurrent layers: one state slot per running request.
        self.num_state_slots = max_num_seqs if self.kv_layout.num_recurrent_layers else 0
        self._max_chunk = max_num_batched_tokens
        ops = attn_ops if attn_ops is not None else default_attention_ops()
        if self.tp is not None and (model_config.load_format == "dummy"
                                    or model_config.batch_invariant):
            raise ValueError("tensor parallel runs with safetensors weights, not "
                             "batch-invariant; got load_format "
                             f"{model_config.load_format!r}, batch_invariant "
                             f"{model_config.batch_invariant}")
        if self.device.type == "cuda":
            self._init_cuda(model_config, cache_config, ops, attn_ops is None, max_num_seqs,
                            max_num_batched_tokens)
            return
        self.num_kv_blocks = self._num_blocks(cache_config)
        self.max_model_len = self._max_model_len(model_config)
        if self.tp is not None:
            self.model = load_tp_model(self.model_dir, cfg, self.dtype, ops, self.tp,
                                       max_positions=self.max_model_len)
        elif model_config.load_format == "dummy":
            self.model = dummy_model(cfg, self.dtype, ops, self.max_model_len, self.device,
                                     batch_invariant=model_config.batch_invariant)
        else:
            self.model = load_model(self.model_dir, cfg, self.dtype, ops,
                                    max_positions=self.max_model_len,
                                    batch_invariant=model_config.batch_invariant).to(self.device)
        self.model.set_kv_cache_layout(self.kv_layout)
        huge_pages.place_weights(self.model)  # CPU: 2 MiB pages for the weight streams
        self.kv_caches = self._allocate_caches()

    def _allocate_caches(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per layer (key_cache, value_cache): the layout's shared slots;
        for a recurrent layer its state tensors over ``num_state_slots``
        slots; None for a layer without a cache."""
        slots = [(self._empty_cache(), self._empty_cache())
                 for _ in range(self.kv_layout.num_slots)]
        states = [self._empty_states(self.num_state_slots)
                  for _ in range(self.kv_layout.num_recurrent_layers)]
        recurrent = self.kv_layout.recurrent_group
        return [None if group < 0 else states[slot] if group == recurrent else slots[slot]
                for group, slot in zip(self.kv_layout.layer_groups, self.kv_layout.layer_slots,
                                       strict=True)]

    def _empty_states(self, n: int) -> tuple[torch.Tensor, ...]:
        """One recurrent layer's state tensors for ``n`` slots
        (:func:`~paternoster.model.recurrent_state.empty_states`)."""
        return recurrent_state.empty_states(self.hf_config, n, self.dtype, self.device)

    def state_bytes(self) -> int:
        """Bytes of every recurrent layer's state for all ``num_state_slots``
        slots (0 without recurrent layers)."""
        if not self.num_state_slots:
            return 0
        per_slot = recurrent_state.slot_bytes(self.hf_config, self.dtype)
        return per_slot * self.num_state_slots * self.kv_layout.num_recurrent_layers

    def bytes_per_block(self) -> int:
        """KV cache bytes of one block id, K and V in every cache slot (all
        layers with one kind of attention; fewer with KV cache groups)."""
        elem = torch.empty((), dtype=self.dtype).element_size()
        slots = self.kv_layout.num_slots
        return 2 * slots * self.block_size * self.num_kv_heads * self.head_dim * elem

    def _num_blocks(self, cache_config: CacheConfig) -> int:
        if cache_config.num_kv_blocks is not None:
            return cache_config.num_kv_blocks
        # The linear layers' states come out of the same budget.
        n = (cache_config.kv_cache_memory - self.state_bytes()) // self.bytes_per_block()
        if n < 1:
            states = (f" after {self.state_bytes()} bytes of recurrent state for "
                      f"{self.num_state_slots} sequences" if self.state_bytes() else "")
            raise ValueError(
                f"kv_cache_memory={cache_config.kv_cache_memory} bytes is less than one block "
                f"({self.bytes_per_block()} bytes){states}"
            )
        return int(n)

    def _max_model_len(self, model_config: ModelConfig) -> int:
        cap = self._context_cap(model_config)
        fits = self.kv_layout.max_tokens(self.num_kv_blocks, self.block_size, self._max_chunk, cap)
        if fits < cap:
            logger.info("max_model_len %d -> %d: what one request can hold in %d KV blocks of %d "
                        "tokens (%s)", cap, fits, self.num_kv_blocks, self.block_size,
                        _describe_groups(self.kv_layout))
        return fits

    def _context_cap(self, model_config: ModelConfig) -> int:
        """The context limit before the KV cache size is known."""
        limit = int(self.hf_config.max_position_embeddings)
        if model_config.max_model_len is not None:
            if model_config.max_model_len > limit:
                raise ValueError(
                    f"max_model_len={model_config.max_model_len} exceeds the model's "
                    f"max_position_embeddings={limit}"
                )
            limit = model_config.max_model_len
        return limit

    def _eos_token_id(self) -> int | None:
        eos = None
        gen = self.model_dir / "generation_config.json"
        if self.model_dir.is_dir() and gen.is_file():
            eos = json.loads(gen.read_text()).get("eos_token_id")
        if eos is None:
            eos = getattr(self.hf_config, "eos_token_id", None)
        if isinstance(eos, (list, tuple)):
            eos = eos[0] if eos else None
        return None if eos is None else int(eos)

    def _empty_cache(self) -> torch.Tensor:
        shape = (self.num_kv_blocks, self.block_size, self.num_kv_heads, self.head_dim)
        if self.device.type == "cpu":
            return huge_pages.zeros(shape, self.dtype)
        return torch.zeros(shape, dtype=self.dtype, device=self.device)

    def execute_model(
        self, model_input: ModelInput | dict[str, np.ndarray]
    ) -> ModelRunnerOutput | torch.Tensor:
        """One step: the forward pass, then the sampling stage.

        Args:
            model_input: the step (:class:`~paternoster.model.interface.ModelInput`).
                Transitional: a bare batch dict (what :meth:`compute_logits`
                takes) returns that method's logits instead; callers that want
                logits should call :meth:`compute_logits`.
        Returns:
            One sampled token per ``model_input.sample_rows`` entry (keyed by
            row), token logprobs and prompt logprobs where asked.
        Raises:
            KeyError: a batch array is missing.
        """
        if isinstance(model_input, dict):
            return self.compute_logits(model_input)
        grammar = self.sampler.start_grammar(model_input, self.vocab_size)
        logits = self.compute_logits(model_input.arrays)
        return self.sampler.sample_step(logits, model_input, grammar)

    @torch.inference_mode()
    def compute_logits(self, batch: dict[str, np.ndarray]) -> torch.Tensor:
        """One forward pass over a flattened batch; logits for selected tokens.

        Args:
            batch: numpy arrays (converted zero-copy when already of the right
                dtype): ``input_ids`` int64[T], ``positions`` int64[T],
                ``slot_mapping`` int64[T], ``block_tables`` int32[B, M],
                ``seq_lens`` int32[B], ``query_start_loc`` int32[B + 1],
                ``logits_indices`` int64[N] (token rows whose logits to return,
                usually each sequence's last scheduled token).
        Returns:
            float32 [N, V] logits, on the model's device.
        Raises:
            KeyError: a batch array is missing.
        """
        if self.device.type == "cuda":
            return self._execute_cuda(batch)
        t = {name: _tensor(batch[name], dt) for name, dt in _BATCH_DTYPES.items()}
        core_only = False
        if self.device.type == "cpu":
            core_only = self.model.core_only_step(len(t["input_ids"]))
            self._set_spin(core_only)
        if self.device.type != "cpu":
            t = {name: x.to(self.device, non_blocking=True) for name, x in t.items()}
        attn = AttentionMetadata(
            slot_mapping=t["slot_mapping"],
            block_tables=t["block_tables"],
            seq_lens=t["seq_lens"],
            query_start_loc=t["query_start_loc"],
            batch_invariant=self.model.batch_invariant,
            **_group_arrays(batch, self.device),
        )
        # The hybrids' delta rule is torch matmuls between the core's kernels:
        # they keep torch's threads (not measured with them off).
        with torch_threads_off(core_only and getattr(self.model, "torch_ops_elementwise",
                                                     False)):
            hidden = self.model(t["input_ids"], t["positions"], attn, self.kv_caches)
            return self.model.compute_logits(hidden[t["logits_indices"]])

    def _set_spin(self, core_only: bool) -> None:
        """Pick the kernel threads' polling time for a step whose matrix
        multiplies all run in the core (``core_only``) or not."""
        spin = CORE_STEP_SPIN_US if core_only else TORCH_STEP_SPIN_US
        if spin != self._spin:
            kernels.set_spin_micros(spin)
            self._spin = spin

    # ------------------------------------------------------------------ CUDA

    def _init_cuda(self, model_config: ModelConfig, cache_config: CacheConfig,
                   ops: AttentionOps, own_kernels: bool, max_num_seqs: int,
                   max_num_batched_tokens: int) -> None:
        """Weights on the GPU, workspace, KV cache sized from free memory, graphs."""
        if not torch.cuda.is_available():
            raise ValueError(f"device {self.device} requested but torch sees no CUDA GPU")
        if self.tp is not None:  # rank r on GPU r (its process set it as current)
            self.device = torch.device("cuda", self.tp.rank)
        elif self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        cfg = self.hf_config
        if own_kernels:
            if not kernels.cuda_kernels_available():
                raise ValueError("device cuda needs the CUDA kernels (paternoster._cuda_ops), "
                                 "which this build does not have: install with nvcc on PATH")
        cap = self._context_cap(model_config)
        if self.tp is not None:
            self.model = load_tp_model(self.model_dir, cfg, self.dtype, ops, self.tp,
                                       max_positions=cap, device=self.device)
        elif model_config.load_format == "dummy":
            self.model = dummy_model(cfg, self.dtype, ops, cap, self.device)
        else:
            self.model = load_model(self.model_dir, cfg, self.dtype, ops, max_positions=cap,
                                    device=self.device)
        if own_kernels:
            self._kernel_hints = True
            num_heads = cfg.num_attention_heads // (self.tp.size if self.tp is not None else 1)
            self.workspace = kernels.alloc_decode_workspace(
                self.device, max_num_seqs, num_heads, self.num_kv_heads, self.head_dim, cap,
            )
        if cache_config.num_kv_blocks is not None:
            self.num_kv_blocks = cache_config.num_kv_blocks
        else:
            self.num_kv_blocks = self._profile_num_blocks(
                cache_config.gpu_memory_utilization, max(max_num_batched_tokens, cap),
                max_num_seqs,
            )
        self.max_model_len = self.kv_layout.max_tokens(self.num_kv_blocks, self.block_size,
                                                       self._max_chunk, cap)
        self.model.set_kv_cache_layout(self.kv_layout)
        self.kv_caches = self._allocate_caches()
        if model_config.cuda_graphs and self.num_state_slots:
            logger.info("CUDA graphs off: the linear-attention layers' state update reads "
                        "the batch on the host")
        elif model_config.cuda_graphs and self.tp is not None:
            logger.info("CUDA graphs off: tensor parallel's NCCL all-reduces are not "
                        "captured (each decode step launches its kernels)")
        elif model_config.cuda_graphs:
            from paternoster.model.cuda_graphs import DecodeGraphs

            self.graphs = DecodeGraphs(self.model, self.kv_caches, self.device,
                                       max_num_seqs=max_num_seqs,
                                       max_model_len=self.max_model_len,
                                       block_size=self.block_size,
                                       workspace=self.workspace if self._kernel_hints else None,
                                       kernel_hints=self._kernel_hints,
                                       num_groups=self.kv_layout.num_groups)

    @torch.inference_mode()
    def _profile_num_blocks(self, utilization: float, num_tokens: int, max_num_seqs: int) -> int:
        """KV blocks that fit once the weights and the activations of a
        ``num_tokens`` prefill step (sequences of up to 1024 tokens over a
        one-block dummy cache, nothing written) are accounted for."""
        dev = self.device
        chunk = max(1, min(1024, num_tokens, self._rope_len()))
        q_lens = [chunk] * (num_tokens // chunk)
        if num_tokens % chunk:
            q_lens.append(num_tokens % chunk)
        qsl = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
        positions = np.concatenate([np.arange(n) for n in q_lens]).astype(np.int64)
        width = -(-chunk // self.block_size)
        attn = self._metadata(
            slot_mapping=torch.full((num_tokens,), -1, dtype=torch.int64, device=dev),
            block_tables=torch.zeros((len(q_lens), width), dtype=torch.int32, device=dev),
            seq_lens=torch.tensor(q_lens, dtype=torch.int32, device=dev),
            query_start_loc=torch.from_numpy(qsl).to(dev),
            max_query_len=chunk, max_seq_len=chunk,
        )
        extra = self.kv_layout.num_groups - 1
        attn = dataclasses.replace(attn, group_slot_mappings=(attn.slot_mapping,) * extra,
                                   group_block_tables=(attn.block_tables,) * extra)
        shape = (1, self.block_size, self.num_kv_heads, self.head_dim)
        kv = (torch.zeros(shape, dtype=self.dtype, device=dev),) * 2
        recurrent = self.kv_layout.recurrent_group
        caches = [None if group < 0 else self._empty_states(1) if group == recurrent else kv
                  for group in self.kv_layout.layer_groups]
        ids = torch.zeros(num_tokens, dtype=torch.int64, device=dev)
        torch.cuda.synchronize(dev)
        torch.cuda.reset_peak_memory_stats(dev)
        hidden = self.model(ids, torch.from_numpy(positions).to(dev), attn, caches)
        logits = self.model.compute_logits(hidden[: min(max_num_seqs, num_tokens)])
        torch.cuda.synchronize(dev)
        peak = torch.cuda.max_memory_allocated(dev)
        del hidden, logits, attn, caches, ids
        torch.cuda.empty_cache()
        free, total = torch.cuda.mem_get_info(dev)
        outside_torch = total - free - torch.cuda.memory_reserved(dev)
        budget = utilization * total - peak - outside_torch - self.state_bytes()
        blocks = int(budget // self.bytes_per_block())
        if self.tp is not None:  # every rank's cache holds the same block ids
            blocks = self.tp.min_over_ranks(blocks)
        gib = 1 << 30
        logger.info(
            "GPU memory: total %.1f GiB, x %.2f; torch peak (weights + %d-token step) %.1f GiB, "
            "outside torch %.1f GiB -> KV cache %.1f GiB = %d blocks",
            total / gib, utilization, num_tokens, peak / gib, outside_torch / gib,
            max(budget, 0) / gib, max(blocks, 0),
        )
        if blocks < 1:
            raise ValueError(
                f"gpu_memory_utilization={utilization} leaves no room for the KV cache: "
                f"{total / gib:.1f} GiB total, {peak / gib:.1f} GiB peak for weights and a "
                f"{num_tokens}-token step, {outside_torch / gib:.1f} GiB used outside torch"
            )
        return blocks

    def _rope_len(self) -> int:
        """Positions the RoPE table holds; a model without RoPE (Nemotron-H,
        Granite 4.0-H) has no such limit: the KV cache's."""
        rotary = getattr(self.model, "rotary", None)
        return int(rotary.cos.shape[0]) if rotary is not None else 1 << 30

    def _metadata(self, **fields) -> AttentionMetadata:
        """AttentionMetadata with the kernel hints when the ops are ours."""
        if not self._kernel_hints:
            fields.pop("max_query_len", None)
            fields.pop("max_seq_len", None)
            return AttentionMetadata(**fields)
        return AttentionMetadata(**fields, workspace=self.workspace)

    def _execute_cuda(self, batch: dict[str, np.ndarray]) -> torch.Tensor:
        """compute_logits on CUDA: a captured graph for decode batches when
        available, else an eager forward with host-side bounds for the kernels."""
        seq_lens = np.asarray(batch["seq_lens"])
        qsl = np.asarray(batch["query_start_loc"])
        num_seqs = len(seq_lens)
        num_tokens = len(batch["input_ids"])
        max_query_len = int((qsl[1:] - qsl[:-1]).max()) if num_seqs else 0
        if self.graphs is not None and self.graphs.can_run(
            num_tokens, num_seqs, max_query_len, np.shape(batch["block_tables"])[1]
        ):
            hidden = self.graphs.run(batch)
        else:
            t = {name: _tensor(batch[name], dt).to(self.device, non_blocking=True)
                 for name, dt in _BATCH_DTYPES.items() if name != "logits_indices"}
            attn = self._metadata(
                slot_mapping=t["slot_mapping"], block_tables=t["block_tables"],
                seq_lens=t["seq_lens"], query_start_loc=t["query_start_loc"],
                max_query_len=max_query_len,
                max_seq_len=max(1, int(seq_lens.max())) if num_seqs else 1,
                **_group_arrays(batch, self.device),
            )
            hidden = self.model(t["input_ids"], t["positions"], attn, self.kv_caches)
        index = _tensor(batch["logits_indices"], np.int64).to(self.device, non_blocking=True)
        return self.model.compute_logits(hidden[index])


def _describe_groups(layout) -> str:
    """The KV cache groups in words, for log lines."""
    if layout.num_groups == 1:
        return "one KV cache group: every layer full attention"
    kinds = []
    for g, window in enumerate(layout.group_windows):
        if g == layout.recurrent_group:
            kinds.append("recurrent state (one slot per request, no blocks)")
        else:
            kinds.append(f"{window}-token sliding window" if window else "full attention")
    return "KV cache groups: " + ", ".join(kinds)


def _group_arrays(batch: dict[str, np.ndarray], device: torch.device) -> dict:
    """``group_slot_mappings`` / ``group_block_tables`` for AttentionMetadata
    from a batch of several KV cache groups (``group_slot_mapping`` [G - 1, T],
    ``group_block_tables`` [G - 1, B, M]); empty for one group."""
    if "group_slot_mapping" not in batch:
        return {}
    slots = _tensor(batch["group_slot_mapping"], np.int64).to(device, non_blocking=True)
    tables = _tensor(batch["group_block_tables"], np.int32).to(device, non_blocking=True)
    return {"group_slot_mappings": tuple(slots.unbind(0)),
            "group_block_tables": tuple(tables.unbind(0))}


def _tensor(array: np.ndarray, dtype: type) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(array, dtype=dtype))
