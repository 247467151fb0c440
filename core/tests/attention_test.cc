// Paged attention and reshape_and_cache against a naive double-precision loop.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "../src/attention_kernel.h"
#include "paternoster/attention.h"
#include "paternoster/thread_pool.h"

#include "bf16_util.h"

namespace paternoster {
namespace {

using test::from_bf16;
using test::to_bf16;

struct Case {
  int64_t hq, hkv, d, bs;
  std::vector<int32_t> q_lens, seq_lens;
  int64_t window = 0;  // sliding window; 0: none
  std::vector<float> sinks = {};  // sink logit per query head; empty: none
};

// Builds a random cache/queries for `c`, runs the kernel (variant `isa`) and
// compares with a double-precision reference; returns the max abs error. With
// a window, the table entries of blocks wholly before each sequence's first
// window are -1 (freed blocks): the kernel must not read them. With sinks, the
// reference adds exp(s_h - max) to each softmax denominator (max over the
// logits and s_h).
double run_case(const Case& c, DType dtype, const char* isa, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int64_t b_count = static_cast<int64_t>(c.q_lens.size());
  std::vector<int32_t> qsl(b_count + 1, 0);
  for (int64_t b = 0; b < b_count; ++b) qsl[b + 1] = qsl[b] + c.q_lens[b];
  const int64_t t_count = qsl[b_count];
  int64_t max_blocks = 0, total_blocks = 0;
  for (int32_t s : c.seq_lens) {
    max_blocks = std::max<int64_t>(max_blocks, (s + c.bs - 1) / c.bs);
    total_blocks += (s + c.bs - 1) / c.bs;
  }
  const int64_t num_blocks = total_blocks + 3;
  // Shuffled block ids so tables are not contiguous.
  std::vector<int32_t> perm(num_blocks);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  std::vector<int32_t> tables(b_count * max_blocks, 0);
  int64_t next = 0;
  for (int64_t b = 0; b < b_count; ++b) {
    for (int64_t j = 0; j < (c.seq_lens[b] + c.bs - 1) / c.bs; ++j) {
      tables[b * max_blocks + j] = perm[next++];
    }
  }
  // First position query row i of sequence b sees.
  auto first_seen = [&](int64_t b, int64_t i) {
    const int64_t pos = c.seq_lens[b] - c.q_lens[b] + i;
    return c.window > 0 ? std::max<int64_t>(0, pos - c.window + 1) : 0;
  };
  std::vector<int32_t> kernel_tables = tables;
  for (int64_t b = 0; b < b_count; ++b) {
    for (int64_t j = 0; j < first_seen(b, 0) / c.bs; ++j) kernel_tables[b * max_blocks + j] = -1;
  }
  const int64_t cache_elems = num_blocks * c.bs * c.hkv * c.d;
  const int64_t q_elems = t_count * c.hq * c.d;
  std::vector<float> kc(cache_elems), vc(cache_elems), q(q_elems);
  for (auto& x : kc) x = normal(rng);
  for (auto& x : vc) x = normal(rng);
  for (auto& x : q) x = normal(rng);
  if (dtype == DType::kBFloat16) {  // the reference sees the rounded values
    for (auto* v : {&kc, &vc, &q}) {
      for (auto& x : *v) x = from_bf16(to_bf16(x));
    }
  }
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.d));
  const float* sinks = c.sinks.empty() ? nullptr : c.sinks.data();

  std::vector<float> out_f(q_elems, -7.0f);
  std::vector<uint16_t> kc_h(cache_elems), vc_h(cache_elems), q_h(q_elems), out_h(q_elems);
  if (dtype == DType::kFloat32) {
    detail::paged_attention_isa(isa, out_f.data(), q.data(), kc.data(), vc.data(),
                                kernel_tables.data(), c.seq_lens.data(), qsl.data(), t_count,
                                b_count, c.hq, c.hkv, c.d, num_blocks, c.bs, max_blocks, scale,
                                dtype, false, c.window, sinks);
  } else {
    for (int64_t i = 0; i < cache_elems; ++i) {
      kc_h[i] = to_bf16(kc[i]);
      vc_h[i] = to_bf16(vc[i]);
    }
    for (int64_t i = 0; i < q_elems; ++i) q_h[i] = to_bf16(q[i]);
    detail::paged_attention_isa(isa, out_h.data(), q_h.data(), kc_h.data(), vc_h.data(),
                                kernel_tables.data(), c.seq_lens.data(), qsl.data(), t_count,
                                b_count, c.hq, c.hkv, c.d, num_blocks, c.bs, max_blocks, scale,
                                dtype, false, c.window, sinks);
    for (int64_t i = 0; i < q_elems; ++i) out_f[i] = from_bf16(out_h[i]);
  }

