"""Tensor parallel over gloo on CPU: each parallel layer against the full
torch layer, the sharding rules, and TP=2 logits of tiny random Llama-,
Qwen2- and Qwen3-shaped checkpoints (a prefill, then decode steps through
each rank's paged KV cache) against TP=1 and HF transformers' own forward.

The multi-rank tests spawn two processes (``torch.multiprocessing``) that
join a gloo group on 127.0.0.1 at a free port, one thread each."""

from __future__ import annotations

import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

from paternoster.model.parallel import (
    ColumnParallelLinear,
    ParallelLMHead,
    RowParallelLinear,
    TPGroup,
    VocabParallelEmbedding,
)
from paternoster.model.parallel.shard import shard_gate_up, shard_qkv, shard_vocab, vocab_range
from paternoster.model.parallel.tp_model import local_config

from .conftest import BatchMaker, Chunk, hf_logits
from .tiny_checkpoints import KINDS, tiny_checkpoint

TP = 2
PROMPTS = [[5, 17, 33, 2, 90, 64, 7, 11, 3], [8, 1, 120, 44, 9, 70, 12, 33, 99, 4, 5, 6, 31]]
DECODE_STEPS = 3


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spawn(fn, *args) -> None:
    """Run ``fn(rank, port, *args)`` on TP ranks in a gloo group; a rank's
    exception fails the test with its traceback."""
    mp.spawn(_rank_main, args=(_free_port(), fn, args), nprocs=TP, join=True)


def _rank_main(rank: int, port: int, fn, args) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=TP)
    try:
        fn(TPGroup.from_default(), *args)
    finally:
        dist.destroy_process_group()


# ------------------------------------------------------------ sharding rules


def test_qkv_shard_keeps_each_rank_query_heads_with_their_kv_heads():
    hq, hkv, d = 4, 2, 3
    rows = torch.arange((hq + 2 * hkv) * d)
    w = rows[:, None].expand(-1, 5)
    parts = [shard_qkv(w, hq, hkv, d, r, 2)[:, 0].tolist() for r in range(2)]
    q, k, v = rows.split([hq * d, hkv * d, hkv * d])
    # rank 1: query heads 2, 3 (GQA group of KV head 1), then KV head 1's k and v.
    assert parts[1] == q[6:].tolist() + k[3:].tolist() + v[3:].tolist()
    assert parts[0] == q[:6].tolist() + k[:3].tolist() + v[:3].tolist()


def test_gate_up_shard_takes_gate_rows_then_up_rows():
    w = torch.arange(8.0)[:, None]
    assert shard_gate_up(w, 1, 2)[:, 0].tolist() == [2.0, 3.0, 6.0, 7.0]


def test_vocab_shards_pad_the_last_block_with_zero_rows():
    w = torch.ones(5, 2)
    assert vocab_range(5, 1, 2) == (3, 5, 3)
    assert shard_vocab(w, 1, 2).tolist() == [[1, 1], [1, 1], [0, 0]]


def test_kv_heads_that_do_not_split_raise_value_error():
    from transformers import LlamaConfig

    cfg = LlamaConfig(num_attention_heads=4, num_key_value_heads=1, hidden_size=64)
    with pytest.raises(ValueError, match="num_key_value_heads"):
        local_config(cfg, 2)


def test_group_of_one_needs_no_process_group():
    x = torch.ones(3, 4)
    tp = TPGroup()
    assert tp.all_reduce(x) is x and tp.all_gather(x) is x
    with pytest.raises(ValueError, match="rank"):
        TPGroup(rank=2, size=2)


# ------------------------------------------------------------ layers, 2 ranks


