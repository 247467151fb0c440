"""CUDA graphs for decode steps: capture the model forward once per padded batch
size, then replay it with the step's inputs copied into static buffers.

A decode step of a Llama-8B launches ~15 kernels per layer; at small batches
their launch overhead from Python exceeds the GPU time, so replaying one graph
per step is what makes small decode batches reach the bandwidth roofline.

Only pure decode batches (one token per sequence) run here; the graph of the
smallest captured size >= B runs with rows B.. padded: slot -1 (nothing
written to the cache) and ``seq_lens`` 0 (the decode kernel writes zeros).
Captured with ``max_seq_len = max_model_len`` so one graph serves every
context length; the CUDA decode kernel picks its split per sequence on the
device. Models with several KV cache groups (:mod:`paternoster.model.kv_layout`)
get a static slot mapping and block table per group. Everything the graphs
touch (inputs, KV caches, the split-K workspace) is allocated before capture
and never reallocated.
"""

from __future__ import annotations

import bisect

import numpy as np
import torch
from torch import nn

from paternoster.model.attention import AttentionMetadata

CAPTURE_SIZES = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 224, 256, 320, 384, 448,
                 512)


def capture_sizes(max_num_seqs: int) -> list[int]:
    """Padded batch sizes to capture: :data:`CAPTURE_SIZES` up to
    ``max_num_seqs``, plus ``max_num_seqs`` itself if it is not one of them."""
    sizes = [s for s in CAPTURE_SIZES if s < max_num_seqs]
    return sizes + [max_num_seqs]


class DecodeGraphs:
    """Captured decode forwards of ``model`` for :func:`capture_sizes` batch sizes.

    Args:
        model: the causal LM (``forward(input_ids, positions, attn, kv_caches)``
            -> hidden [T, H]).
        kv_caches: per layer (key_cache, value_cache) on ``device``.
        device: the CUDA device.
        max_num_seqs: largest decode batch to capture.
        max_model_len: longest context (sizes the block-table buffer and the
            kernels' split grid).
        block_size: tokens per KV block.
        workspace: the decode kernel's split-K workspace (reused by every graph).
        kernel_hints: pass ``max_query_len``/``max_seq_len``/``workspace`` to
            the attention ops (they are :mod:`paternoster.kernels`).
        num_groups: the model's KV cache groups (batches then carry
            ``group_slot_mapping`` / ``group_block_tables``).
    Raises:
        RuntimeError: capture failed (e.g. an op that synchronises).
    """

    def __init__(self, model: nn.Module, kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
                 device: torch.device, *, max_num_seqs: int, max_model_len: int,
                 block_size: int, workspace: torch.Tensor | None, kernel_hints: bool,
                 num_groups: int = 1) -> None:
        self.sizes = capture_sizes(max_num_seqs)
        self.max_blocks = -(-max_model_len // block_size)
        self.max_model_len = max_model_len
        self.device = device
        n = self.sizes[-1]
        self.input_ids = torch.zeros(n, dtype=torch.int64, device=device)
        self.positions = torch.zeros(n, dtype=torch.int64, device=device)
        self.slot_mapping = torch.full((n,), -1, dtype=torch.int64, device=device)
        self.seq_lens = torch.zeros(n, dtype=torch.int32, device=device)
        self.block_tables = torch.zeros((n, self.max_blocks), dtype=torch.int32, device=device)
        self.query_start_loc = torch.arange(n + 1, dtype=torch.int32, device=device)
        extra = num_groups - 1
        self.group_slot_mapping = torch.full((extra, n), -1, dtype=torch.int64, device=device)
        self.group_block_tables = torch.zeros((extra, n, self.max_blocks), dtype=torch.int32,
                                              device=device)
        self._graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self._capture_all(model, kv_caches, workspace, kernel_hints)

    def _metadata(self, size: int, workspace: torch.Tensor | None,
                  kernel_hints: bool) -> AttentionMetadata:
        fields = dict(slot_mapping=self.slot_mapping[:size],
                      block_tables=self.block_tables[:size], seq_lens=self.seq_lens[:size],
                      query_start_loc=self.query_start_loc[: size + 1],
                      group_slot_mappings=tuple(g[:size] for g in self.group_slot_mapping),
                      group_block_tables=tuple(g[:size] for g in self.group_block_tables))
        if kernel_hints:
            fields.update(max_query_len=1, max_seq_len=self.max_model_len, workspace=workspace)
        return AttentionMetadata(**fields)

    @torch.inference_mode()
    def _capture_all(self, model: nn.Module, kv_caches, workspace, kernel_hints: bool) -> None:
        """Largest size first, all graphs sharing one memory pool."""
        pool = None
        stream = torch.cuda.current_stream(self.device)
        for size in reversed(self.sizes):
            attn = self._metadata(size, workspace, kernel_hints)
            ids, pos = self.input_ids[:size], self.positions[:size]
            side = torch.cuda.Stream(self.device)
            side.wait_stream(stream)
            with torch.cuda.stream(side):  # warm-up: lazy initialisation outside the graph
                for _ in range(2):
                    model(ids, pos, attn, kv_caches)
            stream.wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                hidden = model(ids, pos, attn, kv_caches)
            pool = graph.pool()
            self._graphs[size] = (graph, hidden)
        torch.cuda.synchronize(self.device)

    def can_run(self, num_tokens: int, num_seqs: int, max_query_len: int,
                table_width: int) -> bool:
        """True for a pure decode batch (one token per sequence) that fits."""
        return (max_query_len == 1 and num_tokens == num_seqs and 0 < num_seqs <= self.sizes[-1]
                and table_width <= self.max_blocks)

    def run(self, batch: dict[str, np.ndarray]) -> torch.Tensor:
        """Replay the graph for ``batch`` (numpy arrays as for
        ``ModelRunner.execute_model``, a batch :meth:`can_run` accepts).

        Returns:
            [B, H] hidden states (a view of the graph's output buffer, valid
            until the next replay).
        """
        n = len(batch["seq_lens"])
        size = self.sizes[bisect.bisect_left(self.sizes, n)]
        self._fill(self.input_ids, batch["input_ids"], size, 0, np.int64)
        self._fill(self.positions, batch["positions"], size, 0, np.int64)
        self._fill(self.slot_mapping, batch["slot_mapping"], size, -1, np.int64)
        self._fill(self.seq_lens, batch["seq_lens"], size, 0, np.int32)
        tables = np.ascontiguousarray(batch["block_tables"], dtype=np.int32)
        self.block_tables[:n, : tables.shape[1]].copy_(torch.from_numpy(tables),
                                                       non_blocking=True)
        if len(self.group_slot_mapping):
            for g, slots in enumerate(batch["group_slot_mapping"]):
                self._fill(self.group_slot_mapping[g], slots, size, -1, np.int64)
            tables = np.ascontiguousarray(batch["group_block_tables"], dtype=np.int32)
            self.group_block_tables[:, :n, : tables.shape[2]].copy_(torch.from_numpy(tables),
                                                                    non_blocking=True)
        graph, hidden = self._graphs[size]
        graph.replay()
        return hidden[:n]

    @staticmethod
    def _fill(dst: torch.Tensor, src: np.ndarray, size: int, pad: int, dtype: type) -> None:
        """dst[:size] = src padded with ``pad`` (one host-to-device copy)."""
        host = np.full(size, pad, dtype=dtype)
        host[: len(src)] = src
        dst[:size].copy_(torch.from_numpy(host), non_blocking=True)
