// Fused elementwise kernels of the Llama decoder block on the CPU: RMSNorm,
// residual add + RMSNorm, SwiGLU's activation and rotary position embedding.
// Each replaces a chain of small tensor ops (and their float32 copies) with one
// pass over the rows.
//
// Arrays are row-major; tokens (rows) are independent. Element type float32, or
// bfloat16 stored as uint16 (DType); arithmetic is float32. The intermediate
// roundings of HF transformers' Llama are reproduced where the comments say
// so, so RMSNorm, the residual add and RoPE carry HF's bits (RMSNorm up to the
// order of its float32 sum).
//
// Work is split over rows on default_thread_pool() (the attention kernels'
// pool and thread count) when a call is big enough to pay for waking workers.
// Every function checks its arguments first and throws std::invalid_argument
// before writing anything.
#pragma once

#include <cstdint>

#include "paternoster/attention.h"  // DType

namespace paternoster {

// RMSNorm (Zhang & Sennrich 2019), as HF Llama computes it:
//   inv_rms = 1 / sqrt(mean(x[t]^2) + eps)            (float32)
//   out[t]  = round(round(x[t] * inv_rms) * weight)    (round: to dtype)
// x, out [num_tokens, hidden_size]; weight [hidden_size]. out may equal x.
void rms_norm(void* out, const void* x, const void* weight, int64_t num_tokens,
              int64_t hidden_size, double eps, DType dtype);

// Residual add and RMSNorm in one pass (vLLM's fused_add_rms_norm), in place:
//   residual[t] = round(x[t] + residual[t]);  x[t] = rms_norm(residual[t])
// x, residual [num_tokens, hidden_size], distinct; weight [hidden_size].
void fused_add_rms_norm(void* x, void* residual, const void* weight, int64_t num_tokens,
                        int64_t hidden_size, double eps, DType dtype);

// SwiGLU's gating (Shazeer 2020): x [num_tokens, 2 * intermediate_size], gate
// columns first, then up; out [num_tokens, intermediate_size]
//   out = round(silu(gate) * up),  silu(g) = g / (1 + e^-g),
// in float32 with one rounding (torch rounds silu(gate) to bfloat16 first, so
// bfloat16 results may differ from it by one unit in the last place). out must
// not overlap x.
void silu_and_mul(void* out, const void* x, int64_t num_tokens, int64_t intermediate_size,
                  DType dtype);

// Rotary position embedding (RoPE, Su et al. 2021), in place on query
// [num_tokens, num_heads, head_size] and key [num_tokens, num_kv_heads,
// head_size]. Rows (tokens) are query_stride / key_stride elements apart
// (>= heads * head_size; e.g. views into a fused qkv projection); heads within
// a row are contiguous. cos_sin_cache [max_positions, head_size]: cos of the
// head_size / 2 angles of a position, then their sin (frequency scaling is
// already in the table). Token t uses row positions[t].
//   is_neox (GPT-NeoX / HF Llama "rotate half"): pairs (i, i + D/2);
//   otherwise (GPT-J): pairs (2i, 2i + 1); pair i turns by angle i:
//     x'_a = round(round(x_a cos) - round(x_b sin)),
//     x'_b = round(round(x_b cos) + round(x_a sin))
// (the products are rounded to dtype as HF's `q * cos + rotate_half(q) * sin`
// rounds them). head_size must be even; a position outside
// [0, max_positions) throws.
void rotary_embedding(const int64_t* positions, void* query, void* key,
                      const void* cos_sin_cache, int64_t num_tokens, int64_t num_heads,
                      int64_t num_kv_heads, int64_t head_size, int64_t query_stride,
                      int64_t key_stride, int64_t max_positions, bool is_neox, DType dtype);

}  // namespace paternoster
