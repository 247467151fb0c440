"""Checks the recurrent-state models' tests share (Qwen3-Next / Qwen3.5,
LFM2, Nemotron-H, Granite 4.0-H): logits against HF's forward over a
two-step prefill and a batched decode step built by the C++ KV cache
manager's recurrent-state group, and an engine over a tiny checkpoint."""

from __future__ import annotations

import numpy as np
import torch

from paternoster import _core
from paternoster.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from paternoster.engine.core import EngineCore

from .conftest import hf_logits

ATOL = 1e-4
BLOCK_SIZE = 8


def _step(runner, kv, bb, steps: list[tuple[int, int, int]]) -> torch.Tensor:
    """One step of (request id, computed, scheduled) through the C++ manager
    and batch builder; logits of every scheduled token."""
    ids = np.array([r for r, _, _ in steps], np.int64)
    done = np.array([c for _, c, _ in steps], np.int32)
    new = np.array([n for _, _, n in steps], np.int32)
    for r, c, n in steps:
        assert kv.allocate_slots(r, c + n, c)
    batch = bb.build(ids, done, new)
    batch["logits_indices"] = np.arange(len(batch["input_ids"]), dtype=np.int64)
    return runner.compute_logits(batch)


def logits_match_hf(runner, hf, lengths: tuple[int, ...], firsts: list[int],
                    vocab: int = 128) -> None:
    """Prompts of ``lengths`` random tokens: step 1 computes ``firsts[i]``
    tokens of each (none where 0), step 2 the rest, step 3 one greedy decode
    token each, batched; steps 2 and 3's float32 logits within :data:`ATOL`
    of HF's forward."""
    slots = runner.num_state_slots
    kv = _core.KVCacheManager(runner.num_kv_blocks, BLOCK_SIZE,
                              sliding_windows=list(runner.kv_cache_group_windows),
                              recurrent=list(runner.kv_cache_group_recurrent),
                              num_state_slots=slots)
    bb = _core.BatchBuilder(kv)
    gen = torch.Generator().manual_seed(7)
    seqs = [torch.randint(0, vocab, (n,), generator=gen).tolist() for n in lengths]
    for i, s in enumerate(seqs):
        bb.add_request(i, np.asarray(s, np.int64))
    _step(runner, kv, bb, [(i, 0, h) for i, h in enumerate(firsts) if h])
    got = _step(runner, kv, bb, [(i, h, len(s) - h) for i, (s, h) in enumerate(zip(seqs, firsts))])
    ref = torch.cat([hf_logits(hf, s)[h:] for s, h in zip(seqs, firsts)])
    assert (got - ref).abs().max().item() < ATOL
    ends = np.cumsum([len(s) - h for s, h in zip(seqs, firsts)]) - 1
    nxt = [s + [int(got[e].argmax())] for s, e in zip(seqs, ends)]
    for i, s in enumerate(nxt):
        bb.append_tokens(np.array([i], np.int64), np.array([s[-1]], np.int64))
    got = _step(runner, kv, bb, [(i, len(s) - 1, 1) for i, s in enumerate(nxt)])
    ref = torch.stack([hf_logits(hf, s)[-1] for s in nxt])
    assert (got - ref).abs().max().item() < ATOL


def hybrid_engine(path, scheduler: str, budget: int, blocks: int) -> EngineCore:
    """A float32 engine of 4 sequences over the checkpoint at ``path``."""
    return EngineCore(EngineConfig(
        model=ModelConfig(model=str(path), dtype="float32"),
        cache=CacheConfig(block_size=BLOCK_SIZE, num_kv_blocks=blocks),
        scheduler=SchedulerConfig(scheduler=scheduler, max_num_seqs=4,
                                  max_num_batched_tokens=budget)))


def random_prompts(lengths: tuple[int, ...], seed: int = 9) -> list[list[int]]:
    """Prompts of ``lengths`` token ids in [3, 128)."""
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 128, (n,), generator=gen).tolist() for n in lengths]


def file_logits_match_hf(runner, hf) -> None:
    """30 random tokens through ``runner`` (a model from a file) as prefill
    chunks of 11 and 15, then four one-token steps: float32 logits within
    1e-4 of the largest of HF's forward."""
    from .conftest import BatchMaker, Chunk

    tokens = torch.randint(3, 128, (30,), generator=torch.Generator().manual_seed(3)).tolist()
    maker = BatchMaker(128, BLOCK_SIZE, num_groups=runner.kv_layout.num_groups)
    outs = [runner.compute_logits(maker.batch([Chunk("a", tokens, 0, 11)])),
            runner.compute_logits(maker.batch([Chunk("a", tokens, 11, 15)]))]
    outs += [runner.compute_logits(maker.batch([Chunk("a", tokens, p, 1)]))
             for p in range(26, 30)]
    ours = torch.cat(outs)
    ref = hf_logits(hf, tokens)
    assert (ours - ref).abs().max() < 1e-4 * ref.abs().max()
