"""The linear layer (``paternoster.kernels.linear``) against independent
references: the ``gguf`` package's own quantizer and dequantizer (llama.cpp's
gguf-py) for the block formats, and float64 matmuls; batch invariance checked
bit for bit; the torch reference dequantizer against gguf's."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, quants

from paternoster import _core, kernels
from paternoster.kernels.cpu import (
    CPU_DTYPES,
    DENSE_CORE_MAX_TOKENS,
    WEIGHT_FORMATS,
    CpuBackend,
)
from paternoster.kernels.quant import QuantizedWeight, dequantize_torch

GGML_TYPES = {"q8_0": GGMLQuantizationType.Q8_0, "q4_0": GGMLQuantizationType.Q4_0,
              "q4_1": GGMLQuantizationType.Q4_1}


def quantized(w: torch.Tensor, fmt: str) -> tuple[QuantizedWeight, torch.Tensor]:
    """``w`` quantized by gguf-py, and gguf-py's dequantization of it (float64)."""
    blocks = quants.quantize(w.numpy(), GGML_TYPES[fmt])
    ref = torch.from_numpy(quants.dequantize(blocks, GGML_TYPES[fmt]).astype(np.float64))
    return QuantizedWeight(torch.from_numpy(np.ascontiguousarray(blocks)), fmt, w.shape[1]), ref


@pytest.fixture(autouse=True)
def _two_threads():
    old = kernels.get_num_threads()
    kernels.set_num_threads(2)
    yield
    kernels.set_num_threads(old)


