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
    turns a list of chunks into the runner's batch arrays.

    With ``num_groups`` > 1 (a model with KV cache groups, e.g. full and
    sliding-window layers: ``runner.kv_layout.num_groups``) every group gets
    its own blocks, disjoint from the others' as the C++ KVCacheManager's
    (layers of different groups share cache tensors), in ``group_slot_mapping``
    / ``group_block_tables``; no block is released out of a window (the
    kernels skip what a window does not reach).
    """

    def __init__(self, num_blocks: int, block_size: int, seed: int = 0,
                 num_groups: int = 1) -> None:
        self.block_size = block_size
        self.num_groups = num_groups
        self.free = list(range(num_blocks))
        random.Random(seed).shuffle(self.free)
        self.tables: dict[tuple[str, int], list[int]] = {}

    def batch(self, chunks: list[Chunk], all_logits: bool = True) -> dict[str, np.ndarray]:
        bs, G = self.block_size, self.num_groups
        ids, pos, seq_lens, qsl = [], [], [], [0]
        slots: list[list[int]] = [[] for _ in range(G)]
        for c in chunks:
            p = np.arange(c.start, c.start + c.n)
            for g in range(G):
                table = self.tables.setdefault((c.seq, g), [])
                while len(table) * bs < c.start + c.n:
                    table.append(self.free.pop())
                slots[g] += (np.asarray(table)[p // bs] * bs + p % bs).tolist()
            ids += c.tokens[c.start : c.start + c.n]
            pos += p.tolist()
            seq_lens.append(c.start + c.n)
            qsl.append(qsl[-1] + c.n)
        width = max(len(self.tables[(c.seq, 0)]) for c in chunks)
        tables = np.zeros((G, len(chunks), width), np.int32)
        for g in range(G):
            for i, c in enumerate(chunks):
                tables[g, i, : len(self.tables[(c.seq, g)])] = self.tables[(c.seq, g)]
        qsl_arr = np.asarray(qsl, np.int32)
        last = qsl_arr[1:].astype(np.int64) - 1
        batch = {
            "input_ids": np.asarray(ids, np.int64),
            "positions": np.asarray(pos, np.int64),
            "slot_mapping": np.asarray(slots[0], np.int64),
            "block_tables": tables[0],
            "seq_lens": np.asarray(seq_lens, np.int32),
            "query_start_loc": qsl_arr,
            "logits_indices": np.arange(len(ids), dtype=np.int64) if all_logits else last,
        }
        if G > 1:
            batch["group_slot_mapping"] = np.asarray(slots[1:], np.int64)
            batch["group_block_tables"] = tables[1:]
        return batch


def hf_logits(hf_model, tokens: list[int]) -> torch.Tensor:
    """HF transformers' own forward: float32 logits [len(tokens), V]."""
    with torch.inference_mode():
        return hf_model(torch.tensor([tokens])).logits[0].float()


def greedy_matches_hf_generate(model_dir, hf_model, attn_ops, prompt: list[int],
                               n: int) -> tuple[list[int], list[int]]:
    """Greedy decoding of ``n`` tokens, one per step through the paged cache
    (float32), and HF ``generate``'s greedy ids: (ours, HF's)."""
    from paternoster.config import CacheConfig, ModelConfig
    from paternoster.model.runner import ModelRunner

    with torch.inference_mode():
        ref = hf_model.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False,
                                eos_token_id=None, pad_token_id=0)[0, len(prompt):].tolist()
    runner = ModelRunner(ModelConfig(model=str(model_dir), dtype="float32"),
                         CacheConfig(block_size=8, num_kv_blocks=32), attn_ops=attn_ops)
    maker = BatchMaker(runner.num_kv_blocks, 8, seed=1, num_groups=runner.kv_layout.num_groups)
    tokens, ids = list(prompt), []
    chunk = Chunk("a", tokens, 0, len(prompt))
    for _ in range(n):
        logits = runner.execute_model(maker.batch([chunk]))
        ids.append(int(logits[-1].argmax()))
        tokens.append(ids[-1])
        chunk = Chunk("a", tokens, len(tokens) - 1, 1)
    return ids, ref


def stack_and_python_logits(model_dir, vocab: int) -> dict[bool, torch.Tensor]:
    """bfloat16 logits of one decode step of three sequences (after their
    prefill) with the core's decoder stack (True) and through the Python
    layers (False); the stack is checked to be the one used."""
    from paternoster.config import CacheConfig, ModelConfig
    from paternoster.model.runner import ModelRunner

    logits = {}
    for fused in (True, False):
        runner = ModelRunner(ModelConfig(model=str(model_dir), dtype="bfloat16"),
                             CacheConfig(block_size=8, num_kv_blocks=64))
        runner.model.fused_steps = fused
        maker = BatchMaker(runner.num_kv_blocks, 8, seed=3,
                           num_groups=runner.kv_layout.num_groups)
        gen = torch.Generator().manual_seed(4)
        seqs = [torch.randint(0, vocab, (n,), generator=gen).tolist() for n in (9, 20, 3)]
        runner.execute_model(maker.batch([Chunk(str(i), s, 0, len(s) - 1)
                                          for i, s in enumerate(seqs)]))
        if fused:
            assert runner.model._decoder_stack(len(seqs), runner.kv_caches) is not None
        logits[fused] = runner.execute_model(maker.batch(
            [Chunk(str(i), s, len(s) - 1, 1) for i, s in enumerate(seqs)]))
    return logits


def hf_generate(hf_model, prompt: list[int], n: int) -> list[int]:
    """HF ``generate``'s greedy ids for ``n`` new tokens (no EOS stop)."""
    with torch.inference_mode():
        out = hf_model.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False,
                                eos_token_id=None, pad_token_id=0)
    return out[0, len(prompt):].tolist()


def engine_greedy(engine, prompts: list[list[int]], n: int) -> list[list[int]]:
    """Greedy ids of ``n`` tokens for each prompt through ``engine`` (an
    EngineCore), all submitted at once, stepped until done."""
    from paternoster.sampling_params import SamplingParams

    from ..engine.conftest import make_request

    params = SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)
    for i, p in enumerate(prompts):
        engine.add_request(make_request(f"r{i}", p, params))
    tokens: dict[str, list[int]] = {f"r{i}": [] for i in range(len(prompts))}
    while engine.has_unfinished_requests():
        for out in engine.step():
            tokens[out.request_id].extend(out.new_token_ids)
    return [tokens[f"r{i}"] for i in range(len(prompts))]


def make_request_logprobs(engine, prompts: list[list[int]], n: int) -> list[tuple]:
    """Greedy ``n`` tokens with their logprobs (2 alternatives) for each
    prompt through ``engine``, all submitted at once: per prompt ``(token
    ids, repr of the logprobs)`` (repr keeps every bit of every float)."""
    from paternoster.sampling_params import SamplingParams

    from ..engine.conftest import make_request

    params = SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True, logprobs=2)
    for i, p in enumerate(prompts):
        engine.add_request(make_request(f"r{i}", p, params))
    tokens: dict[str, list[int]] = {f"r{i}": [] for i in range(len(prompts))}
    logprobs: dict[str, list[str]] = {f"r{i}": [] for i in range(len(prompts))}
    while engine.has_unfinished_requests():
        for out in engine.step():
            tokens[out.request_id].extend(out.new_token_ids)
            if out.logprobs is not None:
                logprobs[out.request_id].append(repr(out.logprobs))
    return [(tokens[f"r{i}"], logprobs[f"r{i}"]) for i in range(len(prompts))]
