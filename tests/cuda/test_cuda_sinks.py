"""Attention sinks (gpt-oss: a per-head logit in the softmax's normalisation,
no value vector) in the CUDA kernels: the decode kernel's epilogue (one
split), the split-K reduction (several), the prefill kernel's epilogue; with
and without a sliding window; against the suite's float64 reference
(tests/paged_attention_ref.py) under the CPU emulation of the CUDA execution
model and, where there is one, on a GPU."""

from __future__ import annotations

import pytest
import torch

from paternoster import kernels

from ..paged_attention_ref import paged_attention_reference
from .test_cuda_sliding_window import TOLERANCE, make_case, place  # noqa: F401 (fixture)

requires_emulation = pytest.mark.skipif(
    not kernels.cuda_emulation_available(),
    reason="paternoster._cuda_emu not built (needs the CUDA toolkit)")


def run(place, case, sinks, window=0, **hints):  # noqa: F811 (the fixture's value)
    """The kernels on ``case`` with ``sinks`` (moved to the place's device);
    CPU output."""
    attend, device = place
    args = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in case.items()}
    q_lens = case["query_start_loc"].diff()
    hints = {"max_query_len": int(q_lens.max()), "max_seq_len": int(case["seq_lens"].max()),
             **hints}
    out = attend(**args, sliding_window=window,
                 sinks=None if sinks is None else sinks.to(device), **hints)
    return out.cpu()


def reference(case, sinks, window=0):
    return paged_attention_reference(*(case[k] for k in (
        "query", "key_cache", "value_cache", "block_tables", "seq_lens", "query_start_loc")),
        case["scale"], window, sinks)


def assert_matches_reference(out, case, sinks, window=0):
    ref = reference(case, sinks, window)
    assert torch.isfinite(out).all()
    err = (out.double() - ref).abs().max() / ref.abs().max()
    assert err < TOLERANCE[out.dtype], float(err)


def mixed_sinks(num_heads, gen_seed=0):
    """Sinks of the logits' size, every third head's far above them (its rows
    ~0: the sink takes the probability)."""
    sinks = torch.randn(num_heads, generator=torch.Generator().manual_seed(gen_seed)) * 2
    sinks[::3] = 40.0
    return sinks


@pytest.mark.parametrize("d", [64, 256])
@pytest.mark.parametrize("window", [0, 7])
def test_decode_with_sinks(place, window, d):  # noqa: F811
    """One split per sequence: the sink enters in the decode kernel's epilogue."""
    case = make_case([1, 1, 1, 1], [0, 9, 100, 60], 8, 2, d, 16, torch.bfloat16, window)
    sinks = mixed_sinks(8)
    out = run(place, case, sinks, window)
    assert_matches_reference(out, case, sinks, window)
    assert out[:, ::3].float().abs().max() < 1e-6


@pytest.mark.parametrize("d", [128, 256])
@pytest.mark.parametrize("window", [0, 1100])
def test_split_k_decode_with_sinks(place, window, d):  # noqa: F811
    """A 3000-token decode split across thread blocks: the reduction adds the
    sink to the merged maximum and total."""
    case = make_case([1, 1], [3000, 200], 32, 8, d, 16, torch.float16, window, seed=1)
    sinks = mixed_sinks(32, 1)
    out = run(place, case, sinks, window)
    assert_matches_reference(out, case, sinks, window)
    assert out[:, ::3].float().abs().max() < 1e-6


@pytest.mark.parametrize("d", [64, 256])
@pytest.mark.parametrize("window", [0, 16])
@pytest.mark.parametrize("heads", [(8, 2), (4, 4), (16, 1)])
def test_prefill_chunks_with_sinks(place, window, heads, d):  # noqa: F811
    """A prompt and chunks over cached context with decodes in the same call."""
    case = make_case([70, 1, 40, 9], [0, 130, 90, 33], *heads, d, 8, torch.bfloat16, window,
                     seed=3 + window)
    sinks = mixed_sinks(heads[0], 2)
    out = run(place, case, sinks, window)
    assert_matches_reference(out, case, sinks, window)
    assert out[:, ::3].float().abs().max() < 1e-6


@pytest.mark.parametrize("d", [128, 256])
@pytest.mark.parametrize("sink", [float("-inf"), -1e30])
def test_very_negative_sinks_are_no_sinks(place, sink, d):  # noqa: F811
    """exp2(sink - max) is 0: the same bits as no sinks on every path (decode,
    split-K decode, prefill)."""
    case = make_case([33, 1, 1, 5], [0, 150, 2000, 60], 8, 2, d, 16, torch.bfloat16, 0,
                     seed=4)
    sinks = torch.full((8,), sink)
    assert torch.equal(run(place, case, sinks), run(place, case, None))


@requires_emulation
def test_split_k_path_is_taken_with_sinks():
    """The split-K case above really splits (and the reduction runs)."""
    backend = kernels.emulated_cuda_backend()
    assert backend.module.decode_num_splits(2, 32, 8, 3001, 132) == 24
    case = make_case([1, 1], [3000, 200], 32, 8, 128, 16, torch.float16, 0, seed=1)
    backend.module.emu_stats(True)
    sinks = mixed_sinks(32, 1)
    out = backend.paged_attention(**case, sinks=sinks, max_query_len=1, max_seq_len=3001)
    assert backend.module.emu_stats()["blocks"] == 16 * 24 + 2 * 32
    assert_matches_reference(out, case, sinks)


@requires_emulation
def test_sinks_are_checked():
    case = make_case([1, 3], [10, 5], 8, 2, 64, 16, torch.bfloat16, 0)
    backend = kernels.emulated_cuda_backend()
    for bad in (torch.zeros(8, dtype=torch.bfloat16), torch.zeros(9), torch.zeros(1, 8),
                torch.zeros(16)[::2], torch.zeros(8, device="meta")):
        with pytest.raises(ValueError, match="sinks"):
            backend.paged_attention(**case, sinks=bad)
    with pytest.raises(ValueError, match="sinks"):  # the host API's alignment check
        backend.module.paged_attention(*[16] * 7, 1, 1, 8, 2, 64, 1, 16, 1, 0, 0, 1, 16, 0.1,
                                       backend.module.DType.bfloat16, 0, 0, 132, 0, 0, 0, 2)
