"""paternoster.kernels' fused elementwise ops (RMSNorm, residual add + RMSNorm,
SiLU-and-mul, RoPE) against float64 references, against the torch code they
replace (HF Llama's roundings), and their argument checks."""

from __future__ import annotations

import pytest
import torch

from paternoster import kernels
from paternoster.kernels.native import rms_norm_torch, rotary_embedding_torch, silu_and_mul_torch
from paternoster.model.rope import RotaryEmbedding

DTYPES = [torch.float32, torch.bfloat16]
# Error allowed relative to the size of the exact result: float32 sums and the
# kernel's exp; bfloat16: up to two roundings of 2**-9 each.
REL_TOL = {torch.float32: 4e-6, torch.bfloat16: 2**-7}
# Differences allowed against the torch code, relative: float32, a few units
# in the last place (sum order, the kernel's exp); bfloat16, one unit (2**-7 is
# one ulp at the bottom of a binade).
ULPS = {torch.float32: 8 * 2**-23, torch.bfloat16: 2**-7}


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)
    kernels.set_num_threads(1)
    yield
    kernels.set_num_threads(1)


def _randn(*shape, dtype, scale=1.0, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=gen, dtype=torch.float64) * scale).to(dtype)


def _assert_close(got: torch.Tensor, want: torch.Tensor, dtype, size=None):
    """|got - want| <= REL_TOL * size, elementwise (size defaults to |want|)."""
    size = want.abs() if size is None else size
    err = (got.double() - want).abs()
    bad = err > REL_TOL[dtype] * size + 1e-30
    assert not bad.any(), f"{int(bad.sum())} elements off, max error {float(err.max())}"