  double max_err = 0.0;
  const int64_t group = c.hq / c.hkv;
  for (int64_t b = 0; b < b_count; ++b) {
    for (int64_t i = 0; i < c.q_lens[b]; ++i) {
      const int64_t pos = c.seq_lens[b] - c.q_lens[b] + i;
      const int64_t row = qsl[b] + i;
      for (int64_t h = 0; h < c.hq; ++h) {
        const int64_t g = h / group;
        const int64_t lo = first_seen(b, i);
        std::vector<double> s(pos + 1, 0.0);
        double mx = -1e300;
        for (int64_t t = lo; t <= pos; ++t) {
          const int64_t slot = tables[b * max_blocks + t / c.bs] * c.bs + t % c.bs;
          double dot = 0;
          for (int64_t x = 0; x < c.d; ++x) {
            dot += double(q[(row * c.hq + h) * c.d + x]) * kc[(slot * c.hkv + g) * c.d + x];
          }
          s[t] = dot * scale;
          mx = std::max(mx, s[t]);
        }
        if (sinks) mx = std::max(mx, double(sinks[h]));
        double sum = sinks ? std::exp(double(sinks[h]) - mx) : 0.0;
        for (int64_t t = lo; t <= pos; ++t) sum += (s[t] = std::exp(s[t] - mx));
        for (int64_t x = 0; x < c.d; ++x) {
          double o = 0;
          for (int64_t t = lo; t <= pos; ++t) {
            const int64_t slot = tables[b * max_blocks + t / c.bs] * c.bs + t % c.bs;
            o += s[t] * vc[(slot * c.hkv + g) * c.d + x];
          }
          o /= sum;
          max_err = std::max(max_err, std::fabs(o - out_f[(row * c.hq + h) * c.d + x]));
        }
      }
    }
  }
  return max_err;
}

// Decodes, a whole prompt, and prefill chunks over cached context in one call.
const Case kMixed{9, 3, 64, 16, {1, 1, 37, 5, 1, 20}, {1, 300, 37, 70, 17, 64}};

TEST(PagedAttention, MatchesReferenceFloat32AllVariants) {
  for (const auto& isa : detail::available_attention_isas()) {
    SCOPED_TRACE(isa);
    EXPECT_LT(run_case(kMixed, DType::kFloat32, isa.c_str(), 1), 2e-5);
    EXPECT_LT(run_case({8, 2, 128, 8, {3, 1, 19}, {40, 9, 19}}, DType::kFloat32, isa.c_str(), 2),
              2e-5);
    // Head size that is not a multiple of the vector width; MHA; block size 5.
    EXPECT_LT(run_case({4, 4, 40, 5, {1, 12, 2}, {23, 12, 8}}, DType::kFloat32, isa.c_str(), 3),
              2e-5);
  }
}

TEST(PagedAttention, MatchesReferenceBFloat16AllVariants) {
  for (const auto& isa : detail::available_attention_isas()) {
    SCOPED_TRACE(isa);
    EXPECT_LT(run_case(kMixed, DType::kBFloat16, isa.c_str(), 4), 2e-2);
    EXPECT_LT(run_case({4, 4, 40, 32, {1, 40}, {90, 41}}, DType::kBFloat16, isa.c_str(), 5), 2e-2);
  }
}