def _check_layers(tp: TPGroup) -> None:
    gen = torch.Generator().manual_seed(0)  # the same full weights on every rank
    x = torch.randn(5, 8, generator=gen)
    w1, b1 = torch.randn(12, 8, generator=gen), torch.randn(12, generator=gen)
    w2, b2 = torch.randn(6, 12, generator=gen), torch.randn(6, generator=gen)
    table = torch.randn(11, 8, generator=gen)  # 11 rows: the last shard is padded
    ids = torch.tensor([0, 10, 5, 6, 3, 5])

    full = F.linear(x, w1, b1)
    gathered = ColumnParallelLinear.from_full(w1, b1, tp, gather_output=True)(x)
    torch.testing.assert_close(gathered, full, atol=1e-5, rtol=1e-5)
    part = ColumnParallelLinear.from_full(w1, b1, tp)(x)
    assert part.shape == (5, 12 // tp.size)
    # column-parallel then row-parallel: Megatron's MLP pair, one all-reduce.
    out = RowParallelLinear.from_full(w2, b2, tp)(part)
    torch.testing.assert_close(out, F.linear(full, w2, b2), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(VocabParallelEmbedding.from_full(table, tp)(ids),
                               F.embedding(ids, table), atol=0, rtol=0)
    logits = ParallelLMHead.from_full(table, tp)(x)
    assert logits.shape == (5, 11) and logits.dtype == torch.float32
    torch.testing.assert_close(logits, F.linear(x, table), atol=1e-5, rtol=1e-5)
    # Each rank offers its own count (e.g. KV blocks from its free memory): all get the least.
    assert tp.min_over_ranks(100 + 7 * tp.rank) == 100


@pytest.mark.multiprocess
def test_parallel_layers_equal_the_full_torch_layers():
    _spawn(_check_layers)


# ------------------------------------------------------------ models, 2 ranks


def _steps(runner) -> list[torch.Tensor]:
    """Logits of a two-sequence prefill (every position) and DECODE_STEPS
    greedy decode steps of both, through the runner's paged cache."""
    maker = BatchMaker(runner.num_kv_blocks, 8, seed=2)
    seqs = [list(p) for p in PROMPTS]
    out = [runner.compute_logits(maker.batch([Chunk(str(i), s, 0, len(s))
                                             for i, s in enumerate(seqs)]))]
    for _ in range(DECODE_STEPS):
        last = out[-1] if len(out) > 1 else out[0][[len(PROMPTS[0]) - 1, -1]]
        for s, row in zip(seqs, last, strict=True):
            s.append(int(row.argmax()))
        out.append(runner.compute_logits(maker.batch(
            [Chunk(str(i), s, len(s) - 1, 1) for i, s in enumerate(seqs)])))
    return out


def _runner(path, tp: TPGroup | None):
    from paternoster.config import CacheConfig, ModelConfig
    from paternoster.model.runner import ModelRunner

    return ModelRunner(ModelConfig(model=str(path), dtype="float32"),
                       CacheConfig(block_size=8, num_kv_blocks=16), tp=tp)


def _rank_steps(tp: TPGroup, path, out_dir) -> None:
    runner = _runner(path, tp)
    assert runner.kv_caches[0][0].shape[2] == runner.hf_config.num_key_value_heads // tp.size
    torch.save(_steps(runner), out_dir / f"rank{tp.rank}.pt")


@pytest.mark.multiprocess
@pytest.mark.parametrize("kind", KINDS)
def test_tp2_logits_equal_tp1_and_hf(kind, tmp_path):
    path = tmp_path / kind
    hf = tiny_checkpoint(kind, path)
    _spawn(_rank_steps, path, tmp_path)
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(TP)]
    single = _steps(_runner(path, None))
    for step, ref in enumerate(single):
        for r in range(TP):
            torch.testing.assert_close(ranks[r][step], ref, atol=1e-4, rtol=1e-4,
                                       msg=f"rank {r}, step {step}")
    # The prefill against HF's own forward over each whole prompt.
    lens = [len(p) for p in PROMPTS]
    for i, prompt in enumerate(PROMPTS):
        rows = ranks[0][0][sum(lens[:i]) : sum(lens[: i + 1])]
        torch.testing.assert_close(rows, hf_logits(hf, prompt), atol=1e-4, rtol=1e-4)
