// Linear layers on the CPU: out = x W^T (+ bias), with W dense (float32,
// bfloat16) or kept in a GGUF block-quantized format (Q8_0, Q4_0, Q4_1, Q5_0,
// Q5_1, IQ4_NL, MXFP4, and the 256-value K-quants Q4_K, Q5_K, Q6_K and IQ4_XS)
// and dequantized on the fly, one block row at a time, into a small float32 tile.
//
// Layouts (row-major):
//   x      [num_tokens, in_features]    float32 or bfloat16 (x_dtype)
//   weight [out_features, in_features]  dense: in the weight format's element
//          type; quantized: out_features rows of weight_row_bytes(format,
//          in_features) bytes each, the blocks of ggml/GGUF (quantization
//          along in_features, 32 values a block):
//            Q8_0: {float16 d; int8 q[32]}            value = d * q
//            Q4_0: {float16 d; uint8 q[16]}           value = d * (nibble - 8)
//            Q4_1: {float16 d; float16 m; uint8 q[16]} value = d * nibble + m
//            Q5_0: {float16 d; uint8 qh[4]; uint8 q[16]}     value = d * (q5 - 16)
//            Q5_1: {float16 d; float16 m; uint8 qh[4]; uint8 q[16]}  d * q5 + m
//            IQ4_NL: {float16 d; uint8 q[16]}         value = d * kvalues_iq4nl[nibble]
//            MXFP4: {uint8 e; uint8 q[16]}            value = 2^(e-128) * kvalues_mxfp4[nibble]
//          where byte j of q holds element j in its low nibble and element
//          j + 16 in its high nibble, and bit j of qh is element j's fifth bit;
//          the K-quants take 256 values a block (in_features % 256 == 0):
//            Q4_K (144 bytes), Q5_K (176), Q6_K (210), IQ4_XS (136), with
//          6- or 8-bit scales per run of 32 (16 for Q6_K) values; their
//          layouts are spelled out in core/src/quant_formats.h
//          (ggml's ggml-common.h, GGUF spec).
//   bias   [out_features] in x_dtype, or null
//   out    [num_tokens, out_features]   float32 or bfloat16 (out_dtype)
//
// Arithmetic is float32 with one rounding to out_dtype at the end, with one
// exception: on the x86 variants with AVX2, calls with quantized weights of at
// most 8 tokens (avx512bf16) or 64 (avx2, avx512) quantize x to 8 bits per
// block of 32 (as llama.cpp's CPU path does) and sum integer products, unless
// batch_invariant is set.
// Batch invariance: every output element is reduced in an order fixed by
// in_features, the ISA variant and that choice alone (thread splits cut
// out_features and token blocks, never the reduction). With batch_invariant,
// or with dense weights, a row's result is bit-identical whatever num_tokens
// is, which rows it shares a call with and how the work is split; without it,
// a quantized call's result may change between calls below and above that size.
//
// Work is split over default_thread_pool(). Every function checks its
// arguments and throws std::invalid_argument before writing anything.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "paternoster/attention.h"  // DType

namespace paternoster {

// The quantized formats carry ggml's type numbers (GGMLQuantizationType).
enum class WeightFormat : int32_t {
  kFloat32 = 0, kBFloat16 = 1, kQ4_0 = 2, kQ4_1 = 3, kQ5_0 = 6, kQ5_1 = 7, kQ8_0 = 8,
  kQ4_K = 12, kQ5_K = 13, kQ6_K = 14, kIQ4_NL = 20, kIQ4_XS = 23, kMXFP4 = 39
};

// Values per run of the quantized formats: a 32-value block, or one of the
// eight runs of a 256-value K-quant block. The 8-bit activation path
// quantizes x per run.
constexpr int64_t kQuantBlock = 32;

// Bytes of one weight row of in_features values in `format`; quantized
// formats need in_features to be a multiple of their block (32, or 256 for
// Q4_K, Q5_K, Q6_K, IQ4_XS), std::invalid_argument otherwise.
int64_t weight_row_bytes(WeightFormat format, int64_t in_features);

// out = x W^T (+ bias); see the header comment for layouts, rounding and
// batch_invariant.
void linear(void* out, DType out_dtype, const void* x, DType x_dtype, const void* weight,
            WeightFormat format, const void* bias, int64_t num_tokens, int64_t out_features,
            int64_t in_features, bool batch_invariant = false);

// A block of a weight's rows stored on its own, in its own format: a fused
// projection (q/k/v, gate/up) whose parts a GGUF file keeps apart, maybe in
// different types (Q4_K_M stores some v projections as Q6_K), used where they
// lie rather than copied together.
struct WeightPart {
  const void* data = nullptr;  // rows x weight_row_bytes(format, in_features) bytes
  WeightFormat format = WeightFormat::kFloat32;
  int64_t rows = 0;            // > 0
};

// linear() with W the rows of `parts` one after another (out_features = the
// sum of their rows): each part's columns of out come from its own format,
// the bias stays one [out_features] vector, and the results are those of
// linear() on the stacked rows of each part's format. Calls of quantized
// parts within i8_max_tokens take the 8-bit path for those parts only.
void linear_parts(void* out, DType out_dtype, const void* x, DType x_dtype,
                  const WeightPart* parts, int64_t num_parts, const void* bias,
                  int64_t num_tokens, int64_t in_features, bool batch_invariant = false);

// Dequantizes rows [0, num_rows) of a weight in `format` into float32
// out [num_rows, in_features] (the values the linear kernel multiplies by).
void dequantize_rows(float* out, const void* weight, WeightFormat format, int64_t num_rows,
                     int64_t in_features);

// The ISA variants of the linear kernel this build and CPU can run, best
// first (those of the attention kernel), and the one in use.
std::vector<std::string> available_linear_isas();
const char* linear_isa();

// linear() with an explicit ISA variant (tests and benchmarks).
void linear_isa_variant(const char* isa, void* out, DType out_dtype, const void* x,
                        DType x_dtype, const void* weight, WeightFormat format, const void* bias,
                        int64_t num_tokens, int64_t out_features, int64_t in_features,
                        bool batch_invariant = false);

}  // namespace paternoster
