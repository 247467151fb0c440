// Recurrent token mixers' one-token state updates on the CPU (see
// paternoster/ssm.h).
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "paternoster/ssm.h"
#include "paternoster/thread_pool.h"

namespace paternoster {

namespace {

[[noreturn]] void fail(const std::string& msg) { throw std::invalid_argument(msg); }

// Below this many state elements a call runs on the caller alone.
constexpr int64_t kMinParallelElems = 1 << 16;

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
  std::vector<bool> seen(static_cast<size_t>(num_slots), false);
  for (int64_t b = 0; b < batch; ++b) {
    if (slots[b] < 0 || slots[b] >= num_slots || seen[slots[b]]) {
      fail("mamba2_state_update: slot " + std::to_string(slots[b]) + " out of [0, " +
           std::to_string(num_slots) + ") or repeated");
    }
    seen[slots[b]] = true;
  }
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

}  // namespace paternoster
