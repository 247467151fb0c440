"""Weights and KV caches on 2 MiB pages (paternoster.model.huge_pages): the
same logits as on ordinary pages and as HF transformers' forward (a tiny GGUF
Llama with weights kept quantized and a tied LM head, and a dense one), every
weight inside the one mapping, tied weights still tied."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from paternoster.config import CacheConfig, ModelConfig
from paternoster.kernels import QuantizedWeight
from paternoster.model import huge_pages
from paternoster.model.runner import ModelRunner

from .conftest import BatchMaker, Chunk, hf_logits
from .gguf_writer import write_llama_gguf
from .test_gguf import _hf_llama, _reference


def _thp_available() -> bool:
    try:
        mode = Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
    except OSError:
        return False
    return "[never]" not in mode


TOKENS = torch.randint(3, 128, (30,), generator=torch.Generator().manual_seed(2)).tolist()


def _logits(path, dtype: str) -> tuple[torch.Tensor, ModelRunner]:
    """Logits of TOKENS in two chunks. Batch-invariant mode keeps quantized
    matrices on the float-activation path at every chunk size, so the
    comparison with HF's float forward is not blurred by the 8-bit activations
    the default mode uses for small calls (tests/core/test_linear.py)."""
    runner = ModelRunner(ModelConfig(model=str(path), dtype=dtype, batch_invariant=True),
                         CacheConfig(block_size=8, num_kv_blocks=64))
    tokens = TOKENS
    maker = BatchMaker(64, 8)
    first = runner.compute_logits(maker.batch([Chunk("a", tokens, 0, 13)]))
    second = runner.compute_logits(maker.batch([Chunk("a", tokens, 13, 17)]))
    return torch.cat([first, second]), runner


def _mapping_of(address: int) -> tuple[int, int, str]:
    """(start, end, path) of the /proc/self/maps region holding ``address``."""
    with open("/proc/self/maps") as f:
        for line in f:
            fields = line.split(maxsplit=5)
            start, end = (int(x, 16) for x in fields[0].split("-"))
            if start <= address < end:
                return start, end, fields[5].strip() if len(fields) > 5 else ""
    raise AssertionError(f"{address:#x} is in no mapping")


@pytest.mark.parametrize("fmt", ["q4_1", "bf16"])
def test_moved_weights_give_the_same_logits_and_stay_tied(tmp_path, monkeypatch, fmt):
    hf = _hf_llama(0, tied=True)
    path = tmp_path / f"tiny-{fmt}.gguf"
    weights = write_llama_gguf(hf, path, fmt if fmt != "bf16" else "f32")
    dtype = "bfloat16" if fmt == "bf16" else "float32"
    monkeypatch.setenv("PATERNOSTER_HUGE_PAGES", "0")
    plain, _ = _logits(path, dtype)
    monkeypatch.setenv("PATERNOSTER_HUGE_PAGES", "1")
    monkeypatch.setattr(huge_pages, "MIN_BYTES", 1)  # the tiny model's matrices too
    moved, runner = _logits(path, dtype)
    assert torch.equal(plain, moved)  # same values, same kernels: the same bits
    if dtype == "float32":  # against HF's forward on the file's dequantized weights
        assert (moved - hf_logits(_reference(hf, weights), TOKENS)).abs().max() < 1e-4
    model = runner.model
    layer = model.layers[0]
    qkv = layer.self_attn.qkv_weight
    if fmt == "q4_1":
        # the file's quantized tensors are served from its mapping, not copied
        assert all(p.mapped for p in qkv.parts[2:]) and layer.mlp.down_weight.mapped
        return
    # The tied F32 embedding is kept as the file's tensor, served from its mapping
    # (never copied); the bf16 matrices made at load moved into one mapping
    # (torch's heap would scatter them).
    head, embed = model.lm_head, model.embed_tokens
    assert isinstance(head, QuantizedWeight) and head.mapped
    assert head is embed or head.data.data_ptr() == embed.data.data_ptr()  # still tied
    regions = {_mapping_of(t.data_ptr()) for t in (qkv, layer.mlp.down_weight)}
    assert len(regions) == 1 and regions.pop()[2] == ""  # one anonymous mapping
    # the KV caches are on their own zero-filled huge-page mappings
    k = runner.kv_caches[0][0]
    assert k.is_contiguous() and k.dtype == runner.dtype


def test_the_buffer_is_zeroed_aligned_and_backed_by_huge_pages():
    buf = huge_pages.huge_page_buffer(8 << 20)
    assert buf.numel() == 8 << 20 and buf.data_ptr() % (2 << 20) == 0
    assert int(buf.sum()) == 0
    z = huge_pages.zeros((1024, 8, 2, 64), torch.bfloat16)  # a KV cache's shape
    assert z.shape == (1024, 8, 2, 64) and z.is_contiguous() and not z.any()
    assert z.data_ptr() % (2 << 20) == 0
    before = huge_pages._anon_huge_bytes()
    buf.fill_(1)
    if _thp_available():
        assert huge_pages._anon_huge_bytes() - before >= 4 << 20
    with pytest.raises(ValueError, match="nbytes"):
        huge_pages.huge_page_buffer(0)


def test_switched_off_by_the_environment(monkeypatch):
    monkeypatch.setenv("PATERNOSTER_HUGE_PAGES", "0")
    assert not huge_pages.enabled()
    assert huge_pages.place_weights(torch.nn.Linear(1024, 1024)) is None
    assert torch.equal(huge_pages.zeros((3, 4), torch.bfloat16), torch.zeros(3, 4,
                                                                             dtype=torch.bfloat16))
    monkeypatch.setenv("PATERNOSTER_HUGE_PAGES", "1")
    lin = torch.nn.Linear(1024, 1024)
    w = lin.weight.detach().clone()
    placed = huge_pages.place_weights(lin)
    assert placed is not None and placed.num_tensors == 1 and torch.equal(lin.weight, w)
    assert isinstance(lin.weight, torch.nn.Parameter)