// Sliding windows smaller than, not a multiple of, and larger than the block
// size, over decodes, a prompt longer than the window and prefill chunks whose
// window boundary falls inside the chunk; narrow (GQA 3) and wide (MHA,
// group 16) tiles.
TEST(PagedAttention, SlidingWindowMatchesReferenceAllVariants) {
  for (const auto& isa : detail::available_attention_isas()) {
    SCOPED_TRACE(isa);
    for (const int64_t w : {1, 5, 16, 23, 100, 1000}) {
      SCOPED_TRACE(w);
      Case mixed = kMixed;
      mixed.window = w;
      EXPECT_LT(run_case(mixed, DType::kFloat32, isa.c_str(), 7), 2e-5);
      EXPECT_LT(run_case(mixed, DType::kBFloat16, isa.c_str(), 8), 2e-2);
      EXPECT_LT(run_case({4, 4, 40, 5, {1, 70, 2}, {230, 90, 8}, w}, DType::kFloat32, isa.c_str(),
                         9),
                2e-5);
      EXPECT_LT(run_case({16, 1, 64, 8, {1, 33}, {77, 120}, w}, DType::kFloat32, isa.c_str(), 10),
                2e-5);
    }
  }
}

// Sink logits per head: ordinary ones (about the logits' size), ones large
// enough to dominate (the row's output near 0), and very negative ones (no
// effect); with and without a window; decodes, prompts and prefill chunks on
// the narrow (GQA 3) and wide (group 16) tiles.
TEST(PagedAttention, SinksMatchReferenceAllVariants) {
  const float inf = std::numeric_limits<float>::infinity();
  for (const auto& isa : detail::available_attention_isas()) {
    SCOPED_TRACE(isa);
    for (const int64_t w : {0, 5, 23}) {
      SCOPED_TRACE(w);
      Case mixed = kMixed;  // 9 query heads
      mixed.window = w;
      mixed.sinks = {0.5f, -1.0f, 2.0f, 30.0f, -inf, -1e30f, 0.0f, 4.0f, -3.0f};
      EXPECT_LT(run_case(mixed, DType::kFloat32, isa.c_str(), 11), 2e-5);
      EXPECT_LT(run_case(mixed, DType::kBFloat16, isa.c_str(), 12), 2e-2);
      Case wide{16, 1, 64, 8, {1, 33}, {77, 120}, w, std::vector<float>(16)};
      for (int64_t h = 0; h < 16; ++h) wide.sinks[h] = float(h % 5) - 2.0f + (h == 7 ? 50 : 0);
      EXPECT_LT(run_case(wide, DType::kFloat32, isa.c_str(), 13), 2e-5);
      EXPECT_LT(run_case(wide, DType::kBFloat16, isa.c_str(), 14), 2e-2);
      // Head size not a multiple of the vector width, block size 5, MHA.
      Case odd{4, 4, 40, 5, {1, 70, 2}, {230, 90, 8}, w, {1.0f, -inf, 25.0f, -0.5f}};
      EXPECT_LT(run_case(odd, DType::kFloat32, isa.c_str(), 15), 2e-5);
    }
  }
}

// A sink of -inf is no sink: the same bits as a call without sinks (narrow and
// wide tiles, batch-invariant or not).
TEST(PagedAttention, MinusInfinitySinksKeepTheBits) {
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int64_t hq = 8, hkv = 2, d = 64, bs = 16, nb = 12, t_count = 40;
  std::vector<float> kc(nb * bs * hkv * d), vc(kc.size()), q(t_count * hq * d);
  for (auto* v : {&kc, &vc, &q}) {
    for (auto& x : *v) x = normal(rng);
  }
  // A 39-token chunk after 51 cached tokens, and a decode at position 59.
  std::vector<int32_t> tables = {3, 0, 5, 1, 4, 2, 8, 11, 7, 10, 0, 0}, seq_lens = {90, 60};
  std::vector<int32_t> qsl = {0, 39, 40};
  const std::vector<float> no_sink(hq, -std::numeric_limits<float>::infinity());
  for (const auto& isa : detail::available_attention_isas()) {
    SCOPED_TRACE(isa);
    for (const bool inv : {false, true}) {
      std::vector<float> a(q.size()), b(q.size());
      for (auto* out : {&a, &b}) {
        detail::paged_attention_isa(isa.c_str(), out->data(), q.data(), kc.data(), vc.data(),
                                    tables.data(), seq_lens.data(), qsl.data(), t_count, 2, hq,
                                    hkv, d, nb, bs, 6, 0.125f, DType::kFloat32, inv, 0,
                                    out == &a ? nullptr : no_sink.data());
      }
      EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
    }
  }
}