def _rms_ref(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    x64 = x.double()
    return x64 * torch.rsqrt(x64.square().mean(-1, keepdim=True) + eps) * w.double()


# ---------------------------------------------------------------- RMSNorm


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("t, h", [(1, 577), (37, 577), (5, 64), (3, 7)])
def test_rms_norm_matches_float64_reference(dtype, t, h):
    x = _randn(t, h, dtype=dtype, scale=3.0, seed=t * h)
    w = _randn(h, dtype=dtype, seed=1)
    _assert_close(kernels.rms_norm(x, w, 1e-5), _rms_ref(x, w, 1e-5), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_reproduces_the_torch_code(dtype):
    """HF's roundings (normalised rows cast to the dtype, then times the weight in
    the dtype): the bits of the torch code, up to the order of the float32 sum
    (a row whose 1/rms differs in the last bit may round differently)."""
    x = _randn(64, 576, dtype=dtype, scale=2.0, seed=3)
    w = _randn(576, dtype=dtype, seed=4)
    got, want = kernels.rms_norm(x, w, 1e-5), rms_norm_torch(x, w, 1e-5)
    assert ((got.double() - want.double()).abs() <= ULPS[dtype] * want.double().abs()).all()
    if dtype == torch.bfloat16:
        assert (got == want).float().mean().item() >= 0.999


def test_rms_norm_eps_and_out():
    x = _randn(4, 33, dtype=torch.float32, scale=0.01, seed=5)  # mean square 1e-4 << eps
    w = _randn(33, dtype=torch.float32, seed=6)
    out = torch.empty_like(x)
    assert kernels.rms_norm(x, w, 0.1, out=out) is out
    _assert_close(out, _rms_ref(x, w, 0.1), torch.float32)
    y = x.clone()
    kernels.rms_norm(y, w, 0.1, out=y)  # in place
    assert torch.equal(y, out)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("t, h", [(1, 577), (37, 577), (3, 7)])
def test_fused_add_rms_norm_matches_add_then_norm(dtype, t, h):
    x = _randn(t, h, dtype=dtype, seed=7)
    residual = _randn(t, h, dtype=dtype, scale=4.0, seed=8)
    w = _randn(h, dtype=dtype, seed=9)
    total = x + residual  # rounded once, like the kernel's add
    kernels.fused_add_rms_norm(x, residual, w, 1e-6)
    assert torch.equal(residual, total)
    _assert_close(x, _rms_ref(total, w, 1e-6), dtype)
    if dtype == torch.bfloat16:  # the norm reads the rounded sum, as torch's add-then-norm
        assert (x == rms_norm_torch(total, w, 1e-6)).float().mean().item() >= 0.999


# ---------------------------------------------------------------- SiLU and mul


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("t, inter", [(1, 1537), (37, 1537), (4, 5)])
def test_silu_and_mul_matches_float64_reference(dtype, t, inter):
    x = _randn(t, 2 * inter, dtype=dtype, scale=4.0, seed=inter)
    x[0, 0], x[0, 1] = -100.0, 95.0  # exp overflows / underflows in float32
    gate, up = x.double().chunk(2, dim=-1)
    want = gate * torch.sigmoid(gate) * up
    _assert_close(kernels.silu_and_mul(x), want, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_and_mul_is_within_one_rounding_of_torch(dtype):
    """One rounding instead of torch's two (SiLU output, then the product)."""
    x = _randn(64, 2 * 1536, dtype=dtype, scale=3.0, seed=11)
    got, want = kernels.silu_and_mul(x).double(), silu_and_mul_torch(x).double()
    assert ((got - want).abs() <= ULPS[dtype] * want.abs() + 1e-30).all()


def test_silu_and_mul_out():
    x = _randn(3, 10, dtype=torch.float32, seed=12)
    out = torch.full((3, 5), float("nan"))
    assert kernels.silu_and_mul(x, out=out) is out
    assert torch.equal(out, kernels.silu_and_mul(x))


# ---------------------------------------------------------------- RoPE


def _rope_table(head_dim, dtype, max_positions=300):
    return RotaryEmbedding(head_dim, max_positions,
                           {"rope_type": "default", "rope_theta": 10000.0}, dtype)


def _rope_ref(x, cos_sin, positions, is_neox):
    """float64 rotation of x [T, H, D] by the (dtype-rounded) table's rows."""
    x = x.double()
    cos, sin = cos_sin[positions].double().unsqueeze(1).chunk(2, dim=-1)
    if is_neox:
        a, b = x.chunk(2, dim=-1)
        return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1)
    a, b = x[..., 0::2], x[..., 1::2]
    return torch.stack([a * cos - b * sin, b * cos + a * sin], dim=-1).flatten(-2)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize("t, d", [(1, 64), (37, 64), (37, 18)])
def test_rotary_embedding_matches_float64_reference(dtype, is_neox, t, d):
    """In place on views into a fused qkv row (q, k, v side by side); v untouched."""
    hq, hkv = 9, 3
    table = _rope_table(d, dtype)
    qkv = _randn(t, (hq + 2 * hkv) * d, dtype=dtype, seed=t + d)
    before = qkv.clone()
    q = qkv[:, : hq * d].view(t, hq, d)
    k = qkv[:, hq * d : (hq + hkv) * d].view(t, hkv, d)
    positions = torch.randint(0, 300, (t,), generator=torch.Generator().manual_seed(t))
    positions[0] = 299
    kernels.rotary_embedding(positions, q, k, table.cos_sin_cache, d, is_neox)
    for got, orig in ((q, before[:, : hq * d].view(t, hq, d)),
                      (k, before[:, hq * d : (hq + hkv) * d].view(t, hkv, d))):
        want = _rope_ref(orig, table.cos_sin_cache, positions, is_neox)
        _assert_close(got, want, dtype, size=orig.double().abs().amax(-1, keepdim=True) * 2)
    assert torch.equal(qkv[:, (hq + hkv) * d :], before[:, (hq + hkv) * d :])


@pytest.mark.parametrize("dtype", DTYPES)
def test_rotary_embedding_is_bitwise_hf(dtype):
    """The bits of HF Llama's ``q * cos + rotate_half(q) * sin`` in the model dtype."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    t, hq, hkv, d = 37, 9, 3, 64
    table = _rope_table(d, dtype)
    q, k = _randn(t, hq, d, dtype=dtype, seed=1), _randn(t, hkv, d, dtype=dtype, seed=2)
    positions = torch.randint(0, 300, (t,), generator=torch.Generator().manual_seed(3))
    cos = table.cos[positions].repeat(1, 2)[None]  # HF's [B, T, D]: the angles twice
    sin = table.sin[positions].repeat(1, 2)[None]
    hf_q, hf_k = apply_rotary_pos_emb(q.transpose(0, 1)[None], k.transpose(0, 1)[None], cos, sin)
    kernels.rotary_embedding(positions, q, k, table.cos_sin_cache, d)
    assert torch.equal(q, hf_q[0].transpose(0, 1))
    assert torch.equal(k, hf_k[0].transpose(0, 1))


def test_rotary_embedding_accepts_flat_heads_and_matches_the_torch_reference():
    t, hq, hkv, d = 5, 4, 2, 16
    table = _rope_table(d, torch.float32)
    q, k = _randn(t, hq * d, dtype=torch.float32, seed=4), _randn(t, hkv * d, dtype=torch.float32)
    q2, k2 = q.clone(), k.clone()
    positions = torch.arange(t) * 7
    kernels.rotary_embedding(positions, q, k, table.cos_sin_cache, d)
    rotary_embedding_torch(positions, q2, k2, table.cos_sin_cache)
    torch.testing.assert_close(q, q2, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(k, k2, atol=1e-6, rtol=1e-6)


# ---------------------------------------------------------------- threads


@pytest.mark.parametrize("dtype", DTYPES)
def test_two_threads_give_the_same_bits(dtype):
    """Calls big enough to be split over the pool (>= 2**19 elements each, see
    kFusedMinParallelElems in core/src/fused_ops_kernel.h)."""
    t, h, inter, hq, hkv, d = 1000, 577, 601, 9, 3, 64
    x, r, w = _randn(t, h, dtype=dtype), _randn(t, h, dtype=dtype, seed=1), _randn(h, dtype=dtype)
    gate_up = _randn(t, 2 * inter, dtype=dtype, seed=2)
    q, k = _randn(t, hq, d, dtype=dtype, seed=3), _randn(t, hkv, d, dtype=dtype, seed=4)
    table = _rope_table(d, dtype, max_positions=512)
    positions = torch.arange(t) % 512

    def run(threads):
        kernels.set_num_threads(threads)
        xs, rs, qs, ks = x.clone(), r.clone(), q.clone(), k.clone()
        kernels.fused_add_rms_norm(xs, rs, w, 1e-5)
        kernels.rotary_embedding(positions, qs, ks, table.cos_sin_cache, d)
        return [kernels.rms_norm(x, w, 1e-5), xs, rs, kernels.silu_and_mul(gate_up), qs, ks]

    for one, two in zip(run(1), run(2), strict=True):
        assert torch.equal(one, two)


# ---------------------------------------------------------------- argument checks


def test_rms_norm_rejects_bad_arguments():
    x, w = torch.zeros(4, 8), torch.ones(8)
    with pytest.raises(ValueError, match="x must be float32 or bfloat16"):
        kernels.rms_norm(x.half(), w.half(), 1e-5)
    with pytest.raises(ValueError, match="x must be contiguous"):
        kernels.rms_norm(torch.zeros(8, 4).t(), w, 1e-5)
    with pytest.raises(ValueError, match="x must be 2-D"):
        kernels.rms_norm(torch.zeros(2, 2, 8), w, 1e-5)
    with pytest.raises(ValueError, match="weight has 7 entries"):
        kernels.rms_norm(x, torch.ones(7), 1e-5)
    with pytest.raises(ValueError, match="weight must be torch.bfloat16"):
        kernels.rms_norm(x.bfloat16(), w, 1e-5)
    with pytest.raises(ValueError, match="out shape"):
        kernels.rms_norm(x, w, 1e-5, out=torch.empty(4, 9))
    with pytest.raises(ValueError, match="eps"):
        kernels.rms_norm(x, w, -1.0)
    with pytest.raises(ValueError, match="residual shape"):
        kernels.fused_add_rms_norm(x, torch.zeros(3, 8), w, 1e-5)
    with pytest.raises(ValueError, match="residual must be torch.float32"):
        kernels.fused_add_rms_norm(x, torch.zeros(4, 8, dtype=torch.bfloat16), w, 1e-5)
    with pytest.raises(ValueError, match="x and residual"):
        kernels.fused_add_rms_norm(x, x, w, 1e-5)


def test_silu_and_mul_rejects_bad_arguments():
    with pytest.raises(ValueError, match="even number of columns"):
        kernels.silu_and_mul(torch.zeros(2, 7))
    with pytest.raises(ValueError, match="x must be contiguous"):
        kernels.silu_and_mul(torch.zeros(8, 2).t())
    with pytest.raises(ValueError, match=r"out must have shape \(2, 4\)"):
        kernels.silu_and_mul(torch.zeros(2, 8), out=torch.zeros(2, 8))
    x = torch.zeros(2, 8)
    with pytest.raises(ValueError, match="overlap"):
        kernels.silu_and_mul(x, out=x.view(-1)[4:12].view(2, 4))


def test_rotary_embedding_rejects_bad_arguments_before_writing():
    table = _rope_table(8, torch.float32, max_positions=10)
    cache = table.cos_sin_cache
    q, k = torch.ones(3, 2, 8), torch.ones(3, 1, 8)
    pos = torch.tensor([0, 9, 10])
    with pytest.raises(ValueError, match=r"positions\[2\] = 10 out of range \[0, 10\)"):
        kernels.rotary_embedding(pos, q, k, cache, 8)
    assert (q == 1).all() and (k == 1).all()
    pos = pos.clamp(max=9)
    with pytest.raises(ValueError, match="positions must be torch.int64"):
        kernels.rotary_embedding(pos.int(), q, k, cache, 8)
    with pytest.raises(ValueError, match="positions has 2 entries"):
        kernels.rotary_embedding(pos[:2], q, k, cache, 8)
    with pytest.raises(ValueError, match="query has head size 8, expected head_size=4"):
        kernels.rotary_embedding(pos, q, k, cache, 4)
    with pytest.raises(ValueError, match="head_size must be even"):
        kernels.rotary_embedding(pos, q.view(3, 16), k.view(3, 8), cache, 1)
    with pytest.raises(ValueError, match="key has 2 tokens"):
        kernels.rotary_embedding(pos, q, k[:2], cache, 8)
    with pytest.raises(ValueError, match="key must be torch.float32"):
        kernels.rotary_embedding(pos, q, k.bfloat16(), cache, 8)
    with pytest.raises(ValueError, match="cos_sin_cache must be torch.float32"):
        kernels.rotary_embedding(pos, q, k, cache.bfloat16(), 8)
    with pytest.raises(ValueError, match="cos_sin_cache has 16 columns"):
        kernels.rotary_embedding(pos, q, k, torch.zeros(10, 16), 8)
    with pytest.raises(ValueError, match="query must have contiguous heads"):
        kernels.rotary_embedding(pos, torch.ones(3, 8, 2).transpose(1, 2), k, cache, 8)
    with pytest.raises(ValueError, match="query must be float32 or bfloat16"):
        kernels.rotary_embedding(pos, q.half(), k.half(), cache.half(), 8)


# ---------------------------------------------------------------- off the CPU


def test_devices_without_fused_kernels_run_the_torch_reference():
    """Meta tensors stand in for CUDA ones: the dispatch picks the torch
    reference (the CUDA backend's elementwise ops), which keeps the shapes."""
    assert isinstance(kernels.backend_for("meta"), kernels.NativeBackend)
    x, w = torch.empty(4, 8, device="meta"), torch.empty(8, device="meta")
    assert kernels.rms_norm(x, w, 1e-5).shape == (4, 8)
    kernels.fused_add_rms_norm(x, torch.empty(4, 8, device="meta"), w, 1e-5)
    assert kernels.silu_and_mul(x).shape == (4, 4)
    cache = torch.empty(10, 8, device="meta")
    pos = torch.zeros(4, dtype=torch.int64, device="meta")
    kernels.rotary_embedding(pos, torch.empty(4, 2, 8, device="meta"),
                             torch.empty(4, 1, 8, device="meta"), cache, 8)
