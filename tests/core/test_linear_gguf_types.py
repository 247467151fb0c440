"""The linear kernel on every GGUF tensor type it keeps quantized, against the
``gguf`` package's own dequantizer (llama.cpp's gguf-py, written from ggml's
reference code) and a float64 product.

The weights are random bytes made into valid blocks (their scales set to
finite float16 values), so every bit pattern of the quantized values, scales
and minimums is met, not only those a quantizer would write. Bounds: the
float path within float32 summation error; the 8-bit activation path
(decode) within that error of the product with llama.cpp's 8-bit activations
(see test_linear.py) and within llama.cpp's own mul_mat tolerance of the exact
product (test-backend-ops: NMSE <= 5e-4); every x86 variant the same bits."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from paternoster import _core, kernels
from paternoster.kernels.quant import QuantizedWeight, dequantize_torch
from tests.core.test_linear import (  # noqa: F401 - _two_threads: the autouse fixture
    I8_MAX_TOKENS,
    I8K_MAX_TOKENS,
    _two_threads,
    _variant_linear,
    q8_activations,
)
from tests.model import gguf_writer

#: The types kept quantized (beyond Q8_0 / Q4_0 / Q4_1, tested in test_linear.py).
FORMATS = ["q5_0", "q5_1", "iq4_nl", "mxfp4", "q4_k", "q5_k", "q6_k", "iq4_xs"]

def random_blocks(rows: int, k: int, fmt: str, seed: int) -> tuple[QuantizedWeight, torch.Tensor]:
    """A ``[rows, k]`` weight of random valid blocks, and gguf-py's
    dequantization of it (float64)."""
    data, ref = gguf_writer.random_blocks(rows, k, fmt, seed)
    return (QuantizedWeight(torch.from_numpy(data.copy()), fmt, k),
            torch.from_numpy(ref.astype(np.float64)))


def q8k_activations(x: torch.Tensor) -> torch.Tensor:
    """x ``[T, K]`` quantized per 256 values, as llama.cpp quantizes the
    activations that meet its K-quant blocks (Q8_K: one scale per 256; here
    the symmetric ``max|x| / 127`` of its 32-value Q8 rows), dequantized,
    float64."""
    blocks = x.float().numpy().reshape(x.shape[0], -1, 256)
    d = np.abs(blocks).max(-1, keepdims=True) / np.float32(127)
    inv = np.divide(np.float32(1), d, out=np.zeros_like(d), where=d > 0)
    return torch.from_numpy((np.rint(blocks * inv).astype(np.float64) * d).reshape(x.shape))


#: The formats of 256-value blocks, whose activations go per 256 values.
PER_256 = ("q4_k", "q5_k", "q6_k", "iq4_xs")


@pytest.mark.parametrize("fmt", FORMATS)
def test_dequantize_rows_matches_gguf(fmt):
    """The core's decoder of each format gives gguf-py's values exactly (up to
    float32 rounding of the products), on every variant's dequantizer."""
    qw, ref = random_blocks(7, 512, fmt, seed=1)
    out = torch.empty(7, 512)
    _core._dequantize_rows_ptr(out.data_ptr(), qw.data.data_ptr(),
                               getattr(_core.WeightFormat, fmt), 7, 512)
    assert torch.allclose(out.double(), ref, rtol=1e-6, atol=0), fmt
    assert torch.allclose(dequantize_torch(qw.data, fmt, 512).double(), ref, rtol=1e-6, atol=0)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_float_path_matches_gguf_dequantized(fmt, dtype):
    """Batch-invariant calls (the float path, every size): the float64 product
    of gguf-py's values within float32 summation error."""
    k = 768
    qw, ref_w = random_blocks(70, k, fmt, seed=2)
    bias = torch.randn(70).to(dtype)
    if dtype == torch.bfloat16 and _core.linear_isa() == "avx512bf16":
        # bfloat16 dot products: the weights dequantized, then rounded to bfloat16.
        ref_w = ref_w.float().bfloat16().double()
    for t in (1, 5, 70):
        x = torch.randn(t, k).to(dtype)
        out = kernels.linear(x, qw, bias, out_dtype=torch.float32, invariant=True)
        ref = x.double() @ ref_w.T + bias.double()
        scale = (x.double().abs() @ ref_w.abs().T).max()
        assert (out.double() - ref).abs().max() <= 1e-6 * scale, (fmt, t)


@pytest.mark.parametrize("fmt", FORMATS)
def test_8bit_activation_path_matches_gguf_dequantized(fmt):
    """Decode-sized calls on the x86 variants: llama.cpp's 8-bit activations
    (per 32 values, per 256 for the K-quants and IQ4_XS, whose integer sums
    add across a block's runs as in ggml's vec_dot_q4_K_q8_K) times gguf-py's
    values within float32 summation error, within llama.cpp's
    NMSE bound of the exact product, the same bits on every variant; larger
    calls take the float path bit for bit."""
    k = 512
    qw, ref_w = random_blocks(36, k, fmt, seed=3)
    limits = I8K_MAX_TOKENS if fmt in PER_256 else I8_MAX_TOKENS
    for t in (1, 3, 8, 9, 13, 70):
        x = torch.randn(t, k).bfloat16()
        exact = x.double() @ ref_w.T
        ref = (q8k_activations(x) if fmt in PER_256 else q8_activations(x)) @ ref_w.T
        scale = (x.double().abs() @ ref_w.abs().T).max()
        outs = []
        for isa in _core.available_linear_isas():
            out = _variant_linear(isa, x, qw, invariant=False)
            if t > limits.get(isa, 0):
                assert torch.equal(out, _variant_linear(isa, x, qw, invariant=True)), (isa, t)
                continue
            assert (out.double() - ref).abs().max() <= 1e-6 * scale, (fmt, isa, t)
            nmse = ((out.double() - exact) ** 2).sum() / (exact**2).sum()
            assert nmse <= 5e-4, (fmt, isa, t)
            outs.append((isa, out))
        for isa, out in outs[1:]:
            assert torch.equal(out, outs[0][1]), (fmt, isa, outs[0][0], t)


@pytest.mark.parametrize("fmt", PER_256)
def test_8bit_gemm_gives_each_token_the_bits_of_a_call_of_its_own(fmt):
    """Calls of many tokens (a batch's decode step, a prefill) decode each
    weight block once for all of them (the integer GEMM); every token's row
    is still the one a call of that token alone gives (the one-token kernel
    against the same activations), on every x86 variant, across the driver's
    token blocks of 64 and partial tiles of rows."""
    k = 768
    qw, _ = random_blocks(10, k, fmt, seed=5)
    x = torch.randn(70, k).bfloat16()
    for isa in _core.available_linear_isas():
        limit = min(I8K_MAX_TOKENS.get(isa, 0), 70)
        if limit < 3:
            continue
        whole = _variant_linear(isa, x[:limit], qw, invariant=False)
        alone = torch.cat([_variant_linear(isa, x[i:i + 1], qw, invariant=False)
                           for i in range(limit)])
        assert torch.equal(whole, alone), (fmt, isa)


def test_k_quants_need_whole_blocks_of_256():
    qw, _ = random_blocks(2, 256, "q4_k", seed=4)
    with pytest.raises(ValueError, match="multiple of 256"):
        QuantizedWeight(qw.data, "q4_k", 128)
    with pytest.raises(ValueError, match="multiple of 256"):
        _core.weight_row_bytes(_core.WeightFormat.q6_k, 224)
    assert _core.weight_row_bytes(_core.WeightFormat.q6_k, 512) == 420