TEST(PagedAttention, SlidingWindowRejectsNegativeAndChecksVisibleBlocks) {
  std::vector<float> buf(4096);
  std::vector<int32_t> table = {-1, 1}, seq_lens = {20}, qsl = {0, 1};
  auto call = [&](int64_t window) {
    paged_attention(buf.data(), buf.data(), buf.data(), buf.data(), table.data(), seq_lens.data(),
                    qsl.data(), 1, 1, 2, 1, 8, 2, 16, 2, 1.0f, DType::kFloat32, false, window);
  };
  EXPECT_THROW(call(-1), std::invalid_argument);
  EXPECT_THROW(call(0), std::invalid_argument);   // block 0 is read: -1 out of range
  EXPECT_THROW(call(5), std::invalid_argument);   // the decode at 19 sees 15..19
  EXPECT_NO_THROW(call(4));                        // 16..19: block 0 skipped
}

TEST(PagedAttention, TwoThreadsGiveTheSameResult) {
  set_num_threads(2);
  const double err = run_case(kMixed, DType::kFloat32, attention_isa(), 6);
  set_num_threads(1);
  EXPECT_LT(err, 2e-5);
}

TEST(PagedAttention, RejectsBadArguments) {
  std::vector<float> buf(1024);
  std::vector<int32_t> table = {0, 1}, seq_lens = {20}, qsl = {0, 1};
  auto call = [&](int64_t hq, int64_t hkv, int64_t num_blocks, int64_t max_blocks) {
    paged_attention(buf.data(), buf.data(), buf.data(), buf.data(), table.data(), seq_lens.data(),
                    qsl.data(), 1, 1, hq, hkv, 8, num_blocks, 16, max_blocks, 1.0f,
                    DType::kFloat32);
  };
  EXPECT_THROW(call(3, 2, 2, 2), std::invalid_argument);  // Hq % Hkv
  EXPECT_THROW(call(2, 1, 1, 2), std::invalid_argument);  // block id out of range
  EXPECT_THROW(call(2, 1, 2, 1), std::invalid_argument);  // too few table columns
  seq_lens[0] = 0;
  EXPECT_THROW(call(2, 1, 2, 2), std::invalid_argument);  // seq_len < q_len
}

TEST(ReshapeAndCache, WritesSlotsAndSkipsNegative) {
  const int64_t hkv = 2, d = 4, slots = 8, t_count = 3;
  std::vector<float> k(t_count * hkv * d), v(k.size());
  for (size_t i = 0; i < k.size(); ++i) {
    k[i] = float(i);
    v[i] = -float(i);
  }
  std::vector<float> kc(slots * hkv * d, 0.5f), vc(kc.size(), 0.5f);
  std::vector<int64_t> slot_mapping = {5, -1, 0};
  reshape_and_cache(k.data(), v.data(), kc.data(), vc.data(), slot_mapping.data(), t_count, hkv, d,
                    slots, DType::kFloat32);
  for (int64_t s = 0; s < slots; ++s) {
    for (int64_t x = 0; x < hkv * d; ++x) {
      const int64_t t = s == 5 ? 0 : s == 0 ? 2 : -1;
      EXPECT_EQ(kc[s * hkv * d + x], t < 0 ? 0.5f : k[t * hkv * d + x]);
      EXPECT_EQ(vc[s * hkv * d + x], t < 0 ? 0.5f : v[t * hkv * d + x]);
    }
  }
  slot_mapping[1] = slots;
  EXPECT_THROW(reshape_and_cache(k.data(), v.data(), kc.data(), vc.data(), slot_mapping.data(),
                                 t_count, hkv, d, slots, DType::kFloat32),
               std::invalid_argument);
}

}  // namespace
}  // namespace paternoster