@pytest.mark.parametrize("fmt", ["q8_0", "q4_0", "q4_1"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_quantized_matches_gguf_dequantized(fmt, dtype):
    torch.manual_seed(0)
    w = torch.randn(200, 576)
    qw, ref_w = quantized(w, fmt)
    x = torch.randn(9, 576).to(dtype)
    bias = torch.randn(200).to(dtype)
    # invariant: the float-activation path at every size (the 8-bit one has
    # its own test below).
    out = kernels.linear(x, qw, bias, out_dtype=torch.float32, invariant=True)
    assert out.dtype == torch.float32
    scale = (x.double().abs() @ ref_w.abs().T).max()
    if dtype == torch.bfloat16 and _core.linear_isa() == "avx512bf16":
        # bfloat16 dot products: the weights dequantized, then rounded to bfloat16.
        ref_w = ref_w.float().bfloat16().double()
    ref = x.double() @ ref_w.T + bias.double()
    assert (out.double() - ref).abs().max() <= 1e-6 * scale
    # Model-dtype output: the float32 result rounded once.
    assert torch.equal(kernels.linear(x, qw, bias, invariant=True), out.to(dtype))


@pytest.mark.parametrize("fmt", ["q8_0", "q4_0", "q4_1"])
def test_torch_reference_dequantizer_matches_gguf(fmt):
    torch.manual_seed(1)
    qw, ref_w = quantized(torch.randn(33, 96), fmt)
    assert torch.allclose(dequantize_torch(qw.data, fmt, 96).double(), ref_w, rtol=1e-6,
                          atol=1e-7)


def test_float32_results_of_bfloat16_inputs_are_unrounded_at_any_batch():
    """float32 out (the logits): the core's unrounded sums at every batch
    size; bfloat16 out above DENSE_CORE_MAX_TOKENS rows: torch's GEMM,
    rounded to bfloat16."""
    torch.manual_seed(2)
    w = torch.randn(300, 130).bfloat16()
    for t in (1, DENSE_CORE_MAX_TOKENS, DENSE_CORE_MAX_TOKENS + 1, 70):
        x = torch.randn(t, 130).bfloat16()
        ref = x.double() @ w.double().T
        out = kernels.linear(x, w, out_dtype=torch.float32)
        assert (out.double() - ref).abs().max() <= 1e-4, t
        rounded = kernels.linear(x, w)
        assert rounded.dtype == torch.bfloat16
        assert ((rounded.double() - ref).abs() <= 1e-4 + 2.0**-8 * ref.abs()).all(), t


@pytest.mark.parametrize("weight_kind", ["bfloat16", "float32", "q4_1", "q8_0"])
def test_batch_invariant_bits(weight_kind):
    """A row alone, inside batches of several sizes and with 1 or 2 threads:
    the same bits (the fixed reduction order of paternoster/linear.h)."""
    torch.manual_seed(3)
    w = torch.randn(257, 576)
    dtype = torch.float32 if weight_kind == "float32" else torch.bfloat16
    weight = quantized(w, weight_kind)[0] if weight_kind.startswith("q") else w.to(dtype)
    x = torch.randn(80, 576).to(dtype)
    alone = kernels.linear(x[5:6].clone(), weight, out_dtype=torch.float32, invariant=True)
    for t, threads in ((7, 1), (33, 2), (80, 2)):
        kernels.set_num_threads(threads)
        batch = kernels.linear(x[:t], weight, out_dtype=torch.float32, invariant=True)
        assert torch.equal(batch[5], alone[0]), (t, threads)


def test_isa_variants_agree_within_rounding():
    torch.manual_seed(4)
    qw, ref_w = quantized(torch.randn(64, 320), "q4_1")
    x = torch.randn(3, 320)
    ref = x.double() @ ref_w.T
    for isa in _core.available_linear_isas():
        out = torch.empty(3, 64)
        _core._linear_ptr(out.data_ptr(), _core.DType.float32, x.data_ptr(), _core.DType.float32,
                          qw.data.data_ptr(), _core.WeightFormat.q4_1, 0, 3, 64, 320, isa,
                          batch_invariant=True)
        assert (out.double() - ref).abs().max() < 1e-4, isa


def q8_activations(x: torch.Tensor) -> torch.Tensor:
    """x ``[T, K]`` quantized as llama.cpp quantizes activations for its
    integer dot products (ggml's quantize_row_q8_1 reference): per block of 32,
    scale ``d = max|x| / 127`` and values ``round(x / d)``, ties to even, in
    float32; returned dequantized, float64."""
    blocks = x.float().numpy().reshape(x.shape[0], -1, 32)
    d = np.abs(blocks).max(-1, keepdims=True) / np.float32(127)
    inv = np.divide(np.float32(1), d, out=np.zeros_like(d), where=d > 0)
    q = np.rint(blocks * inv)
    return torch.from_numpy((q.astype(np.float64) * d).reshape(x.shape))


# The most tokens a quantized call may have and take the 8-bit activation
# path, per ISA variant (core/include/paternoster/linear.h); other variants
# never take it.
I8_MAX_TOKENS = {"avx512bf16": 8, "avx512": 64, "avx2": 64}
#: The same for the 256-value formats (Q4_K, Q5_K, Q6_K, IQ4_XS: the integer GEMM).
I8K_MAX_TOKENS = {"avx512bf16": 1 << 40, "avx512": 1 << 40, "avx2": 1 << 40}


def _variant_linear(isa: str, x: torch.Tensor, qw: QuantizedWeight,
                    invariant: bool) -> torch.Tensor:
    """``x @ w.T`` float32 ``[T, N]`` on one ISA variant of the core."""
    t, k = x.shape
    n = qw.data.shape[0]
    out = torch.empty(t, n)
    _core._linear_ptr(out.data_ptr(), _core.DType.float32, x.data_ptr(), CPU_DTYPES[x.dtype],
                      qw.data.data_ptr(), WEIGHT_FORMATS[qw.format], 0, t, n, k, isa,
                      batch_invariant=invariant)  # fmt: skip
    return out


@pytest.mark.parametrize("fmt", ["q8_0", "q4_0", "q4_1"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_small_quantized_calls_take_8bit_activations_on_x86_variants(fmt, dtype):
    """Quantized calls of up to I8_MAX_TOKENS rows on the x86 variants: x
    quantized to 8 bits per block (llama.cpp's q8 activations) times the
    gguf-dequantized weights, within float32 summation error; error against
    the float path within llama.cpp's own mul_mat tolerance (test-backend-ops:
    NMSE <= 5e-4); the same bits on every variant (vpdpbusd and AVX2's
    vpmaddubsw + vpmaddwd give the same exact integer sums). Larger calls and
    batch-invariant calls take the float path, bit for bit."""
    torch.manual_seed(5)
    qw, ref_w = quantized(torch.randn(130, 576), fmt)
    for t in (1, 3, 4, 8, 9, 64, 65):
        x = torch.randn(t, 576).to(dtype)
        exact = x.double() @ ref_w.T
        ref = q8_activations(x) @ ref_w.T
        scale = (x.double().abs() @ ref_w.abs().T).max()
        i8_outs = []
        for isa in _core.available_linear_isas():
            out = _variant_linear(isa, x, qw, invariant=False)
            invariant = _variant_linear(isa, x, qw, invariant=True)
            if t > I8_MAX_TOKENS.get(isa, 0):
                assert torch.equal(out, invariant), (isa, t)
                continue
            assert (out.double() - ref).abs().max() <= 1e-6 * scale, (isa, t)
            nmse = ((out.double() - exact) ** 2).sum() / (exact**2).sum()
            # the activations' rounding shows, within llama.cpp's bound
            assert 1e-7 < nmse <= 5e-4, (isa, t)
            i8_outs.append((isa, out))
        for isa, out in i8_outs[1:]:
            assert torch.equal(out, i8_outs[0][1]), (isa, i8_outs[0][0], t)


@pytest.mark.parametrize("fmt", ["q8_0", "q4_1"])
def test_8bit_activation_path_through_kernels_linear(fmt):
    """Through ``kernels.linear`` on the default variant: ``invariant`` keeps
    the float path of the widest calls bit for bit, and a NaN or infinity in
    a row reaches that row's outputs (not finite) and no other row's."""
    torch.manual_seed(6)
    qw, _ = quantized(torch.randn(130, 576), fmt)
    for t in (1, 4):
        x = torch.randn(t, 576).bfloat16()
        invariant = kernels.linear(x, qw, out_dtype=torch.float32, invariant=True)
        wide = kernels.linear(x.repeat(70, 1), qw, out_dtype=torch.float32)  # > 64 rows
        assert torch.equal(invariant, wide[:t]), t
    for bad in (float("nan"), float("inf")):
        x = torch.randn(2, 576).bfloat16()
        x[1, 40] = bad
        out = kernels.linear(x, qw, out_dtype=torch.float32)
        assert not out[1].isfinite().any() and out[0].isfinite().all(), bad


def test_bad_arguments_name_the_argument():
    backend = CpuBackend()
    x = torch.randn(2, 64)
    with pytest.raises(ValueError, match="input features"):
        backend.linear(x, torch.randn(8, 32))
    with pytest.raises(ValueError, match="weight must be torch.float32"):
        backend.linear(x, torch.randn(8, 64).bfloat16())
    with pytest.raises(ValueError, match="bias"):
        backend.linear(x, torch.randn(8, 64), torch.randn(7))
    with pytest.raises(ValueError, match="out_dtype"):
        backend.linear(x, torch.randn(8, 64), out_dtype=torch.float16)
    qw = quantized(torch.randn(8, 64), "q8_0")[0]
    with pytest.raises(ValueError, match="input features"):
        backend.linear(torch.randn(2, 96), qw)
    with pytest.raises(ValueError, match="multiple of 32"):
        QuantizedWeight(qw.data, "q8_0", 48)
    with pytest.raises(ValueError, match="format"):
        QuantizedWeight(qw.data, "q3_k", 64)
    with pytest.raises(ValueError, match="uint8"):
        QuantizedWeight(qw.data[:, :10].contiguous(), "q8_0", 64)


def test_native_backend_refuses_invariant_and_dequantizes():
    from paternoster.kernels import NativeBackend

    qw, ref_w = quantized(torch.randn(16, 64), "q4_0")
    x = torch.randn(2, 64)
    out = NativeBackend("cpu").linear(x, qw)
    assert torch.allclose(out.double(), x.double() @ ref_w.T, atol=1e-4)
    with pytest.raises(ValueError, match="batch-invariant"):
        NativeBackend("cpu").linear(x, qw, invariant=True)
