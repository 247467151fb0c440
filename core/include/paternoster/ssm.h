// One-token state updates of the recurrent token mixers, in place on each
// sequence's state slot: one pass over the state instead of the chain of
// tensor ops (each a full read and write of it) the Python form takes.
//
// Arrays are row-major float32. Every function checks its arguments first and
// throws std::invalid_argument before writing anything.
#pragma once

#include <cstdint>

#include "paternoster/attention.h"  // DType

namespace paternoster {

// Mamba2's selective state update (Dao & Gu 2024, arXiv:2405.21060) for one
// token of each of `batch` sequences. Sequence b's state is
// state[slots[b]] ([heads, head_dim, state_size] of a [num_slots, ...] array);
// head h reads group h / (heads / groups) of B and C. Per head h and row p:
//   decay    = exp(dt[b, h] * A[h])
//   s[p, n]  = s[p, n] * decay + (dt[b, h] * x[b, h, p]) * B[b, g, n]
//   y[b,h,p] = sum_n s[p, n] * C[b, g, n] + D[h] * x[b, h, p]
// (float32, the sum over n in order). x, y [batch, heads, head_dim];
// dt [batch, heads] (after softplus and any clamp); A, D [heads];
// B, C [batch, groups, state_size]. Slots must be distinct and in
// [0, num_slots). A sequence's result does not depend on the others in the
// call. Work is split over (sequence, head) pairs on default_thread_pool().
void mamba2_state_update(float* state, const int64_t* slots, int64_t batch, int64_t num_slots,
                         int64_t heads, int64_t head_dim, int64_t groups, int64_t state_size,
                         const float* x, const float* dt, const float* A, const float* B,
                         const float* C, const float* D, float* y);

// LFM2's gated short convolution for one token of each of `batch` sequences
// (Liquid AI 2025; HF Lfm2ShortConv), in place on each sequence's conv state:
// with bcx[b] = [B | C | x] (3 H values of the in-projection, `dtype`),
//   u        = round(B * x)                        (round: to dtype)
//   conv     = round(sum_i w[h, i] * window[i] + bias[h])   (float32 sum, in order)
//   y[b, h]  = round(C * conv)
// where window is the state's K - 1 inputs (oldest first) then u; the state
// becomes the window's last K - 1. conv_state [num_slots, H, K - 1] and
// weight [H, K], bias [H] (or null), bcx [batch, 3 H], y [batch, H], all in
// `dtype` (float32 or bfloat16). Slots distinct, in [0, num_slots). A
// sequence's result does not depend on the others in the call.
void short_conv_update(void* conv_state, const int64_t* slots, int64_t batch, int64_t num_slots,
                       int64_t hidden, int64_t kernel, const void* bcx, const void* weight,
                       const void* bias, void* y, DType dtype);

}  // namespace paternoster
