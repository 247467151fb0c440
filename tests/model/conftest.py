"""Small worlds for model tests: the attention ops, a toy block allocator that
builds step batches the way the C++ BatchBuilder does, and HF reference logits."""

from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np
import pytest
import torch

from paternoster import kernels


@pytest.fixture(scope="session")
def attn_ops():
    """The kernels the runner uses by default (:mod:`paternoster.kernels`): a
    missing compiled core fails the import above, it is never replaced."""
    return kernels


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


@dataclass
class Chunk:
    """Compute ``tokens[start:start + n]`` of sequence ``seq`` this step."""

    seq: str
    tokens: list[int]
    start: int
    n: int


class BatchMaker:
    """Hands out KV blocks (shuffled ids, so block tables are not contiguous) and
    turns a list of chunks into the runner's batch arrays."""

    def __init__(self, num_blocks: int, block_size: int, seed: int = 0) -> None:
        self.block_size = block_size
        self.free = list(range(num_blocks))
        random.Random(seed).shuffle(self.free)
        self.tables: dict[str, list[int]] = {}

    def batch(self, chunks: list[Chunk], all_logits: bool = True) -> dict[str, np.ndarray]:
        bs = self.block_size
        ids, pos, slots, seq_lens, qsl = [], [], [], [], [0]
        for c in chunks:
            table = self.tables.setdefault(c.seq, [])
            while len(table) * bs < c.start + c.n:
                table.append(self.free.pop())
            p = np.arange(c.start, c.start + c.n)
            ids += c.tokens[c.start : c.start + c.n]
            pos += p.tolist()
            slots += (np.asarray(table)[p // bs] * bs + p % bs).tolist()
            seq_lens.append(c.start + c.n)
            qsl.append(qsl[-1] + c.n)
        width = max(len(self.tables[c.seq]) for c in chunks)
        tables = np.zeros((len(chunks), width), np.int32)
        for i, c in enumerate(chunks):
            tables[i, : len(self.tables[c.seq])] = self.tables[c.seq]
        qsl_arr = np.asarray(qsl, np.int32)
        last = qsl_arr[1:].astype(np.int64) - 1
        return {
            "input_ids": np.asarray(ids, np.int64),
            "positions": np.asarray(pos, np.int64),
            "slot_mapping": np.asarray(slots, np.int64),
            "block_tables": tables,
            "seq_lens": np.asarray(seq_lens, np.int32),
            "query_start_loc": qsl_arr,
            "logits_indices": np.arange(len(ids), dtype=np.int64) if all_logits else last,
        }


def hf_logits(hf_model, tokens: list[int]) -> torch.Tensor:
    """HF transformers' own forward: float32 logits [len(tokens), V]."""
    with torch.inference_mode():
        return hf_model(torch.tensor([tokens])).logits[0].float()
