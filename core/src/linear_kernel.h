// Internal interface between the linear-layer driver (linear_cpu.cc: checks,
// conversions, threads, choice of variant) and the per-ISA tile kernels
// (linear_isa_*.cc, each compiling linear_kernel.inc with its own SIMD width
// and -march).
#pragma once

#include <cstdint>

#include "paternoster/linear.h"

namespace paternoster {
namespace detail {

// One call's operands, x and bias already in float32.
struct LinearArgs {
  void* out;            // [M, N] in out_dtype
  DType out_dtype;
  const float* x;       // [M, K] float32 (null when x_bf16 is used)
  const uint16_t* x_bf16;  // [M, K] bfloat16, for kernels with bf16_dot; else null
  // x quantized to 8 bits per block of 32, for calls within i8_max_tokens and
  // quantized weights (else null): x[m, k] ~ xd[m, k / 32] * x_q8[m, k], with
  // the scale xd in all 8 floats of x_q8_scale8[m, b] and xd * (sum of block
  // b's x_q8) in the first of x_q8_sum8[m, b] (the other 7 zero).
  const int8_t* x_q8;        // [M, K]
  const float* x_q8_scale8;  // [M, K / 32, 8]
  const float* x_q8_sum8;    // [M, K / 32, 8]
  const uint8_t* weight;
  WeightFormat format;
  int64_t row_bytes;    // bytes per weight row
  const float* bias;    // [N] or null
  int64_t M, N, K;
  // The 256-value formats (Q4_K, Q5_K, Q6_K, IQ4_XS) on the 8-bit path take x
  // quantized per 256 values instead (llama.cpp's Q8_K): x[m, k] ~
  // x_q8k_scale[m, k / 256] * x_q8k[m, k], and x_q8k_bsum[m, r] the sum of
  // run r's 32 values of x_q8k (x_q8 null then).
  const int8_t* x_q8k = nullptr;        // [M, K]
  const float* x_q8k_scale = nullptr;   // [M, K / 256]
  const int32_t* x_q8k_bsum = nullptr;  // [M, K / 32]
  // The sums of each 16 values of x_q8k (Q6_K's sub-blocks), [M, K / 16].
  const int32_t* x_q8k_bsum16 = nullptr;
};

// Weight rows a tile kernel dequantizes at a time (its scratch: kLinearNR * K floats).
constexpr int64_t kLinearNR = 4;

struct LinearKernels {
  const char* isa;
  // out rows [m0, m1) x columns [n0, n1); scratch holds kLinearNR * K floats.
  void (*tile)(const LinearArgs&, int64_t m0, int64_t m1, int64_t n0, int64_t n1,
               float* scratch);
  // One weight row of K values in `format` -> float32 (dense formats too).
  void (*dequantize_row)(const uint8_t* row, WeightFormat format, int64_t K, float* out);
  // Takes bfloat16 x as is (x_bf16) and multiplies with bfloat16 dot products
  // (AVX-512 BF16): weights rounded to bfloat16, products exact, float32 sums.
  bool bf16_dot;
  // Calls of up to this many tokens with quantized weights take x_q8 and
  // multiply with 8-bit integer dot products (AVX-512 VNNI, else AVX2's
  // vpmaddubsw; see linear_dot_i8.inc), outside batch-invariant mode; 0: never.
  // Where the float path is bound by dequantizing weights in registers (the
  // decode steps) this is up to 6x faster; larger calls on the avx512bf16
  // variant reuse each dequantized weight row across their tokens with
  // vdpbf16ps, cheaper per (token, row) pair than an integer dot plus a scaled
  // conversion per block. One 3072 x 576 matrix, bfloat16 x, 2 threads,
  // variants interleaved, float / 8-bit time (a 2-core Intel Xeon VM with
  // AVX-512 BF16, VNNI and AMX, during a test run), Q8_0 | Q4_1:
  //   avx512bf16: 1.41x | 1.62x at 4 tokens, 1.03x | 1.11x at 8, 0.91x | 0.96x
  //               at 12, 0.78x | 0.57x at 32
  //   avx512:     1.31x | 1.69x at 4, 1.09x | 1.08x at 16, 1.11x | 1.08x at 64
  //   avx2:       2.16x | 6.09x at 4, 1.46x | 1.51x at 16, 1.23x | 1.17x at 64
  int64_t i8_max_tokens;
  // The same for the 256-value formats (Q4_K, Q5_K, Q6_K, IQ4_XS), whose calls
  // past 2 tokens run an integer GEMM that decodes each weight block once for
  // all the call's tokens: with AVX-512 VNNI the tokens-in-lanes one
  // (linear_gemm_vnni.inc), else i8k_gemm (linear_dot_i8.inc).
  int64_t i8k_max_tokens;
};

namespace baseline { extern const LinearKernels kLinearKernels; }
namespace avx2 { extern const LinearKernels kLinearKernels; }
namespace avx512 { extern const LinearKernels kLinearKernels; }
namespace avx512bf16 { extern const LinearKernels kLinearKernels; }

}  // namespace detail
}  // namespace paternoster
