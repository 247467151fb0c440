// Recurrent token mixers' one-token state updates on the CPU (see
// paternoster/ssm.h).
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "paternoster/ssm.h"
#include "paternoster/thread_pool.h"
#include "scalar_dtype.h"

namespace paternoster {

namespace {

[[noreturn]] void fail(const std::string& msg) { throw std::invalid_argument(msg); }

// Below this many state elements a call runs on the caller alone.
constexpr int64_t kMinParallelElems = 1 << 16;

using detail::load_elem;
using detail::round_elem;
using detail::store_elem;

void check_slots(const int64_t* slots, int64_t batch, int64_t num_slots, const char* who) {
  std::vector<bool> seen(static_cast<size_t>(num_slots), false);
  for (int64_t b = 0; b < batch; ++b) {
    if (slots[b] < 0 || slots[b] >= num_slots || seen[slots[b]]) {
      fail(std::string(who) + ": slot " + std::to_string(slots[b]) + " out of [0, " +
           std::to_string(num_slots) + ") or repeated");
    }
    seen[slots[b]] = true;
  }
}

}  // namespace

void mamba2_state_update(float* state, const int64_t* slots, int64_t batch, int64_t num_slots,
                         int64_t heads, int64_t head_dim, int64_t groups, int64_t state_size,
                         const float* x, const float* dt, const float* A, const float* B,
                         const float* C, const float* D, float* y) {
  if (batch < 0) fail("mamba2_state_update: batch must be >= 0, got " + std::to_string(batch));
  if (heads <= 0 || head_dim <= 0 || groups <= 0 || state_size <= 0 || num_slots <= 0) {
    fail("mamba2_state_update: heads, head_dim, groups, state_size and num_slots must be > 0");
  }
  if (heads % groups) {
    fail("mamba2_state_update: heads (" + std::to_string(heads) +
         ") must be a multiple of groups (" + std::to_string(groups) + ")");
  }
  if (batch == 0) return;
  if (!state || !slots || !x || !dt || !A || !B || !C || !D || !y) {
    fail("mamba2_state_update: null pointer");
  }
  check_slots(slots, batch, num_slots, "mamba2_state_update");
  const int64_t per_group = heads / groups;
  const int64_t head_elems = head_dim * state_size;
  auto one = [&](int64_t item) {
    const int64_t b = item / heads, h = item % heads, g = h / per_group;
    float* s = state + (slots[b] * heads + h) * head_elems;
    const float* bn = B + (b * groups + g) * state_size;
    const float* cn = C + (b * groups + g) * state_size;
    const float* xh = x + (b * heads + h) * head_dim;
    float* yh = y + (b * heads + h) * head_dim;
    const float step = dt[b * heads + h];
    const float decay = std::exp(step * A[h]);
    for (int64_t p = 0; p < head_dim; ++p) {
      const float xdt = step * xh[p];
      float* row = s + p * state_size;
      float acc = 0.0f;
      for (int64_t n = 0; n < state_size; ++n) {
        const float v = row[n] * decay + xdt * bn[n];
        row[n] = v;
        acc += v * cn[n];
      }
      yh[p] = acc + D[h] * xh[p];
    }
  };
  const int64_t items = batch * heads;
  ThreadPool& pool = default_thread_pool();
  if (pool.num_threads() <= 1 || items < 2 || items * head_elems < kMinParallelElems) {
    for (int64_t i = 0; i < items; ++i) one(i);
    return;
  }
  pool.parallel_for(items, one);
}

void short_conv_update(void* conv_state, const int64_t* slots, int64_t batch, int64_t num_slots,
                       int64_t hidden, int64_t kernel, const void* bcx, const void* weight,
                       const void* bias, void* y, DType dtype) {
  if (batch < 0) fail("short_conv_update: batch must be >= 0, got " + std::to_string(batch));
  if (hidden <= 0 || num_slots <= 0 || kernel < 2) {
    fail("short_conv_update: hidden and num_slots must be > 0 and kernel >= 2");
  }
  if (dtype != DType::kFloat32 && dtype != DType::kBFloat16) {
    fail("short_conv_update: dtype must be float32 or bfloat16");
  }
  if (batch == 0) return;
  if (!conv_state || !slots || !bcx || !weight || !y) fail("short_conv_update: null pointer");
  check_slots(slots, batch, num_slots, "short_conv_update");
  const int64_t H = hidden, K = kernel, S = kernel - 1;
  auto rows = [&](int64_t lo, int64_t hi) {
    for (int64_t item = lo; item < hi; ++item) {
      const int64_t b = item / H, h = item % H;
      const int64_t in = b * 3 * H;
      const float u =
          round_elem(load_elem(bcx, in + h, dtype) * load_elem(bcx, in + 2 * H + h, dtype), dtype);
      const int64_t st = (slots[b] * H + h) * S;
      float acc = 0.0f;
      for (int64_t i = 0; i < S; ++i) {
        acc += load_elem(weight, h * K + i, dtype) * load_elem(conv_state, st + i, dtype);
      }
      acc += load_elem(weight, h * K + S, dtype) * u;
      if (bias) acc += load_elem(bias, h, dtype);
      for (int64_t i = 0; i + 1 < S; ++i) {
        store_elem(conv_state, st + i, load_elem(conv_state, st + i + 1, dtype), dtype);
      }
      store_elem(conv_state, st + S - 1, u, dtype);
      store_elem(y, b * H + h, load_elem(bcx, in + H + h, dtype) * round_elem(acc, dtype), dtype);
    }
  };
  const int64_t items = batch * H;
  ThreadPool& pool = default_thread_pool();
  if (pool.num_threads() <= 1 || items * K < kMinParallelElems) {
    rows(0, items);
    return;
  }
  const int64_t parts = pool.num_threads() * 4;
  pool.parallel_for(parts, [&](int64_t i) { rows(items * i / parts, items * (i + 1) / parts); });
}

}  // namespace paternoster
